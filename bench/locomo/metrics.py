"""Ranking metrics against LoCoMo's evidence turns: plain functions, numbers in, numbers out.

A ranking is given as ``reached``: for each result, best first, the set of turn ids
(``dia_id``) it stands for. A message found by search reaches its own turn (``{dia_id}``, or
nothing when it has none); a memory reaches the turns its fact rests on (an observation's
evidence). So one ranking of memories is scored exactly like one of messages:

- hit@k: 1 when one of the first k results reaches an evidence turn, else 0;
- recall@k: the share of the evidence turns reached by the first k results together;
- reciprocal rank: 1 / the rank of the first result that reaches an evidence turn (0 when
  none of the first ``depth`` does); its mean over questions is the MRR.
"""

from collections.abc import Callable, Collection, Iterable, Sequence, Set
from typing import TypeVar

from bench.common import mean
from bench.locomo.dataset import CATEGORIES

# The metrics ``ranking_metrics`` gives, in the order the tables and the JSON show them.
METRICS = ("hit@5", "recall@5", "recall@10", "mrr")
DEPTH = 10  # the results a question is scored on (the benchmarks ask for this many)

Item = TypeVar("Item")


def first_hit_rank(
    reached: Sequence[Collection[str]], evidence: Set[str], depth: int = DEPTH
) -> int | None:
    """The rank (from 1) of the first of the first ``depth`` results that reaches an
    evidence turn; None when none does."""
    for rank, turns in enumerate(reached[:depth], start=1):
        if not evidence.isdisjoint(turns):
            return rank
    return None


def hit_at(k: int, reached: Sequence[Collection[str]], evidence: Set[str]) -> float:
    """1.0 when one of the first ``k`` results reaches an evidence turn, else 0.0."""
    return 0.0 if first_hit_rank(reached, evidence, depth=k) is None else 1.0


def recall_at(k: int, reached: Sequence[Collection[str]], evidence: Set[str]) -> float:
    """The share of the (non-empty) ``evidence`` reached by the first ``k`` results."""
    found = set().union(*reached[:k]) & evidence
    return len(found) / len(evidence)


def reciprocal_rank(
    reached: Sequence[Collection[str]], evidence: Set[str], depth: int = DEPTH
) -> float:
    """1 / the rank of the first result that reaches an evidence turn; 0.0 when none of the
    first ``depth`` does."""
    rank = first_hit_rank(reached, evidence, depth)
    return 0.0 if rank is None else 1.0 / rank


def ranking_metrics(reached: Sequence[Collection[str]], evidence: Set[str]) -> dict[str, float]:
    """``METRICS`` of one ranking."""
    return {
        "hit@5": hit_at(5, reached, evidence),
        "recall@5": recall_at(5, reached, evidence),
        "recall@10": recall_at(10, reached, evidence),
        "mrr": reciprocal_rank(reached, evidence),
    }


def mean_metrics(scores: Iterable[dict], names: Sequence[str] = METRICS) -> dict:
    """The mean of each metric over per-question scores (``ranking_metrics``' dicts, or any
    dict with those keys); None for no questions."""
    scores = list(scores)
    return {name: mean(score[name] for score in scores) for name in names}


def by_category(items: Iterable[Item], category: Callable[[Item], int]) -> dict[int, list[Item]]:
    """``items`` (questions, or records of them) grouped by ``category(item)``, in the order
    of ``CATEGORIES``; categories outside it and those without items are left out."""
    items = list(items)
    groups = {number: [item for item in items if category(item) == number] for number in CATEGORIES}
    return {number: group for number, group in groups.items() if group}
