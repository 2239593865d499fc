"""A document put back, all of it or nothing: checked, then each of its sections restored
(``restore``) in one transaction. ``memsvc import`` (the operator's: any document, each
record where it was) and ``POST /v1/agent/import`` (an agent's own: its memory from an
export, put in the agent as it could have written it itself)."""

from dataclasses import dataclass, field

from django.db import DataError, IntegrityError, transaction

from agents_api.models import Agent
from agents_api.portability.export import FORMAT, VERSION
from agents_api.portability.records import AgentRecord
from agents_api.portability.restore import ImportCollides, ImportRefused, parse_records
from agents_api.portability.sections import AGENT_SECTIONS, USER_SECTIONS
from agents_api.selectors import memory_off_for, messages_seen_by
from conversations.selectors import visible_conversation_ids
from memsvc.api.fields import contains_nul


@dataclass
class ImportResult:
    kind: str
    subject: str  # the user id, or the agent's name and id
    stored: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)


def document_import(document, *, into: Agent | None = None) -> ImportResult:
    """Store what ``document`` (an export, parsed) holds; ``ImportRefused`` when it is not
    one of ours or contradicts itself, ``ImportCollides`` when it collides with what is
    stored (then nothing is).

    ``into``: an agent importing with its own key. Only an agent's document, every record
    put in ``into`` (``_as_its_own``)."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ImportRefused(f"not a {FORMAT} document")
    if document.get("version") != VERSION:
        raise ImportRefused(f"version {document.get('version')!r} (this server reads {VERSION})")
    if contains_nul(document):
        raise ImportRefused("it holds a NUL character, which no text here can")
    kind = document.get("kind")
    if into is not None and kind != "agent":
        raise ImportRefused(f"kind: {kind!r}: an agent imports an agent's document")
    if kind == "user":
        user_id = document.get("userId")
        if not isinstance(user_id, str) or not user_id:
            raise ImportRefused("userId: missing")
        sections, result = USER_SECTIONS, ImportResult(kind, user_id)
    elif kind == "agent":
        [agent_data] = parse_records(AgentRecord, [document.get("agent")], "agent")
        sections = AGENT_SECTIONS
        result = ImportResult(kind, f"{agent_data['name']} ({agent_data['id']})")
    else:
        raise ImportRefused(f"kind: {kind!r} is neither user nor agent")
    parsed = {
        section.name: parse_records(section.record, document.get(section.name, []), section.name)
        for section in sections
    }
    given = {name: len(records) for name, records in parsed.items()}
    if into is not None:
        _as_its_own(into, agent_data["id"], parsed)
    try:
        with transaction.atomic():
            subject = user_id if kind == "user" else (into or _agent(agent_data))
            for section in sections:
                stored = section.restore(subject, parsed[section.name])
                result.stored[section.name] = stored
                result.skipped[section.name] = given[section.name] - stored
    except IntegrityError as exc:
        raise ImportCollides(f"it collides with what is stored: {exc}".strip()) from None
    except DataError:
        # (PostgreSQL's own words would name its internals.)
        raise ImportRefused("a value does not fit where it is stored (too long?)") from None
    return result


def _as_its_own(agent: Agent, document_agent_id, parsed: dict[str, list[dict]]) -> None:
    """An agent's document made what ``agent`` could have written itself through the API:
    new ids for its memories and tool records (made here, as for every new row: an id of
    someone else's row is never tried), cited messages and tool records' conversations only
    those the agent sees (the others dropped, as a random id would be), no memory about a
    user who turned memory off (skipped), and the document's agent, where a block's history
    names it, is this one."""
    actor = agent.as_principal()
    off = memory_off_for(memory["user_id"] for memory in parsed["memories"])
    memories = [memory for memory in parsed["memories"] if memory["user_id"] not in off]
    seen = messages_seen_by(actor, [i for memory in memories for i in memory["message_ids"]])
    for memory in memories:
        del memory["id"]
        memory["message_ids"] = [i for i in memory["message_ids"] if i in seen]
    parsed["memories"] = memories

    records = parsed["toolRecords"]
    visible = set(
        visible_conversation_ids(actor)
        .filter(id__in=[r["conversation_id"] for r in records if r["conversation_id"]])
        .values_list("id", flat=True)
    )
    for record in records:
        del record["id"]
        if record["conversation_id"] not in visible:
            record["conversation_id"] = None

    old_self = Agent(id=document_agent_id).principal_id
    for block in parsed["memoryBlocks"]:
        for revision in block["exported_revisions"]:
            if revision["actor_principal"] == old_self:
                revision["actor_principal"] = agent.principal_id


def _agent(data: dict) -> Agent:
    """The agent of an agent's document: the one with its id, or made again."""
    agent = Agent.objects.filter(id=data["id"]).first()
    if agent is None:
        agent = Agent.objects.create(**data)
    return agent
