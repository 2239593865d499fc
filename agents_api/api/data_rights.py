"""Data rights and portability: a user's (``/v1/user/export``, ``/v1/user/erase``) and an
agent's (``/v1/agent/export``, ``/v1/agent/import``). Thin views over
``agents_api.portability`` and ``services.user_erase``. Only ever the caller's own data:
none takes a user id other than the token's, or an agent other than the key's."""

from django.http import StreamingHttpResponse
from django.utils.cache import add_never_cache_headers
from rest_framework import serializers
from rest_framework.response import Response

from agents_api import services
from agents_api.api.views import AgentApiView, agent_operation
from agents_api.models import Scope
from agents_api.portability.export import (
    FORMAT,
    VERSION,
    agent_header,
    document_chunks,
    user_header,
)
from agents_api.portability.importing import document_import
from agents_api.portability.records import AgentRecord
from agents_api.portability.restore import ImportCollides, ImportRefused
from agents_api.portability.sections import AGENT_SECTIONS, USER_SECTIONS
from memsvc.api.errors import Conflict, Forbidden, InvalidInput
from memsvc.api.fields import ChoiceField, InputSerializer, TextField
from memsvc.api.parsers import DocumentJSONParser
from memsvc.api.schema import errors
from memsvc.api.views import UserApiView, user_operation


def _document_schema(name: str, kind: str, subject, sections) -> type[serializers.Serializer]:
    """The OpenAPI shape of a document, from the same list of sections that writes it
    (``subject``: the header's field naming whose document it is)."""
    fields = {
        "format": ChoiceField(choices=[FORMAT]),
        "version": ChoiceField(choices=[VERSION]),
        "kind": ChoiceField(choices=[kind]),
        **subject,
        "exportedAt": serializers.DateTimeField(),
        **{section.name: section.record(many=True) for section in sections},
        "Meta": type("Meta", (), {"ref_name": name}),
    }
    return type(name, (serializers.Serializer,), fields)


def _streamed(chunks) -> StreamingHttpResponse:
    """A document as a file to download, which no browser or proxy keeps (all that is kept
    about someone; review)."""
    response = StreamingHttpResponse(chunks, content_type="application/json")
    response["Content-Disposition"] = 'attachment; filename="memsvc-export.json"'
    add_never_cache_headers(response)
    return response


UserExportOut = _document_schema(
    "UserExport", "user", {"userId": serializers.CharField()}, USER_SECTIONS
)
AgentExportOut = _document_schema("AgentExport", "agent", {"agent": AgentRecord()}, AGENT_SECTIONS)


class EraseIn(InputSerializer):
    confirm = TextField(max_length=255, help_text="Your own user id: erasing cannot be undone.")

    class Meta:
        ref_name = "EraseMyDataRequest"


class ErasedOut(serializers.Serializer):
    conversations = serializers.IntegerField(help_text="Conversations you owned, forks included.")
    messages = serializers.IntegerField(
        help_text="The messages of those, and yours in others' conversations."
    )
    memberships = serializers.IntegerField(help_text="Yours, everywhere.")
    ownershipTransfers = serializers.IntegerField(
        source="ownership_transfers",
        help_text="Of the conversations you owned, and those you made or were offered.",
    )
    memories = serializers.IntegerField(help_text="What agents kept about you.")
    memoryBlocks = serializers.IntegerField(source="memory_blocks")
    toolRecords = serializers.IntegerField(
        source="tool_records",
        help_text="Agents' tool records made for you, or in the conversations you owned.",
    )

    class Meta:
        ref_name = "ErasedMyData"


class UserExportView(UserApiView):
    @user_operation(
        "exportMyData",
        description=(
            "Everything kept about you, as one JSON document streamed as it is read: the "
            "conversations you own (every fork, every message, their memberships and "
            "transfers), your memberships, messages and transfers in others' conversations, "
            "and what every agent keeps about you (memories, memory blocks with revisions, "
            "tool records made for you or in the conversations you own), and whether you "
            "let agents remember you (`memorySetting`, empty when you never changed it). "
            "`memsvc import` puts it back."
        ),
        responses={200: UserExportOut, **errors(401)},
    )
    def get(self, request):
        user_id = request.principal.id
        return _streamed(document_chunks(user_header(user_id), USER_SECTIONS, user_id))


class UserEraseView(UserApiView):
    @user_operation(
        "eraseMyData",
        description=(
            "Erase everything `exportMyData` returns, in one transaction: the conversations "
            "you own (for everyone in them), your messages and memberships elsewhere, "
            "transfers you made or were offered, and what agents keep about you (the tool "
            "records made for you or in the conversations you own too). Others' "
            "conversations stay, without your messages; others' memories stay, citing none "
            "of the messages erased. A memory switch you turned off stays off, so that "
            "agents do not start remembering you again."
        ),
        request=EraseIn,
        responses={200: ErasedOut, **errors(400, 401)},
    )
    def post(self, request):
        data = EraseIn.parse(request.data)
        erased = services.user_erase(request.principal, confirm=data["confirm"])
        return Response(ErasedOut(erased).data)


# --- an agent's memory -----------------------------------------------------------------------


class ImportedOut(serializers.Serializer):
    stored = serializers.DictField(
        child=serializers.IntegerField(), help_text="Records stored, by section."
    )
    skipped = serializers.DictField(
        child=serializers.IntegerField(),
        help_text=(
            "Records left out, by section: memories, blocks and tool records about a user "
            "who turned memory off, or made before the user was erased; memories whose "
            "time is up."
        ),
    )

    class Meta:
        ref_name = "ImportedAgentMemory"


def _whole_agent(request):
    """The agent's whole memory is the agent's own: not for a request acting for a user."""
    acting_for = request.principal.on_behalf_of
    if acting_for:
        raise Forbidden(f"acting for {acting_for}, this request cannot reach the agent's memory")
    return request.agent


class AgentExportView(AgentApiView):
    @agent_operation(
        "agentExportMemory",
        description=(
            "Your whole memory as one JSON document streamed as it is read: your memory "
            "blocks (yours and those about each user, with every revision), your memories "
            "(yours and about each user) and your tool records. `agentImportMemory` puts it "
            "in an agent, on this server or another."
        ),
        responses={200: AgentExportOut, **errors(401, 403)},
    )
    def get(self, request):
        agent = _whole_agent(request)
        return _streamed(document_chunks(agent_header(agent), AGENT_SECTIONS, agent))


class AgentImportView(AgentApiView):
    # Its records' values as deep as a request may make them, two levels below the body.
    parser_classes = [DocumentJSONParser]
    # Its 409 tells whether a memory's content is kept already: a key that may not read may
    # not learn it by importing (a write-only key made a memory it may not save: review).
    writes_read = ("POST",)

    @agent_operation(
        "agentImportMemory",
        description=(
            "Put an agent's export (`agentExportMemory`, or `memsvc export agent`) in your "
            "memory, all of it or nothing, as you could have written it yourself: every row "
            "new (new ids and block numbers, no time later than now, memories not yet used, "
            "a block's history one revision by you); a cited message or a tool record's "
            "conversation you cannot see here is dropped; a tool record made for a user "
            "needs a key with the `impersonate` scope (else 400); a key needs `read` beside "
            "`write` (the answer tells what you keep); memories, blocks and tool "
            "records "
            "about a user who turned memory off, and memories whose `expiresAt` has passed, "
            "are skipped. "
            "409 when a block's label or a memory's content is one "
            "you keep already, or is in the document twice. "
            "Vectors are made in the background (found by keyword meanwhile). Larger "
            "documents than the body limit: `memsvc import`."
        ),
        request=AgentExportOut,
        responses={200: ImportedOut, **errors(400, 401, 403, 409)},
    )
    def post(self, request):
        agent = _whole_agent(request)
        try:
            result = document_import(
                request.data,
                into=agent,
                impersonates=Scope.IMPERSONATE in request.principal.scopes,
            )
        except ImportCollides as exc:
            raise Conflict(f"nothing imported: {exc}") from None
        except ImportRefused as exc:
            if exc.details:
                raise InvalidInput(f"nothing imported: {exc}", details=exc.details) from None
            raise InvalidInput.for_field("body", f"nothing imported: {exc}") from None
        return Response(ImportedOut(result).data)
