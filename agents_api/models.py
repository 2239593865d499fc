"""Agents, their always-in-context memory blocks and their long-term memories."""

import hashlib
import re
import unicodedata
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.functions import RandomUUID
from django.contrib.postgres.indexes import GinIndex
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Cast, Left, Length, Now
from django.db.models.lookups import LessThanOrEqual
from django.utils import timezone

from agents_api.reading import Place
from conversations.selectors import group_owners
from memsvc.api.principals import AGENT_PRINCIPAL_PREFIX, PRINCIPAL_MAX_LENGTH, Principal
from memsvc.db import embedding_has_model, embedding_index, json_is_object, words_column
from memsvc.text import DEFAULT_IGNORABLE
from memsvc.validators import (
    LONE_SURROGATE_PROBLEM,
    composed,
    has_lone_surrogates,
    no_blank_ends,
    no_control_characters,
    no_hidden_characters,
    no_nul_characters,
    one_line,
    shown_as_it_is,
)
from search.embeddings import EmbeddingField

DEFAULT_BLOCK_LIMIT = 5_000
BLOCK_DESCRIPTION_MAX_CHARS = 2_000  # what the API and the admin take
AGENT_NAME_MAX_CHARS = 200
# The Letta settings' texts an agent keeps in its row (``services.letta.LETTA_SETTINGS``),
# read with it by every request of its keys: a system prompt of 20 MB made each 150 ms.
AGENT_DESCRIPTION_MAX_CHARS = 2_000
AGENT_SYSTEM_MAX_CHARS = 50_000
# A name, whoever gives it (an API, the admin, an import): one line, shown as what it is. An
# agent's titles its own conversation ("<name> (local)"); a block's label heads its section
# of every prompt and names it in the pages. (Labels from before the rule stay reachable:
# only a label given is checked, not one looked up.)
NAME_RULES = (no_control_characters, shown_as_it_is)
# And a name given now (an API's, the CLI's; not one an import restores as it was stored).
GIVEN_NAME_RULES = (*NAME_RULES, one_line, no_blank_ends, no_hidden_characters, composed)


class Agent(models.Model):
    """An agent: a principal (``agent:<id>``) that can be a member of conversation groups."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Who created the agent: a user id, or "local" for agents of the local compatibility API.
    owner_principal = models.CharField(max_length=PRINCIPAL_MAX_LENGTH)
    name = models.CharField(
        max_length=AGENT_NAME_MAX_CHARS, validators=[no_nul_characters, *NAME_RULES]
    )
    description = models.TextField(blank=True, default="", validators=[no_nul_characters])
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Where the local compatibility API keeps this agent's messages (made on first use).
    local_conversation = models.OneToOneField(
        "conversations.Conversation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="local_agent",
    )
    # Reachable without a key from loopback in local mode (MEMSVC_LOCAL_TRUST_LOOPBACK): only
    # agents the local API made for a keyless caller, and only until the agent gets a key.
    loopback_trusted = models.BooleanField(default=False)

    class Meta:
        db_table = "agent"
        constraints = [
            models.UniqueConstraint(
                fields=["owner_principal", "name"], name="agent_name_unique_per_owner"
            ),
            models.CheckConstraint(condition=~Q(name=""), name="agent_name_not_empty"),
            json_is_object("metadata", name="agent_metadata_is_object"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def principal_id(self) -> str:
        return f"{AGENT_PRINCIPAL_PREFIX}{self.id}"

    def as_principal(self, **kwargs) -> Principal:
        """This agent as the actor of a request (``Principal.for_agent``'s options)."""
        return Principal.for_agent(self.id, name=self.name, **kwargs)


class MemoryBlock(models.Model):
    """A labelled piece of text that an agent keeps in every prompt (Letta's core memory).

    Blocks belong to an agent and optionally to one user of that agent (``user_id``).
    ``limit`` is a hard cap in characters, held by a check constraint so that no write path
    can exceed it. Every change of ``value`` is kept as a :class:`MemoryBlockRevision`.
    """

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="memory_blocks")
    # The id the local API shows (the seed's "uuid"): the key counted every block of the
    # server up, and a seed client that reads a uuid there broke (review).
    # (``db_default`` too: a process of the release before this column, still running while
    # the migrations are applied, inserts without it; its block creates failed, as a 409.)
    public_id = models.UUIDField(
        default=uuid.uuid4, db_default=RandomUUID(), unique=True, editable=False
    )
    # "" for a block of the agent itself, shared by all of its users.
    user_id = models.CharField(
        max_length=PRINCIPAL_MAX_LENGTH, blank=True, default="", validators=[no_nul_characters]
    )
    label = models.CharField(max_length=100, validators=[no_nul_characters, *NAME_RULES])
    value = models.TextField(blank=True, default="", validators=[no_nul_characters])
    description = models.TextField(blank=True, default="", validators=[no_nul_characters])
    limit = models.PositiveIntegerField(default=DEFAULT_BLOCK_LIMIT)
    read_only = models.BooleanField(default=False)
    # Made by Letta's ``POST /v1/blocks`` to be attached to an agent next: it waits on the
    # key's own agent, which does not keep it (``KEPT_BLOCKS``, ``services.letta_block_attach``).
    awaiting_attach = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "memory_block"
        constraints = [
            # A block waiting for its attach holds no label: one whose attach never came
            # (the client stopped between the two calls) refuses no block made after it.
            models.UniqueConstraint(
                fields=["agent", "user_id", "label"],
                condition=Q(awaiting_attach=False),
                name="memory_block_unique_label",
            ),
            models.CheckConstraint(
                condition=LessThanOrEqual(Length("value"), F("limit")),
                name="memory_block_value_within_limit",
            ),
            models.CheckConstraint(condition=Q(limit__gt=0), name="memory_block_limit_positive"),
            models.CheckConstraint(condition=~Q(label=""), name="memory_block_label_not_empty"),
        ]

    def __str__(self) -> str:
        return self.label


# The blocks an agent keeps: every read of an agent's blocks (its prompt, its lists, its
# export) leaves out a block that only waits on it for an attach (``awaiting_attach``).
KEPT_BLOCKS = Q(awaiting_attach=False)


class MemoryBlockRevision(models.Model):
    """The value of a memory block after one change, and who made it."""

    # Indexed by ``block_revision_recent``, whose first column it is.
    block = models.ForeignKey(
        MemoryBlock, on_delete=models.CASCADE, related_name="revisions", db_index=False
    )
    value = models.TextField(blank=True)
    actor_principal = models.CharField(max_length=PRINCIPAL_MAX_LENGTH)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    # The order revisions are listed and kept in (MEMSVC_BLOCK_REVISIONS_KEPT newest).
    NEWEST_FIRST = ("-created_at", "-id")

    class Meta:
        db_table = "memory_block_revision"
        indexes = [models.Index(fields=["block", "-created_at"], name="block_revision_recent")]

    def __str__(self) -> str:
        return f"{self.block_id} @ {self.created_at:%Y-%m-%d %H:%M:%S}"


class Scope(models.TextChoices):
    READ = "read"
    WRITE = "write"
    IMPERSONATE = "impersonate"


def api_key_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a key's note (``ApiKey.name``'s rules), or None."""
    field = ApiKey._meta.get_field("name")
    if len(name) > field.max_length:
        return f"at most {field.max_length} characters"
    if has_lone_surrogates(name):  # (a command line's bytes that are no UTF-8)
        return LONE_SURROGATE_PROBLEM
    try:
        field.run_validators(name)
    except ValidationError as exc:
        return exc.messages[0]
    return None


class ApiKey(models.Model):
    """An agent's credential: ``msk_<public_id>_<secret>``.

    Only the public id, a display prefix and an HMAC of the secret (keyed by the Django
    secret key) are stored; the secret is shown once, when the key is created.
    """

    public_id = models.CharField(max_length=32, unique=True, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="api_keys")
    # A note that tells keys apart, shown in lists: one line of text shown as it is (a bidi
    # control or a control character showed another note: review).
    name = models.CharField(
        max_length=200,
        blank=True,
        default="",
        validators=[no_nul_characters, *GIVEN_NAME_RULES],
    )
    prefix = models.CharField(max_length=64, editable=False)
    secret_hmac = models.CharField(max_length=64, editable=False)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "api_key"
        verbose_name = "API key"
        constraints = [
            models.CheckConstraint(
                condition=Q(scopes__contained_by=Scope.values), name="api_key_scopes_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.agent.name})"

    @property
    def rate_limit_key(self) -> str:
        """A key's requests count together (memsvc.api.ratelimit), whoever it acts for."""
        return f"key:{self.public_id}"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


# --- long-term memories ----------------------------------------------------------------------

MEMORY_TTL = timedelta(days=15)  # kagent: a memory lives 15 days unless it keeps being used
MEMORY_MAX_TAGS = 50
MEMORY_TAG_MAX_LENGTH = 100
MEMORY_DEFAULT_IMPORTANCE = 0.5  # a memory saved without one
MEMORY_MAX_MESSAGES = 100  # the turns one memory may cite
MEMORY_LISTING_TTL = timedelta(days=1)  # how long a walk by popularity may take
MEMORY_LISTING_MAX = 10_000  # the most popular memories a walk by popularity goes through
MEMORY_LISTINGS_PER_SCOPE = 8  # walks of one list (agent, user, tag) kept at once
CITES = ~Q(message_ids=[])  # a memory that cites turns
# A memory not yet expired. One whose ``expires_at`` has passed is gone at once, for every
# list, read, search and save alike (``selectors.memory_scope`` says it in SQL, on the same
# clock: the statement's time): the daily prune (``memories_prune``) only reclaims its row,
# or gives a popular one a new life, after which it is found again.
LIVE = Q(expires_at__gt=Now())


class MemorySource(models.TextChoices):
    API = "api"
    EXTRACTED = "extracted"  # distilled from a conversation by the LLM
    MCP = "mcp"
    LEARNING = "learning"


def normalised_content(content: str) -> str:
    """The text two memories must share to be one: case and runs of whitespace ignored.
    (Other forms of one text, a fullwidth digit or a zero-width space inside a word, are
    one fact by their vectors and ``claims``: a hash of them read otherwise would need every
    stored hash, and every export's, read again.)"""
    return re.sub(r"\s+", " ", content).strip().casefold()


def same_words(content: str, other: str) -> bool:
    """Whether two texts say the same words in the same order, whatever their case, spacing
    and the sentence punctuation at the ends of their words ("lives in Oslo!!" and "lives
    in Oslo"): a repeat, if they state the same ``claims`` ("3.5 km" and "35 km" do not).
    Their vectors may be far apart (cosine 0.90 for those two: a repeat was kept twice;
    review). Only that punctuation: any other sign is part of its word ("C++" is no "C",
    "A+" no "A-", "$500" no "€500": code review), and a text of no word repeats nothing."""
    words = _punctuated_words(content)
    return bool(words) and words == _punctuated_words(other)


# The sentence punctuation a word may carry at either end and still be the same word.
_SENTENCE_PUNCTUATION = ".,;:!?\u2026\"'\u201c\u201d\u2018\u2019\u00ab\u00bb()[]{}\u00bf\u00a1"


def _punctuated_words(content: str) -> list[str]:
    text = unicodedata.normalize("NFC", normalised_content(content))
    stripped = (_without_sentence_punctuation(word) for word in text.split())
    return [word for word in stripped if word]


def _without_sentence_punctuation(word: str) -> str:
    """``word`` without the sentence punctuation at its ends, but where it touches a digit
    (".5 mg" is no "5 mg", 6' no 6": code review)."""
    start, end = 0, len(word)
    while (
        start < end
        and word[start] in _SENTENCE_PUNCTUATION
        and not (start + 1 < end and word[start + 1].isdigit())
    ):
        start += 1
    while (
        end > start
        and word[end - 1] in _SENTENCE_PUNCTUATION
        and not word[end - 2 : end - 1].isdigit()
    ):
        end -= 1
    return word[start:end]


# A text's numbers and words, in the order it says them.
_NUMBERS_AND_WORDS = re.compile(r"(\d+(?:[.,:/-]\d+)*)|([^\W\d_]+(?:'[^\W\d_]+)?)")
# Numbers written as words: "has three children" corrects "has two children" as "3" does
# "2" (a review's "three" was merged into the "two" it corrected, and lost). A word that
# names one number is read as its digits ("has 2 children" repeats "has two children":
# review); the rest stay words. ("one" is also a pronoun: a repeat that differs in it is
# kept twice, a correction is never lost.)
_NUMBER_DIGITS = (
    {
        word: str(value)
        for value, word in enumerate(
            [
                "zero",
                "one",
                "two",
                "three",
                "four",
                "five",
                "six",
                "seven",
                "eight",
                "nine",
                "ten",
                "eleven",
                "twelve",
                "thirteen",
                "fourteen",
                "fifteen",
                "sixteen",
                "seventeen",
                "eighteen",
                "nineteen",
            ]
        )
    }
    | {
        word: str(10 * tens)
        for tens, word in enumerate(
            ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"], start=2
        )
    }
    | {"dozen": "12"}
)
_NUMBER_WORDS = frozenset(
    (  # noqa: SIM905 (a list of words, a line of them, reads worse)
        "hundred thousand million billion half once twice thrice first second third fourth"
        " fifth sixth seventh eighth ninth tenth"
    ).split()
)
_NEGATIONS = frozenset(
    [
        "not",
        "no",
        "never",
        "none",
        "nothing",
        "nobody",
        "nowhere",
        "neither",
        "nor",
        "cannot",
        "without",
        "non",  # ("a non-smoker" corrected "a smoker", and was merged into it: review)
        # A few other languages' ("ist nicht allergisch" was merged into "ist allergisch":
        # review). A word counted here that negates nothing keeps two memories apart: a
        # repeat kept twice, never a correction lost.
        "nicht",
        "kein",
        "keine",
        "keinen",
        "nie",
        "niemals",
        "pas",
        "jamais",
        "nunca",
    ]
)
# Words a fact turns on as it does on its numbers: the half of the day, the day, the month,
# the side, the order ("at 5am" corrected "at 5pm", "on Tuesday" "on Monday", "right-handed"
# "left-handed", "after work" "before work", each merged into the fact it corrected: review),
# and the past ("was vegetarian", "used to be vegetarian" corrected "is vegetarian", and were
# merged into it: review; a repeat in another tense is kept twice, a correction never lost).
_CLAIM_WORDS = frozenset(
    (  # noqa: SIM905 (a list of words, a line of them, reads worse)
        "am pm monday tuesday wednesday thursday friday saturday sunday january february"
        " march april may june july august september october november december left right"
        " before after was were had did used formerly previously former anymore"
    ).split()
)
# An email address: a fact that names one turns on it ("alice@example.org" corrected
# "alice@example.com", and was merged into it: review).
# (Each begins where its characters begin: tried at every letter of a long run, a word of
# 20,000 letters took 7 s, and a save of 100,000 its web worker's life; review.)
_EMAILS = re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
# Other names of things, words joined by a dot, a slash, a colon, an underscore or a dash (a
# domain, a path, a handle, "part-time"): told apart only where both texts hold some (a text
# that writes "e-mail", "U.S." or "5:30pm" where the other writes "email", "US" or "5:30 pm"
# repeats it: code review; "github.com/bob" corrects "github.com/alice").
_NAMES = re.compile(r"(?<!\w)\w+(?:[./:_-]\w+)+")
# A word negated by its first letters ("disallowed", "unable", "inactive"), counted as
# "not" is: a text near another but for one is a correction ("is allowed": review). A word
# that only looks so ("interested") keeps a repeat apart from a text without it, rarely as
# near: a repeat kept twice, never a correction lost.
_NEGATING = re.compile(r"(?:dis|un|non|in|im|ir|il)\w{3,}")
# Apostrophes typed otherwise (a right quotation mark, by a phone's smart punctuation or a
# model; a modifier letter): "isn\u2019t" was read as the words "isn" and "t", no negation
# (review).
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u02bc": "'", "\u2018": "'"})


@dataclass(frozen=True, eq=False)
class Claims:
    """What a text states that its vector barely tells (``claims``): its numbers and email
    addresses, in order, how many negations it holds, and the other names of things it
    holds. Equal when they state the same: the same numbers, addresses and negations, and
    the same names where both hold some."""

    numbers: tuple
    negations: int
    names: tuple

    def __eq__(self, other) -> bool:
        if not isinstance(other, Claims):
            return NotImplemented
        named_both = bool(self.names) and bool(other.names)
        return (
            self.numbers == other.numbers
            and self.negations == other.negations
            and (not named_both or self.names == other.names)
        )

    __hash__ = None


def claims(content: str) -> Claims:
    """What a text states that its vector barely tells (``Claims``). Two texts a cosine
    similarity calls the same fact (``NEAR_DUPLICATE_SIMILARITY``) are one only if these
    agree: "is allergic to peanuts" and "is not allergic to peanuts", two phone numbers,
    two email addresses, or "is allowed" and "is disallowed", are a correction to keep, not
    a repeat to merge into the old fact."""
    numbers, negations = [], 0
    if not content.isascii():  # (a fullwidth "\uff13" is a "3"; a zero-width space is nothing)
        content = unicodedata.normalize("NFKC", DEFAULT_IGNORABLE.sub("", content))
    content = content.casefold().translate(_APOSTROPHES)
    numbers += _EMAILS.findall(content)
    # (A number's own dots and colons make no name: "5:30", "3.12" are numbers.)
    names = tuple(
        name for name in _NAMES.findall(_EMAILS.sub(" ", content)) if not name[0].isdigit()
    )
    for number, word in _NUMBERS_AND_WORDS.findall(content):
        if number or word in _NUMBER_WORDS or word in _CLAIM_WORDS:
            numbers.append(number or word)
        elif word in _NUMBER_DIGITS:
            numbers.append(_NUMBER_DIGITS[word])
        else:
            negations += (
                word in _NEGATIONS or word.endswith("n't") or _NEGATING.fullmatch(word) is not None
            )
            if word.endswith("n't") and word[:-3] in _CLAIM_WORDS:  # ("wasn't": past, negated)
                numbers.append(word[:-3])
    return Claims(tuple(numbers), negations, names)


def content_hash(content: str) -> str:
    return hashlib.sha256(normalised_content(content).encode()).hexdigest()


def default_expiry():
    return timezone.now() + MEMORY_TTL


class Memory(models.Model):
    """A fact an agent keeps about a user (``user_id``) or about itself (``user_id`` "").

    One short text, searched like a message: a vector (written when it is saved, or later
    by the sweep when the embedding backend was down) and a full-text vector generated by
    PostgreSQL, so keywords find it from the start. ``content_hash`` makes the same fact
    saved twice one row. ``importance``, recency and ``access_count`` rank it beside its
    relevance; ``expires_at`` and ``access_count`` decide its life (``memories_prune``).

    Every search counts a use of what it returns (``memories_touch``), so the use columns
    are in no index and the table leaves room on each page (fillfactor 70, migration 0008):
    a count is then a HOT update, which writes no index entry (the HNSW graph's would cost
    milliseconds). Listing by popularity sorts the scope's rows instead of reading an index.
    """

    SEARCH_DATA = ("embedding", "search_vector")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by ``memory_recent`` and the others whose first column it is: one index fewer
    # for every insert.
    agent = models.ForeignKey(
        Agent, on_delete=models.CASCADE, related_name="memories", db_index=False
    )
    user_id = models.CharField(
        max_length=PRINCIPAL_MAX_LENGTH, blank=True, default="", validators=[no_nul_characters]
    )
    content = models.TextField(validators=[no_nul_characters])
    content_hash = models.CharField(max_length=64, editable=False)
    summary = models.TextField(blank=True, default="", validators=[no_nul_characters])
    tags = ArrayField(models.CharField(max_length=MEMORY_TAG_MAX_LENGTH), default=list, blank=True)
    importance = models.FloatField(default=MEMORY_DEFAULT_IMPORTANCE)
    metadata = models.JSONField(default=dict, blank=True)
    source = models.CharField(max_length=16, choices=MemorySource.choices, default=MemorySource.API)
    access_count = models.PositiveIntegerField(default=0)
    last_accessed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(default=default_expiry)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now)

    # The turns it rests on (an extracted memory: those it was distilled from): a search of
    # messages also ranks the turns the best memories cite (``search.engine.ranked``). Ids,
    # not keys: a turn deleted since is no longer found, and its id says nothing of it (a
    # user's erase takes the ids of theirs too: ``services.memory_citations_forget``). A
    # change of a memory may send back the ids it cites, deleted ones too (``memory_update``).
    message_ids = ArrayField(models.UUIDField(), default=list, blank=True)
    embedding = EmbeddingField(
        dimensions=settings.MEMORY_EMBEDDING_DIMENSION, null=True, blank=True
    )
    embedding_model = models.CharField(max_length=200, blank=True, default="")
    embedded_at = models.DateTimeField(null=True, blank=True)
    search_vector = words_column("content", models.Value(" "), "summary")

    class Meta:
        db_table = "memory"
        verbose_name_plural = "memories"
        indexes = [
            models.Index(fields=["agent", "user_id", "-created_at"], name="memory_recent"),
            # What a search's scope counts (``search.statements.nearest_order``): an
            # index-only scan, not a heap fetch per memory of a large store.
            models.Index(fields=["agent", "user_id", "expires_at"], name="memory_scope"),
            models.Index(fields=["user_id", "-created_at"], name="memory_of_user"),
            # The memories a search of messages reads (``selectors.memories_citing``): an
            # agent's, or a user's. An index probe finds that a store of many memories cites
            # no turn at all.
            models.Index(fields=["agent", "user_id"], condition=CITES, name="memory_citing"),
            models.Index(fields=["user_id"], condition=CITES, name="memory_of_user_citing"),
            models.Index(fields=["expires_at"], name="memory_expiry"),
            # Whether an agent keeps a live memory at all (``selectors.keeps_live_memory_sql``):
            # the first entry past (agent, now). With an agent's user (``memory_scope``).
            models.Index(fields=["agent", "expires_at"], name="memory_agent_expiry"),
            # A memory's words under its agent and user (``btree_gin``): a keyword search
            # of one scope intersects its rarest word's few entries with the scope's inside
            # the index. With the words alone, PostgreSQL intersected the word's bitmap with
            # a bitmap of the whole scope, read from ``memory_recent``: 100,000 entries of an
            # agent's store, 6.5 of a search's 7 ms (docs/benchmarks.md).
            # No pending list, as messages' (``conversations.models.Message``): its size
            # swung the planner from this index to walking the scope's rows.
            GinIndex(
                fields=["agent", "user_id", "search_vector"],
                name="memory_scope_words",
                fastupdate=False,
            ),
            GinIndex(fields=["tags"], name="memory_tags"),
            embedding_index("memory_embedding_hnsw"),
            models.Index(
                fields=["created_at"],
                condition=Q(embedded_at__isnull=True),
                name="memory_unembedded",
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "user_id", "content_hash"], name="memory_unique_content"
            ),
            models.CheckConstraint(condition=~Q(content=""), name="memory_content_not_empty"),
            models.CheckConstraint(
                condition=Q(importance__gte=0) & Q(importance__lte=1),
                name="memory_importance_0_1",
            ),
            models.CheckConstraint(
                condition=Q(source__in=MemorySource.values), name="memory_source_valid"
            ),
            json_is_object("metadata", name="memory_metadata_is_object"),
            embedding_has_model("memory_embedding_has_model"),
        ]

    def __str__(self) -> str:
        return self.content[:80]


class MemoryExtraction(models.Model):
    """How far an agent has distilled memories from one conversation (``extraction.py``), a
    reader's place (``reading.Place``): ``through_seq`` is the ``seq`` of the last message
    the latest extraction read. The user turns of the conversation's view after it count
    toward the next extraction. ``unread``: the spans of messages (``[after_seq,
    through_seq]``) an extraction gave back (the LLM failed) after a later one had read past
    them, read first by the next. ``taken``: the spans workers are reading, each with the
    time its lease lapses."""

    # Indexed by ``memory_extraction_unique``, whose first column it is.
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+", db_index=False)
    conversation = models.ForeignKey(
        "conversations.Conversation", on_delete=models.CASCADE, related_name="+"
    )
    through_seq = models.BigIntegerField(default=0)
    unread = models.JSONField(  # (``db_default``: as ``MemoryBlock.public_id``)
        default=list, db_default=models.Value([], output_field=models.JSONField()), blank=True
    )
    taken = models.JSONField(
        default=list, db_default=models.Value([], output_field=models.JSONField()), blank=True
    )
    extracted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "memory_extraction"
        indexes = [
            # The leases the minute's sweep looks at (``extraction.recover_lapsed_claims``): a
            # handful among a row per agent and conversation ever read.
            models.Index(fields=["id"], name="memory_extraction_leased", condition=~Q(taken=[])),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "conversation"], name="memory_extraction_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id} in {self.conversation_id} through #{self.through_seq}"

    @property
    def place(self) -> Place:
        return Place.of(self.through_seq, self.unread, self.taken)

    @place.setter
    def place(self, place: Place) -> None:
        self.through_seq, self.unread, self.taken = place.through, place.unread, place.taken

    @property
    def place_as_stored(self) -> Place:
        """The place as its columns hold it, whatever its shape (``place`` reads it)."""
        return Place(self.through_seq, self.unread, self.taken)

    def keep(self, place: Place, *also: str) -> None:
        """Save ``place`` (and the fields ``also``), unless it is the one stored."""
        if place != self.place_as_stored:
            self.place = place
            self.save(update_fields=["through_seq", "unread", "taken", *also])


class MemoryListing(models.Model):
    """The order of a walk through memories by popularity (``selectors.memory_page``): the
    ids of the memories listed, as they ranked when the walk began. Its pages follow it
    (the memories as they are now, those deleted or expired since left out), so the counts
    that every search moves neither show a memory twice nor skip one. Kept
    ``MEMORY_LISTING_TTL`` (``memories_prune``), the newest ``MEMORY_LISTINGS_PER_SCOPE`` of
    a list; no key to the memories: an id deleted since is simply not found."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Which list it walks (a digest of its statement): each keeps its newest listings only.
    scope = models.CharField(max_length=64, default="", db_default="")  # (as Message.written_for)
    memory_ids = ArrayField(models.UUIDField())
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "memory_listing"
        indexes = [
            models.Index(fields=["created_at"], name="memory_listing_created"),
            models.Index(fields=["scope", "created_at"], name="memory_listing_scope"),
        ]

    def __str__(self) -> str:
        return f"{len(self.memory_ids)} memories listed at {self.created_at}"


class UserMemorySetting(models.Model):
    """What a user lets agents remember about them (OpenMemory's "private chat" switch).

    While ``memory_enabled`` is off, no agent saves a new memory about the user (409 in
    every API) and memory searches about them find nothing; what was kept stays, for the
    user to see and delete. No row means memory is on.
    """

    user_id = models.CharField(
        primary_key=True, max_length=PRINCIPAL_MAX_LENGTH, validators=[no_nul_characters]
    )
    memory_enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "user_memory_setting"
        constraints = [models.CheckConstraint(condition=~Q(user_id=""), name="memory_setting_user")]

    def __str__(self) -> str:
        return f"{self.user_id}: memory {'on' if self.memory_enabled else 'off'}"


class UserErasure(models.Model):
    """That a user's data was erased, and when: all memsvc keeps of them after an erase.
    An owner's export made before it holds their turns and membership in the owner's
    conversations, and an import of it brought them back (review); an import erases again
    what of theirs is older than this (``portability.importing``), and an agent's import
    skips what it holds about them that is older (``restore._agents_for``) until they
    import their own document (``restored_at``): what they brought back themselves, an agent
    moved later keeps (review). Kept then: an owner's older document still does not bring
    back their turns."""

    user_id = models.CharField(
        primary_key=True, max_length=PRINCIPAL_MAX_LENGTH, validators=[no_nul_characters]
    )
    erased_at = models.DateTimeField()
    restored_at = models.DateTimeField(null=True, blank=True)  # their own import's, since
    # The conversations erased with them (ids: nothing of them): an agent's older document
    # brings back none of its tool records of those (``restore.restore_tool_records``).
    conversation_ids = ArrayField(models.UUIDField(), default=list, db_default=[], blank=True)

    class Meta:
        db_table = "user_erasure"

    def __str__(self) -> str:
        return f"{self.user_id}: erased {self.erased_at:%Y-%m-%d %H:%M}"


# --- tool records (the memory bank) ---------------------------------------------------------

# How much of a tool's raw output (as JSON text) the full-text index covers: every
# identifier of an ordinary answer, and a bound on the index entry of a huge one.
TOOL_OUTPUT_INDEXED_CHARS = 100_000


class SummarySource(models.TextChoices):
    CALLER = "caller"  # given with the record
    FALLBACK = "fallback"  # written at once from the output (``observer.fallback_summary``)
    LLM = "llm"  # the observer's model


def kept_about_the_owner(collector, field, sub_objs, using):
    """``on_delete`` of a tool record's conversation: the record outlives it, unlinked
    (``SET_NULL``), and one made for no user (``user_id`` "") is kept about the person who
    owned the conversation: their export and erase still find it (``selectors
    .tool_records_about``). Unlinked, it was about nobody: a person who deleted a
    conversation, then erased themselves, left an agent's records of it behind (review).
    The records are not loaded (``lazy_sub_objs``): an update by owner of the ids of those
    made for no one, then one of them all."""
    made_for_none = list(sub_objs.filter(user_id="").values_list("pk", "conversation__group_id"))
    owners = group_owners({group for _, group in made_for_none})
    about: dict[str, list] = {}
    for record, group in made_for_none:
        owner = owners.get(group)
        if owner and not owner.startswith(AGENT_PRINCIPAL_PREFIX):
            about.setdefault(owner, []).append(record)
    user_id = ToolRecord._meta.get_field("user_id")
    for owner, records in about.items():  # (by id: run before or after the unlinking alike)
        collector.add_field_update(user_id, owner, ToolRecord.objects.filter(pk__in=records))
    collector.add_field_update(field, None, sub_objs)


kept_about_the_owner.lazy_sub_objs = True


class ToolRecord(models.Model):
    """One tool interaction of an agent (seed: memory-bank-strategy), both of the seed's
    stores in one row: the fact store is the raw input and output, kept whole; the insight
    store is the summary's vector. ``id`` is the seed's trace id.

    A record always has a summary (the caller's, else a deterministic one from the output,
    later the observer's LLM's), and its full-text vector covers the summary, the tool's
    name and the raw output's text, so an identifier that only the output holds (a hotel id)
    finds the record by keyword from the moment it is written.
    """

    SEARCH_DATA = ("embedding", "search_vector")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by ``tool_record_task``, whose first column it is.
    agent = models.ForeignKey(
        Agent, on_delete=models.CASCADE, related_name="tool_records", db_index=False
    )
    # The user the agent acted for when it made the record (``X-On-Behalf-Of``); "" for the
    # agent's own. An agent acting for a user reaches no other user's (``tool_records_of``),
    # and the user's erase deletes them.
    user_id = models.CharField(
        max_length=PRINCIPAL_MAX_LENGTH, blank=True, default="", validators=[no_nul_characters]
    )
    # The conversation the interaction belongs to, when the agent says so (one it sees).
    # The record is the agent's memory: it outlives the conversation (as an import keeps a
    # record whose conversation is gone), kept about its owner (``kept_about_the_owner``);
    # only the erase of the conversation's owner takes it along (``services.user_erase``).
    conversation = models.ForeignKey(
        "conversations.Conversation",
        null=True,
        blank=True,
        on_delete=kept_about_the_owner,
        related_name="+",
    )
    # The caller's task (any string; "" for none): what a search or a clean-up is limited to.
    task_id = models.CharField(
        max_length=255, blank=True, default="", validators=[no_nul_characters]
    )
    step = models.PositiveIntegerField(null=True, blank=True)
    tool_name = models.CharField(max_length=200, validators=[no_nul_characters])
    raw_input = models.JSONField(default=dict, blank=True)
    raw_output = models.JSONField(null=True, blank=True)  # any JSON value
    summary = models.TextField(validators=[no_nul_characters])
    summary_source = models.CharField(
        max_length=16, choices=SummarySource.choices, default=SummarySource.FALLBACK
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    embedding = EmbeddingField(
        dimensions=settings.MEMORY_EMBEDDING_DIMENSION, null=True, blank=True
    )
    embedding_model = models.CharField(max_length=200, blank=True, default="")
    embedded_at = models.DateTimeField(null=True, blank=True)
    search_vector = words_column(
        "tool_name",
        models.Value(" "),
        "summary",
        models.Value(" "),
        Left(Cast("raw_output", output_field=models.TextField()), TOOL_OUTPUT_INDEXED_CHARS),
    )

    class Meta:
        db_table = "tool_record"
        indexes = [
            # A task's records in order (the list), and what a search's scope counts.
            models.Index(fields=["agent", "task_id", "created_at", "id"], name="tool_record_task"),
            # A user's records (export, erase).
            models.Index(fields=["user_id"], condition=~Q(user_id=""), name="tool_record_of_user"),
            GinIndex(fields=["search_vector"], name="tool_record_search_vector"),
            embedding_index("tool_record_embedding_hnsw"),
            models.Index(
                fields=["created_at"],
                condition=Q(embedded_at__isnull=True),
                name="tool_record_unembedded",
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=~Q(tool_name=""), name="tool_record_tool_name_set"),
            models.CheckConstraint(condition=~Q(summary=""), name="tool_record_summary_set"),
            models.CheckConstraint(
                condition=Q(summary_source__in=SummarySource.values),
                name="tool_record_summary_source_valid",
            ),
            json_is_object("raw_input", name="tool_record_input_is_object"),
            embedding_has_model("tool_record_embedding_has_model"),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} #{self.step}" if self.step is not None else self.tool_name
