"""The arithmetic of ranking: numbers in, numbers out, no database.

- BM25 without length normalisation (b = 0) and each word counted once per row: turns and
  memories are short and of similar length, and normalising by length mostly promotes
  one-word turns ("Wow!") that happen to share a word. A row's keyword score is then the
  sum of the IDFs of the query words it holds.
- Hybrid fusion: each measure min-max normalised over the candidates (a candidate found by
  one retriever is scored by both, so it is not penalised for missing from the other's
  short list), then weighted and added.
"""

import math
from collections.abc import Collection, Iterable, Mapping


def bm25_idf(frequencies: Mapping[str, int], documents: int, *, floor: int) -> dict[str, float]:
    """BM25's inverse document frequency of each word, from how many of ``documents`` rows
    hold it, counted as at least ``floor`` (``SearchTuning.document_count_floor``)."""
    documents = max(documents, floor, 1)
    return {
        word: math.log(1 + (documents - f + 0.5) / (f + 0.5))
        for word, f in ((w, min(max(f, floor), documents)) for w, f in frequencies.items())
    }


def rarest_within(frequencies: Mapping[str, int], cap: int) -> list[str]:
    """The words to match candidates on: rarest first while together they occur in at most
    ``cap`` rows; the rarest one always."""
    chosen, covered = [], 0
    for word in sorted(frequencies, key=lambda w: (frequencies[w], w)):
        if chosen and covered + frequencies[word] > cap:
            break
        chosen.append(word)
        covered += frequencies[word]
    return chosen


def feedback_words(
    rows: Iterable[tuple[float, Iterable[str]]],
    idf: Mapping[str, float],
    *,
    known: Collection[str],
    count: int,
) -> list[str]:
    """The ``count`` words that best describe the best rows (each row: its weight and its
    words) besides the ``known`` ones (the query's): a word is worth the sum of the weights
    of the rows holding it x its ``idf``, so a rare word of the best row leads, a common
    word of every row follows. Ties broken by the word, so that the choice is stable."""
    worth: dict[str, float] = {}
    for weight, words in rows:
        for word in set(words):
            if word not in known and idf.get(word, 0.0) > 0:
                worth[word] = worth.get(word, 0.0) + weight * idf[word]
    return sorted(worth, key=lambda w: (-worth[w], w))[:count]


def keyword_score(words: Iterable[str], idf: Mapping[str, float]) -> float:
    """A row's BM25 score (b = 0, each word once) for a query of ``idf``'s words: the sum of
    the weights of those it holds."""
    return sum(idf.get(word, 0.0) for word in set(words))


def normalised(scores: Mapping, ids: Iterable) -> dict:
    """Min-max over the candidates; a candidate without a score gets 0."""
    ids = list(ids)
    values = [scores[i] for i in ids if i in scores]
    if not values:
        return dict.fromkeys(ids, 0.0)
    low, high = min(values), max(values)
    spread = high - low
    return {i: ((scores[i] - low) / spread if spread else 1.0) if i in scores else 0.0 for i in ids}


def fuse(
    semantic: Mapping,
    keyword: Mapping,
    *,
    semantic_weight: float,
    keyword_weight: float,
    vectorless: Collection = (),
):
    """One score per candidate from both measures, each normalised over the candidates. A
    candidate in ``vectorless`` (no vector yet: its semantic measure unknown, not 0) is
    scored by its keyword measure alone, at both weights: a new message that held the only
    word asked for ranked below the nearest unrelated one until it was embedded (review)."""
    ids = set(semantic) | set(keyword)
    s, k = normalised(semantic, ids), normalised(keyword, ids)
    return {
        i: (semantic_weight + keyword_weight) * k[i]
        if i in vectorless
        else semantic_weight * s[i] + keyword_weight * k[i]
        for i in ids
    }


def with_neighbours(
    scores: Mapping, neighbours: Mapping, *, weight: float, expansion: float = 0.0
) -> dict:
    """Each candidate plus ``weight`` x its best neighbour's score (a neighbour that is no
    candidate adds 0). With ``expansion``, a neighbour that is no candidate joins them with
    ``expansion`` x its best candidate neighbour's score (the turn next to a match)."""
    result = {
        i: score + weight * max(scores.get(n, 0.0) for n in neighbours.get(i, (None,)))
        for i, score in scores.items()
    }
    if expansion:
        for i, around in neighbours.items():
            for n in around:
                if n is not None and n not in scores and i in scores:
                    result[n] = max(result.get(n, 0.0), expansion * scores[i])
    return result


def with_bonus(scores: Mapping, chosen: Collection, *, weight: float) -> dict:
    """Each score plus ``weight`` for the ids in ``chosen`` (those written in a span of
    time the query names, or by someone it names)."""
    return {i: score + (weight if i in chosen else 0.0) for i, score in scores.items()}


def cited_shares(citing: list[Iterable], *, weight: float, places: int) -> dict:
    """What the best ``places`` citing rows (best first, each the ids it cites) give the
    rows they cite: ``weight`` x (1 - rank / places), from the best of those citing each
    (the first one's turns about a whole score, the third's a third)."""
    shares: dict = {}
    for rank, cited in enumerate(citing[:places]):
        for i in cited:
            shares.setdefault(i, weight * (1 - rank / places))
    return shares


def with_shares(scores: Mapping, shares: Mapping) -> dict:
    """Each score plus its share; a row with a share and no score joins with it."""
    return {i: scores.get(i, 0.0) + shares.get(i, 0.0) for i in scores.keys() | shares.keys()}


def best_of(rankings: list[Mapping], weights: list[float]) -> dict:
    """One score per id from several rankings: its best weighted score among them."""
    best: dict = {}
    for scores, weight in zip(rankings, weights, strict=True):
        for i, score in scores.items():
            best[i] = max(best.get(i, float("-inf")), weight * score)
    return best


def top(scores: Mapping, k: int, *, then: Mapping | None = None) -> list[tuple]:
    """The ``k`` best (id, score); ties broken by ``then`` (higher first), then by id so that
    the order is stable."""
    then = then or {}
    return sorted(
        scores.items(), key=lambda item: (-item[1], -then.get(item[0], 0.0), str(item[0]))
    )[:k]


def mixed_vector(vector, other, share: float) -> list[float]:
    """``vector`` plus ``share`` x ``other``, each of unit length first, the sum of unit
    length: a query's vector with that share of its words' besides the names
    (``SearchTuning.unnamed_vector_share``)."""
    a, b = _unit(vector), _unit(other)
    return _unit([x + share * y for x, y in zip(a, b, strict=True)])


def _unit(vector) -> list[float]:
    length = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / length for x in vector]


def keyword_coverage(score: float, idf: Mapping[str, float]) -> float:
    """A keyword score as a share of the best possible (a row holding every query word):
    comparable across queries, unlike the score itself."""
    best = sum(idf.values())
    return min(score / best, 1.0) if best > 0 else 0.0


def recency(age_days: float, *, days: float) -> float:
    """1 for a row made now, 1/e after ``days``."""
    return math.exp(-max(age_days, 0.0) / days)


def memory_rank(relevance: float, importance: float, age_days: float, ranking) -> float:
    """A memory's place among the found (``MemoryRanking``)."""
    return (
        ranking.relevance * relevance
        + ranking.importance * importance
        + ranking.recency * recency(age_days, days=ranking.recency_days)
    )
