"""The JSON parser of every API (``/v1`` and the local API): a body PostgreSQL can store.

Python's ``json`` accepts two things the rest of the code cannot take: a lone surrogate
(``"\\ud800"``: no UTF-8 encoding exists, so any later ``encode`` fails) and nesting deep
enough to exhaust the interpreter's recursion limit (``RecursionError`` in the decoder, or in
whatever walks the value next). Both are refused here, as a bad body (400 ``validation_error``
on ``/v1``, 422 on the local API), naming where in the body the problem is.
"""

import sys

from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError

from memsvc.validators import LONE_SURROGATE_PROBLEM, has_lone_surrogates

# Far deeper than any real metadata, far below the recursion limit (1000) of the code that
# walks a value (the decoder, the serializers, the JSON renderer).
MAX_JSON_DEPTH = 64
# An export document holds each record two levels below its top (its section's list, the
# record): a value as deep as a request may make it is as deep as that in a document.
DOCUMENT_MAX_JSON_DEPTH = MAX_JSON_DEPTH + 2
# A value given outside a request's body (the admin's forms) as deep as one in it may be: a
# field of the body, one level below its top.
FIELD_MAX_JSON_DEPTH = MAX_JSON_DEPTH - 1


def too_deep(max_depth: int) -> str:
    return f"must not be nested more than {max_depth} levels deep"


def json_problem(value, max_depth: int = MAX_JSON_DEPTH) -> tuple[tuple, str] | None:
    """``(path, problem)`` for the first part of a parsed JSON value that cannot be stored
    (``path``: the keys and indexes that lead to it), or None. Iterative, so the check itself
    cannot run out of stack. A container's own texts are checked at once and only the
    containers in it entered, the path kept once for all: each item was put on a stack with
    a path of its own, and a body of 4,000,000 numbers 60 levels deep took 2.5 GB and 20 s
    (review)."""
    path: list = []
    containers: list = []  # (the containers in one entered, and its depth)
    item, depth = value, 0
    while True:
        if depth > max_depth:
            return tuple(path), too_deep(max_depth)
        if type(item) is str:
            if has_lone_surrogates(item):
                return tuple(path), LONE_SURROGATE_PROBLEM
        elif type(item) in (dict, list):
            if any(map(has_lone_surrogates, item if type(item) is dict else ())):  # its keys
                return tuple(path), LONE_SURROGATE_PROBLEM
            if item and depth == max_depth:  # (its items are a level deeper)
                return (*path, next(iter(_steps(item)))[0]), too_deep(max_depth)
            subs = item.values() if type(item) is dict else item
            kinds = set(map(type, subs))  # (at C's pace: a list of numbers stops here)
            if str in kinds:
                texts = [sub for sub in subs if type(sub) is str]
                if not all(map(str.isascii, texts)) and any(map(has_lone_surrogates, texts)):
                    step = next(
                        step
                        for step, sub in _steps(item)
                        if type(sub) is str and has_lone_surrogates(sub)
                    )
                    return (*path, step), LONE_SURROGATE_PROBLEM
            if dict in kinds or list in kinds:
                inside = [(step, sub) for step, sub in _steps(item) if type(sub) in (dict, list)]
                containers.append((iter(inside), depth))
        while containers:
            inside, at = containers[-1]
            entered = next(inside, None)
            if entered is not None:
                break
            containers.pop()
        else:
            return None
        step, item = entered
        depth = at + 1
        del path[at:]
        path.append(step)


def _steps(container: dict | list):
    """(key or index, item) of each item of a JSON container."""
    return container.items() if type(container) is dict else enumerate(container)


def too_many_digits(exc: ValueError) -> str | None:
    """A JSON decoder's refusal of a number too long, in our words (Python's name its own
    setting: "use sys.set_int_max_str_digits()"; review); None for any other."""
    if "int_max_str_digits" in str(exc):
        return f"a number has more than {sys.get_int_max_str_digits()} digits"
    return None


class JSONParser(parsers.JSONParser):
    max_depth = MAX_JSON_DEPTH

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(
                f"JSON parse error - nested more than {self.max_depth} levels deep"
            ) from None
        except ParseError as exc:
            if isinstance(exc.__context__, ValueError):  # (DRF's: "JSON parse error - ...")
                said = too_many_digits(exc.__context__) or exc.__context__
                raise ParseError(f"JSON parse error - {said}") from None
            raise
        problem = json_problem(data, self.max_depth)
        if problem:
            path, message = problem
            # Nested as DRF nests a field's errors: each API names the place its own way.
            detail = [message]
            for part in reversed(path or ("body",)):
                detail = {part: detail}
            raise ValidationError(detail)
        return data


class DocumentJSONParser(JSONParser):
    """The parser of an export document's body (``POST /v1/agent/import``)."""

    max_depth = DOCUMENT_MAX_JSON_DEPTH
