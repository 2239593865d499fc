"""Distinct memory texts for many users, and questions to search them with.

From LoCoMo (read in place) when the file is there: each user gets two people's names (its
own and a friend's) and 100 (``per_user``) of the data's observations, the two speakers of
each observation's sample renamed to those two. So a user's memories read like LoCoMo's
facts about a person and a friend, and the same fact differs from user to user by its names.
Texts are distinct across the whole corpus (case and whitespace ignored, as the service
compares them), because the agent's whole store (``bench.memories.store``) copies them all
under one user. A text can still be near another of the same user in meaning (LoCoMo repeats
some facts across sessions): the service merges those (cosine >= 0.95), and the benchmark
counts them.

Without the file, a small generator combines names, actions, places and numbers.
"""

import random
import re
from dataclasses import dataclass
from pathlib import Path

from bench.common import BenchError, log
from bench.locomo.dataset import CATEGORIES, read_dataset

# Word lists read better as text than as a list literal of a hundred strings.
FIRST_NAMES = """
Amara Bo Chiara Dmitri Elif Farid Greta Hiro Ines Jonas Kavya Lars Mei Nia Oskar Pilar
Quentin Rosa Sami Tove Umar Vera Wen Ximena Yusuf Zofia Adele Bruno Carmen Dario Esme Felix
Gaia Hamid Ilse Joaquin Kirsi Luca Maren Nikhil Olga Paulo Rania Soren Talia Ugo Valentina
Wiktor Yara Zane Anouk Bastien Cleo Dagny Emre Fiona Goran Hana Ivo Jana Kofi Leila Matteo
Noor Otto Priya Rafael Selin Tomas Uma Viggo Wanda Xavier Yasmin Zeno Alba Ciro Dilnoza
Eero Femi Gisela Hugo Irina Jules Keiko Lionel Magda Nadia Orla Pavel Renata Stellan Tariq
Ulla Vito Wilma Aziz Beatriz Cosmin Daria Emil Flora Gideon Hedda Isak Joelle Kamal Liv
""".split()  # noqa: SIM905
SURNAMES = """
Okafor Lindqvist Moreau Tanaka Haddad Novak Castillo Brennan Ivanova Mensah Rossi Kaur
Fischer Almeida Nakamura Dubois Kowalski Osei Petrov Sato Varga Nilsen Quispe Reyes Bakker
Demir Horvat Jensen Lopes Mwangi
""".split()  # noqa: SIM905


@dataclass(frozen=True)
class UserTexts:
    user_id: str
    name: str
    friend: str
    memories: list[str]


def _renamer(names: dict[str, str]):
    """A function that replaces each of ``names``' keys (whole words) by its value."""
    if not names:
        return lambda text: text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return lambda text: pattern.sub(lambda match: names[match[1]], text)


def _normalised(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()  # as agents_api.models.content_hash


class LocomoTexts:
    """Observations and questions of the LoCoMo file, renamed per user."""

    def __init__(self, path: Path):
        samples = read_dataset(path).samples
        self.facts = []  # (text, (speaker a, speaker b)) of every observation
        self.questions = []
        for sample in samples:
            speakers = tuple(sorted({turn.speaker for turn in sample.turns}))
            if len(speakers) != 2:
                raise BenchError(f"{sample.sample_id} has speakers {speakers}, expected two")
            self.facts += [(o.text, speakers, o.speaker) for o in sample.observations]
            self.questions += [
                (q.text, speakers) for q in sample.questions if q.category in CATEGORIES
            ]
        log(f"texts: {len(self.facts)} LoCoMo observations, {len(self.questions)} questions")

    @staticmethod
    def _rename(text: str, speakers: tuple[str, str], subject: str, name: str, friend: str):
        other = speakers[1] if speakers[0] == subject else speakers[0]
        return _renamer({subject: name, other: friend})(text)

    def user_memories(self, name: str, friend: str, count: int, rng, taken: set) -> list[str]:
        texts = []
        for text, speakers, subject in rng.sample(self.facts, len(self.facts)):
            renamed = self._rename(text, speakers, subject, name, friend)
            key = _normalised(renamed)
            if key in taken:
                continue
            taken.add(key)
            texts.append(renamed)
            if len(texts) == count:
                return texts
        raise BenchError(f"only {len(texts)} distinct texts for {name}: ask for fewer per user")

    def question(self, name: str, friend: str, rng) -> str:
        text, speakers = rng.choice(self.questions)
        subject = rng.choice(speakers)
        return self._rename(text, speakers, subject, name, friend)


class GeneratedTexts:
    """Sentences from names, actions, places and numbers, for runs without the data file."""

    ACTIONS = [
        "adopted a dog called",
        "ran a half marathon in",
        "started a pottery class in",
        "booked a trip to",
        "lost a wallet in",
        "painted a mural in",
        "moved to a flat in",
        "sang in a choir in",
        "planted tomatoes in",
        "met an old teacher in",
    ]
    PLACES = [
        "Lisbon",
        "Osaka",
        "Nairobi",
        "Quebec",
        "Tromso",
        "Cusco",
        "Hanoi",
        "Tbilisi",
        "Perth",
        "Bergen",
        "Accra",
        "Porto",
    ]
    WHEN = ["last spring", "in March", "two weeks ago", "after the wedding", "on a Sunday"]

    def __init__(self):
        self.questions = []
        log("texts: no LoCoMo data; generated sentences")

    def user_memories(self, name: str, friend: str, count: int, rng, taken: set) -> list[str]:
        texts = []
        for _ in range(count * 50):
            who = rng.choice([name, name, friend])
            text = (
                f"{who} {rng.choice(self.ACTIONS)} {rng.choice(self.PLACES)} "
                f"{rng.choice(self.WHEN)} with {rng.randrange(2, 40)} friends"
            )
            if _normalised(text) in taken:
                continue
            taken.add(_normalised(text))
            texts.append(text)
            if len(texts) == count:
                return texts
        raise BenchError(f"only {len(texts)} distinct generated texts for {name}")

    def question(self, name: str, friend: str, rng) -> str:
        return f"Where did {rng.choice([name, friend])} {rng.choice(self.ACTIONS).split(' a ')[0]}?"


def load_texts(path: Path):
    return LocomoTexts(path) if path.is_file() else GeneratedTexts()


def users_texts(
    source, users: int, per_user: int, seed: int, taken: set | None = None
) -> list[UserTexts]:
    """``per_user`` distinct texts for each of ``users`` users (``user-0`` ...). Each user
    has a full name of its own (so its facts are its own across the corpus) and a friend
    known by a first name. ``taken``: the normalised texts already made (updated)."""
    if users > len(FIRST_NAMES) * len(SURNAMES):
        raise BenchError(f"at most {len(FIRST_NAMES) * len(SURNAMES)} users have distinct names")
    rng = random.Random(seed)
    taken = set() if taken is None else taken
    made = []
    for index in range(users):
        first = FIRST_NAMES[index % len(FIRST_NAMES)]
        name = f"{first} {SURNAMES[index // len(FIRST_NAMES)]}"
        friend = FIRST_NAMES[(index * 7 + 3) % len(FIRST_NAMES)]
        if friend == first:
            friend = FIRST_NAMES[(index + 1) % len(FIRST_NAMES)]
        memories = source.user_memories(name, friend, per_user, rng, taken)
        made.append(UserTexts(f"user-{index}", name, friend, memories))
    return made


def probe_texts(source, count: int, seed: int, taken: set) -> list[str]:
    """``count`` texts about a person none of the users is (``users_texts`` made ``taken``)."""
    return source.user_memories("Ottilie Winterbourne", "Bram", count, random.Random(seed), taken)
