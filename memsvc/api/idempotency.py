"""The ``Idempotency-Key`` request header of the APIs that append messages (the agent API's
bulk append, the local API's ``POST /messages``) and store tool records (``POST
/v1/agent/tool-records``, the local API's ``POST /tool-records``): a retry with the same key
gets the first request's result and writes nothing (``agents_api.services.idempotency``)."""

import hashlib
import json

KEY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"


def idempotency_key(request) -> str | None:
    """The request's key, or None when it sends none."""
    key = (request.headers.get(KEY_HEADER) or "").strip()
    return key or None


def request_fingerprint(*parts) -> str:
    """What a retry with the same key must repeat, as one hash: ``parts`` as canonical JSON."""
    canonical = json.dumps(list(parts), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def marked_replayed(response, created: bool):
    """``response``, saying so (``Idempotent-Replayed: true``) when it answers a retry."""
    if not created:
        response[REPLAYED_HEADER] = "true"
    return response
