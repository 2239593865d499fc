"""Choosing search settings leaving one conversation out (``--loo``).

The server reads ``settings.SEARCH_TUNING`` once; to compare settings without restarting
it, this process sets Django up against the private server's database
(``bench.message_copy.setup_django``) and calls ``search.selectors.search_messages`` itself
with each setting's ``SearchTuning``, on the conversations the HTTP run loaded: the same
questions, ``topK`` 10, hybrid mode, the benchmark agent's access. The query is embedded in
this process by the same local model, with one thread as the server's web processes have.

A setting is chosen leaving one conversation out: for each conversation, the setting with
the best mean hit@5 on the other conversations' questions (then recall@10, then the earlier
in ``settings()``: the search before issue 21 first, simpler before more), scored on that
conversation's questions. The mean over all questions of those held-out scores is what choosing by this
rule is worth on conversations it was not chosen on; each setting's plain figure (all four
conversations) is reported beside it.
"""

import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from bench.common import log, mean, percentile
from bench.locomo.evaluate import TOP_K, Plan
from bench.locomo.metrics import METRICS, ranking_metrics

Key = tuple[str, int]  # (sample id, question index)


def settings() -> dict[str, object]:
    """The settings compared, label -> ``SearchTuning``, in order of preference: the search
    before issue 21 first (no dates, no expansion), the current default last. A label's
    first word names its direction; each direction is also chosen on its own (against the
    first), leaving one conversation out."""
    from search.tuning import DEFAULT_TUNING, FEEDBACK_TUNING

    d = replace(
        DEFAULT_TUNING,
        expansion_weight=0.0,
        date_weight=0.0,
        query_parts=0,
        citation_weight=0.0,
        citation_min_relevance=0.0,
        author_weight=0.0,
    )
    return {
        "before": d,
        "neighbours 0.1": replace(d, neighbour_weight=0.1),
        "neighbours 0.3": replace(d, neighbour_weight=0.3),
        "weights semantic 0.4": replace(d, semantic_weight=0.4, keyword_weight=0.6),
        "weights semantic 0.6": replace(d, semantic_weight=0.6, keyword_weight=0.4),
        "expansion 0.3": replace(d, expansion_weight=0.3),
        "expansion 0.5": replace(d, expansion_weight=0.5),
        "expansion 0.8": replace(d, expansion_weight=0.8),
        "parts 3 x 1.0": replace(d, query_parts=3, part_weight=1.0),
        "parts 3 x 0.8": replace(d, query_parts=3, part_weight=0.8),
        "dates 0.05": replace(d, date_weight=0.05),
        "dates 0.1": replace(d, date_weight=0.1),
        "dates 0.15": replace(d, date_weight=0.15),
        "dates 0.1 +7 days": replace(d, date_weight=0.1, date_slack_days=7),
        "dates 0.2 +7 days": replace(d, date_weight=0.2, date_slack_days=7),
        "dates 0.2 +31 days": replace(d, date_weight=0.2, date_slack_days=31),
        "keywords cap 2000": replace(d, keyword_match_cap=2000),
        "candidates 10 per result": replace(d, candidates_per_result=10),
        # Memories citing turns (``bench.locomo --observations``; without memories these
        # settings are the search before): weight x memories, and a relevance floor.
        "citations 0.5 x 3": replace(d, citation_weight=0.5, cited_memories=3),
        "citations 1.0 x 3": replace(d, citation_weight=1.0, cited_memories=3),
        "citations 1.5 x 3": replace(d, citation_weight=1.5, cited_memories=3),
        "citations 1.0 x 5": replace(d, citation_weight=1.0, cited_memories=5),
        "citations 0.5 x 10": replace(d, citation_weight=0.5, cited_memories=10),
        "citations 1.0 x 3 floor 0.2": replace(d, citation_weight=1.0, citation_min_relevance=0.2),
        "citations 1.0 x 3 floor 0.3": replace(d, citation_weight=1.0, citation_min_relevance=0.3),
        "citations 1.0 x 3 floor 0.4": replace(d, citation_weight=1.0, citation_min_relevance=0.4),
        "citations 1.0 x 3 floor 0.5": replace(d, citation_weight=1.0, citation_min_relevance=0.5),
        "citations 1.0 x 3 floor 0.6": replace(d, citation_weight=1.0, citation_min_relevance=0.6),
        "citations 1.0 x 3 floor 0.5 semantic": replace(
            d, citation_weight=1.0, citation_min_relevance=0.5, citation_mode="semantic"
        ),
        # A turn whose author the question names.
        "authors 0.1": replace(d, author_weight=0.1),
        "authors 0.2": replace(d, author_weight=0.2),
        "authors 0.3": replace(d, author_weight=0.3),
        # The directions that helped on their own, together.
        "combined dates 0.1 + expansion 0.5": replace(d, date_weight=0.1, expansion_weight=0.5),
        "combined dates 0.1 + neighbours 0.3": replace(d, date_weight=0.1, neighbour_weight=0.3),
        "combined dates 0.1 + expansion 0.5 + parts 3": replace(
            d, date_weight=0.1, expansion_weight=0.5, query_parts=3
        ),
        "combined dates 0.1 + citations 1.0 x 3": replace(d, date_weight=0.1, citation_weight=1.0),
        "combined dates 0.1 + citations 1.0 x 3 + expansion 0.5": replace(
            d, date_weight=0.1, citation_weight=1.0, expansion_weight=0.5
        ),
        "combined dates 0.1 + authors 0.2": replace(d, date_weight=0.1, author_weight=0.2),
        "combined dates 0.1 + citations floor 0.5": replace(
            d, date_weight=0.1, citation_weight=1.0, citation_min_relevance=0.5
        ),
        "combined dates 0.1 + citations floor 0.5 + authors 0.1": replace(
            d, date_weight=0.1, citation_weight=1.0, citation_min_relevance=0.5, author_weight=0.1
        ),
        "combined dates 0.1 + citations floor 0.5 + authors 0.2": replace(
            d, date_weight=0.1, citation_weight=1.0, citation_min_relevance=0.5, author_weight=0.2
        ),
        "combined dates 0.1 + citations floor 0.5 + authors 0.3": replace(
            d, date_weight=0.1, citation_weight=1.0, citation_min_relevance=0.5, author_weight=0.3
        ),
        "default": DEFAULT_TUNING,
        # Keyword feedback on top of the default (off there): its best rows' and memories'
        # words that the question lacks, at a share of their weight.
        **{
            f"feedback {rows} rows + {memories} memories, {words} words x {weight}": replace(
                DEFAULT_TUNING,
                feedback_rows=rows,
                feedback_memories=memories,
                feedback_words=words,
                feedback_weight=weight,
            )
            for rows in (3, 5, 8)
            for memories in (0, 1, 2, 3)
            for words in (10, 20)
            for weight in (0.1, 0.2, 0.3)
        },
        # The feedback chosen (``FEEDBACK_TUNING``) with the directions that helped before.
        "feedback+ expansion 0.3": replace(FEEDBACK_TUNING, expansion_weight=0.3),
        "feedback+ expansion 0.5": replace(FEEDBACK_TUNING, expansion_weight=0.5),
        "feedback+ neighbours 0.3": replace(FEEDBACK_TUNING, neighbour_weight=0.3),
        "feedback+ candidates 10 per result": replace(FEEDBACK_TUNING, candidates_per_result=10),
        "feedback+ citations 1.0 x 5": replace(FEEDBACK_TUNING, cited_memories=5),
        "feedback+ keywords cap 2000": replace(FEEDBACK_TUNING, keyword_match_cap=2000),
        # The query's vector with a share of its words' besides the names, on the default and
        # on the feedback chosen.
        "unnamed vector 1.0": replace(DEFAULT_TUNING, unnamed_vector_share=1.0),
        **{
            f"unnamed vector feedback+ {share}": replace(
                FEEDBACK_TUNING, unnamed_vector_share=share
            )
            for share in (0.5, 1.0, 2.0)
        },
    }


def direction(label: str) -> str:
    return label.split()[0]


def means(per_question: Mapping[Key, dict], keys: list[Key]) -> dict:
    """Each metric's mean over ``keys``."""
    return {name: mean(per_question[key][name] for key in keys) for name in METRICS}


def summary(plan: Plan, per_question: Mapping[Key, dict]) -> dict:
    """The means over all questions, per sample and per category (keys as strings)."""
    keys = [
        (q.sample_id, q.index) for q in plan.questions if (q.sample_id, q.index) in per_question
    ]
    by_sample: dict[str, list] = {}
    by_category: dict[str, list] = {}
    for question in plan.questions:
        key = (question.sample_id, question.index)
        if key in per_question:
            by_sample.setdefault(question.sample_id, []).append(key)
            by_category.setdefault(str(question.category), []).append(key)
    return {
        **means(per_question, keys),
        "questions": len(keys),
        "bySample": {sample: means(per_question, ks) for sample, ks in by_sample.items()},
        "byCategory": {c: means(per_question, ks) for c, ks in sorted(by_category.items())},
    }


def leave_one_out(
    plan: Plan, scores: Mapping[str, Mapping[Key, dict]], preference: Callable[[str], float]
) -> dict:
    """Per held-out sample: the setting chosen on the other samples (best hit@5, then
    recall@10, then the highest ``preference``) and its scores there; then ``summary`` of
    those held-out scores. Empty with fewer than two samples."""
    samples = list(dict.fromkeys(q.sample_id for q in plan.questions))
    if len(samples) < 2:
        return {}
    chosen, held_out = {}, {}
    for sample in samples:
        others = [(q.sample_id, q.index) for q in plan.questions if q.sample_id != sample]
        here = [(q.sample_id, q.index) for q in plan.questions if q.sample_id == sample]

        def merit(label, others=others):
            on_others = means(scores[label], others)
            return (
                round(on_others["hit@5"], 6),
                round(on_others["recall@10"], 6),
                preference(label),
            )

        best = max(scores, key=merit)
        chosen[sample] = best
        held_out.update({key: scores[best][key] for key in here})
    return {"chosen": chosen, **summary(plan, held_out)}


def compare(agent_name: str, plan: Plan, loaded: Mapping, chosen: list[str] | None = None) -> dict:
    """Search every planned question under every setting (or those labelled in ``chosen``),
    in-process; each setting's summary and the leave-one-out choice."""
    from agents_api.models import Agent
    from memsvc.api.principals import Principal
    from search.selectors import search_messages

    agent = Agent.objects.get(name=agent_name)
    principal = Principal.for_agent(agent.id, name=agent.name)
    every = settings()
    labels = [label for label in every if chosen is None or label in chosen]
    scores: dict[str, dict] = {}
    timings: dict[str, dict] = {}
    for label in labels:
        log(f"  --loo: {label}")
        tuning = every[label]
        scores[label] = {}
        elapsed = []
        for question in plan.questions:
            key = (question.sample_id, question.index)
            conversation = loaded[question.sample_id]
            started = time.perf_counter()
            hits = search_messages(
                principal,
                query=question.text,
                top_k=TOP_K,
                mode="hybrid",
                conversation_ids=[conversation.conversation_id],
                for_agent=True,
                tuning=tuning,
            )
            elapsed.append((time.perf_counter() - started) * 1000)
            reached = [{(hit.message.metadata or {}).get("dia_id")} - {None} for hit in hits]
            scores[label][key] = ranking_metrics(reached, set(plan.evidence[key]))
        timings[label] = {"p50Ms": percentile(elapsed, 50), "p95Ms": percentile(elapsed, 95)}
    tunings = {label: vars_of(every[label]) for label in labels}
    return conclude(plan.questions, scores, tunings, timings)


@dataclass(frozen=True)
class Asked:
    """What the choice needs of a question."""

    sample_id: str
    index: int
    category: int


def conclude(
    questions: list,
    scores: dict[str, dict],
    tunings: dict[str, dict],
    timings: Mapping[str, dict] | None = None,
) -> dict:
    """The summaries of the settings in ``scores`` (label -> question key -> metrics, in
    order of preference; with their search times in the process, ``timings``), each
    direction's choice against the first (the search before) and the choice among all,
    leaving one conversation out."""
    timings = timings or {}
    plan = Plan(questions=list(questions), evidence={})
    labels = list(scores)
    order = {label: position for position, label in enumerate(labels)}

    def preference(label):
        return -order[label]

    directions = {}
    for label in labels[1:]:
        directions.setdefault(direction(label), [labels[0]]).append(label)
    return {
        "settings": {
            label: {
                "tuning": tunings[label],
                **timings.get(label, {}),
                **summary(plan, per_question),
            }
            for label, per_question in scores.items()
        },
        "byDirection": {
            name: leave_one_out(plan, {label: scores[label] for label in group}, preference)
            for name, group in directions.items()
        },
        "leaveOneOut": leave_one_out(plan, scores, preference),
        # Per setting, per question: runs of some settings each can be put together
        # (``merge``).
        "tunings": tunings,
        "questionList": [[q.sample_id, q.index, q.category] for q in plan.questions],
        "perQuestion": {
            label: {f"{s}/{i}": metrics for (s, i), metrics in per_question.items()}
            for label, per_question in scores.items()
        },
    }


def merge(paths: list[Path]) -> dict:
    """``conclude`` over the settings of several ``--loo`` runs on the same questions (the
    first run's first setting first, then each label once, in the order of ``settings``)."""
    runs = [json.loads(path.read_text())["loo"] for path in paths]
    questions = [Asked(*q) for q in runs[0]["questionList"]]
    scores, tunings, timings = {}, {}, {}
    for run in runs:
        for label, per_question in run["perQuestion"].items():
            if label not in scores:
                scores[label] = {
                    (key.rsplit("/", 1)[0], int(key.rsplit("/", 1)[1])): metrics
                    for key, metrics in per_question.items()
                }
                tunings[label] = run["tunings"][label]
                timings[label] = {
                    name: run["settings"][label][name]
                    for name in ("p50Ms", "p95Ms")
                    if name in run["settings"][label]
                }
    known = list(settings())
    ordered = sorted(scores, key=lambda label: known.index(label) if label in known else len(known))
    return conclude(questions, {label: scores[label] for label in ordered}, tunings, timings)


def vars_of(tuning) -> dict:
    """The fields of ``tuning`` that differ from the default (JSON-ready)."""
    from search.tuning import DEFAULT_TUNING

    return {
        name: value
        for name, value in vars(tuning).items()
        if getattr(DEFAULT_TUNING, name) != value
    }


def main(argv: list[str]) -> int:
    import argparse

    from bench.locomo.report import format_loo

    parser = argparse.ArgumentParser(
        prog="python -m bench.locomo.loo",
        description="Put together runs of `bench.locomo --loo` (one per host, say) and "
        "print the leave-one-conversation-out table of them all.",
    )
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN.json", help="their --out")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.runs if not path.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    print(format_loo(merge(args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
