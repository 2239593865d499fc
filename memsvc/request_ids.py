"""Every request's id: sent back on its answer (``X-Request-Id``) and named in the lines
logged about it, so that a refusal or a failure a client reports is found in the log (a
refused request could not be traced from its answer to its log lines: review).

The id a proxy in front gave is kept when it is plain (letters, digits and ``._:-``, at
most 128); any other, or none, is replaced by a new one (a client's id is no way into the
log: it cannot hold a newline or an escape sequence)."""

import logging
import re
import uuid

REQUEST_ID_HEADER = "X-Request-Id"
_PLAIN_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class RequestIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        given = request.headers.get(REQUEST_ID_HEADER, "")
        request.request_id = given if _PLAIN_ID.fullmatch(given) else uuid.uuid4().hex
        response = self.get_response(request)
        response[REQUEST_ID_HEADER] = request.request_id
        return response


class RequestIdFilter(logging.Filter):
    """A line logged about a request (Django's, and memsvc's: their ``request`` extra) ends
    with the request's id."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = getattr(getattr(record, "request", None), "request_id", None)
        if request_id and not getattr(record, "request_id_named", False):
            # (A plain id: no ``%`` to read as a placeholder of the message's arguments.)
            record.msg = f"{record.msg} [request {request_id}]"
            record.request_id_named = True  # (one line, through several handlers)
        return True
