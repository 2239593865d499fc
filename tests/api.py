"""A small client for the JSON API, sending real ``Authorization`` headers."""

import json


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

    def delete(self, path, as_=None):
        return self.call("DELETE", path, as_=as_)
