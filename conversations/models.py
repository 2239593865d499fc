"""Conversations, their groups and forks, who may see them, and their messages.

Access control and ownership live on the *group*: every fork of a conversation belongs to
the group of the conversation it was forked from, so sharing a conversation shares all of
its branches. A principal is a user id (the JWT ``sub``, any string) or an agent
(``agent:<uuid>``).
"""

import uuid

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone
from pgvector.django import VectorField

from memsvc.api.principals import PRINCIPAL_MAX_LENGTH
from memsvc.db import embedding_has_model, embedding_index, json_is_object, words_column
from memsvc.validators import no_control_characters, no_nul_characters

TITLE_MAX_LENGTH = 500


class AccessLevel(models.TextChoices):
    OWNER = "owner"
    MANAGER = "manager"
    WRITER = "writer"
    READER = "reader"

    @property
    def rank(self) -> int:
        return _ACCESS_RANK[self]

    def allows(self, needed: "AccessLevel") -> bool:
        """True when this level includes everything ``needed`` may do."""
        return self.rank >= AccessLevel(needed).rank


_ACCESS_RANK = {
    AccessLevel.READER: 1,
    AccessLevel.WRITER: 2,
    AccessLevel.MANAGER: 3,
    AccessLevel.OWNER: 4,
}


class ConversationGroup(models.Model):
    """A conversation and all of its forks. Memberships and ownership belong here.

    Invariant (a deferred constraint trigger, see migration 0002): when a transaction
    commits, every group has exactly one membership with access level ``owner``.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        db_table = "conversation_group"

    def __str__(self) -> str:
        return str(self.id)


class Conversation(models.Model):
    """One branch of a conversation group.

    A fork stores only where it left its parent: ``forked_at_conversation`` and
    ``forked_at_message`` (the last HISTORY message the fork shares with the parent, null
    when the fork starts before the parent's first message). No message is ever copied.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by ``conversation_group_created``, whose first column it is.
    group = models.ForeignKey(
        ConversationGroup, on_delete=models.CASCADE, related_name="conversations", db_index=False
    )
    title = models.CharField(
        max_length=TITLE_MAX_LENGTH,
        blank=True,
        default="",
        validators=[no_nul_characters, no_control_characters],
    )
    metadata = models.JSONField(default=dict, blank=True)
    forked_at_conversation = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,  # deleting a conversation deletes the forks below it
        related_name="forks",
    )
    forked_at_message = models.ForeignKey(
        "Message",
        null=True,
        blank=True,
        on_delete=models.RESTRICT,  # unless the fork goes too (cascade)
        related_name="+",
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Its latest change of any kind: an agent-only turn too. Agents' lists go by it.
    updated_at = models.DateTimeField(default=timezone.now)
    # Its latest change that its users see: its creation, a new title or metadata, a message
    # on the HISTORY channel for users. Users' lists go by it and show it as ``updatedAt``:
    # ``updated_at`` told them when an agent wrote turns they cannot read.
    # (``db_default`` too: a process of the release before this column, still running while
    # the migrations of the next one are applied, inserts rows without it: review.)
    seen_at = models.DateTimeField(default=timezone.now, db_default=Now())
    vectorized_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "conversation"
        indexes = [
            models.Index(fields=["group", "created_at"], name="conversation_group_created"),
            models.Index(fields=["-updated_at", "id"], name="conversation_updated"),
            models.Index(fields=["-seen_at", "id"], name="conversation_seen"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(forked_at_message__isnull=True)
                | Q(forked_at_conversation__isnull=False),
                name="conversation_fork_point_needs_parent",
            ),
            models.CheckConstraint(
                condition=~Q(forked_at_conversation=models.F("id")),
                name="conversation_not_its_own_parent",
            ),
            json_is_object("metadata", name="conversation_metadata_is_object"),
        ]

    def __str__(self) -> str:
        return self.title or str(self.id)

    @property
    def fork_point_shown(self):
        """The id of the fork point as the APIs show it: the last message of the parent
        that the fork shares and users see (set by ``selectors.show_fork_points``); the
        stored one until that has run."""
        return self.__dict__.get("_fork_point_shown", self.forked_at_message_id)

    @fork_point_shown.setter
    def fork_point_shown(self, message_id) -> None:
        self.__dict__["_fork_point_shown"] = message_id


class Membership(models.Model):
    """A principal's access to a conversation group."""

    # Indexed by ``membership_unique``, whose first column it is.
    group = models.ForeignKey(
        ConversationGroup, on_delete=models.CASCADE, related_name="memberships", db_index=False
    )
    principal_id = models.CharField(max_length=PRINCIPAL_MAX_LENGTH, validators=[no_nul_characters])
    access_level = models.CharField(max_length=16, choices=AccessLevel.choices)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        db_table = "membership"
        indexes = [
            models.Index(fields=["principal_id", "group"], name="membership_principal"),
            # A principal's memberships made since a moment: the conversations given to them
            # while they walk their list (``selectors.activity_page``).
            models.Index(fields=["principal_id", "created_at"], name="membership_principal_joined"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["group", "principal_id"], name="membership_unique"),
            models.UniqueConstraint(
                fields=["group"],
                condition=Q(access_level=AccessLevel.OWNER),
                name="membership_one_owner_per_group",
            ),
            models.CheckConstraint(
                condition=Q(access_level__in=AccessLevel.values),
                name="membership_access_level_valid",
            ),
            models.CheckConstraint(
                condition=~Q(principal_id=""), name="membership_principal_not_empty"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.principal_id} ({self.access_level})"


class TransferStatus(models.TextChoices):
    PENDING = "pending"
    ACCEPTED = "accepted"
    DECLINED = "declined"
    CANCELLED = "cancelled"


class OwnershipTransfer(models.Model):
    """An offer to hand a group over to another principal; at most one pending per group."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    group = models.ForeignKey(
        ConversationGroup, on_delete=models.CASCADE, related_name="ownership_transfers"
    )
    # The conversation the offer was made from: what the recipient is shown.
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="ownership_transfers"
    )
    from_principal = models.CharField(max_length=PRINCIPAL_MAX_LENGTH)
    to_principal = models.CharField(max_length=PRINCIPAL_MAX_LENGTH, validators=[no_nul_characters])
    status = models.CharField(
        max_length=16, choices=TransferStatus.choices, default=TransferStatus.PENDING
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ownership_transfer"
        indexes = [
            models.Index(fields=["to_principal", "status"], name="transfer_to"),
            models.Index(fields=["from_principal", "status"], name="transfer_from"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["group"],
                condition=Q(status=TransferStatus.PENDING),
                name="transfer_one_pending_per_group",
            ),
            models.CheckConstraint(
                condition=Q(status__in=TransferStatus.values), name="transfer_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(from_principal=models.F("to_principal")),
                name="transfer_to_someone_else",
            ),
            models.CheckConstraint(
                condition=Q(status=TransferStatus.PENDING, resolved_at__isnull=True)
                | (~Q(status=TransferStatus.PENDING) & Q(resolved_at__isnull=False)),
                name="transfer_resolved_at_matches_status",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.from_principal} -> {self.to_principal} ({self.status})"


class Channel(models.TextChoices):
    HISTORY = "history"
    MEMORY = "memory"
    SUMMARY = "summary"


class Role(models.TextChoices):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"
    TOOL = "tool"
    AGENT = "agent"


class Visibility(models.TextChoices):
    USER = "user"
    AGENT = "agent"
    SYSTEM = "system"


class MessageQuerySet(models.QuerySet):
    def without_search_data(self):
        """Skip the vector and the full-text columns (``Message.SEARCH_DATA``)."""
        return self.defer(*Message.SEARCH_DATA)


class Message(models.Model):
    """One message of one conversation.

    ``seq`` is a global, strictly increasing number drawn from a database sequence: the
    order of messages (within a conversation and across a fork's ancestry) and the key of
    every cursor. The full-text vector is generated by PostgreSQL from the speaker's name and
    the content, the same text that is embedded.
    """

    # What search reads and no API shows: a vector is 384 floats to send and parse per row.
    SEARCH_DATA = ("embedding", "search_vector")

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    seq = models.BigIntegerField(
        unique=True,
        editable=False,
        db_default=models.Func(
            models.Value("message_seq"), function="nextval", output_field=models.BigIntegerField()
        ),
    )
    # Indexed by ``message_conversation_seq``, whose first column it is.
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages", db_index=False
    )
    channel = models.CharField(max_length=16, choices=Channel.choices, default=Channel.HISTORY)
    role = models.CharField(max_length=16, choices=Role.choices)
    visibility = models.CharField(
        max_length=16, choices=Visibility.choices, default=Visibility.USER
    )
    author_principal = models.CharField(max_length=PRINCIPAL_MAX_LENGTH)
    author_name = models.CharField(
        max_length=PRINCIPAL_MAX_LENGTH, blank=True, default="", validators=[no_nul_characters]
    )
    content = models.TextField(validators=[no_nul_characters])
    # The user whose turn an agent recorded (a user turn signed with the id of a member of
    # the conversation when it was written: the user it acted for, the owner, a member it
    # named); "" for any other message. Their export and erase find it by this, whether or
    # not they are a member still (``selectors.messages_elsewhere``).
    written_for = models.CharField(  # (``db_default``: as ``Conversation.seen_at``)
        max_length=PRINCIPAL_MAX_LENGTH, blank=True, default="", db_default=""
    )
    metadata = models.JSONField(default=dict, blank=True)
    # Indexed by ``message_parent`` (replies only: most messages have no parent).
    parent_message = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="replies",
        db_index=False,
    )
    created_at = models.DateTimeField(default=timezone.now)

    embedding = VectorField(dimensions=settings.MEMORY_EMBEDDING_DIMENSION, null=True, blank=True)
    embedding_model = models.CharField(max_length=200, blank=True, default="")
    embedded_at = models.DateTimeField(null=True, blank=True)

    search_vector = words_column("author_name", models.Value(": "), "content")

    objects = MessageQuerySet.as_manager()

    class Meta:
        db_table = "message"
        indexes = [
            models.Index(fields=["conversation", "seq"], name="message_conversation_seq"),
            # No pending list (``fastupdate``): every keyword search read all of it, up to
            # 4 MB of the newest entries, unsorted (docs/benchmarks.md, "GIN's pending list").
            GinIndex(fields=["search_vector"], name="message_search_vector", fastupdate=False),
            embedding_index("message_embedding_hnsw"),
            models.Index(
                fields=["parent_message"],
                condition=Q(parent_message__isnull=False),
                name="message_parent",
            ),
            # Keeps the embedding backlog (the sweep, /v1/health) cheap at any table size.
            models.Index(
                fields=["seq"], condition=Q(embedded_at__isnull=True), name="message_unembedded"
            ),
            # A user's own messages, for their export and erase (``messages_elsewhere``).
            models.Index(fields=["author_principal"], name="message_author"),
            models.Index(
                fields=["written_for"], condition=~Q(written_for=""), name="message_written_for"
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(channel__in=Channel.values), name="message_channel_valid"
            ),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="message_role_valid"),
            models.CheckConstraint(
                condition=Q(visibility__in=Visibility.values), name="message_visibility_valid"
            ),
            models.CheckConstraint(condition=~Q(content=""), name="message_content_not_empty"),
            json_is_object("metadata", name="message_metadata_is_object"),
            embedding_has_model("message_embedding_has_model"),
        ]

    def __str__(self) -> str:
        return f"#{self.seq} {self.role}: {self.content[:60]}"

    @classmethod
    def shown_fields(cls) -> list[models.Field]:
        """The columns a message is shown with (all but ``SEARCH_DATA``)."""
        return [f for f in cls._meta.concrete_fields if f.name not in cls.SEARCH_DATA]

    @property
    def seen_by_users(self) -> bool:
        """Whether users read it: ``selectors.SEEN_BY_USERS`` of one message."""
        return self.channel == Channel.HISTORY and self.visibility == Visibility.USER

    @property
    def embedding_dimension(self) -> int | None:
        return None if self.embedding is None else len(self.embedding)
