"""Who is asking: the one object the rest of the code sees as ``request.principal``."""

from dataclasses import dataclass, field

# Principal ids of agents: ``agent:<uuid>``. Anything else is a user id.
AGENT_PRINCIPAL_PREFIX = "agent:"


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

    # DRF's IsAuthenticated reads this from request.user.
    is_authenticated = True

    @classmethod
    def user(cls, user_id: str) -> "Principal":
        return cls(id=user_id, kind="user")

    @classmethod
    def for_agent(
        cls,
        agent_id,
        *,
        scopes: frozenset[str] = frozenset({"read", "write"}),
        on_behalf_of: str | None = None,
    ) -> "Principal":
        return cls(
            id=f"{AGENT_PRINCIPAL_PREFIX}{agent_id}",
            kind="agent",
            scopes=scopes,
            agent_id=str(agent_id),
            on_behalf_of=on_behalf_of,
        )

    @property
    def member_ids(self) -> tuple[str, ...]:
        """Every principal whose membership a request needs (one, or the agent and its user)."""
        return (self.id, self.on_behalf_of) if self.on_behalf_of else (self.id,)

    @property
    def owner_id(self) -> str:
        """Who owns what this principal creates."""
        return self.on_behalf_of or self.id
