"""What the schemathesis tests of the user API and the agent API share: the checks every
response must pass, and the path parameters their hooks mix with the ids of seeded rows."""

from pathlib import Path

import hypothesis.strategies as st
import schemathesis
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

# What ``/v1/schema`` serves (tests/memsvc/test_openapi.py holds the two equal).
COMMITTED_SCHEMA = Path(__file__).resolve().parents[1] / "openapi" / "schema.yaml"


def served_schema(path_regex: str):
    """The API's OpenAPI description, the operations of paths matching ``path_regex``, its
    requests sent to the WSGI application in-process: ``schemathesis.openapi.from_wsgi``
    without making the schema in every test process (3 s of a slow host's CPU each, at
    collection, for each of the two modules)."""
    from memsvc.wsgi import application

    schema = schemathesis.openapi.from_path(COMMITTED_SCHEMA)
    schema.app, schema.location = application, "/v1/schema"
    return schema.include(path_regex=path_regex)


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def with_known_ids(known: dict[str, list[str]], path_parameters):
    """A strategy that keeps each generated path parameter or swaps in one of ``known``'s
    values for it (the ids of seeded rows), so the success paths run too."""
    if not path_parameters:
        return st.just(path_parameters)
    return st.fixed_dictionaries(
        {
            name: st.one_of(st.just(value), st.sampled_from(known[name]))
            if name in known
            else st.just(value)
            for name, value in path_parameters.items()
        }
    )
