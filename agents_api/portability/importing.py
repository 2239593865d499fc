"""A document put back, all of it or nothing: checked, then each of its sections restored
(``restore``) in one transaction. ``memsvc import`` (the operator's: any document, each
record where it was) and ``POST /v1/agent/import`` (an agent's own: its memory from an
export, put in the agent as it could have written it itself)."""

from dataclasses import dataclass, field

from django.apps import apps
from django.db import DataError, IntegrityError, transaction
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from agents_api.api.serializers import TagsField
from agents_api.models import Agent, Scope, UserErasure
from agents_api.portability.export import FORMAT, VERSION
from agents_api.portability.records import AgentRecord
from agents_api.portability.restore import (
    ImportCollides,
    ImportRefused,
    not_after_now,
    parse_records,
    sequences_past_stored_numbers,
)
from agents_api.portability.sections import AGENT_SECTIONS, USER_SECTIONS
from agents_api.selectors import LOCAL_OWNER, erasures_of, messages_seen_by
from agents_api.services.blocks import check_readable
from agents_api.services.data_rights import user_traces_erase
from conversations.models import AccessLevel, Conversation
from conversations.selectors import said_by, visible_conversation_ids
from memsvc.api.errors import InvalidInput
from memsvc.api.fields import contains_nul
from memsvc.api.parsers import DOCUMENT_MAX_JSON_DEPTH, json_problem
from memsvc.api.principals import user_id_problem
from memsvc.db import hold_users
from memsvc.text import named

UNIQUE_VIOLATION = "23505"  # PostgreSQL's SQLSTATE


@dataclass
class ImportResult:
    kind: str
    subject: str  # the user id, or the agent's name and id
    stored: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)


def document_import(
    document, *, into: Agent | None = None, impersonates: bool = True
) -> ImportResult:
    """Store what ``document`` (an export, parsed) holds; ``ImportRefused`` when it is not
    one of ours or contradicts itself, ``ImportCollides`` when it collides with what is
    stored (then nothing is).

    ``into``: an agent importing with its own key. Only an agent's document, every record
    put in ``into`` (``_as_its_own``); a tool record made for a user only with a key that
    may act for users (``impersonates``), as the API makes one."""
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ImportRefused(f"not a {FORMAT} document")
    version = document.get("version")
    if type(version) is not int or version != VERSION:  # (true == 1 to Python)
        raise ImportRefused(f"version {version!r} (this server reads {VERSION})")
    # (Before anything that walks it recursively.)
    problem = json_problem(document, DOCUMENT_MAX_JSON_DEPTH)
    if problem:
        path, message = problem
        raise ImportRefused(f"{'.'.join(map(str, path)) or 'the document'}: {message}")
    if contains_nul(document):
        raise ImportRefused("it holds a NUL character, which no text here can")
    kind = document.get("kind")
    if into is not None and kind != "agent":
        raise ImportRefused(f"kind: {kind!r}: an agent imports an agent's document")
    if kind == "user":
        user_id = document.get("userId")
        if not isinstance(user_id, str) or not user_id:
            raise ImportRefused("userId: missing")
        if problem := user_id_problem(user_id):
            raise ImportRefused(f"userId: {problem}")
        sections, result = USER_SECTIONS, ImportResult(kind, user_id)
    elif kind == "agent":
        if not isinstance(document.get("agent"), dict):
            raise ImportRefused("agent: missing (an object: the agent's id, name, ...)")
        [agent_data] = parse_records(AgentRecord, [document["agent"]], "agent")
        sections = AGENT_SECTIONS
        result = ImportResult(kind, f"{agent_data['name']} ({agent_data['id']})")
    else:
        raise ImportRefused(f"kind: {kind!r} is neither user nor agent")
    # A name no export writes (a typo, "memroies"): its records were skipped in silence, and
    # the import said it was done (review).
    header = {"format", "version", "kind", "exportedAt", "userId" if kind == "user" else "agent"}
    unknown = sorted(set(document) - header - {section.name for section in sections})
    if unknown:
        raise ImportRefused(f"{named(unknown[0])}: no part of {kind} documents")
    parsed = {
        section.name: parse_records(section.record, document.get(section.name, []), section.name)
        for section in sections
    }
    given = {name: len(records) for name, records in parsed.items()}
    try:
        with transaction.atomic():
            # Before any other lock: nothing is put back about a user whose erase is in
            # flight until it ends (``hold_users``).
            hold_users(
                {user_id if kind == "user" else "", *_users_named(parsed), *_members_named(parsed)}
            )
            if into is not None:
                _as_its_own(into, parsed, impersonates=impersonates)
            if kind == "user":
                _within_its_own(user_id, parsed)
            subject = user_id if kind == "user" else (into or _agent(agent_data))
            for section in sections:
                stored = section.restore(subject, parsed[section.name])
                result.stored[section.name] = stored
                result.skipped[section.name] = given[section.name] - stored
            if kind == "user":
                _erased_again(user_id, parsed, result)
                _restored(user_id, parsed)
            sequences_past_stored_numbers()
    # (In our own words: PostgreSQL's would name its internals and echo whole rows.)
    except IntegrityError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == UNIQUE_VIOLATION:
            raise ImportCollides(_collision(exc.__cause__)) from None
        raise ImportRefused(_broken_rule(exc.__cause__)) from None
    except DataError:
        raise ImportRefused("a value does not fit where it is stored (too long?)") from None
    return result


# What a unique constraint broken by an import says, by constraint (else the id of the
# table's rows, named as its model is); the one message for all of them named neither the
# record nor the problem (review).
_COLLISIONS = {
    "membership_one_owner_per_group": "a group has one owner: a membership of the document "
    "makes a second one",
    "membership_unique": "a membership is stored already, or is in the document twice",
    "memory_block_unique_label": "a block's label is stored already, or is in the document twice",
    "memory_unique_content": "a memory's content is stored already, or is in the document twice",
    "agent_name_unique_per_owner": "an agent's name is taken here",
    # (It said a message's id was, where none was: review.)
    "message_seq_key": "a message's place (seq) is taken here, or is in the document twice",
}


def _collision(error) -> str:
    """What collided, in our words, from PostgreSQL's unique violation ``error``: its
    constraint or its table, never its text (which names internals and echoes rows)."""
    diagnosis = getattr(error, "diag", None)
    said = _COLLISIONS.get(getattr(diagnosis, "constraint_name", None) or "")
    if said is not None:
        return said
    table = getattr(diagnosis, "table_name", None)
    names = {model._meta.db_table: model._meta.verbose_name for model in apps.get_models()}
    name = names.get(table, "record")
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}'s id is stored already, or is in the document twice"


# What another rule broken by an import says, by constraint (else the rule's name): "a
# record breaks a rule" named neither the record nor the rule among 100,000 (review).
_RULES = {
    "conversation_group_one_owner": "a conversation group has no owner, or more than one: "
    "its owner's membership must be in the document (memberships)",
}


def _broken_rule(error) -> str:
    """The rule PostgreSQL's ``error`` says an import broke, in our words or by its name,
    never its text (which names internals and echoes rows)."""
    constraint = getattr(getattr(error, "diag", None), "constraint_name", None)
    if constraint in _RULES:
        return _RULES[constraint]
    rule = f" ({constraint})" if constraint else ""
    return f"a record breaks a rule of what is stored{rule}"


def _restored(user_id: str, parsed: dict[str, list[dict]]) -> None:
    """The user's erasure, once their own document is back: restored, and the conversations
    it brought back are no longer of those it took (a record made in one after, and kept
    unlinked when it was deleted, was left out of an import as if the erase had taken it;
    review)."""
    named = [record["id"] for record in parsed["conversations"]]
    back = set(Conversation.objects.filter(id__in=named).values_list("id", flat=True))
    for erasure in UserErasure.objects.select_for_update().filter(user_id=user_id):
        erasure.restored_at = timezone.now()
        erasure.conversation_ids = [i for i in erasure.conversation_ids if i not in back]
        erasure.save(update_fields=["restored_at", "conversation_ids"])


def _erased_again(user_id: str, parsed: dict[str, list[dict]], result: ImportResult) -> None:
    """What a user's document brought back of others erased since it was made (its
    conversations hold every member's turns and memberships, and the tool records made for
    them there): erased again by their erase's own service (``user_traces_erase``: a fork
    at one of their turns starts at the message before), within the document's groups, but
    what they did after their erase. The user's own erasure stays: their own document
    brings their data back, and what it did not bring back stays erased (review:
    forgetting it let any older document undo it)."""
    groups = {record["group_id"] for record in parsed["conversations"]}
    named = _members_named(parsed) | _users_named(parsed)
    for user, erased_at in erasures_of(named - {user_id}).items():
        erased = user_traces_erase(user, within=groups, made_before=erased_at)
        for section, count in [
            ("messages", erased.messages),
            ("memberships", erased.memberships),
            ("ownershipTransfers", erased.ownership_transfers),
            ("toolRecords", erased.tool_records),
        ]:
            result.stored[section] -= count
            result.skipped[section] += count


def _members_named(parsed: dict[str, list[dict]]) -> set[str]:
    """Who a user's document names in its conversations: members, those whose turns they
    are, those who offered or were offered one (nobody, in an agent's document)."""
    named = {record["principal_id"] for record in parsed.get("memberships", [])}
    for record in parsed.get("ownershipTransfers", []):
        named |= {record["from_principal"], record["to_principal"]}
    for record in parsed.get("messages", []):
        named.add(
            said_by(
                role=record["role"],
                author_principal=record["author_principal"],
                author_name=record["author_name"],
            )
        )
    return named


def _users_named(parsed: dict[str, list[dict]]) -> set[str]:
    """The users a document's records are about (memories, blocks, tool records, a
    switch: their ``user_id``; "" for an agent's own)."""
    return {record.get("user_id", "") for records in parsed.values() for record in records}


def _as_its_own(agent: Agent, parsed: dict[str, list[dict]], *, impersonates: bool) -> None:
    """An agent's document made what ``agent`` could have written itself through the API.
    Every row is new: new ids and block numbers (made here, as for every new row: no id of
    someone else's row is ever tried), no time later than now, a memory not yet used
    (``accessCount`` 0), a block's history one revision (its value, by this agent, now: the
    document's history is not the agent's to tell). Cited messages and tool records'
    conversations only those the agent sees (the others dropped, as a random id would be);
    no memory whose time is up (skipped, as the API refuses an ``expiresAt`` not in the
    future: a document that was exported, and is imported later, is not wrong for it).
    (What is about a user who turned memory off, or was erased after it was made, is
    skipped by every import: ``restore._agents_for``.) Each memory keeps its ``source``:
    how it was first kept (from a conversation, through MCP, ...)."""
    actor, now = agent.as_principal(), timezone.now()
    # The API's rules of what it writes (``TagsField``'s, as a save holds them to):
    # ``records.MemoryRecord`` takes tags as stored.
    given = TagsField()
    for memory in parsed["memories"]:
        try:
            given.run_validation(memory["tags"])
        except ValidationError as exc:
            [(place, [problem, *_])] = list(exc.detail.items())[:1]
            tag = memory["tags"][place]
            raise ImportRefused(f"memories: the tag {tag!r}: {problem}") from None
    memories = [memory for memory in parsed["memories"] if memory["expires_at"] > now]
    seen = messages_seen_by(actor, [i for memory in memories for i in memory["message_ids"]])
    for memory in memories:
        memory["message_ids"] = [i for i in memory["message_ids"] if i in seen]
        memory.update(access_count=0, last_accessed_at=None)
    parsed["memories"] = memories

    records = parsed["toolRecords"]
    made_for = next((r["user_id"] for r in records if r["user_id"]), None)
    if made_for is not None and not impersonates:
        # (Through the API a record is a user's only by ``X-On-Behalf-Of``.)
        raise ImportRefused(
            f"toolRecords: one is made for {made_for!r}: that needs a key with the "
            f"'{Scope.IMPERSONATE}' scope"
        )
    named = {r["conversation_id"] for r in records if r["conversation_id"]}
    visible = set(visible_conversation_ids(actor).filter(id__in=named).values_list("id", flat=True))
    # Unlinked here: those that exist and the agent does not see. One that is gone is left
    # to ``restore.restore_tool_records``, as in every import (unlinked, or skipped when it
    # went with its owner's erase: unlinked here first, it came back; review).
    hidden = set(Conversation.objects.filter(id__in=named - visible).values_list("id", flat=True))
    for record in records:
        if record["conversation_id"] in hidden:
            record["conversation_id"] = None

    for block in parsed["memoryBlocks"]:
        # (A value of blanks alone, which every write refuses, was stored: review.)
        try:
            check_readable(block["value"], "value")
        except InvalidInput as exc:
            raise ImportRefused(f"memoryBlocks: {block['label']!r}: {exc.message}") from None
        block["exported_revisions"] = [
            {"value": block["value"], "actor_principal": actor.id, "created_at": now}
        ]
    rows = [*memories, *records, *parsed["memoryBlocks"]]
    for row in rows:
        del row["id"]
    not_after_now(rows, "created_at", "updated_at")


def _within_its_own(user_id: str, parsed: dict[str, list[dict]]) -> None:
    """Refuses a user's document unless the memberships, messages and transfers it holds
    of the user's own conversations are in those (whose groups the import makes: a group's
    id stored already collides), the user owns them, and its forks are forked from those,
    in their group. What it holds of others' conversations ("...Elsewhere") is checked
    against the user in ``restore``."""
    owner = next(
        (
            r["principal_id"]
            for r in parsed["memberships"]
            if r["access_level"] == AccessLevel.OWNER and r["principal_id"] != user_id
        ),
        None,
    )
    if owner is not None:  # (and a group has one owner: the database holds that)
        raise ImportRefused(f"memberships: {owner} is not {user_id}, who owns its conversations")
    conversations = {record["id"] for record in parsed["conversations"]}
    groups = {record["group_id"] for record in parsed["conversations"]}
    for section, key, own in (
        ("memberships", "group_id", groups),
        ("messages", "conversation_id", conversations),
        ("ownershipTransfers", "conversation_id", conversations),
        ("ownershipTransfers", "group_id", groups),
    ):
        stranger = next((r[key] for r in parsed[section] if r[key] not in own), None)
        if stranger is not None:
            raise ImportRefused(f"{section}: {stranger} is not of the document's conversations")
    # A fork reads its parent's messages up to its fork point: both are of its own group.
    group_of = {record["id"]: record["group_id"] for record in parsed["conversations"]}
    group_of.update(
        (record["id"], group_of[record["conversation_id"]]) for record in parsed["messages"]
    )
    for record in parsed["conversations"]:
        for point in (record["forked_at_conversation_id"], record["forked_at_message_id"]):
            if point is not None and group_of.get(point) != record["group_id"]:
                raise ImportRefused(
                    f"conversations: {record['id']} is not forked within its own group"
                )
    _forks_form_trees(parsed)


def _forks_form_trees(parsed: dict) -> None:
    """Each fork's ancestry ends at a root, and its fork point is a message of its parent or
    of one of the parent's ancestors (what the fork reads). Conversations forked from each
    other in a ring were imported, and reading one then walked the ring until the statement
    timed out (30 s of a connection, then a 503, on every read).

    In time linear in the conversations: each is settled once (a walk up stops at one
    settled before), and "is an ancestor of" is read from a depth-first walk of the forks'
    trees (an ancestor is entered before and left after). Walking each one's whole ancestry
    took 14.8 s for a chain of 2,000 forks, inside the import's transaction."""
    parent_of = {r["id"]: r["forked_at_conversation_id"] for r in parsed["conversations"]}
    settled: set = set()
    for start in parent_of:
        path, on_path, node = [], set(), start
        while node is not None and node not in settled:
            if node in on_path:
                raise ImportRefused(
                    f"conversations: {start} is forked from itself, through its forks"
                )
            path.append(node)
            on_path.add(node)
            node = parent_of.get(node)
        settled.update(path)
    children: dict = {}
    for conversation, parent in parent_of.items():
        children.setdefault(parent, []).append(conversation)
    entered, left, clock = {}, {}, 0
    stack = [(root, False) for root in children.get(None, [])]
    while stack:
        node, leaving = stack.pop()
        clock += 1
        if leaving:
            left[node] = clock
            continue
        entered[node] = clock
        stack.append((node, True))
        stack.extend((child, False) for child in children.get(node, []))
    conversation_of = {r["id"]: r["conversation_id"] for r in parsed["messages"]}
    for record in parsed["conversations"]:
        point = record["forked_at_message_id"]
        if point is None:
            continue
        forked_from, me = conversation_of.get(point), record["id"]
        if not (
            forked_from in entered
            and forked_from != me
            and entered[forked_from] < entered[me]
            and left[me] < left[forked_from]
        ):
            raise ImportRefused(
                f"conversations: {record['id']}'s fork point is not a message it forks from"
            )


def _agent(data: dict) -> Agent:
    """The agent of an agent's document: the one with its id, when it is the document's
    owner's; or made again, unless its owner has another agent of its name. An agent of
    someone else is not given the document's records (whoever its id names)."""
    owner, name = data["owner_principal"], data["name"]
    agent = Agent.objects.select_for_update().filter(id=data["id"]).first()
    if agent is not None:
        if agent.owner_principal != owner:
            raise ImportRefused(
                f"agent: {agent.id} is an agent of {agent.owner_principal} here, not of {owner}"
            )
        return agent
    if Agent.objects.filter(owner_principal=owner, name=name).exists():
        raise ImportCollides(f"agent: {owner} has an agent named {name!r} here, of another id")
    # Keyless trust is the local API's agents' only (``selectors.local_agent``).
    data["loopback_trusted"] = data.get("loopback_trusted", False) and owner == LOCAL_OWNER
    return Agent.objects.create(**data)
