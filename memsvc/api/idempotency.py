"""The ``Idempotency-Key`` request header of the APIs that append messages (the agent API's
bulk append, the local API's ``POST /messages``) and store tool records (``POST
/v1/agent/tool-records``, the local API's ``POST /tool-records``): a retry with the same key
gets the first request's result and writes nothing (``agents_api.services.idempotency``)."""

import hashlib
import json

from memsvc.api.errors import InvalidInput
from memsvc.api.fields import header_text

KEY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"


def idempotency_key(request) -> str | None:
    """The request's key, or None when it sends none; 400 when it is empty, given twice or
    not UTF-8 (``header_text``): taken as none, or as the two joined, a client's retry
    was not the retry it meant (review)."""
    key = header_text(request, KEY_HEADER)
    if key == "":
        raise InvalidInput.for_field(KEY_HEADER, "must not be empty", location="header")
    return key


def request_fingerprint(*parts) -> str:
    """What a retry with the same key must repeat, as one hash: ``parts`` as canonical JSON."""
    canonical = json.dumps(list(parts), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def marked_replayed(response, created: bool):
    """``response``, saying so (``Idempotent-Replayed: true``) when it answers a retry."""
    if not created:
        response[REPLAYED_HEADER] = "true"
    return response
