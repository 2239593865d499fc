"""``POST /v1/user/search/messages`` and ``POST /v1/agent/search/messages``: one selector,
two doors."""

from django.conf import settings
from rest_framework.response import Response

from agents_api.api.views import AgentApiView, agent_operation
from agents_api.models import Scope
from conversations.api.views import UserApiView, user_operation
from memsvc.api.schema import errors
from search.api.serializers import SearchMessagesIn, SearchResultsOut
from search.selectors import search_messages


def _search(request, *, for_agent: bool) -> Response:
    data = SearchMessagesIn.parse(request.data)
    hits = search_messages(
        request.principal,
        query=data["query"],
        top_k=data.get("topK", settings.MEMORY_DEFAULT_SEARCH_LIMIT),
        mode=data["mode"],
        conversation_ids=data.get("conversationIds"),
        before_message_id=data.get("before"),
        for_agent=for_agent,
    )
    return Response(SearchResultsOut({"data": hits}).data)


class UserSearchView(UserApiView):
    @user_operation(
        "searchMessages",
        request=SearchMessagesIn,
        responses={200: SearchResultsOut, **errors(400, 401)},
    )
    def post(self, request):
        return _search(request, for_agent=False)


class AgentSearchView(AgentApiView):
    required_scope = Scope.READ  # a POST, but searching changes nothing

    @agent_operation(
        "agentSearchMessages",
        request=SearchMessagesIn,
        responses={200: SearchResultsOut, **errors(400, 401, 403)},
    )
    def post(self, request):
        return _search(request, for_agent=True)
