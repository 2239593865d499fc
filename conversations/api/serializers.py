"""The JSON of the user API (camelCase), in and out."""

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers

from conversations.models import AccessLevel, Channel, Role, TransferStatus, Visibility
from memsvc.api.fields import (
    GIVEN_USER_ID_RULE,
    ChoiceField,
    InputSerializer,
    ListField,
    MessageContentField,
    MetadataField,
    PrincipalIdField,
    TextField,
    TitleField,
    UserIdField,
    something_to_read,
)
from memsvc.api.pagination import AFTER_PARAMETER, LIMIT_PARAMETER
from memsvc.api.schema import paged
from search.selectors import HEADLINE_CHARS, MODES

# --- out -------------------------------------------------------------------------------------


class ParentMessageField(serializers.UUIDField):
    """A message's parent: as users see it where ``selectors.show_parents`` ran (null for a
    message they do not see), else whichever it is (agents see every message)."""

    def get_attribute(self, instance):
        return getattr(instance, "parent_shown", instance.parent_message_id)


class MessageOut(serializers.Serializer):
    id = serializers.UUIDField()
    conversationId = serializers.UUIDField(source="conversation_id")
    role = serializers.ChoiceField(choices=Role.choices)
    channel = serializers.ChoiceField(choices=Channel.choices)
    visibility = serializers.ChoiceField(choices=Visibility.choices)
    authorName = serializers.CharField(source="author_name")
    content = serializers.CharField()
    metadata = serializers.DictField()
    parentMessageId = ParentMessageField(allow_null=True)
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "Message"


class ConversationSummaryOut(serializers.Serializer):
    id = serializers.UUIDField()
    title = serializers.CharField()
    ownerUserId = serializers.CharField(source="owner_id")
    createdAt = serializers.DateTimeField(source="created_at")
    updatedAt = serializers.DateTimeField(
        source="activity_at",
        help_text="Its latest change: for a user, the latest they can read (a message on "
        "their channel, a new title or metadata); for an agent, any.",
    )
    lastMessagePreview = serializers.CharField(source="last_message_preview", allow_null=True)
    accessLevel = ChoiceField(source="access_level", choices=AccessLevel.choices)

    class Meta:
        ref_name = "ConversationSummary"


class ConversationOut(ConversationSummaryOut):
    metadata = serializers.DictField(
        help_text="As it was given (create, update, fork), kept as jsonb keeps it: its keys "
        "the shorter first, numbers as their values."
    )
    conversationGroupId = serializers.UUIDField(source="group_id")
    forkedAtConversationId = serializers.UUIDField(
        source="forked_at_conversation_id", allow_null=True
    )
    forkedAtMessageId = serializers.UUIDField(
        source="fork_point_shown",
        allow_null=True,
        help_text="The last message of the parent that the fork shares and users see.",
    )

    class Meta:
        ref_name = "Conversation"


class ForkOut(serializers.Serializer):
    conversationId = serializers.UUIDField(source="id")
    # The seed's name of the same id (a UI written from it looked for ``forkId``: review);
    # each fork is a conversation of its own, with its own id.
    forkId = serializers.UUIDField(source="id", help_text="The same id: a fork is a conversation.")
    forkedAtConversationId = serializers.UUIDField(
        source="forked_at_conversation_id", allow_null=True
    )
    forkedAtMessageId = serializers.UUIDField(
        source="fork_point_shown",
        allow_null=True,
        help_text="The last message of the parent that the fork shares and users see.",
    )
    forkedFromMessageId = serializers.UUIDField(
        source="fork_point_shown", allow_null=True, help_text="The same message."
    )
    title = serializers.CharField()
    createdAt = serializers.DateTimeField(source="created_at")
    isCurrentFork = serializers.SerializerMethodField()

    class Meta:
        ref_name = "ConversationForkSummary"

    def get_isCurrentFork(self, conversation) -> bool:
        return conversation.id == self.context["current_id"]


class MembershipOut(serializers.Serializer):
    conversationId = serializers.SerializerMethodField()
    userId = serializers.CharField(source="principal_id")
    accessLevel = ChoiceField(source="access_level", choices=AccessLevel.choices)
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "ConversationMembership"

    def get_conversationId(self, membership) -> str:
        return str(self.context["conversation_id"])


class TransferOut(serializers.Serializer):
    id = serializers.UUIDField()
    conversationId = serializers.UUIDField(source="conversation_id")
    fromUserId = serializers.CharField(source="from_principal")
    toUserId = serializers.CharField(source="to_principal")
    status = ChoiceField(choices=TransferStatus.choices)
    createdAt = serializers.DateTimeField(source="created_at")

    class Meta:
        ref_name = "OwnershipTransfer"


ConversationPage = paged(ConversationSummaryOut, "ConversationSummaryPage")
CONVERSATION_LIST_PARAMETERS = [
    LIMIT_PARAMETER,
    AFTER_PARAMETER,
    OpenApiParameter(
        "query",
        str,
        description="A text the title, or a text or number anywhere in the metadata, contains "
        '(in any case and accents: "cafe" finds "Café").',
    ),
]
CONVERSATION_LIST_DESCRIPTION = (
    "Latest activity first. A walk of the pages loses no conversation: one with activity, "
    "or given to you (shared, or yours by a transfer), while you walk moves ahead of your "
    "cursor, so once the others are listed, the pages go on with those that had activity "
    "or were given since the walk began, each again with its new `updatedAt` (keep the "
    "latest of an id), until there was none."
)


class SearchResultOut(serializers.Serializer):
    message = MessageOut()
    conversationId = serializers.UUIDField(source="message.conversation_id")
    score = serializers.FloatField(
        help_text="How the hit ranks among those this search found (higher is better): a "
        "fusion of its measures stretched over the candidates, with shares for its "
        "neighbours, the dates and people the query names, and the memories citing it. "
        "Comparable within one answer only; it is not the relevance `minScore` bounds."
    )
    highlights = serializers.CharField(
        allow_null=True,
        help_text=f"Extracts with the query's words in <b>, from {HEADLINE_CHARS:,} characters "
        "of the text: its first, or, when a longer text holds no match there, those from a "
        "little before its first word that begins with one of the query's. The text is the messages' own, not HTML-escaped: escape it, then give "
        "back the <b> and </b> markers, before showing it as HTML (any member may have "
        'written markup; a message\'s own "<b>" or "</b>" reads as a marker there: '
        "`content` holds it as written).",
    )

    class Meta:
        ref_name = "SearchResult"


class SearchResultsOut(serializers.Serializer):
    data = SearchResultOut(many=True)

    class Meta:
        ref_name = "SearchResults"


# --- in --------------------------------------------------------------------------------------


class CreateConversationIn(InputSerializer):
    title = TitleField(required=False)
    metadata = MetadataField(required=False)
    agentId = serializers.UUIDField(required=False, help_text="An agent to add as a writer.")

    class Meta:
        ref_name = "CreateConversationRequest"


class UpdateConversationIn(InputSerializer):
    title = TitleField(required=False)
    metadata = MetadataField(required=False)

    class Meta:
        ref_name = "UpdateConversationRequest"


class CreateUserMessageIn(InputSerializer):
    content = MessageContentField()
    metadata = MetadataField(required=False)

    class Meta:
        ref_name = "CreateUserMessageRequest"


class ForkIn(InputSerializer):
    title = TitleField(required=False)
    newMessage = CreateUserMessageIn(required=False)

    class Meta:
        ref_name = "ForkFromMessageRequest"


# A level a membership may be given: not the owner's, given by a transfer alone.
SHARED_LEVEL = "Not owner (403): ownership is given by a transfer."


class ShareIn(InputSerializer):
    userId = PrincipalIdField(help_text=f"{GIVEN_USER_ID_RULE} Or agent:<id> of an existing agent.")
    accessLevel = ChoiceField(choices=AccessLevel.choices, help_text=SHARED_LEVEL)

    class Meta:
        ref_name = "ShareConversationRequest"


class UpdateMembershipIn(InputSerializer):
    accessLevel = ChoiceField(choices=AccessLevel.choices, help_text=SHARED_LEVEL)

    class Meta:
        ref_name = "UpdateMembershipRequest"


class TransferIn(InputSerializer):
    # A user: an agent could never accept (its key reaches no transfer route).
    newOwnerUserId = UserIdField(given=True)

    class Meta:
        ref_name = "TransferOwnershipRequest"


class SearchMessagesIn(InputSerializer):
    query = TextField(max_length=2000)
    topK = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=settings.MEMORY_MAX_SEARCH_LIMIT,
        default=settings.MEMORY_DEFAULT_SEARCH_LIMIT,
    )
    conversationIds = ListField(child=serializers.UUIDField(), required=False, max_length=100)
    before = serializers.UUIDField(required=False, help_text="Only messages before this one.")
    mode = ChoiceField(choices=MODES, default="hybrid")
    # (Scores are ranks, stretched over what was found: the best of a search that matched
    # nothing scored as high as an exact match, and a caller could not tell them apart; review.)
    minScore = serializers.FloatField(
        required=False,
        min_value=0.0,
        max_value=1.0,
        default=0.0,
        help_text="The least relevance of a result: its cosine similarity to the query or the "
        "share of the query's words it holds (by their weight), whichever is higher, the same "
        "for every query (0, the default: none).",
    )

    class Meta:
        ref_name = "SearchMessagesRequest"

    def validate_query(self, value):
        return something_to_read(value)

    @classmethod
    def search_arguments(cls, body) -> dict:
        """The request, parsed, as arguments of ``search.selectors.search_messages``."""
        data = cls.parse(body)
        return {
            "query": data["query"],
            "top_k": data["topK"],
            "mode": data["mode"],
            "conversation_ids": data.get("conversationIds"),
            "before_message_id": data.get("before"),
            "min_relevance": data["minScore"],
            "exclusions": True,  # (a search asked for: its "-word"s exclude)
        }
