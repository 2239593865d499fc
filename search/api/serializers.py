from django.conf import settings
from rest_framework import serializers

from conversations.api.serializers import MessageOut
from memsvc.api.fields import InputSerializer, TextField
from search.selectors import MODES


class SearchMessagesIn(InputSerializer):
    query = TextField(max_length=2000)
    topK = serializers.IntegerField(
        required=False, min_value=1, max_value=settings.MEMORY_MAX_SEARCH_LIMIT
    )
    conversationIds = serializers.ListField(
        child=serializers.UUIDField(), required=False, max_length=100
    )
    before = serializers.UUIDField(required=False, help_text="Only messages before this one.")
    mode = serializers.ChoiceField(choices=MODES, default="hybrid")

    class Meta:
        ref_name = "SearchMessagesRequest"

    def validate_query(self, value):
        if not value.strip():
            raise serializers.ValidationError("must not be empty")
        return value


class SearchResultOut(serializers.Serializer):
    message = MessageOut()
    conversationId = serializers.UUIDField(source="message.conversation_id")
    score = serializers.FloatField()
    highlights = serializers.CharField(allow_null=True)

    class Meta:
        ref_name = "SearchResult"


class SearchResultsOut(serializers.Serializer):
    data = SearchResultOut(many=True)

    class Meta:
        ref_name = "SearchResults"
