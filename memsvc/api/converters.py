"""Path converters of the URL confs (registered in ``memsvc.urls``)."""

from django.urls.converters import UUIDConverter


class AnyCaseUuidConverter(UUIDConverter):
    """An id in a path (``<id:conversation_id>``), a UUID in either case: Django's ``uuid``
    takes lower case only, and an id a client writes in capitals (Swift's ``uuidString``,
    as a body's ids are taken) was "no such route". URLs are written in lower case."""

    regex = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"

    def to_url(self, value) -> str:
        return super().to_url(value).lower()
