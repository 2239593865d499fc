"""The MCP tools, one registry for every transport.

Each tool checks the scope the agent API asks for the same operation, checks its arguments
against the JSON schema it publishes, then parses them with the agent API's serializers and
calls the same services and selectors, so a rule (importance in 0..1, a block's limit, who
may see a conversation) holds alike through REST and MCP. Results are the agent API's JSON
made compact (kagent's LoadMemory: no null or empty fields, fewer tokens for the model);
refusals are the API's error shape, returned as a tool error the model can read.

Tools are plain functions run in a worker thread (``server``): Django's ORM is synchronous.
"""

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import jsonschema
from django.conf import settings
from django.db import DatabaseError

from agents_api import selectors, services
from agents_api.api import serializers as s
from agents_api.api.memories import search_memories
from agents_api.authentication import authenticate_key, principal_for_key, require_scope
from agents_api.models import (
    MEMORY_DEFAULT_IMPORTANCE,
    MEMORY_MAX_MESSAGES,
    MEMORY_MAX_TAGS,
    MEMORY_TAG_MAX_LENGTH,
    Agent,
    MemorySource,
    Scope,
)
from conversations.api.serializers import SearchMessagesIn, SearchResultsOut
from memsvc.api.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    Unavailable,
    as_api_error,
    error_body,
)
from memsvc.api.fields import contains_nul
from memsvc.api.middleware import InternalError, exception_refusal
from memsvc.api.pagination import DEFAULT_LIMIT, MAX_LIMIT, page_data
from memsvc.api.principals import Principal
from memsvc.db import DATABASE_GONE_SAID, database_gone, like_a_request
from memsvc.text import named
from search.selectors import search_messages

logger = logging.getLogger(__name__)

# The ASGI scope key under which the /mcp view hands the authenticated caller to the tools.
CALLER_SCOPE_KEY = "memsvc.caller"

# The server's instructions (kagent's two lines, with where the other tools fit).
INSTRUCTIONS = """\
This server is your long-term memory across sessions.
Use memory_search when you need more context: before answering anything that may depend on \
the user's preferences, earlier decisions or past work; conversation_search finds what was \
said word for word.
Use memory_save for findings and learnings worth keeping: durable facts, preferences, \
decisions, project conventions (one self-contained fact per call).
memory_block_list shows the always-relevant notes; memory_block_append and \
memory_block_replace keep them current."""


@dataclass(frozen=True)
class Caller:
    """Who calls the tools: an agent, with the scopes of its API key (a local agent in local
    mode has read and write), acting for the user of ``X-On-Behalf-Of`` if any."""

    principal: Principal
    agent: Agent
    # The key to check again at each call (stdio: the process's key, taken once at its
    # start; revoked meanwhile it kept working: review). Over HTTP each request's key is.
    api_key: str | None = None

    @classmethod
    def of_key(cls, api_key: str) -> "Caller":
        """The agent of ``api_key`` with the key's scopes, as the key stands now (revoked or
        unknown: ``Unauthorized``)."""
        key = authenticate_key(api_key)
        return cls(principal=principal_for_key(key, None), agent=key.agent, api_key=api_key)

    def as_it_stands(self) -> "Caller":
        """This caller with its key as it stands now: revoked or its agent gone, a 401 as
        over HTTP; its scopes changed, the new ones. Without a key (``memsvc mcp --agent``),
        its agent deleted meanwhile is a 404 (its saves said "the memory store is
        unavailable", its lists answered nothing: review)."""
        if self.api_key is not None:
            return Caller.of_key(self.api_key)
        if not Agent.objects.filter(pk=self.agent.pk).exists():
            raise NotFound("this session's agent was deleted; start memsvc mcp again")
        return self

    @property
    def subject(self) -> str:
        """Whose memories and blocks the tools reach: the user the key acts for, else the
        agent's own (the agent API without ``userId``)."""
        return selectors.memory_subject(self.principal, user_id=None)


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    properties: dict
    required: tuple[str, ...]
    scope: str  # what the agent API needs for the same operation
    run: Callable[[Caller, dict], dict]
    # A write that answers with what only a reader may see (a block's whole value): needs
    # ``read`` too, as the agent API's (``require_scope``'s ``answers_stored``).
    writes_read: bool = False
    # The agent API's fields the tool fills, by the argument that fills each: a refusal of
    # one names the argument (a model was told to fix an ``append`` it never sent; review).
    fields: dict[str, str] = field(default_factory=dict)

    read_only: bool = False
    destructive: bool = False

    @property
    def input_schema(self) -> dict:
        return {
            "type": "object",
            "properties": self.properties,
            "required": list(self.required),
            "additionalProperties": False,
        }

    @cached_property
    def validator(self) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator(self.input_schema)


@dataclass(frozen=True)
class Outcome:
    """A tool's answer: its JSON, or the API's error shape when ``is_error``."""

    data: dict
    is_error: bool = False

    @property
    def text(self) -> str:
        """The text content: a refusal's readable message, else the JSON itself."""
        if self.is_error:
            return self.data["error"]
        return json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))


def compact(result: dict) -> dict:
    """A tool's result without null or empty fields, at every depth; but an empty list of
    the result's own stays (``"data": []`` says "none")."""
    kept = {key: _compact(value) for key, value in result.items()}
    return {key: value for key, value in kept.items() if value not in (None, "", {})}


def _compact(value):
    if isinstance(value, dict):
        kept = {key: _compact(item) for key, item in value.items()}
        return {key: item for key, item in kept.items() if item not in (None, "", [], {})}
    if isinstance(value, list):
        return [_compact(item) for item in value]
    return value


# --- the tools -------------------------------------------------------------------------------


def _memory_save(caller: Caller, args: dict) -> dict:
    data = s.NewMemoryIn.parse(args)
    memory, created = services.memory_save(
        caller.principal,
        agent=caller.agent,
        user_id=caller.subject,
        source=MemorySource.MCP,
        **vars(s.NewMemoryIn.new_memory(data)),
    )
    # A fact already kept is merged into the stored memory (higher importance, every tag).
    return {"id": str(memory.id), "status": "saved", "merged": not created or None}


def _memory_search(caller: Caller, args: dict) -> dict:
    data = s.AgentSearchMemoriesIn.parse(args)
    hits = search_memories(caller.agent, user_id=caller.subject, data=data, in_use=True)
    return {"data": s.MemoryHitOut(hits, many=True).data}


def _memory_list(caller: Caller, args: dict) -> dict:
    page = selectors.memory_page(
        caller.principal,
        caller.agent,
        user_id=caller.subject,
        tag=args.get("tag"),
        order=args.get("order", "recent"),
        after=args.get("after"),
        # (JSON Schema's integer admits 5.0 too: the schema checked it is a whole number)
        limit=int(args.get("limit", DEFAULT_LIMIT)),
    )
    return page_data(page, s.MemoryOut)


def _memory_delete(caller: Caller, args: dict) -> dict:
    # The memories an agent API request may name by id: the agent's, and of the users' only
    # the one it acts for.
    reachable = selectors.memories_of(
        caller.agent, user_id=caller.principal.on_behalf_of, with_expired=True
    )
    memory = selectors.memory_of(reachable, args["id"])
    deleted = str(memory.id)  # (a deleted instance's id is None)
    services.memory_delete(caller.principal, memory=memory)
    return {"id": deleted, "status": "deleted"}


def _conversation_search(caller: Caller, args: dict) -> dict:
    body = {"query": args["query"]}
    if "limit" in args:
        body["topK"] = args["limit"]
    if "minScore" in args:
        body["minScore"] = args["minScore"]
    hits = search_messages(
        caller.principal, for_agent=True, **SearchMessagesIn.search_arguments(body)
    )
    return SearchResultsOut({"data": hits}).data


def _memory_block_list(caller: Caller, args: dict) -> dict:
    blocks = selectors.memory_blocks(caller.agent, user_id=caller.subject)
    return {"data": s.MemoryBlockOut(blocks, many=True).data}


def _block_edit(caller: Caller, label: str, edit: dict) -> dict:
    # (The edit read first: a blank append to no block was made a block of blanks.)
    data = s.PatchMemoryBlockIn.parse(edit)
    block = selectors.memory_block(caller.agent, user_id=caller.subject, label=label)
    replace = data.get("replace")
    block = services.memory_block_update(
        caller.principal,
        block=block,
        append=data.get("append"),
        replace=(replace["old"], replace["new"]) if replace else None,
    )
    return s.MemoryBlockOut(block).data


def _memory_block_append(caller: Caller, args: dict) -> dict:
    """The line appended; to a block of that label made now if there is none (an agent that
    only speaks MCP has no other way to make one)."""
    try:
        return _block_edit(caller, args["label"], {"append": args["text"]})
    except NotFound:
        data = s.CreateMemoryBlockIn.parse({"label": args["label"], "value": args["text"]})
        try:
            block = services.memory_block_create(
                caller.principal,
                agent=caller.agent,
                user_id=caller.subject,
                label=data["label"],
                value=data["value"],
            )
        except Conflict as refused:  # made meanwhile by another call: append to it
            try:
                return _block_edit(caller, args["label"], {"append": args["text"]})
            except NotFound:
                raise refused from None  # not made: refused (the user turned memory off)
        return s.MemoryBlockOut(block).data


def _memory_block_replace(caller: Caller, args: dict) -> dict:
    return _block_edit(caller, args["label"], {"replace": {"old": args["old"], "new": args["new"]}})


# --- the registry ----------------------------------------------------------------------------

IMPORTANCE_GUIDE = """\
importance (0.0-1.0, default 0.5):
- 0.9-1.0: critical preferences, key decisions
- 0.7-0.8: important context, project configs
- 0.5-0.6: general useful information
- 0.3-0.4: nice to know, minor details
- 0.1-0.2: ephemeral context"""

_TAGS = {
    "type": "array",
    "items": {"type": "string", "minLength": 1, "maxLength": MEMORY_TAG_MAX_LENGTH},
    "maxItems": MEMORY_MAX_TAGS,
}
_LABEL = {"type": "string", "minLength": 1, "maxLength": 100, "description": "The block's label."}

TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in [
        Tool(
            name="memory_save",
            title="Save a memory",
            description=(
                "Save a fact to long-term memory so that it can be recalled in later sessions. "
                "Use it when you learn something worth keeping beyond this conversation: a "
                "preference of the user, a decision, a project convention, a finding or a "
                "lesson learned. One self-contained fact per call, written to make sense "
                'without the conversation ("The user prefers TypeScript over JavaScript"). '
                "Saving a fact that is already kept merges the two. Never save secrets.\n\n"
                + IMPORTANCE_GUIDE
            ),
            properties={
                "content": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": settings.MEMSVC_MAX_MESSAGE_CHARS,
                    "description": "The information to remember.",
                },
                "summary": {
                    "type": "string",
                    "maxLength": 10_000,
                    "description": "A brief summary for quick reference.",
                },
                "importance": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 1,
                    "default": MEMORY_DEFAULT_IMPORTANCE,
                    "description": "How much this matters (see the guide above).",
                },
                "tags": {**_TAGS, "description": 'Categories, such as ["preference", "coding"].'},
                "messageIds": {
                    "type": "array",
                    "items": {"type": "string", "format": "uuid"},
                    "maxItems": MEMORY_MAX_MESSAGES,
                    "description": (
                        "The ids of the messages the fact rests on (as conversation_search "
                        "returns them): a later search of messages finds those turns by it."
                    ),
                },
            },
            required=("content",),
            scope=Scope.WRITE,
            run=_memory_save,
            writes_read=True,  # ("merged": the fact was kept already, as the API's answer)
        ),
        Tool(
            name="memory_search",
            title="Search memories",
            description=(
                "Search long-term memory for facts saved in earlier sessions. Use it whenever "
                "you need more context: before answering a question that may depend on the "
                "user's preferences, earlier decisions or past work. Returns the best matches "
                "first (by relevance, importance and recency); an empty list means nothing "
                "relevant is kept."
            ),
            properties={
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 2000,
                    "description": "What to look for, in words or a question.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    # (The operator's result counts, as /v1's memory search: review.)
                    "maximum": settings.MEMORY_MAX_SEARCH_LIMIT,
                    "default": settings.MEMORY_DEFAULT_SEARCH_LIMIT,
                    "description": "How many memories at most.",
                },
                "tags": {**_TAGS, "description": "Only memories with any of these tags."},
            },
            required=("query",),
            scope=Scope.READ,
            run=_memory_search,
            read_only=True,
        ),
        Tool(
            name="memory_list",
            title="List memories",
            description=(
                "List the memories kept, newest first (or most used first). Use it to review "
                "or tidy what is remembered; to find something, use memory_search."
            ),
            properties={
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 20},
                "order": {"type": "string", "enum": list(s.MEMORY_ORDER_CHOICES)},
                # (A longer one would be cut to a tag's length and match a tag it is not.)
                "tag": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MEMORY_TAG_MAX_LENGTH,
                    "description": "Only with this tag.",
                },
                "after": {
                    "type": "string",
                    "description": "nextCursor of the previous page, for the next one "
                    "(with the same tag and order: another list's is refused).",
                },
            },
            required=(),
            scope=Scope.READ,
            run=_memory_list,
            read_only=True,
        ),
        Tool(
            name="memory_delete",
            title="Delete a memory",
            description=(
                "Delete a memory by its id (from memory_search or memory_list). Use it when a "
                "memory is wrong or outdated, or the user asks to forget it; to correct a "
                "fact, delete the old memory and save the new one."
            ),
            properties={"id": {"type": "string", "description": "The memory's id."}},
            required=("id",),
            scope=Scope.WRITE,
            run=_memory_delete,
            destructive=True,
        ),
        Tool(
            name="conversation_search",
            title="Search conversations",
            description=(
                "Search the messages of the conversations you take part in (what was said, "
                "word for word), best matches first, with highlighted extracts. Use it to "
                "find an earlier exchange; for distilled facts, use memory_search. The best "
                "found come back even when nothing matches well: minScore (0..1, e.g. 0.4) "
                "keeps only messages relevant themselves, and an empty list then means "
                "nothing was said about it."
            ),
            properties={
                "query": {"type": "string", "minLength": 1, "maxLength": 2000},
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": settings.MEMORY_MAX_SEARCH_LIMIT,
                    "default": settings.MEMORY_DEFAULT_SEARCH_LIMIT,
                },
                "minScore": {"type": "number", "minimum": 0, "maximum": 1, "default": 0},
            },
            required=("query",),
            scope=Scope.READ,
            run=_conversation_search,
            fields={"topK": "limit"},
            read_only=True,
        ),
        Tool(
            name="memory_block_list",
            title="List memory blocks",
            description=(
                "List the memory blocks: labelled notes kept in full (such as 'human' about "
                "the user, 'persona' about yourself), each with its value and size limit. "
                "Use it at the start of a task, and before changing a block."
            ),
            properties={},
            required=(),
            scope=Scope.READ,
            run=_memory_block_list,
            read_only=True,
        ),
        Tool(
            name="memory_block_append",
            title="Append to a memory block",
            description=(
                "Add a line at the end of a memory block (see memory_block_list for the "
                "labels; a block with a new label is made, e.g. 'human' for what to always "
                "remember about the user). Use it to note something that belongs in that "
                "block for good."
            ),
            properties={
                "label": _LABEL,
                "text": {"type": "string", "minLength": 1, "description": "The line to add."},
            },
            required=("label", "text"),
            scope=Scope.WRITE,
            run=_memory_block_append,
            writes_read=True,
            fields={"append": "text", "value": "text"},
        ),
        Tool(
            name="memory_block_replace",
            title="Replace text in a memory block",
            description=(
                "Replace the first occurrence of some text in a memory block with new text "
                "(empty new text deletes it). Use it to correct or remove what a block says; "
                "the old text must appear in the block exactly."
            ),
            properties={
                "label": _LABEL,
                "old": {"type": "string", "minLength": 1, "description": "The text to replace."},
                "new": {"type": "string", "description": "The text to put in its place."},
            },
            required=("label", "old", "new"),
            scope=Scope.WRITE,
            run=_memory_block_replace,
            writes_read=True,
            fields={"replace": "new", "replace.new": "new", "replace.old": "old"},
        ),
    ]
}


# The schema's messages that would quote the value whole: a model that sent too much would
# read it all back as its error. Said as the REST API says them, with the limit only; and
# for a value of another type or outside an enum, what it must be (a 3,000,000-character
# ``order`` came back three times over: 9 MB).
_SIZE_PROBLEMS = {
    "maxLength": "must be at most {} characters",
    "maxItems": "must hold at most {} items",
    "enum": "must be one of {}",
    "type": "must be of type {}",
    "minimum": "must be at least {}",
    "maximum": "must be at most {}",
    "exclusiveMinimum": "must be more than {}",
    "exclusiveMaximum": "must be less than {}",
}


def _check_arguments(tool: Tool, arguments: dict) -> None:
    """400-style refusal naming the argument when ``arguments`` break the tool's schema. A
    list longer than its most is refused first, before its items are checked (each of
    1,500,000 tags was: 24 s a call, and eight such calls held every tool thread a minute;
    review)."""
    for name, value in arguments.items():
        most = tool.properties.get(name, {}).get("maxItems")
        if isinstance(value, list) and most is not None and len(value) > most:
            raise InvalidInput.for_field(name, _SIZE_PROBLEMS["maxItems"].format(most))
    error = jsonschema.exceptions.best_match(tool.validator.iter_errors(arguments))
    if error is None:
        return
    # Named as the REST API names it ("tags[0]", not "tags.0": review).
    field = "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path
    ).removeprefix(".")
    problem = error.message
    if error.validator == "minLength":  # (not the schema's "'' should be non-empty": review)
        limit = error.validator_value
        problem = "must not be empty" if limit == 1 else f"must be at least {limit} characters"
    elif error.validator in _SIZE_PROBLEMS:  # (said without the value: 4,000 digits were
        limit = error.validator_value  # quoted three times; review)
        limit = ", ".join(map(str, limit)) if isinstance(limit, list) else limit
        problem = _SIZE_PROBLEMS[error.validator].format(limit)
    elif error.validator == "required":
        field = next(name for name in tool.required if name not in error.instance)
        problem = "is required"
    elif error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(tool.properties))
        field = named(unknown[0])
        expected = ", ".join(tool.properties)
        problem = f"unknown argument (expected: {expected})" if expected else "takes no arguments"
    raise InvalidInput.for_field(field or "arguments", problem)


def _without_nulls(tool: Tool, arguments: dict) -> dict:
    """``arguments`` with a null for an optional argument read as the argument left out:
    models send ``"limit": null`` for what they do not mean to set, as their SDKs' optional
    parameters do (each such call was refused: review). A required one stays, to be refused."""
    return {
        name: value
        for name, value in arguments.items()
        if value is not None or name in tool.required
    }


def _refuse_nul(arguments: dict) -> None:
    """A NUL character, which the database cannot store or look up, is a bad argument (as
    on the REST API), not a store that is down."""
    for name, value in arguments.items():
        if contains_nul(value):
            raise InvalidInput.for_field(name, "must not contain NUL characters")


def call_tool(caller: Caller, name: str, arguments: dict) -> Outcome:
    """Run tool ``name`` (one of ``TOOLS``) for ``caller``. A refusal (a missing scope, bad
    arguments, an unknown id) is an error outcome; anything else that fails is a bug and
    raises. Brackets the call as Django brackets a request, so a worker thread's database
    connection is reused, and dropped once broken or too old."""
    tool = TOOLS[name]
    try:
        with like_a_request():
            caller = caller.as_it_stands()
            require_scope(caller.principal, tool.scope, answers_stored=tool.writes_read)
            arguments = _without_nulls(tool, arguments)
            _check_arguments(tool, arguments)
            _refuse_nul(arguments)
            return Outcome(compact(tool.run(caller, arguments)))
    except DatabaseError as exc:
        # As a request's: a value the database cannot take a 400, a row deleted meanwhile a
        # 404 (both were "unavailable", with a traceback: code review), else unavailable.
        error = exception_refusal(exc)
        if isinstance(error, InternalError | Unavailable):
            if not database_gone(exc):  # (a statement's own failure: a timeout, a deadlock)
                logger.exception("MCP tool %s: database error", name)
            else:  # (every call meets it while it lasts: its traceback was 411 lines in 2 s)
                DATABASE_GONE_SAID.say(
                    logger.error,
                    "MCP tool %s: the database is unavailable (said once a minute while it lasts)",
                    name,
                    exc_info=exc,
                )
            error = Unavailable("the memory store is unavailable; try again shortly")
        return Outcome(error_body(error.message, error.code, error.details), is_error=True)
    except Exception as exc:
        error = as_api_error(exc)
        if error is None:
            raise
        error = error.named(tool.fields)  # (a refusal of a field names the tool's argument)
        return Outcome(error_body(error.message, error.code, error.details), is_error=True)
