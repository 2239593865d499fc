"""Input fields shared by every API that accepts messages and metadata (and the one way a
time is written out).

The user API, the agent API and the local compatibility API all validate a message's
content, a title or a metadata object with these, so the rules (and their messages) are the
same everywhere.
"""

import decimal
import json
import re

from django.conf import settings
from django.core.validators import ProhibitNullCharactersValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from memsvc.api.errors import InvalidInput
from memsvc.api.principals import PRINCIPAL_MAX_LENGTH, user_id_problem
from memsvc.text import named, shows_nothing
from memsvc.validators import (
    no_control_characters,
    no_nul_characters,
    one_line,
    path_segment,
)

METADATA_MAX_BYTES = 16 * 1024


class TextField(serializers.CharField):
    """A JSON string (not a number turned into one) that keeps its whitespace, without NUL."""

    def __init__(self, **kwargs):
        kwargs.setdefault("trim_whitespace", False)
        if not kwargs.get("allow_blank", False):
            kwargs.setdefault("min_length", 1)  # documents in the schema what allow_blank means
        super().__init__(**kwargs)
        # The models' own check (DRF reports it as 400), said once: in place of DRF's own,
        # which would say it a second time in other words.
        self.validators = [
            *(v for v in self.validators if not isinstance(v, ProhibitNullCharactersValidator)),
            no_nul_characters,
        ]

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class ListField(serializers.ListField):
    """A JSON list, refused for its length before its items are checked (DRF checks each of
    them first: 1,500,000 tags took 11-24 s to be told that 50 is the most; review)."""

    def to_internal_value(self, data):
        if isinstance(data, list) and self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return super().to_internal_value(data)


def with_rule(kwargs: dict, rule: str) -> dict:
    """``kwargs`` of a field whose description (``help_text``) says ``rule`` after what the
    caller says of it: the schema says what the server enforces (review)."""
    given = kwargs.get("help_text")
    return {**kwargs, "help_text": f"{given}. {rule}" if given else rule}


class PathSegmentField(TextField):
    """A text that names a thing in a URL's path (``path_segment``)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.validators.append(path_segment)


class MomentField(serializers.DateTimeField):
    """A time as the schema's ``date-time`` says (RFC 3339): a date, a time and its offset
    (``Z`` or ``+hh:mm``), ``T`` and ``Z`` in either case (or a space for ``T``, as RFC 3339
    allows and Python writes). A date alone, or a time without its offset, was read in the
    server's zone, whatever the client meant; ``t`` and ``z`` were refused (review)."""

    default_error_messages = {
        "invalid": "must be a date and time with its offset (RFC 3339), as "
        "2026-05-06T10:00:00Z or 2026-05-06T12:00:00+02:00",
        # (DRF's "Datetime value out of range.": a year 9999 west of UTC, 0001 east of it)
        "overflow": "must be between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z in UTC",
    }
    # (ASCII digits: ``\d`` took fullwidth ones; a fraction of any length, as RFC 3339's)
    _RFC_3339 = re.compile(
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?"
        r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
    )

    def to_internal_value(self, value):
        if isinstance(value, str) and self._RFC_3339.fullmatch(value):
            # Django reads up to 12 digits of a fraction (6 kept): the rest cannot matter.
            value = re.sub(r"(\.[0-9]{6})[0-9]+", r"\1", value)
            return super().to_internal_value(value.upper())
        self.fail("invalid")


class PrincipalIdField(TextField):
    """A user id, or ``agent:<id>`` where an agent may stand (sharing)."""

    # (As ``user_id_problem`` says it, not DRF's "Ensure this field has ...": review.)
    default_error_messages = {"max_length": "must be at most {max_length} characters"}

    def __init__(self, **kwargs):
        kwargs.setdefault("max_length", PRINCIPAL_MAX_LENGTH)
        super().__init__(**kwargs)


# What ``user_id_problem`` refuses, as the schema says it.
USER_ID_RULE = (
    "A user id: no control, bidirectional or invisible character nor line separator, no "
    'blank at either end, neither "." nor ".." (nor one between its "/"), not beginning '
    '"agent:".'
)
GIVEN_USER_ID_RULE = (
    f"{USER_ID_RULE[:-1]} in any case, and in Unicode's NFKC form (one given here: "
    "shared with, offered ownership)."
)


class UserIdField(PrincipalIdField):
    """A user id (``user_id_problem``); ``given``: one introduced here."""

    def __init__(self, *, given: bool = False, **kwargs):
        self.given = given
        rule = GIVEN_USER_ID_RULE if given else USER_ID_RULE
        super().__init__(**with_rule(kwargs, rule))

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        problem = user_id_problem(value, given=self.given)
        if problem:
            raise serializers.ValidationError(problem)
        return value


def something_to_read(value: str) -> str:
    """``value``, refused (400) when it holds nothing to read or search (``shows_nothing``):
    a message's or a memory's content, a search's query."""
    if shows_nothing(value):
        raise serializers.ValidationError("must not be empty")
    return value


class MessageContentField(TextField):
    def __init__(self, **kwargs):
        kwargs.setdefault("allow_blank", False)
        kwargs.setdefault("max_length", settings.MEMSVC_MAX_MESSAGE_CHARS)
        rule = "Something to read: not only spaces or invisible characters."
        super().__init__(**with_rule(kwargs, rule))

    def to_internal_value(self, data):
        return something_to_read(super().to_internal_value(data))


class TitleField(TextField):
    """A conversation's title: one line (no tab, newline or escape), at most 500 characters.
    ``restored``: one an import brings back as it was stored (``one_line`` came later)."""

    def __init__(self, *, restored: bool = False, **kwargs):
        kwargs.setdefault("max_length", 500)
        kwargs.setdefault("allow_blank", True)
        if not restored:
            kwargs = with_rule(kwargs, "One line: no control character nor line separator.")
        super().__init__(**kwargs)
        self.validators.append(no_control_characters)
        if not restored:
            self.validators.append(one_line)


def contains_nul(value) -> bool:
    """Whether a JSON value holds a NUL character anywhere (PostgreSQL refuses it in text)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(contains_nul(k) or contains_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(contains_nul(v) for v in value)
    return False


def as_jsonb_gives_back(value):
    """``value`` as PostgreSQL's jsonb gives it back, so that a write answers what later
    reads answer (review: a message's ``-0.0`` read back ``0.0``). A number is a ``numeric``
    there, which has no negative zero and writes the float that Python shows in exponent
    form (from 1e16 up) as its digits: ``1E30`` is read back as the integer
    ``1000000000000000000000000000000``. Small exponents (``1.5e-07``) are read back as
    the same float. An object's keys in jsonb's order: the shorter first, then by their
    bytes (a tool record's output was answered in the order sent, and read in this one ever
    after, by the API and by the model the memory bank showed it to; review); the last of
    a key given twice, as jsonb keeps it."""
    if isinstance(value, float):
        if value == 0:
            return 0.0
        shown = repr(value)
        return int(decimal.Decimal(shown)) if "e+" in shown else value
    if isinstance(value, dict):
        return {key: as_jsonb_gives_back(value[key]) for key in sorted(value, key=_jsonb_order)}
    if isinstance(value, list):
        return [as_jsonb_gives_back(item) for item in value]
    return value


def _jsonb_order(key: str) -> tuple[int, bytes]:
    """Where jsonb puts an object's ``key``: by its length in bytes, then its bytes."""
    encoded = key.encode()
    return len(encoded), encoded


def json_value_problem(value, *, max_bytes: int, objects_only: bool) -> str | None:
    """What makes a JSON value unfit to store (``JSONValueField``'s rules), or None."""
    if objects_only and not isinstance(value, dict):
        return "must be a JSON object"
    # Counted as compact JSON (no space after "," and ":"), as a client sends it at least:
    # counted with Python's spaces, a body of 12,000 bytes was refused as over 16,384 (review).
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # (1e999 reads as infinity, which jsonb cannot hold: a DataError)
        return "numbers must be finite: no NaN or Infinity"
    if len(text.encode()) > max_bytes:
        return f"must be at most {max_bytes} bytes"
    if contains_nul(value):
        return "must not contain NUL characters"
    return None


class JSONValueField(serializers.JSONField):
    """Any JSON value of at most ``max_bytes`` (serialized), without NUL characters (which
    PostgreSQL's jsonb cannot hold); with ``objects_only``, a JSON object."""

    objects_only = False
    # (DRF's "Value must be valid JSON." for 1e999, which reads as infinity)
    default_error_messages = {"invalid": "numbers must be finite: no NaN or Infinity"}

    def __init__(self, *, max_bytes: int, **kwargs):
        self.max_bytes = max_bytes
        super().__init__(**kwargs)

    def validate_empty_values(self, data):
        # ``null`` is a JSON value like any other (not "no value"), without ``allow_null``,
        # whose schema would be ``oneOf: [{}, null]``, which a null matches twice.
        if data is None and not self.objects_only:
            return True, None
        return super().validate_empty_values(data)

    def to_internal_value(self, data):
        # (Measured as it is kept: 1e308, five bytes sent, is kept as 309 digits; code review.)
        value = as_jsonb_gives_back(super().to_internal_value(data))
        problem = json_value_problem(
            value, max_bytes=self.max_bytes, objects_only=self.objects_only
        )
        if problem:
            raise serializers.ValidationError(problem)
        return value


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(JSONValueField):
    objects_only = True


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": True,
        "description": f"A JSON object of at most {METADATA_MAX_BYTES} bytes (as compact JSON "
        "text, UTF-8), "
        "without NUL characters.",
    }
)
class MetadataField(JSONObjectField):
    """A JSON object of at most 16 KiB (serialized), without NUL characters."""

    def __init__(self, **kwargs):
        kwargs.setdefault("max_bytes", METADATA_MAX_BYTES)
        super().__init__(**kwargs)


class ChoiceField(serializers.ChoiceField):
    """DRF's, refusing a value it does not know by naming the choices, never by quoting the
    value (DRF's message did: a megabyte sent, a megabyte or two answered)."""

    def fail(self, key, **kwargs):
        if key == "invalid_choice":
            choices = ", ".join(map(str, self.choices))
            raise serializers.ValidationError(f"must be one of {choices}", code=key)
        super().fail(key, **kwargs)


# The JSON types a field of these kinds takes, as the schema says (DRF's fields take a
# number for a boolean, "10" for an integer, 3 for a UUID; review): the first kind a field
# is decides. A boolean is no number; 5.0 is an integer, as JSON Schema counts.
_JSON_TYPES = (
    (serializers.BooleanField, None, "must be a boolean (true or false)"),
    (
        serializers.IntegerField,
        lambda v: isinstance(v, int) or (isinstance(v, float) and v.is_integer()),
        "must be an integer",
    ),
    (serializers.FloatField, lambda v: isinstance(v, int | float), "must be a number"),
    (serializers.UUIDField, lambda v: isinstance(v, str), "must be a string (a UUID)"),
    (serializers.DateTimeField, lambda v: isinstance(v, str), "must be a string (a date and time)"),
)


def _json_type_problem(field, value) -> str | None:
    """Why ``value`` (from JSON) is not of the JSON type ``field`` takes, or None."""
    if value is None:  # (null: the field's ``allow_null`` decides)
        return None
    for kind, takes, problem in _JSON_TYPES:
        if isinstance(field, kind):
            a_boolean = isinstance(value, bool)  # (a bool is an int to Python)
            fits = a_boolean if kind is serializers.BooleanField else takes(value) and not a_boolean
            return None if fits else problem
    return None


def _json_type_problems(fields, data: dict) -> dict:
    """Why values of ``data`` (a JSON object) are not of the JSON types of ``fields`` (a
    serializer's), as DRF's errors say it (a list's item by its index); empty when none."""
    problems = {}
    for name, field in fields.items():
        if name not in data:
            continue
        value = data[name]
        if isinstance(field, serializers.ListField) and isinstance(value, list):
            items = {
                index: [problem]
                for index, item in enumerate(value)
                if (problem := _json_type_problem(field.child, item))
            }
            if items:
                problems[name] = items
        elif problem := _json_type_problem(field, value):
            problems[name] = [problem]
    return problems


def json_typed(fields, data: dict) -> dict:
    """``data`` (a JSON object) if its values are of the JSON types of ``fields`` (a
    serializer's), a whole number written as a float an int (DRF read 1e16 as no integer:
    str(1e16) is "1e+16"); else a ValidationError naming each value that is not."""
    problems = _json_type_problems(fields, data)
    if problems:
        raise serializers.ValidationError(problems)
    whole = {
        name: int(value)
        for name, field in fields.items()
        if isinstance(field, serializers.IntegerField)
        and isinstance(value := data.get(name), float)
    }
    return {**data, **whole} if whole else data


class InputSerializer(serializers.Serializer):
    # A request body: unknown fields are an error, not silently ignored (unless a subclass
    # mimics an API that ignores them), and a value of another JSON type than the schema's
    # is refused (unless a subclass mimics an API that converts it: pydantic's). A comment,
    # not a docstring: drf-spectacular would copy a docstring into the description of every
    # request schema.
    ignore_unknown_fields = False
    json_types_strict = True

    def run_validation(self, data=serializers.empty):
        if data is None and self.parent is None:  # a body of ``null``: as any other non-object
            self.to_internal_value(data)  # (DRF said "non_field_errors: No data provided": review)
        return super().run_validation(data)

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            # The body, or a nested object: named by the field that holds it ("body" in
            # its place said ``memory_blocks.0.body``; review).
            problem = ["must be a JSON object"]
            raise serializers.ValidationError(problem if self.parent else {"body": problem})
        unknown = sorted(set(data) - set(self.fields))
        if unknown and not self.ignore_unknown_fields:
            raise serializers.ValidationError({named(name): ["unknown field"] for name in unknown})
        if self.json_types_strict:
            data = json_typed(self.fields, data)
        return super().to_internal_value(data)

    @classmethod
    def parse(cls, data, **context) -> dict:
        """Validated data, or ValidationError (400 ``validation_error`` naming the field)."""
        serializer = cls(data=data, context=context)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


class _NoFields(InputSerializer):
    pass


def no_body_fields(request) -> None:
    """400 naming the fields of a JSON body sent to an operation that takes none (accepting
    an offer of ownership): they were ignored, whatever the client meant by them. No body,
    ``{}``, or an empty form (what a client sends for "no data") is none."""
    if request.content_type.startswith("application/json"):
        _NoFields.parse(request.data or {})


def chosen_by_query(request, *names: str) -> None:
    """A deletion chosen by its query (``names``; ``views.operation`` refuses any other): no
    body, whose filter was passed over (``{"userId": "bob"}`` deleted the agent's own
    memories: review)."""
    if request.data != {} and request.data is not None:  # (no body, ``{}`` or ``null``)
        raise InvalidInput(
            f"this request takes no body: what it deletes is chosen by its query "
            f"({', '.join(f'?{name}=' for name in names)})"
        )


def only_query_parameters(request, *names: str) -> None:
    """400 naming the first query parameter that is not one of ``names`` (``views.operation``:
    those its description names). A misspelt filter read as none deleted more than was asked
    (``DELETE /v1/agent/memories?userid=alice``: every memory of the agent's own); a write or
    search whose subject is its body's passed over the list's ``?userId=``."""
    unknown = sorted(set(request.query_params) - set(names))
    if unknown:
        raise InvalidInput.for_field(named(unknown[0]), "unknown query parameter", location="query")


def query_text(request, name: str) -> str | None:
    """The query parameter ``name``, None when absent. Present but empty (``?name=``, a
    client's empty variable) is not absent: 400 (read as a value it narrowed a list to the
    rows without one; review)."""
    value = request.query_params.get(name)
    if value == "":
        raise InvalidInput.for_field(name, "must not be empty", location="query")
    return value


def header_text(request, name: str) -> str | None:
    """A header's value as the text its client sent, UTF-8 (a server hands header values
    over as Latin-1, a character per byte), stripped; None when absent; 400 naming it when
    it is not UTF-8 or given twice."""
    value = request.headers.get(name)
    if value is None:
        return None
    raw = getattr(request, "scope", {}).get("headers", ())  # (an ASGI request's, as sent)
    if sum(sent == name.lower().encode() for sent, _ in raw) > 1:
        # Django joins a header's values with ",": "alice" and "bob" acted for "alice,bob"
        # (review).
        raise InvalidInput.for_field(name, "must be given once", location="header")
    try:
        # (HTTP's own blanks around it, not Unicode's: "carol" and a line separator acted
        # for "carol", where every other way in refuses that id; review.)
        return value.encode("latin-1").decode("utf-8").strip(" \t")
    except UnicodeError:
        raise InvalidInput.for_field(name, "must be UTF-8 text", location="header") from None


def query_choice(request, name: str, choices, default: str | None = None) -> str | None:
    """The query parameter ``name``: one of ``choices``, or ``default`` when absent. Present
    but empty (``?name=``) is not absent: 400, as the schema's enum says."""
    value = request.query_params.get(name)
    if value is None:
        return default
    if value not in choices:
        raise InvalidInput.for_field(name, f"must be one of {', '.join(choices)}")
    return value


_DATETIME = serializers.DateTimeField()


def datetime_text(value) -> str:
    """A time as the serializers write it (ISO 8601, ``settings.TIME_ZONE``), for the APIs
    that build their JSON by hand: one field for all (it keeps no state of a value; making
    one per value cost a tenth of a millisecond for a context's ten messages)."""
    return _DATETIME.to_representation(value)
