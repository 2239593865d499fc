"""The hybrid fusion weights for memories, compared on LoCoMo in-process.

The server reads ``settings.SEARCH_TUNING`` once; to compare weights without restarting it,
this process sets Django up against the private server's database (``bench.message_copy.
setup_django``: the server's settings and secrets, its PostgreSQL) and calls
``agents_api.selectors.memory_search`` itself, each setting under
``django.test.override_settings(SEARCH_TUNING=replace(DEFAULT_TUNING, semantic_weight=...,
keyword_weight=...))``, on the memories the HTTP run saved. The same questions, ``limit``
10 and ``minScore`` 0, hybrid mode. The query is embedded in this process by the same local
model. The default setting is checked against the HTTP run's hybrid rankings.

``MemoryRanking`` (relevance against importance and recency) is not chosen here: every
observation was saved with the same importance a few seconds apart, so importance is a
constant and recency nearly one. Two rankings are run anyway to show that: relevance alone
(the same order as the default), and OpenMemory's importance x 0.6 + recency x 0.4, which
drops relevance and so orders by when the memories were saved.

A weight is chosen leaving one conversation out: for each sample, the setting with the best
mean hit@5 (then recall@10, then nearest the default) on the other samples' questions, scored
on that sample's; the mean over all questions is what choosing by this rule is worth.
"""

from dataclasses import replace

from bench.common import log
from bench.locomo.evaluate import Plan
from bench.locomo.load import LoadedMemories
from bench.locomo.loo import leave_one_out, summary
from bench.memories.locomo import LIMIT, score

SEMANTIC_WEIGHTS = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0)


def _label(semantic: float) -> str:
    return f"semantic {semantic:.1f} / keyword {1 - semantic:.1f}"


def sweep(
    agent_name: str, plan: Plan, loaded: dict[str, LoadedMemories], http_ranked: dict
) -> dict:
    """Search every planned question with every weight setting (and the two rankings);
    the metrics per setting, per sample and per category, the leave-one-out choice, and how
    many default rankings match the HTTP run's (``http_ranked``: question key -> ids)."""
    from django.test import override_settings

    from agents_api.models import Agent
    from agents_api.selectors import memory_search
    from search.tuning import DEFAULT_TUNING, OPENMEMORY_RANKING, MemoryRanking

    agent = Agent.objects.get(name=agent_name)
    settings = {
        _label(weight): (
            replace(DEFAULT_TUNING, semantic_weight=weight, keyword_weight=round(1 - weight, 2)),
            None,
        )
        for weight in SEMANTIC_WEIGHTS
    }
    settings["ranking: relevance only"] = (DEFAULT_TUNING, MemoryRanking(1.0, 0.0, 0.0))
    settings["ranking: OpenMemory (importance 0.6, recency 0.4)"] = (
        DEFAULT_TUNING,
        OPENMEMORY_RANKING,
    )
    scores: dict[str, dict] = {}  # setting -> question key -> metrics
    same_as_http, differing = 0, []
    default_label = _label(DEFAULT_TUNING.semantic_weight)
    for label, (tuning, ranking) in settings.items():
        log(f"  sweep: {label}")
        scores[label] = {}
        with override_settings(SEARCH_TUNING=tuning):
            for question in plan.questions:
                key = (question.sample_id, question.index)
                memories = loaded[question.sample_id]
                hits = memory_search(
                    agent,
                    user_id=memories.user_id,
                    query=question.text,
                    limit=LIMIT,
                    min_score=0.0,
                    mode="hybrid",
                    ranking_=ranking,
                )
                ranked = [str(hit.memory.id) for hit in hits]
                scores[label][key] = score(ranked, memories, plan.evidence[key])
                if label == default_label and key in http_ranked:
                    if http_ranked[key] == ranked:
                        same_as_http += 1
                    else:
                        differing.append(
                            {"key": list(key), "http": http_ranked[key], "inProcess": ranked}
                        )
    weights = {_label(weight): weight for weight in SEMANTIC_WEIGHTS}
    return {
        "settings": {label: summary(plan, per_question) for label, per_question in scores.items()},
        # The best on the other samples, then the nearest to the default weight.
        "leaveOneOut": leave_one_out(
            plan,
            {label: scores[label] for label in map(_label, SEMANTIC_WEIGHTS)},
            lambda label: -abs(weights[label] - DEFAULT_TUNING.semantic_weight),
        ),
        "defaultSetting": default_label,
        "defaultSameAsHttp": same_as_http,
        "defaultDifferentFromHttp": differing,
        "questions": len(plan.questions),
    }
