"""LoCoMo's data file as Python objects, for every benchmark that reads it.

``read_dataset(path)`` gives the samples. A sample is one long two-person conversation:
its sessions (a date and turns, each turn with its ``dia_id``), its questions (a category
and the evidence turns that hold the answer) and its observations (facts about one speaker
that the data's authors drew from a session, each with the turns it rests on).

Evidence ids are normalised the same way in questions and observations
(``normalise_evidence``): ``"D:11:26"`` -> ``"D11:26"``, ``"D30:05"`` -> ``"D30:5"``,
``"D8:6; D9:17"`` -> both; pieces that are no turn id (``"D"``) are dropped. What that did
is counted for each kind, for the report. Whether an id names a turn of the sample is left
to the caller, who knows which turns it loaded.
"""

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

# The question categories with an answer in the conversation, the ones retrieval is scored
# on; category 5 (adversarial) has none.
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
SESSION_KEY = re.compile(r"session_(\d+)")
OBSERVATION_KEY = re.compile(r"session_(\d+)_observation")
EVIDENCE_ID = re.compile(r"D:?(\d+):(\d+)")
EVIDENCE_SEPARATORS = re.compile(r"[;,\s]+")
SESSION_DATE_FORMAT = "%I:%M %p on %d %B, %Y"


@dataclass(frozen=True)
class Turn:
    """One turn of a session. ``created_at`` is the session's date plus one second per turn
    before it, so turns keep distinct, ordered times (sessions are hours apart at least)."""

    dia_id: str
    session: int
    speaker: str
    text: str  # with ``" [shares a photo: <caption>]"`` when it shares one (``turn_text``)
    created_at: datetime
    has_photo: bool


@dataclass(frozen=True)
class Session:
    number: int
    started_at: datetime
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Question:
    sample_id: str
    index: int  # position in the sample's ``qa`` list
    text: str
    category: int
    evidence: tuple[str, ...]  # normalised turn ids, in the data's order, without duplicates
    raw_evidence: tuple[str, ...]


@dataclass(frozen=True)
class Observation:
    """A fact about ``speaker`` drawn from one session, and the turns it rests on."""

    sample_id: str
    session: int
    speaker: str
    text: str
    evidence: tuple[str, ...]  # normalised turn ids, in the data's order, without duplicates
    raw_evidence: tuple[str, ...]


@dataclass
class Sample:
    sample_id: str
    sessions: list[Session]
    questions: list[Question]
    observations: list[Observation]

    @property
    def turns(self) -> list[Turn]:
        """Every turn, sessions in number order, turns in file order."""
        return [turn for session in self.sessions for turn in session.turns]


@dataclass
class EvidenceStats:
    """What normalising the evidence ids did, for the report."""

    ids: int = 0
    fixed: list[tuple[str, list[str]]] = field(default_factory=list)
    unparseable: list[str] = field(default_factory=list)


@dataclass
class Dataset:
    samples: list[Sample]
    question_evidence: EvidenceStats
    observation_evidence: EvidenceStats


def parse_session_date(text: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` as an aware UTC datetime."""
    cleaned = " ".join(text.split())
    return datetime.strptime(cleaned, SESSION_DATE_FORMAT).replace(tzinfo=UTC)


def turn_text(turn: dict) -> str:
    """The words of a turn, with the caption of the photo it shares, if any."""
    text = turn.get("text", "")
    caption = (turn.get("blip_caption") or "").strip()
    return f"{text} [shares a photo: {caption}]" if caption else text


def normalise_evidence(raw: str) -> tuple[list[str], list[str]]:
    """Turn ids in one evidence string, and the pieces that are no turn id.

    ``"D:11:26"`` -> ``["D11:26"]``; ``"D30:05"`` -> ``["D30:5"]``; ``"D8:6; D9:17"`` ->
    ``["D8:6", "D9:17"]``; ``"D"`` -> ``[]`` with ``"D"`` rejected.
    """
    ids, rejected = [], []
    for piece in EVIDENCE_SEPARATORS.split(raw.strip()):
        if not piece:
            continue
        match = EVIDENCE_ID.fullmatch(piece)
        if match:
            ids.append(f"D{int(match[1])}:{int(match[2])}")
        else:
            rejected.append(piece)
    return ids, rejected


def read_evidence(raw: Iterable[str], stats: EvidenceStats) -> tuple[str, ...]:
    """The normalised turn ids of evidence strings, in order, without duplicates; counted
    in ``stats``."""
    evidence: list[str] = []
    for piece in raw:
        ids, rejected = normalise_evidence(piece)
        stats.ids += 1
        if rejected:
            stats.unparseable.extend(rejected)
        if ids and ids != [piece]:
            stats.fixed.append((piece, ids))
        evidence += [i for i in ids if i not in evidence]
    return tuple(evidence)


def read_sessions(conversation: dict) -> list[Session]:
    """The sessions that have turns, in number order, their turns in file order."""
    numbered = sorted(
        (int(match[1]), key)
        for key in conversation
        if (match := SESSION_KEY.fullmatch(key)) and conversation[key]
    )
    sessions = []
    for number, key in numbered:
        started = parse_session_date(conversation[f"{key}_date_time"])
        turns = tuple(
            Turn(
                dia_id=turn["dia_id"],
                session=number,
                speaker=turn["speaker"],
                text=turn_text(turn),
                created_at=started + timedelta(seconds=position),
                has_photo=bool((turn.get("blip_caption") or "").strip()),
            )
            for position, turn in enumerate(conversation[key])
        )
        sessions.append(Session(number=number, started_at=started, turns=turns))
    return sessions


def read_questions(sample_id: str, qa: list[dict], stats: EvidenceStats) -> list[Question]:
    """The sample's questions (all categories) with normalised evidence."""
    questions = []
    for index, item in enumerate(qa):
        raw = tuple(str(e) for e in item.get("evidence") or [])
        questions.append(
            Question(
                sample_id=sample_id,
                index=index,
                text=item["question"],
                category=int(item["category"]),
                evidence=read_evidence(raw, stats),
                raw_evidence=raw,
            )
        )
    return questions


def read_observations(sample_id: str, observation: dict, stats: EvidenceStats) -> list[Observation]:
    """The sample's observations, sessions in number order, then speakers and facts in file
    order. Each fact is ``[text, evidence]``, the evidence one id string or a list of them."""
    numbered = sorted(
        (int(match[1]), key) for key in observation if (match := OBSERVATION_KEY.fullmatch(key))
    )
    observations = []
    for number, key in numbered:
        for speaker, facts in observation[key].items():
            for text, evidence in facts:
                raw = tuple(str(e) for e in ([evidence] if isinstance(evidence, str) else evidence))
                observations.append(
                    Observation(
                        sample_id=sample_id,
                        session=number,
                        speaker=speaker,
                        text=text,
                        evidence=read_evidence(raw, stats),
                        raw_evidence=raw,
                    )
                )
    return observations


def read_dataset(path: Path) -> Dataset:
    """The LoCoMo file at ``path``: its samples, and what evidence normalisation did."""
    dataset = Dataset(
        samples=[], question_evidence=EvidenceStats(), observation_evidence=EvidenceStats()
    )
    for item in json.loads(path.read_text()):
        sample_id = item["sample_id"]
        dataset.samples.append(
            Sample(
                sample_id=sample_id,
                sessions=read_sessions(item["conversation"]),
                questions=read_questions(sample_id, item["qa"], dataset.question_evidence),
                observations=read_observations(
                    sample_id, item.get("observation") or {}, dataset.observation_evidence
                ),
            )
        )
    return dataset
