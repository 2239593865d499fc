"""What both MCP transports (``http``, ``stdio``) answer themselves, before the SDK, to a
message it must not be given: JSON-RPC 2.0 errors. No import of the SDK: the web
processes load this with the app's URLs, and the SDK on the first call to ``/mcp``."""

import json
from typing import NamedTuple

from memsvc.api.parsers import MAX_JSON_DEPTH, json_problem
from memsvc.text import shortened

INVALID_REQUEST = -32600  # JSON-RPC 2.0: "the JSON sent is not a valid Request object"
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
SERVICE_REFUSED = -32000  # JSON-RPC's range for a server's own errors: ``refusal``
# The requests memsvc's server serves (``server.build_server``'s handlers and the SDK's own:
# ``initialize``, ``ping``, the 2026-07-28 protocol's ``server/discover``). The SDK answers
# another with -32601 only when its params are right for it, else "Invalid request
# parameters" and nothing more ("completion/complete" with ``{}``: review).
SERVED_METHODS = frozenset({"initialize", "ping", "server/discover", "tools/list", "tools/call"})
NOT_A_MESSAGE = (
    'Invalid Request: a JSON-RPC 2.0 message is one JSON object with "jsonrpc": "2.0" '
    "and a method (a request or a notification) or a result or an error (a response); "
    "batches are not supported"
)


class Refused(NamedTuple):
    """The answer to a message the SDK is not given, and its HTTP status: 400 for one that
    is no request memsvc can take, 200 for a request whose params are wrong (as the SDK
    answers one: a client reads the error, not a failed exchange)."""

    answer: bytes
    status: int = 400


def request_refused(body: bytes | str) -> Refused | None:
    """The answer to a body the SDK must not be given, else None: JSON the service cannot
    take (nested deeper than ``MAX_JSON_DEPTH``, or holding a lone surrogate: ``json_problem``,
    as every other API refuses it; 1,000 levels were a 500 here, 65 went on to the tools), a
    request (it has a method) whose ``id`` is neither a string nor an integer (MCP: "MUST
    be a string or integer", not null: the SDK took it for a notification, answered 202 and
    nothing, and the caller waited for an answer that never came), or one whose params the
    SDK refuses without saying what is wrong (``_params_problem``)."""
    try:
        message = json.loads(body)
    except RecursionError:
        return Refused(invalid_request(f"nested more than {MAX_JSON_DEPTH} levels deep"))
    except ValueError:
        return None  # (the SDK's parse error)
    problem = json_problem(message)
    if problem is not None:
        path, what = problem
        problem = f"{'.'.join(map(str, path)) or 'body'}: {what}"
        return Refused(invalid_request(problem, request_id_of(message)))
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return None
    request_id = request_id_of(message)
    if request_id is None:
        return Refused(invalid_request("id: a string or an integer"))
    # (The SDK answered these with the id null, which JSON-RPC keeps for an id it cannot
    # read: review.)
    if message.get("jsonrpc") != "2.0":
        return Refused(invalid_request('jsonrpc: must be "2.0"', request_id))
    method = message["method"]
    if not isinstance(method, str):
        return Refused(invalid_request("method: must be a text", request_id))
    if method not in SERVED_METHODS:
        found = error_answer(
            request_id, METHOD_NOT_FOUND, "Method not found", shortened(method, 100)
        )
        return Refused(found, status=_status_of(message, METHOD_NOT_FOUND))
    problem = _params_problem(message)
    if problem is not None:
        answer = error_answer(request_id, INVALID_PARAMS, f"Invalid params: {problem}")
        return Refused(answer, status=_status_of(message, INVALID_PARAMS))
    return None


# The key of a request's ``_meta`` that names its protocol on the per-request one
# (2026-07-28: no handshake), whose errors have HTTP statuses of their own (the SDK's
# ``ERROR_CODE_HTTP_STATUS``): the SDK answered 404 and 400 where these answered 200 (review).
PROTOCOL_VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"
_PER_REQUEST_STATUS = {METHOD_NOT_FOUND: 404, INVALID_PARAMS: 400}


def _status_of(request: dict, code: int) -> int:
    """The HTTP status of a request's error of ``code``: 200 on the handshake protocols (a
    client reads the error, not a failed exchange), the per-request protocol's own else."""
    params = request.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    per_request = isinstance(meta, dict) and PROTOCOL_VERSION_META_KEY in meta
    return _PER_REQUEST_STATUS[code] if per_request else 200


# The params of the requests whose refusal by the SDK says nothing of what is wrong ("Invalid
# request parameters", and no data: review): key -> (what it must be, the types it may be).
_OBJECT, _TEXT = (dict,), (str,)
_META = ("an object", _OBJECT, False)
_PARAMS = {
    "tools/call": {
        "name": ("a text", _TEXT, True),
        "arguments": ("an object", _OBJECT, False),
        "_meta": _META,
    },
    "tools/list": {"cursor": ("a text", _TEXT, False), "_meta": _META},
    "ping": {"_meta": _META},
    "server/discover": {"_meta": _META},
    "initialize": {
        "protocolVersion": ("a text", _TEXT, True),
        "capabilities": ("an object", _OBJECT, True),
        "clientInfo": ("an object with a name and a version", _OBJECT, True),
        "_meta": _META,
    },
}
# The texts an object of the params must hold.
_HOLDS = {"clientInfo": ("name", "version")}


def _params_problem(request: dict) -> str | None:
    """What is wrong with the params of a request of ``_PARAMS``, said plainly, or None."""
    shape = _PARAMS.get(request["method"])
    if shape is None:
        return None
    params = request.get("params")
    if params is None and not any(required for *_, required in shape.values()):
        return None  # (params of nothing but optional keys may be left out)
    if not isinstance(params, dict):
        return f"{request['method']} takes params: an object with {', '.join(shape)}"
    for key, (what, types, required) in shape.items():
        if key not in params:
            if required:
                return f"params.{key}: missing ({what})"
        elif not isinstance(params[key], types) and (required or params[key] is not None):
            return f"params.{key}: must be {what}"  # (an optional one may be null: none)
        elif not all(isinstance(params[key].get(text), str) for text in _HOLDS.get(key, ())):
            return f"params.{key}: must be {what}"
        elif key in _INSIDE and (problem := _INSIDE[key](params[key] or {})):
            return f"params.{key}.{problem}"
    return None


def _progress_token_problem(meta: dict) -> str | None:
    token = meta.get("progressToken")
    if token is None or (isinstance(token, str | int) and not isinstance(token, bool)):
        return None
    return "progressToken: must be a text or an integer"


def _capabilities_problem(capabilities: dict) -> str | None:
    return next(
        (
            f"{name}: must be an object"
            for name, value in capabilities.items()
            if value is not None and not isinstance(value, dict)
        ),
        None,
    )


# What the objects of the params must hold inside, said plainly (the SDK's refusal of a
# progress token of [1, 2], or a capability of [1], named nothing: review).
_INSIDE = {"_meta": _progress_token_problem, "capabilities": _capabilities_problem}


def request_id_of(message) -> str | int | None:
    """The id of a request, if it has one MCP allows (a string or an integer), else None:
    an answer names it, so that the client knows which request it answers (JSON-RPC: null
    only when it cannot be told)."""
    request_id = message.get("id") if isinstance(message, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return None
    return request_id


def invalid_request(problem: str, request_id: str | int | None = None) -> bytes:
    return error_answer(request_id, INVALID_REQUEST, f"Invalid Request: {problem}")


def error_answer(request_id: str | int | None, code: int, message: str, data=None) -> bytes:
    """A JSON-RPC 2.0 error answer to the request ``request_id``."""
    return json.dumps(error_object(request_id, code, message, data)).encode()


def error_object(request_id: str | int | None, code: int, message: str, data=None) -> dict:
    error = {"code": code, "message": message, **({} if data is None else {"data": data})}
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def refusal(body: dict) -> dict:
    """memsvc's refusal of a request before its method ran (``memsvc.api.errors.error_body``:
    a key that is no key, a rate limit, the database down, ...) as a JSON-RPC error: an MCP
    client reads the error of a non-2xx answer in that shape only (told "Server returned an
    error response" and nothing more, its user never saw why: review). ``data``: the /v1
    error's code and details; the id null (the message was not read)."""
    data = {"code": body["code"], "details": body["details"]}
    return error_object(None, SERVICE_REFUSED, body["error"], data)
