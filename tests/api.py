"""A small client for the JSON API, sending real ``Authorization`` headers."""

import base64
import json

from memsvc.api.pagination import ANOTHER_LIST, encode_cursor


class Api:
    def __init__(self, client):
        self.client = client

    def call(self, method: str, path: str, as_=None, body=None, headers=None, **params):
        kwargs = dict(headers or {})
        if as_ is not None:
            kwargs.update(as_.auth_headers() if hasattr(as_, "auth_headers") else as_)
        if body is not None:
            kwargs.update(data=json.dumps(body), content_type="application/json")
        elif params:
            kwargs["data"] = params
        return getattr(self.client, method.lower())(path, **kwargs)

    def get(self, path, as_=None, **params):
        return self.call("GET", path, as_=as_, **params)

    def post(self, path, body=None, as_=None, **kw):
        return self.call("POST", path, as_=as_, body=body if body is not None else {}, **kw)

    def patch(self, path, body, as_=None):
        return self.call("PATCH", path, as_=as_, body=body)

    def put(self, path, body, as_=None):
        return self.call("PUT", path, as_=as_, body=body)

    def delete(self, path, as_=None):
        return self.call("DELETE", path, as_=as_)


def refusal_code(response, *, mcp: bool = False) -> str:
    """The code of memsvc's refusal: the /v1 error's, or on ``/mcp`` (``mcp``) that of the
    JSON-RPC error it is told as (the /v1 error's code and details in its data)."""
    answer = response.json()
    if not mcp:
        return answer["code"]
    assert answer["jsonrpc"] == "2.0" and answer["id"] is None, answer
    assert answer["error"]["code"] == -32000 and answer["error"]["message"], answer
    assert set(answer["error"]["data"]) == {"code", "details"}, answer
    return answer["error"]["data"]["code"]


def rekeyed(cursor: str, *key) -> str:
    """``cursor`` (a list's ``nextCursor``) holding ``key`` instead: a forged key in a
    cursor of the right list (``memsvc.api.pagination``: the list's digest, then the key)."""
    of_list = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))[0]
    return encode_cursor(*key, of_list=of_list)


def another_list(response, field: str = "after") -> bool:
    """``response`` is the 400 of a cursor of another list, naming ``field``."""
    return response.status_code == 400 and response.json().get("details") == {field: [ANOTHER_LIST]}


def items_after(api, path: str, cursor: str | None, *, as_, **params) -> list:
    """The items of a paged list after ``cursor`` (a page's ``nextCursor``) to its end,
    page by page with the same ``params``."""
    items = []
    while cursor:
        response = api.get(path, as_=as_, after=cursor, **params)
        assert response.status_code == 200, response.content
        page = response.json()
        items += page["data"]
        cursor = page["nextCursor"]
    return items
