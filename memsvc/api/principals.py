"""Who is asking: the one object the rest of the code sees as ``request.principal``; and
which principal ids exist."""

import unicodedata
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError

from memsvc.api.errors import InvalidInput, NotFound
from memsvc.text import (
    INVISIBLE_PROBLEM,
    has_bidi_controls,
    has_blank_ends,
    has_control_characters,
    has_line_separators,
    named,
)
from memsvc.validators import (
    DOT_SEGMENT_PROBLEM,
    LONE_SURROGATE_PROBLEM,
    as_uuid,
    has_dot_segment,
    has_invisible_characters,
    has_lone_surrogates,
    has_unnormalised_letters,
)

# The owners of memsvc's own agents: the local API's and the operator's (``memsvc apikey
# create``, ``memsvc mcp``), and the pages' assistant's. No user is either: a user "local"
# had every operator agent as an agent of their own on the pages, its blocks in a prompt
# they read back (review).
LOCAL_OWNER = "local"
PAGES_OWNER = "memsvc"
SERVICE_OWNERS = frozenset({LOCAL_OWNER, PAGES_OWNER})

# Principal ids of agents: ``agent:<uuid>``. Anything else is a user id.
AGENT_PRINCIPAL_PREFIX = "agent:"
# The width of every column that holds a principal id.
PRINCIPAL_MAX_LENGTH = 255


def user_id_problem(value, *, given: bool = False) -> str | None:
    """Why ``value`` cannot be a user id (a JWT ``sub``, ``X-On-Behalf-Of``, a ``userId``
    parameter), or None when it can: a non-empty string PostgreSQL can store in a principal
    column, without control characters (a tab, an escape: no one's name), line separators,
    bidirectional or invisible ones (which show it as another id), that does not name an agent (a user
    called ``agent:...`` would borrow that agent's memberships) and that a member's routes
    can name (not a dot segment).

    ``given``: an id introduced here (shared with, offered a conversation, a login made, an
    agent's owner), held to the rules made later too: NFKC, and no ``agent:`` in any case.
    An id presented (a token's, a lookup's, an import's) is not: one stored before them
    still authenticates, erases and exports (code review)."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if value in SERVICE_OWNERS:
        return f"must not be {value!r}: it owns memsvc's own agents"
    if "\x00" in value:
        return "must not contain NUL characters"
    if has_lone_surrogates(value):  # (a JWT's sub was a 500 where it was counted; review)
        return LONE_SURROGATE_PROBLEM
    if has_control_characters(value):
        return "must not contain control characters"
    if has_line_separators(value):
        # (one id shown as two: "mallory\u2028alice" as "mallory" and "alice"; review)
        return "must be one line"
    if has_bidi_controls(value):
        # (one id shown as another's: "\u202eecila" as "alice", in a list of members)
        return "must not contain bidirectional control characters"
    if has_invisible_characters(value):
        # (one id that looks like another: "ali\u200bce" is listed as "alice")
        return INVISIBLE_PROBLEM
    if has_blank_ends(value):
        return "must not begin or end with a space"  # ("bob " is listed as "bob")
    if given and has_unnormalised_letters(value):
        # (As a login's name is read: "\ufb01sh" logs in as "fish"; review.) Unless that form
        # is refused in its turn: "\uff21gent:x" was told to be written "Agent:x" (review).
        normal = unicodedata.normalize("NFKC", value)
        return user_id_problem(normal, given=True) or (
            f"must be written as it reads in Unicode's NFKC form: {named(normal)!r}"
        )
    if len(value) > PRINCIPAL_MAX_LENGTH:
        return f"must be at most {PRINCIPAL_MAX_LENGTH} characters"
    agent_like = value[: len(AGENT_PRINCIPAL_PREFIX)]
    if agent_like == AGENT_PRINCIPAL_PREFIX or (
        given and agent_like.casefold() == AGENT_PRINCIPAL_PREFIX
    ):
        # (given, in any case: "AGENT:<id>" was a user who looked like an agent; review)
        return "must name a user, not an agent"
    if has_dot_segment(value):
        # (a member's routes name them: "remove member .." reached the conversation's own
        # DELETE, and deleted it; review)
        return DOT_SEGMENT_PROBLEM
    return None


def agent_owner_problem(owner: str) -> str | None:
    """Why ``owner`` cannot own a new agent, or None: a user id given here, or the local
    API's and the operator's owner (``LOCAL_OWNER``)."""
    return None if owner == LOCAL_OWNER else user_id_problem(owner, given=True)


def user_id_validator(value) -> None:
    """``user_id_problem`` as a Django validator: a login's username, which the pages act
    as (``memsvc.apps``: the admin's form and ``manage.py createsuperuser`` alike)."""
    if problem := user_id_problem(value, given=True):
        raise ValidationError(f"A user id {problem}.", code="invalid")


@dataclass(frozen=True)
class Principal:
    """A user (``id`` = the JWT ``sub``) or an agent (``id`` = ``agent:<uuid>``).

    ``on_behalf_of`` is the user an agent acts for (``X-On-Behalf-Of``); such a request
    needs both the agent's and the user's access, and what it creates belongs to the user.
    """

    id: str
    kind: str  # "user" | "agent"
    scopes: frozenset[str] = field(default_factory=frozenset)
    agent_id: str | None = None
    on_behalf_of: str | None = None
    # How the principal signs what it writes: an agent's name; a user's id.
    name: str = ""

    # DRF's IsAuthenticated reads this from request.user.
    is_authenticated = True

    @classmethod
    def user(cls, user_id: str) -> "Principal":
        return cls(id=user_id, kind="user", name=user_id)

    @classmethod
    def for_agent(
        cls,
        agent_id,
        *,
        name: str = "",
        scopes: frozenset[str] = frozenset({"read", "write"}),
        on_behalf_of: str | None = None,
    ) -> "Principal":
        return cls(
            id=f"{AGENT_PRINCIPAL_PREFIX}{agent_id}",
            kind="agent",
            scopes=scopes,
            agent_id=str(agent_id),
            on_behalf_of=on_behalf_of,
            name=name,
        )

    @property
    def rate_limit_key(self) -> str:
        """Whose requests this one counts with (memsvc.api.ratelimit)."""
        return self.id if self.kind == "agent" else f"user:{self.id}"

    @property
    def member_ids(self) -> tuple[str, ...]:
        """Every principal whose membership a request needs (one, or the agent and its user)."""
        return (self.id, self.on_behalf_of) if self.on_behalf_of else (self.id,)

    @property
    def owner_id(self) -> str:
        """Who owns what this principal creates."""
        return self.on_behalf_of or self.id


# --- which agents exist ----------------------------------------------------------------------

# Conversations are shared with agents, but agents are built on conversations: the
# conversations app cannot import the agents app. The agents app tells, at start-up
# (``AgentsApiConfig.ready``), how to know whether an agent exists.
_agent_exists: Callable[[uuid.UUID], bool] | None = None
# ... and how to hold agents' rows until the transaction ends: the ids of those that exist.
_agents_held: Callable[[list[uuid.UUID]], set[uuid.UUID]] | None = None


def register_agent_lookup(
    exists: Callable[[uuid.UUID], bool], held: Callable[[list[uuid.UUID]], set[uuid.UUID]]
) -> None:
    global _agent_exists, _agents_held
    _agent_exists, _agents_held = exists, held


def hold_agents(principal_ids: Iterable[str]) -> None:
    """Hold the agents among ``principal_ids`` until the transaction ends, for a write that
    makes one an owner or a member: the agent's deletion (``agents_api.services.agent_delete``)
    waits for it, then deletes what it wrote; one that comes later finds the agent gone (404
    ``agent not found``). A conversation an agent made while it was deleted was left owned by
    no one (review). Nothing for users."""
    wanted = {agent for principal_id in principal_ids if (agent := agent_uuid_of(principal_id))}
    if wanted and _agents_held is not None and _agents_held(sorted(wanted)) != wanted:
        raise NotFound("agent not found")


def agent_uuid_of(principal_id: str) -> uuid.UUID | None:
    """The agent id in ``agent:<id>``; None for a user, or an id that is not one."""
    if not principal_id.startswith(AGENT_PRINCIPAL_PREFIX):
        return None
    return as_uuid(principal_id.removeprefix(AGENT_PRINCIPAL_PREFIX))


def agent_principal_id(agent_id, *, field: str) -> str:
    """``agent:<id>`` of an existing agent (users know agents by the id of
    ``GET /v1/agent/me``); 400 naming ``field`` otherwise."""
    agent_uuid = as_uuid(str(agent_id))
    if agent_uuid is None or _agent_exists is None or not _agent_exists(agent_uuid):
        raise InvalidInput.for_field(field, "no such agent")
    return f"{AGENT_PRINCIPAL_PREFIX}{agent_uuid}"


def stored_principal_id(principal_id: str) -> str:
    """``principal_id`` as memberships store it: an agent's as ``agent:<id>`` with the id in
    its canonical form (``agent_principal_id``), so that the id a member was shared with
    names their membership, however its letters were written; a user's as it is."""
    agent_uuid = agent_uuid_of(principal_id)
    return f"{AGENT_PRINCIPAL_PREFIX}{agent_uuid}" if agent_uuid else principal_id


def principal_for_sharing(principal_id: str, *, field: str) -> str:
    """A principal to share with: a user id (``user_id_problem``: one no user can have is a
    400), or ``agent:<id>`` of an existing agent."""
    if principal_id.startswith(AGENT_PRINCIPAL_PREFIX):
        return agent_principal_id(principal_id.removeprefix(AGENT_PRINCIPAL_PREFIX), field=field)
    problem = user_id_problem(principal_id, given=True)
    if problem:
        raise InvalidInput.for_field(field, problem)
    return principal_id
