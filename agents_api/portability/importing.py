"""A document put back (``memsvc import``), all of it or nothing: checked, then each of its
sections restored (``restore``) in one transaction."""

from dataclasses import dataclass, field

from django.db import IntegrityError, transaction

from agents_api.models import Agent
from agents_api.portability.export import FORMAT, VERSION
from agents_api.portability.records import AgentRecord
from agents_api.portability.restore import ImportRefused, parse_records
from agents_api.portability.sections import AGENT_SECTIONS, USER_SECTIONS


@dataclass
class ImportResult:
    kind: str
    subject: str  # the user id, or the agent's name and id
    stored: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)


def document_import(document) -> ImportResult:
    """Store what ``document`` (an export, parsed) holds; ``ImportRefused`` when it is not
    one of ours, contradicts itself, or collides with what is stored (then nothing is)."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ImportRefused(f"not a {FORMAT} document")
    if document.get("version") != VERSION:
        raise ImportRefused(f"version {document.get('version')!r} (this server reads {VERSION})")
    kind = document.get("kind")
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
    try:
        with transaction.atomic():
            subject = user_id if kind == "user" else _agent(agent_data)
            for section in sections:
                records = parsed[section.name]
                stored = section.restore(subject, records)
                result.stored[section.name] = stored
                result.skipped[section.name] = len(records) - stored
    except IntegrityError as exc:
        raise ImportRefused(f"it collides with what is stored: {exc}".strip()) from None
    return result


def _agent(data: dict) -> Agent:
    """The agent of an agent's document: the one with its id, or made again."""
    agent = Agent.objects.filter(id=data["id"]).first()
    if agent is None:
        agent = Agent.objects.create(**data)
    return agent
