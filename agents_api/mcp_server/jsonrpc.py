"""What both MCP transports (``http``, ``stdio``) answer themselves, before the SDK, to a
message it must not be given: JSON-RPC 2.0 errors. No import of the SDK: the web
processes load this with the app's URLs, and the SDK on the first call to ``/mcp``."""

import json

from memsvc.api.parsers import MAX_JSON_DEPTH, json_problem

INVALID_REQUEST = -32600  # JSON-RPC 2.0: "the JSON sent is not a valid Request object"
INVALID_PARAMS = -32602
NOT_A_MESSAGE = (
    'Invalid Request: a JSON-RPC 2.0 message is one JSON object with "jsonrpc": "2.0" '
    "and a method (a request or a notification) or a result or an error (a response); "
    "batches are not supported"
)


def request_refused(body: bytes | str) -> bytes | None:
    """The answer to a body the SDK must not be given, else None: JSON the service cannot
    take (nested deeper than ``MAX_JSON_DEPTH``, or holding a lone surrogate: ``json_problem``,
    as every other API refuses it; 1,000 levels were a 500 here, 65 went on to the tools), or
    a request (it has a method) whose ``id`` is neither a string nor an integer (MCP: "MUST
    be a string or integer", not null: the SDK took it for a notification, answered 202 and
    nothing, and the caller waited for an answer that never came)."""
    try:
        message = json.loads(body)
    except RecursionError:
        return invalid_request(f"nested more than {MAX_JSON_DEPTH} levels deep")
    except ValueError:
        return None  # (the SDK's parse error)
    problem = json_problem(message)
    if problem is not None:
        path, what = problem
        problem = f"{'.'.join(map(str, path)) or 'body'}: {what}"
        return invalid_request(problem, request_id_of(message))
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return None
    if request_id_of(message) is not None:
        return None
    return invalid_request("id: a string or an integer")


def request_id_of(message) -> str | int | None:
    """The id of a request, if it has one MCP allows (a string or an integer), else None:
    an answer names it, so that the client knows which request it answers (JSON-RPC: null
    only when it cannot be told)."""
    request_id = message.get("id") if isinstance(message, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        return None
    return request_id


def invalid_request(problem: str, request_id: str | int | None = None) -> bytes:
    error = {"code": INVALID_REQUEST, "message": f"Invalid Request: {problem}"}
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()
