"""LoCoMo's data file as Python objects: samples (one long two-person conversation each),
their turns with ``dia_id``, and their questions with normalised evidence turn ids."""

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
SESSION_KEY = re.compile(r"session_(\d+)")
EVIDENCE_ID = re.compile(r"D:?(\d+):(\d+)")
EVIDENCE_SEPARATORS = re.compile(r"[;,\s]+")
SESSION_DATE_FORMAT = "%I:%M %p on %d %B, %Y"


@dataclass(frozen=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str
    created_at: datetime
    has_photo: bool


@dataclass(frozen=True)
class Question:
    sample_id: str
    index: int  # position in the sample's ``qa`` list
    text: str
    category: int
    evidence: tuple[str, ...]  # normalised turn ids, in the data's order, without duplicates
    raw_evidence: tuple[str, ...]


@dataclass
class Sample:
    sample_id: str
    turns: list[Turn]
    questions: list[Question]


@dataclass
class EvidenceStats:
    """What normalising the evidence ids did, for the report."""

    ids: int = 0
    fixed: list[tuple[str, list[str]]] = field(default_factory=list)
    unparseable: list[str] = field(default_factory=list)


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


def read_turns(conversation: dict) -> list[Turn]:
    """Every turn of every session, sessions in number order, turns in file order."""
    sessions = sorted(
        (int(match[1]), key)
        for key in conversation
        if (match := SESSION_KEY.fullmatch(key)) and conversation[key]
    )
    turns = []
    for number, key in sessions:
        started = parse_session_date(conversation[f"{key}_date_time"])
        for position, turn in enumerate(conversation[key]):
            turns.append(
                Turn(
                    dia_id=turn["dia_id"],
                    session=number,
                    speaker=turn["speaker"],
                    text=turn_text(turn),
                    created_at=started + timedelta(seconds=position),
                    has_photo=bool((turn.get("blip_caption") or "").strip()),
                )
            )
    return turns


def read_questions(sample_id: str, qa: list[dict], stats: EvidenceStats) -> list[Question]:
    """The sample's questions (all categories) with normalised evidence."""
    questions = []
    for index, item in enumerate(qa):
        raw = tuple(str(e) for e in item.get("evidence") or [])
        evidence: list[str] = []
        for piece in raw:
            ids, rejected = normalise_evidence(piece)
            stats.ids += 1
            if rejected:
                stats.unparseable.extend(rejected)
            if ids and ids != [piece]:
                stats.fixed.append((piece, ids))
            evidence += [i for i in ids if i not in evidence]
        questions.append(
            Question(
                sample_id=sample_id,
                index=index,
                text=item["question"],
                category=int(item["category"]),
                evidence=tuple(evidence),
                raw_evidence=raw,
            )
        )
    return questions


def read_samples(path: Path) -> tuple[list[Sample], EvidenceStats]:
    """The LoCoMo file at ``path``: its samples, and what evidence normalisation did."""
    stats = EvidenceStats()
    samples = []
    for item in json.loads(path.read_text()):
        sample_id = item["sample_id"]
        samples.append(
            Sample(
                sample_id=sample_id,
                turns=read_turns(item["conversation"]),
                questions=read_questions(sample_id, item["qa"], stats),
            )
        )
    return samples, stats
