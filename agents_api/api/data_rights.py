"""A user's data rights (``/v1/user/export``, ``/v1/user/erase``): thin views over
``agents_api.portability`` and ``services.user_erase``. Only ever the caller's own data:
neither takes a user id other than the token's."""

from django.http import StreamingHttpResponse
from rest_framework import serializers
from rest_framework.response import Response

from agents_api import services
from agents_api.portability.export import FORMAT, VERSION, document_chunks, user_header
from agents_api.portability.sections import USER_SECTIONS
from memsvc.api.fields import InputSerializer, TextField
from memsvc.api.schema import errors
from memsvc.api.views import UserApiView, user_operation


def _document_schema(name: str, sections) -> type[serializers.Serializer]:
    """The OpenAPI shape of a document, from the same list of sections that writes it."""
    fields = {
        "format": serializers.ChoiceField(choices=[FORMAT]),
        "version": serializers.ChoiceField(choices=[VERSION]),
        "kind": serializers.ChoiceField(choices=["user"]),
        "userId": serializers.CharField(),
        "exportedAt": serializers.DateTimeField(),
        **{section.name: section.record(many=True) for section in sections},
        "Meta": type("Meta", (), {"ref_name": name}),
    }
    return type(name, (serializers.Serializer,), fields)


UserExportOut = _document_schema("UserExport", USER_SECTIONS)


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

    class Meta:
        ref_name = "ErasedMyData"


class UserExportView(UserApiView):
    @user_operation(
        "exportMyData",
        description=(
            "Everything kept about you, as one JSON document streamed as it is read: the "
            "conversations you own (every fork, every message, their memberships and "
            "transfers), your memberships, messages and transfers in others' conversations, "
            "and what every agent keeps about you (memories, memory blocks with revisions). "
            "`memsvc import` puts it back."
        ),
        responses={200: UserExportOut, **errors(401)},
    )
    def get(self, request):
        user_id = request.principal.id
        response = StreamingHttpResponse(
            document_chunks(user_header(user_id), USER_SECTIONS, user_id),
            content_type="application/json",
        )
        response["Content-Disposition"] = 'attachment; filename="memsvc-export.json"'
        return response


class UserEraseView(UserApiView):
    @user_operation(
        "eraseMyData",
        description=(
            "Erase everything `exportMyData` returns, in one transaction: the conversations "
            "you own (for everyone in them), your messages and memberships elsewhere, "
            "transfers you made or were offered, and what agents keep about you. Others' "
            "conversations stay, without your messages."
        ),
        request=EraseIn,
        responses={200: ErasedOut, **errors(400, 401)},
    )
    def post(self, request):
        data = EraseIn.parse(request.data)
        erased = services.user_erase(request.principal, confirm=data["confirm"])
        return Response(ErasedOut(erased).data)
