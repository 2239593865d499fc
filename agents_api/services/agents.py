"""Writes of agents and their API keys."""

from contextlib import suppress

from django.db import transaction
from django.utils import timezone

from agents_api.keys import hash_secret, new_key
from agents_api.models import (
    Agent,
    ApiKey,
    Scope,
)
from conversations.models import AccessLevel, Membership
from conversations.selectors import groups_owned_by
from conversations.services import conversation_groups_delete, membership_delete
from memsvc.api.errors import Forbidden, InvalidInput, NotFound
from memsvc.api.principals import Principal, hold_agents
from memsvc.db import locked_row


@transaction.atomic
def agent_get_or_create(
    *,
    owner_principal: str,
    name: str,
    description: str = "",
    metadata: dict | None = None,
    loopback_trusted: bool = False,
) -> tuple[Agent, bool]:
    """The named agent of ``owner_principal``, made if missing. ``loopback_trusted``: made by
    the local API for a keyless loopback caller, who may reach it without a key (an existing
    agent keeps what it was)."""
    return Agent.objects.get_or_create(
        owner_principal=owner_principal,
        name=name,
        defaults={
            "description": description,
            "metadata": metadata or {},
            "loopback_trusted": loopback_trusted,
        },
    )


@transaction.atomic
def agent_delete(actor: Principal, *, agent: Agent) -> None:
    """Delete an agent with what it keeps (keys, blocks, memories, tool records), the
    conversations it owns, forks and all (``conversation_groups_delete``: its own one, the
    local API's messages and Letta's captured turns, and those made through ``/v1/agent``,
    as a user's go with their erase: they stayed with an owner that was no more, whom no
    one could ask to delete them or hand them on), and its memberships of others'
    conversations, each removed as an operator removes a member (``membership_delete``: an
    offer of ownership to the agent ends with it). The agent's row is locked first, as a
    capture locks it (``local_conversation_for``) before it writes to the conversation."""
    agent = locked_row(Agent.objects, agent.pk, missing="agent not found")
    owned = groups_owned_by(agent.principal_id).order_by("id").values_list("id", flat=True)
    conversation_groups_delete(agent.as_principal(), group_ids=list(owned))
    memberships = Membership.objects.filter(principal_id=agent.principal_id).exclude(
        access_level=AccessLevel.OWNER
    )
    for membership in memberships.order_by("id"):
        # One removed meanwhile (404), or made the owner's (403), is left as it is now.
        with suppress(NotFound, Forbidden):
            membership_delete(actor, membership=membership, by_operator=True)
    agent.delete()


@transaction.atomic
def api_key_create(
    *, agent: Agent, scopes: list[str] | None = None, name: str = ""
) -> tuple[ApiKey, str]:
    """A new key for ``agent`` and its full text, which is never stored and shown only now.
    The agent is held first (``hold_agents``): one deleted meanwhile is a 404, not a key
    whose agent is gone (its foreign key failed at commit: review)."""
    hold_agents([agent.principal_id])
    scopes = sorted(set(scopes or [Scope.READ, Scope.WRITE]))
    unknown = set(scopes) - set(Scope.values)
    if unknown:
        raise InvalidInput.for_field("scopes", f"unknown scopes: {', '.join(sorted(unknown))}")
    public_id, secret, full_key = new_key()
    api_key = ApiKey.objects.create(
        public_id=public_id,
        agent=agent,
        name=name,
        prefix=full_key[: len("msk_") + len(public_id) + 5],
        secret_hmac=hash_secret(secret),
        scopes=scopes,
    )
    # An agent with a key is reached with its key: no longer without one from loopback.
    Agent.objects.filter(pk=agent.pk, loopback_trusted=True).update(loopback_trusted=False)
    agent.loopback_trusted = False
    return api_key, full_key


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
    return api_key
