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

from bench.common import log, mean
from bench.locomo.evaluate import Plan
from bench.locomo.metrics import METRICS
from bench.memories.locomo import LIMIT, LoadedMemories, score

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
    return {
        "settings": {label: _summary(plan, per_question) for label, per_question in scores.items()},
        "leaveOneOut": _leave_one_out(
            plan,
            {label: scores[label] for label in map(_label, SEMANTIC_WEIGHTS)},
            default_weight=DEFAULT_TUNING.semantic_weight,
        ),
        "defaultSetting": default_label,
        "defaultSameAsHttp": same_as_http,
        "defaultDifferentFromHttp": differing,
        "questions": len(plan.questions),
    }


def _means(per_question: dict, keys) -> dict:
    return {name: mean(per_question[key][name] for key in keys) for name in METRICS}


def _summary(plan: Plan, per_question: dict) -> dict:
    keys = [(q.sample_id, q.index) for q in plan.questions]
    by_sample, by_category = {}, {}
    for question in plan.questions:
        key = (question.sample_id, question.index)
        by_sample.setdefault(question.sample_id, []).append(key)
        by_category.setdefault(str(question.category), []).append(key)
    return {
        **_means(per_question, keys),
        "bySample": {sample: _means(per_question, ks) for sample, ks in by_sample.items()},
        "byCategory": {c: _means(per_question, ks) for c, ks in sorted(by_category.items())},
    }


def _leave_one_out(plan: Plan, scores: dict[str, dict], *, default_weight: float) -> dict:
    """Per held-out sample: the setting chosen on the others and its metrics there; then
    the mean over every question of the held-out scores."""
    samples = list(dict.fromkeys(q.sample_id for q in plan.questions))
    if len(samples) < 2:
        return {}  # nothing to choose on (a run with --limit-questions)
    labels = list(scores)
    chosen, held_out = {}, {}
    for sample in samples:
        others = [(q.sample_id, q.index) for q in plan.questions if q.sample_id != sample]
        here = [(q.sample_id, q.index) for q in plan.questions if q.sample_id == sample]

        def merit(label, others=others):
            means = _means(scores[label], others)
            weight = SEMANTIC_WEIGHTS[labels.index(label)]
            return (
                round(means["hit@5"], 6),
                round(means["recall@10"], 6),
                -abs(weight - default_weight),
            )

        best = max(labels, key=merit)
        chosen[sample] = best
        held_out.update({key: scores[best][key] for key in here})
    return {"chosen": chosen, **_means(held_out, list(held_out))}
