"""What the schemathesis tests of the user API and the agent API share: the checks every
response must pass, and the path parameters their hooks mix with the ids of seeded rows."""

import hypothesis.strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

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
