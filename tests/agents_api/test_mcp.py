"""The MCP server with the SDK's own client, over both transports, against the test database:
stdio (``memsvc mcp`` as the process a client starts) and streamable HTTP (``memsvc serve``,
the live server users run, with ``/mcp``)."""

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from django.conf import settings
from django.db import transaction
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from agents_api.mcp_server import http as mcp_http
from agents_api.models import (
    MEMORY_DEFAULT_IMPORTANCE,
    Agent,
    Memory,
    MemoryBlock,
    MemorySource,
)
from agents_api.selectors import LOCAL_OWNER
from agents_api.services import (
    agent_get_or_create,
    api_key_create,
    api_key_revoke,
    local_message_append,
    memory_block_create,
    memory_save,
)
from memsvc.api.pagination import ANOTHER_LIST
from tests.api import refusal_code
from tests.db import database_url
from tests.factories import ConversationFactory, ConversationGroupFactory, MessageFactory
from tests.memsvc.test_serve import START_DEADLINE_SECONDS, free_port

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
STRANGERS_MESSAGE = uuid.UUID("00000000-0000-4000-8000-00000000f001")
MEMSVC = Path(sys.executable).parent / "memsvc"
TOOLS = {
    "memory_save",
    "memory_search",
    "memory_list",
    "memory_delete",
    "conversation_search",
    "memory_block_list",
    "memory_block_append",
    "memory_block_replace",
}


def server_env(**extra: str) -> dict[str, str]:
    """A memsvc process on the test database, with this checkout's code; tasks (a search's
    use count) run inline, so their effect is visible when a call returns."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "MEMSVC_LOCAL_MODE": "1",  # the test data dir's secrets, as the tests use
        "MEMSVC_DATA_DIR": str(settings.MEMSVC_DATA_DIR),
        "CELERY_TASK_ALWAYS_EAGER": "1",
        "PYTHONPATH": str(REPO),
    }
    env.pop("MEMSVC_API_KEY", None)
    return {**env, **extra}


def run(server, session, **client_options):
    """``session(client)`` against ``server`` with the SDK's ``Client``; its result."""

    async def main():
        async with Client(server, **client_options) as client:
            return await session(client)

    return anyio.run(main)


def stdio(*args: str, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=str(MEMSVC), args=["mcp", *args], env=server_env(**env), cwd=str(REPO)
    )


def body(result) -> dict:
    """A tool result's JSON text, parsed; it must equal the structured content."""
    [content] = result.content
    assert not result.is_error, content.text
    data = json.loads(content.text)
    assert data == result.structured_content
    return data


def refusal(result) -> str:
    [content] = result.content
    assert result.is_error
    return content.text


def no_nulls(value) -> bool:
    if isinstance(value, dict):
        return all(v not in (None, "", [], {}) and no_nulls(v) for v in value.values())
    if isinstance(value, list):
        return all(no_nulls(v) for v in value)
    return True


async def memory_session(client) -> dict:
    """The calls a model makes in a session, with what each answered."""
    out = {"instructions": client.instructions, "server": client.server_info}
    out["tools"] = {tool.name: tool for tool in (await client.list_tools()).tools}
    call = client.call_tool
    out["save"] = await call(
        "memory_save",
        {
            "content": "The user prefers TypeScript over JavaScript",
            "summary": "TypeScript preference",
            "importance": 0.8,
            "tags": ["preference", "coding"],
        },
    )
    out["save_again"] = await call(
        "memory_save",
        {"content": "the user prefers TypeScript over  JavaScript", "importance": 0.9},
    )
    out["other"] = await call("memory_save", {"content": "The deploy target is Kubernetes"})
    out["search"] = await call("memory_search", {"query": "Which language does the user prefer?"})
    out["list"] = await call("memory_list", {"limit": 1})
    out["blocks"] = await call("memory_block_list", {})
    out["append"] = await call("memory_block_append", {"label": "human", "text": "Likes tea"})
    out["replace"] = await call(
        "memory_block_replace", {"label": "human", "old": "Ada", "new": "Ada Lovelace"}
    )
    out["conversations"] = await call("conversation_search", {"query": "billing database"})
    # Nothing said about it: the best found come back, unless only relevant ones are asked.
    out["nothing_said"] = await call("conversation_search", {"query": "quokka", "minScore": 0.5})
    out["min_score_2"] = await call("conversation_search", {"query": "x", "minScore": 2})
    # The fact again, citing the turn it rests on (merged: the same memory now cites it).
    turn = body(out["conversations"])["data"][0]["message"]["id"]
    out["cite"] = await call(
        "memory_save",
        {"content": "The user prefers TypeScript over JavaScript", "messageIds": [turn]},
    )
    # A real message, of a conversation the agent is no member of: as unknown as a random id.
    out["cite_unseen"] = await call(
        "memory_save", {"content": "x", "messageIds": [str(STRANGERS_MESSAGE)]}
    )
    # Refusals: each a tool error the model can read, and the session goes on.
    out["no_query"] = await call("memory_search", {"limit": 3})
    out["importance_7"] = await call("memory_save", {"content": "x", "importance": 7})
    out["blank"] = await call("memory_save", {"content": "   "})
    out["unknown_argument"] = await call("memory_search", {"query": "x", "user": "bob"})
    out["unknown_id"] = await call("memory_delete", {"id": "00000000-0000-0000-0000-000000000000"})
    out["not_an_id"] = await call("memory_delete", {"id": "nope"})
    out["absent_text"] = await call(
        "memory_block_replace", {"label": "human", "old": "Babbage", "new": "x"}
    )
    out["no_block"] = await call("memory_block_replace", {"label": "nope", "old": "x", "new": "y"})
    # An agent that only speaks MCP makes a block by appending to a new label.
    out["new_block"] = await call(
        "memory_block_append", {"label": "project", "text": "Billing runs on PostgreSQL"}
    )
    out["nul"] = await call("memory_block_append", {"label": "hu\x00man", "text": "x"})
    out["delete"] = await call("memory_delete", {"id": body(out["other"])["id"]})
    out["after_delete"] = await call("memory_search", {"query": "Kubernetes deploy target"})
    return out


def check_memory_session(out: dict, agent) -> None:
    assert out["server"].name == "memsvc"
    assert "memory_search when you need more context" in out["instructions"]
    assert "memory_save for findings and learnings" in out["instructions"]

    tools = out["tools"]
    assert set(tools) == TOOLS
    save_tool = tools["memory_save"]
    assert "0.9-1.0: critical preferences, key decisions" in save_tool.description
    assert save_tool.input_schema["required"] == ["content"]
    assert save_tool.input_schema["properties"]["importance"]["maximum"] == 1
    assert tools["memory_search"].annotations.read_only_hint is True
    assert tools["memory_delete"].annotations.destructive_hint is True

    saved = body(out["save"])
    assert saved == {"id": saved["id"], "status": "saved"}
    memory = Memory.objects.get(id=saved["id"])
    assert (memory.agent_id, memory.user_id, memory.source) == (agent.id, "", MemorySource.MCP)
    assert memory.importance == 0.9  # merged with the second save of the same fact
    assert body(out["save_again"]) == {"id": saved["id"], "status": "saved", "merged": True}

    [hit] = body(out["search"])["data"]
    assert hit["id"] == saved["id"]
    assert hit["tags"] == ["preference", "coding"]
    assert hit["score"] > 0
    assert "userId" not in hit and "lastAccessedAt" not in hit and "metadata" not in hit
    assert no_nulls(body(out["search"]))
    memory.refresh_from_db()
    assert memory.access_count == 1  # a search by the agent counts a use, as over REST

    listed = body(out["list"])
    assert len(listed["data"]) == 1 and listed["nextCursor"]
    assert [b["label"] for b in body(out["blocks"])["data"]] == ["human"]
    assert body(out["append"])["value"] == "Name: Ada\nLikes tea"
    assert no_nulls(body(out["append"]))  # (its empty description was there)
    assert body(out["replace"])["value"] == "Name: Ada Lovelace\nLikes tea"
    assert MemoryBlock.objects.get(agent=agent, label="human").value == (
        "Name: Ada Lovelace\nLikes tea"
    )
    [found] = body(out["conversations"])["data"]
    assert found["message"]["content"] == "We chose PostgreSQL for the billing database"
    assert "<b>billing</b>" in found["highlights"]
    assert body(out["nothing_said"])["data"] == []  # (a model could not tell: review)
    assert refusal(out["min_score_2"]).startswith("minScore: ")

    assert body(out["cite"]) == {"id": saved["id"], "status": "saved", "merged": True}
    assert memory.message_ids == [uuid.UUID(found["message"]["id"])]
    assert refusal(out["cite_unseen"]) == f"messageIds: no such message: {STRANGERS_MESSAGE}"

    assert refusal(out["no_query"]) == "query: is required"
    assert out["no_query"].structured_content["code"] == "validation_error"
    assert refusal(out["importance_7"]) == "importance: must be at most 1"
    assert refusal(out["blank"]) == "content: must not be empty"
    assert refusal(out["unknown_argument"]).startswith("user: unknown argument")
    assert refusal(out["unknown_id"]) == "memory not found"
    assert out["unknown_id"].structured_content["code"] == "not_found"
    assert refusal(out["not_an_id"]) == "memory not found"
    assert refusal(out["absent_text"]) == "the text to replace is not in the block"
    assert refusal(out["no_block"]) == "no memory block labelled 'nope'"
    made = body(out["new_block"])
    assert (made["label"], made["value"]) == ("project", "Billing runs on PostgreSQL")
    assert MemoryBlock.objects.get(agent=agent, label="project").revisions.count() == 1
    assert refusal(out["nul"]) == "label: must not contain NUL characters"
    assert out["nul"].structured_content["code"] == "validation_error"

    assert body(out["delete"]) == {"id": body(out["other"])["id"], "status": "deleted"}
    assert body(out["after_delete"])["data"] == []
    assert list(Memory.objects.values_list("content", flat=True)) == [memory.content]


def local_agent_with_history(name: str):
    """A local agent with a block and a message of its own; beside it, a stranger's
    message (``STRANGERS_MESSAGE``) the agent does not see."""
    agent, _ = agent_get_or_create(owner_principal=LOCAL_OWNER, name=name, loopback_trusted=True)
    memory_block_create(agent.as_principal(), agent=agent, label="human", value="Name: Ada")
    local_message_append(agent, role="user", content="We chose PostgreSQL for the billing database")
    with transaction.atomic():  # (a group has its owner when the transaction commits)
        strangers = ConversationFactory(group=ConversationGroupFactory(owner="stranger"))
        MessageFactory(id=STRANGERS_MESSAGE, conversation=strangers, content="a secret")
    return agent


# --- stdio -----------------------------------------------------------------------------------


def test_a_stdio_session_as_a_local_agent():
    agent = local_agent_with_history("x")
    out = run(stdio("--agent", "x"), memory_session)
    check_memory_session(out, agent)


def test_stdio_makes_the_local_agent_it_is_named_after():
    async def session(client):
        return await client.call_tool("memory_save", {"content": "First fact of a new agent"})

    saved = body(run(stdio("--agent", "newcomer"), session))
    memory = Memory.objects.select_related("agent").get(id=saved["id"])
    assert (memory.agent.name, memory.agent.owner_principal) == ("newcomer", LOCAL_OWNER)


def test_stdio_with_a_read_key_acts_as_its_agent_and_cannot_write():
    agent = local_agent_with_history("keyed")
    memory_save(agent.as_principal(), agent=agent, content="The office is in Lisbon")
    _, key = api_key_create(agent=agent, scopes=["read"])

    async def session(client):
        return (
            await client.call_tool("memory_search", {"query": "where is the office"}),
            await client.call_tool("memory_save", {"content": "Something new"}),
            await client.call_tool("memory_block_append", {"label": "human", "text": "x"}),
        )

    search, save, append = run(stdio(MEMSVC_API_KEY=key), session)
    assert body(search)["data"][0]["content"] == "The office is in Lisbon"
    assert refusal(save) == "this API key lacks the 'write' scope"
    assert save.structured_content["code"] == "forbidden"
    assert refusal(append) == "this API key lacks the 'write' scope"
    assert Memory.objects.count() == 1
    assert MemoryBlock.objects.get(agent=agent).value == "Name: Ada"


def test_a_key_revoked_during_a_stdio_session_works_no_more():
    """The process's key was checked once, at its start: revoked meanwhile (`memsvc apikey
    revoke`), it still saved and searched (over HTTP, the next request was a 401; review)."""
    agent = local_agent_with_history("keyed")
    stored, key = api_key_create(agent=agent, scopes=["read", "write"])

    async def session(client):
        before = await client.call_tool("memory_save", {"content": "Saved before"})
        await anyio.to_thread.run_sync(lambda: api_key_revoke(api_key=stored))
        after = await client.call_tool("memory_save", {"content": "Saved after"})
        return before, after, await client.call_tool("memory_search", {"query": "saved"})

    before, after, search = run(stdio(MEMSVC_API_KEY=key), session)
    assert body(before)["status"] == "saved"
    assert refusal(after) == "invalid API key" and refusal(search) == "invalid API key"
    assert after.structured_content["code"] == "unauthorized"
    assert list(Memory.objects.values_list("content", flat=True)) == ["Saved before"]


@pytest.mark.django_db(transaction=True)  # (a tool call closes a connection in a transaction)
def test_a_database_that_is_gone_is_logged_once_a_minute_a_statements_failure_each_time(
    monkeypatch, caplog
):
    """Every tool call logged its traceback while the database was down (411 lines in an
    outage of 2 s, kept by the MCP host: review); a statement's own failure (a timeout) is
    each call's own, and said each time. A value the database cannot take, or a row
    deleted meanwhile, is the caller's 400 or 404, as a request's (they were "unavailable",
    with a traceback: code review)."""
    import psycopg
    from django.db import DataError, IntegrityError, OperationalError

    from agents_api.mcp_server import tools
    from memsvc.outage import Reminder

    agent = local_agent_with_history("outage")
    caller = tools.Caller(principal=agent.as_principal(), agent=agent)
    monkeypatch.setattr(tools, "DATABASE_GONE_SAID", Reminder())
    failure = {}

    def failing(caller, arguments):
        raise failure["error"]("failed") from failure["cause"]

    monkeypatch.setitem(
        tools.TOOLS, "memory_list", dataclasses.replace(tools.TOOLS["memory_list"], run=failing)
    )
    for error, cause, code, logged in (
        (OperationalError, psycopg.OperationalError("gone"), "unavailable", 1),
        (OperationalError, TimeoutError("slow"), "unavailable", 3),
        (DataError, psycopg.errors.NumericValueOutOfRange("big"), "validation_error", 0),
        (IntegrityError, psycopg.errors.ForeignKeyViolation("gone"), "not_found", 0),
    ):
        failure.update(error=error, cause=cause)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="agents_api.mcp_server.tools"):
            outcomes = [tools.call_tool(caller, "memory_list", {}) for _ in range(3)]
        assert {o.data["code"] for o in outcomes} == {code}, error
        assert all(o.is_error for o in outcomes)
        assert len(caplog.records) == logged, caplog.text


def test_an_agent_deleted_during_a_keyless_stdio_session_is_said_so():
    """Its saves said "the memory store is unavailable; try again shortly" (a foreign key
    refused), its lists answered nothing (review): one clear 404 for every tool."""
    agent = local_agent_with_history("doomed")

    async def session(client):
        before = await client.call_tool("memory_save", {"content": "Saved before"})
        await anyio.to_thread.run_sync(lambda: Agent.objects.filter(pk=agent.pk).delete())
        return before, [
            await client.call_tool("memory_save", {"content": "Saved after"}),
            await client.call_tool("memory_list", {}),
            await client.call_tool("memory_block_append", {"label": "x", "text": "y"}),
        ]

    before, after = run(stdio("--agent", "doomed"), session)
    assert body(before)["status"] == "saved"
    for answer in after:
        assert refusal(answer) == "this session's agent was deleted; start memsvc mcp again"
        assert answer.structured_content["code"] == "not_found"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["mcp"], {}, "name the agent (--agent NAME) or set MEMSVC_API_KEY"),
        (["mcp", "--agent", "x"], {"MEMSVC_API_KEY": "msk_nope_nope"}, "invalid API key"),
        (
            ["mcp", "--agent", "x"],
            {"MEMSVC_LOCAL_MODE": "0", "DJANGO_SECRET_KEY": "s"},
            "outside local mode",
        ),
        # (Made, and then out of reach of the local API's /agents/{name}.)
        (["mcp", "--agent", "a/b"], {}, 'agent name must not contain "/"'),
        (["mcp", "--agent", "x" * 300], {}, "agent name must be at most 200 characters"),
    ],
)
def test_stdio_refuses_to_start_without_an_agent_it_may_act_as(args, env, message):
    done = subprocess.run(
        [str(MEMSVC), *args],
        env=server_env(**env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stdout == ""


# The handshake's first request, as a raw client sends it.
RAW_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}


def raw_process() -> subprocess.Popen:
    """``memsvc mcp --agent raw`` with its three pipes, as text."""
    return subprocess.Popen(
        [str(MEMSVC), "mcp", "--agent", "raw"],
        env=server_env(),
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="surrogateescape",  # (a line's "\udcff" is the byte 0xff)
    )


def raw_stdio(lines: list[str], *, answers: int) -> tuple[list[str], str]:
    """``lines`` sent raw to ``memsvc mcp --agent raw``: the first ``answers`` lines of its
    stdout, and its stderr, once it has ended on EOF (nothing else written to stdout)."""
    with raw_process() as process:
        process.stdin.write("".join(line + "\n" for line in lines))
        process.stdin.flush()
        # A client keeps stdin open until its answers are in (EOF ends the session at once).
        # A line left unanswered would hold the read for good: the server is ended.
        deadline = threading.Timer(60, process.kill)
        deadline.start()
        try:
            read = [process.stdout.readline() for _ in range(answers)]
        finally:
            deadline.cancel()
        assert all(read), f"unanswered lines: {read}"
        process.stdin.close()
        assert process.wait(timeout=60) == 0
        assert process.stdout.read() == ""
        return read, process.stderr.read()


def test_stdout_carries_nothing_but_protocol():
    """Raw JSON-RPC on the pipes, as a client sees them: every stdout line is a message;
    logs (the start-up line, a refused key's warning) go to stderr."""
    local_agent_with_history("raw")
    messages = [
        RAW_INITIALIZE,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "memory_search", "arguments": {"query": "billing"}},
        },
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "no_such_tool", "arguments": {}},
        },
    ]
    lines, stderr = raw_stdio([json.dumps(m) for m in messages], answers=3)
    # Requests are served concurrently: answers come as they are ready.
    answers = sorted((json.loads(line) for line in lines), key=lambda a: a["id"])
    assert [a["id"] for a in answers] == [1, 2, 3], stderr
    assert answers[0]["result"]["serverInfo"]["name"] == "memsvc"
    assert answers[1]["result"]["isError"] is False
    assert answers[2]["error"]["message"] == "Unknown tool: no_such_tool"
    assert "serving agent 'raw' over stdio" in stderr


def test_stdio_ends_quietly_when_the_client_stops_reading():
    """A client that closed its end of stdout, wrote on, and then went: the session ended
    in a traceback of a broken pipe, exit 1 (review). It ends, exit 0, and says nothing of
    it. (It ends once stdin ends too: the line it waits for is read in a thread.)"""
    with raw_process() as process:
        process.stdin.write(json.dumps(RAW_INITIALIZE) + "\n")
        process.stdin.flush()
        assert json.loads(process.stdout.readline())["id"] == 1
        process.stdout.close()  # stops reading
        for n in range(2, 6):
            with contextlib.suppress(BrokenPipeError):
                process.stdin.write(
                    json.dumps({"jsonrpc": "2.0", "id": n, "method": "tools/list"}) + "\n"
                )
                process.stdin.flush()
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()
        assert process.wait(timeout=60) == 0
        stderr = process.stderr.read()
    assert "Traceback" not in stderr, stderr


def test_stdio_ends_on_ctrl_c_while_it_waits_for_the_client():
    """The line it waited for was read in a thread the interpreter waited for at its exit:
    a Ctrl-C in the terminal ended the session only once stdin was closed (35 s later;
    review)."""
    with raw_process() as process:
        process.stdin.write(json.dumps(RAW_INITIALIZE) + "\n")
        process.stdin.flush()
        assert json.loads(process.stdout.readline())["id"] == 1
        process.send_signal(signal.SIGINT)  # stdin stays open
        assert process.wait(timeout=20) == 130
        assert "memsvc: interrupted" in process.stderr.read()


def test_stdio_ended_by_sigterm_sends_the_use_counts_of_its_searches_first():
    """An MCP client may end its server with SIGTERM (stdin still open): the process ended
    where it was, and the uses of the memories its last searches returned (sent a second
    later) were never counted (review). It ends as on Ctrl-C, its counts sent."""
    agent = local_agent_with_history("raw")
    memory, _ = memory_save(agent.as_principal(), agent=agent, content="The office is in Lisbon")
    search = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "memory_search", "arguments": {"query": "where is the office"}},
    }
    with raw_process() as process:
        for message in (RAW_INITIALIZE, search):
            process.stdin.write(json.dumps(message) + "\n")
        process.stdin.flush()
        answers = [json.loads(process.stdout.readline()) for _ in range(2)]
        assert "Lisbon" in json.dumps(answers[1])
        process.send_signal(signal.SIGTERM)  # stdin stays open
        assert process.wait(timeout=20) == 130
        assert "Traceback" not in process.stderr.read()
    memory.refresh_from_db()
    assert memory.access_count == 1


@pytest.mark.django_db
def test_a_stdio_session_leaves_sigterm_as_it_found_it():
    """The session's event loop takes SIGTERM while it serves; its end set the signal's
    default action, and a SIGTERM during the flush of use counts that follows killed the
    process (code review): it is handled as before the session began."""
    import io

    from agents_api.mcp_server.stdio import serve, stdio_caller

    caller = stdio_caller(agent_name="raw", api_key=None, local_mode=True)
    before = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        serve(caller, io.BytesIO(b""), io.BytesIO())  # (stdin at its end: the session ends)
        assert signal.getsignal(signal.SIGTERM) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, before)


def test_stdio_answers_every_line_it_cannot_serve():
    """A line the SDK would log and leave unanswered (JSON the service refuses, a line that
    is no JSON, JSON that is no JSON-RPC message, a request whose id MCP does not allow) is
    answered with a JSON-RPC error, as on HTTP; blank lines are skipped, and the session
    goes on."""
    start = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "r", "version": "1"},
    }
    lines = [
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": start}),
        '{"jsonrpc": "2.0", "method": "notifications/initialized"}',
        '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "memory_search",'
        ' "arguments": {"query": "a\\udc00b"}}}',
        "",
        "not json",
        # bytes that are no UTF-8 (were stored as "\ufffd"; HTTP refuses them: review)
        '{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "memory_save",'
        ' "arguments": {"content": "latin \udcff\udcfe bytes"}}}',
        "[1, 2]",
        '{"jsonrpc": "2.0", "id": 5, "method": "ping", "params": {"n": ' + "7" * 4301 + "}}",
        '{"jsonrpc": "2.0", "id": null, "method": "tools/list"}',
        '{"jsonrpc": "2.0", "id": "p", "method": "ping", "params": "x"}',
        '{"jsonrpc": "2.0", "id": 3, "method": "tools/list"}',
    ]
    read, _ = raw_stdio(lines, answers=9)
    answers = [json.loads(line) for line in read]
    errors = [(a["id"], a["error"]) for a in answers if "error" in a]
    assert [(i, e["code"]) for i, e in errors] == [
        (2, -32600),  # (an id the answer can name, it names: the client is waiting on it)
        (None, -32700),
        (None, -32700),
        (None, -32600),
        (None, -32700),
        (None, -32600),
        ("p", -32602),  # (its params, said: "ping takes params: an object with _meta")
    ]
    assert "lone surrogate" in errors[0][1]["message"]
    assert errors[2][1]["message"] == "Parse error: a line is UTF-8 text"
    assert errors[4][1]["message"] == "Parse error: a number has more than 4300 digits"
    assert "id: a string or an integer" in errors[5][1]["message"]
    assert sorted(a["id"] for a in answers if "result" in a) == [1, 3]
    assert not Memory.objects.exists()


def test_stdio_serves_the_2026_protocol_without_a_handshake():
    """(Its requests open a connection with no ``initialize``: not refused as sent before it.)"""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "r", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}}
    read, _ = raw_stdio([json.dumps(request)], answers=1)
    [answer] = map(json.loads, read)
    assert "memory_save" in {tool["name"] for tool in answer["result"]["tools"]}, answer


def test_a_tools_list_cursor_is_refused_as_invalid_params():
    """The tools fit one page: a cursor given was taken as none (review)."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "r", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/list",
        "params": {"_meta": meta, "cursor": "abc"},
    }
    read, _ = raw_stdio([json.dumps(request)], answers=1)
    [answer] = map(json.loads, read)
    assert answer["error"]["code"] == -32602, answer
    assert answer["error"]["message"] == "no such cursor: the tools fit one page"


def test_the_methods_answered_as_not_found_before_the_sdk_are_those_it_does_not_serve():
    from agents_api.mcp_server.jsonrpc import SERVED_METHODS
    from agents_api.mcp_server.server import build_server

    assert {*build_server()._request_handlers, "initialize"} == SERVED_METHODS


def test_stdio_says_what_is_wrong_with_a_request_it_does_not_serve():
    """The SDK answered a call before ``initialize``, and a method it does not serve with
    params not of it, "Invalid request parameters" and nothing more; an invalid request whose
    id it could read with the id null (review)."""
    start = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "r", "version": "1"},
    }
    lines = [
        '{"jsonrpc": "2.0", "id": "early", "method": "tools/list"}',
        '{"jsonrpc": "2.0", "id": "ping", "method": "ping"}',
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": start}),
        '{"jsonrpc": "2.0", "method": "notifications/initialized"}',
        '{"jsonrpc": "2.0", "id": "c", "method": "completion/complete", "params": {}}',
        '{"jsonrpc": "1.0", "id": 9, "method": "ping"}',
        '{"jsonrpc": "2.0", "id": 3, "method": "tools/list"}',
    ]
    read, _ = raw_stdio(lines, answers=6)
    answers = {answer["id"]: answer for answer in map(json.loads, read)}
    assert answers["early"]["error"] == {
        "code": -32600,
        "message": "Invalid Request: the session is not initialized: send initialize first",
    }
    assert answers["ping"]["result"] == {} and "result" in answers[1]
    assert answers["c"]["error"] == {
        "code": -32601,
        "message": "Method not found",
        "data": "completion/complete",
    }
    assert answers[9]["error"] == {
        "code": -32600,
        "message": 'Invalid Request: jsonrpc: must be "2.0"',
    }
    assert "memory_save" in {tool["name"] for tool in answers[3]["result"]["tools"]}


# --- streamable HTTP -------------------------------------------------------------------------


def serve(command: list[str], log_path: Path):
    """A web server of the test database (``command`` with ``{port}``), until the generator
    is closed; yields its /mcp URL."""
    port = free_port()
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [part.format(port=port) for part in command],
            env=server_env(MEMSVC_WEB_WORKERS="1"),
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_DEADLINE_SECONDS
    while True:
        assert process.poll() is None, log_path.read_text()
        try:
            httpx.get(f"{url}/v1/health", timeout=2)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
    yield f"{url}/mcp"
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)


@pytest.fixture(scope="module")
def served(django_db_setup, django_db_blocker, tmp_path_factory):
    """``memsvc serve`` (the web server only) on the test database."""
    log_path = tmp_path_factory.mktemp("mcp-serve") / "serve.log"
    yield from serve([str(MEMSVC), "serve", "--no-worker", "--port", "{port}"], log_path)


@pytest.fixture(scope="module")
def served_asgi(django_db_setup, django_db_blocker, tmp_path_factory):
    """The same Django project under an ASGI server (uvicorn, which the SDK brings)."""
    log_path = tmp_path_factory.mktemp("mcp-asgi") / "serve.log"
    command = [sys.executable, "-m", "uvicorn", "memsvc.asgi:application", "--port", "{port}"]
    yield from serve(command, log_path)


def refused_with(response) -> str:
    """The code of memsvc's refusal of an ``/mcp`` request (a JSON-RPC error)."""
    return refusal_code(response, mcp=True)


def test_http_refusals_reach_the_sdks_client_with_their_reason(served):
    """The SDK's client reads the error of a non-2xx answer only when it is JSON-RPC's: a
    key that is no key was "Server returned an error response" (review)."""
    _, key = keyed_agent("refused-agent", scopes=["read"])

    async def session(client):
        return await client.call_tool("memory_save", {"content": "Bob is vegetarian"})

    for credentials, headers, said in (
        ("msk_nope_nope", {}, "invalid API key"),
        (key, {"X-On-Behalf-Of": "bob"}, "impersonate"),
    ):
        from mcp.shared.exceptions import MCPError

        with pytest.raises((MCPError, BaseExceptionGroup)) as raised:
            run(http(served, credentials, **headers), session)
        errors = [raised.value]
        while isinstance(errors[-1], BaseExceptionGroup):
            errors.append(errors[-1].exceptions[0])
        assert isinstance(errors[-1], MCPError) and said in str(errors[-1]), repr(raised.value)


def http(url: str, key: str, **headers: str):
    """The SDK's streamable HTTP transport with an API key (and a patient read timeout: the
    server's first search may wait for its model to load on a busy machine)."""
    return streamable_http_client(
        url,
        http_client=httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {key}", **headers}, timeout=120
        ),
    )


def keyed_agent(name: str, scopes=("read", "write")):
    agent = local_agent_with_history(name)
    _, key = api_key_create(agent=agent, scopes=list(scopes))
    return agent, key


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_an_http_session_with_an_api_key(served, mode):
    """``auto``: the 2026-07-28 protocol (a request per message, no handshake); ``legacy``:
    the initialize handshake of earlier clients. The stateless endpoint serves both."""
    agent, key = keyed_agent("http-agent")
    out = run(http(served, key), memory_session, mode=mode)
    check_memory_session(out, agent)


def test_http_read_key_cannot_save_or_delete(served):
    agent, key = keyed_agent("reader", scopes=["read"])
    memory, _ = memory_save(agent.as_principal(), agent=agent, content="The office is in Lisbon")

    async def session(client):
        return (
            await client.call_tool("memory_search", {"query": "office"}),
            await client.call_tool("memory_save", {"content": "Something new"}),
            await client.call_tool("memory_delete", {"id": str(memory.id)}),
        )

    search, save, delete = run(http(served, key), session)
    assert body(search)["data"][0]["id"] == str(memory.id)
    assert refusal(save) == "this API key lacks the 'write' scope"
    assert refusal(delete) == "this API key lacks the 'write' scope"
    assert list(Memory.objects.values_list("id", flat=True)) == [memory.id]


def test_http_write_only_key_cannot_read_a_block_by_editing_it(served):
    """``memory_block_append`` and ``memory_block_replace`` answer with the whole block
    (an append: all it held before), ``memory_save`` whether the fact was kept: a key that
    may not read (``memory_block_list``: refused) read them that way, as the agent API's
    and Letta's writes no longer let it."""
    agent, key = keyed_agent("writer", scopes=["write"])
    memory_block_create(agent.as_principal(), agent=agent, label="notes", value="Secret line")

    async def session(client):
        return (
            await client.call_tool("memory_block_append", {"label": "notes", "text": "probe"}),
            await client.call_tool(
                "memory_block_replace", {"label": "notes", "old": "Secret", "new": "Open"}
            ),
            await client.call_tool("memory_save", {"content": "Something new"}),
        )

    append, replace, save = run(http(served, key), session)
    assert refusal(append) == "this API key lacks the 'read' scope"
    assert refusal(replace) == "this API key lacks the 'read' scope"
    assert MemoryBlock.objects.get(agent=agent, label="notes").value == "Secret line"
    # A save's answer says whether the fact was kept already ("merged"): read too (review).
    assert refusal(save) == "this API key lacks the 'read' scope"
    assert not Memory.objects.filter(agent=agent).exists()


def test_http_acts_for_the_user_of_an_impersonating_key(served):
    agent, key = keyed_agent("assistant", scopes=["read", "write", "impersonate"])

    async def session(client):
        return await client.call_tool("memory_save", {"content": "Bob is vegetarian"})

    saved = body(run(http(served, key, **{"X-On-Behalf-Of": "bob"}), session))
    memory = Memory.objects.get(id=saved["id"])
    assert (memory.agent_id, memory.user_id) == (agent.id, "bob")


def test_http_refuses_requests_without_a_valid_key(served):
    initialize = RAW_INITIALIZE
    headers = {"Accept": "application/json, text/event-stream"}
    for auth in ({}, {"Authorization": "Bearer msk_nope_nope"}, {"Authorization": "Basic x"}):
        response = httpx.post(served, json=initialize, headers={**headers, **auth}, timeout=10)
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert refused_with(response) == "unauthorized"

    _, key = keyed_agent("raw-http")
    authorized = {**headers, "Authorization": f"Bearer {key}"}
    response = httpx.post(served, json=initialize, headers=authorized, timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["result"]["serverInfo"]["name"] == "memsvc"
    assert "Mcp-Session-Id" not in response.headers  # stateless: nothing kept between requests
    # So a call needs no handshake before it (the README's curl example).
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "memory_block_list", "arguments": {}},
    }
    response = httpx.post(served, json=call, headers=authorized, timeout=60)
    assert response.status_code == 200
    [block] = json.loads(response.json()["result"]["content"][0]["text"])["data"]
    assert block["value"] == "Name: Ada"
    # Not JSON: refused in the API's shape (the SDK's own refusal is a plain-text 400).
    for media_type in ("text/plain", "application/jsonfoo"):
        text = httpx.post(served, content=b"{}", headers={**authorized, "Content-Type": media_type})
        assert text.status_code == 415, media_type
        assert refused_with(text) == "unsupported_media_type"
    # An MCP client opens its stream asking for events only: 405 (no stream) all the same,
    # which the protocol reads as "none"; a 406 broke the TypeScript SDK's client.
    for accept in ("application/json, text/event-stream", "text/event-stream"):
        stream = httpx.get(served, headers={**authorized, "Accept": accept}, timeout=10)
        assert stream.status_code == 405, accept
        assert "POST" in stream.headers["Allow"] and "GET" not in stream.headers["Allow"]
        assert refused_with(stream) == "method_not_allowed"


def test_http_works_the_same_under_an_asgi_server(served_asgi):
    agent, key = keyed_agent("asgi-agent")

    async def session(client):
        return (
            await client.call_tool("memory_save", {"content": "The team meets on Mondays"}),
            await client.call_tool("memory_search", {"query": "when does the team meet"}),
            await client.call_tool("memory_block_list", {}),
        )

    saved, found, blocks = run(http(served_asgi, key), session)
    assert body(found)["data"][0]["id"] == body(saved)["id"]
    assert body(blocks)["data"][0]["value"] == "Name: Ada"
    assert Memory.objects.get(id=body(saved)["id"]).agent_id == agent.id
    assert httpx.post(served_asgi, json={}, timeout=10).status_code == 401


def test_http_calls_in_one_process_share_one_event_loop_and_session_manager(client):
    # The SDK's session manager is entered once per process, on one loop thread, not once
    # per call (a loop and a manager per call cost about 2 ms of CPU each).
    _, key = keyed_agent("one-loop")
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    managers = []
    for _ in range(3):
        response = post_mcp(client, key, listing)
        assert response.status_code == 200, response.content
        assert "memory_search" in {tool["name"] for tool in response.json()["result"]["tools"]}
        managers.append(mcp_http._exchanges._manager)
    assert managers[0] is managers[1] is managers[2]
    assert [thread.name for thread in threading.enumerate()].count("mcp-http") == 1


def post_mcp(client, key: str, body):
    """``POST /mcp`` of ``body`` as it is written (bytes, or JSON of any value) with the key."""
    return client.post(
        "/mcp",
        body if isinstance(body, bytes) else json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
        HTTP_ACCEPT="application/json, text/event-stream",
    )


@pytest.mark.parametrize("media_type", ["Application/JSON", "application/json; charset=UTF-8"])
def test_http_a_media_type_in_any_case_or_with_a_charset_is_json(client, media_type):
    """Media types are case-insensitive: the view took "Application/JSON", and the SDK then
    refused it (415 in JSON-RPC's shape, where the view's own 415 is the API's; review)."""
    _, key = keyed_agent(f"media-{uuid.uuid4().hex[:8]}")
    response = client.post(
        "/mcp",
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}),
        content_type=media_type,
        HTTP_AUTHORIZATION=f"Bearer {key}",
        HTTP_ACCEPT="application/json, text/event-stream",
    )
    assert response.status_code == 200, response.content
    assert response.json() == {"jsonrpc": "2.0", "id": 1, "result": {}}


@pytest.mark.parametrize("path", ["/mcp/", "/mcp/x", "/mcp/v1/tools"])
def test_http_a_path_under_the_endpoint_is_404_in_its_shape(client, path):
    """(The local API's ``{"detail": "Not Found"}``: a client's URL with a slash too
    much was not told where the endpoint is; review.)"""
    _, key = keyed_agent(f"slash-{uuid.uuid4().hex[:8]}")
    response = client.post(
        path, "{}", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}"
    )
    assert response.status_code == 404
    assert response.json() == {
        "error": "no such route (the endpoint is /mcp)",
        "code": "not_found",
        "details": {},
    }


@pytest.mark.parametrize(
    ("method", "params", "problem"),
    [
        ("tools/call", None, "tools/call takes params: an object with name, arguments, _meta"),
        ("tools/call", {"name": 5}, "params.name: must be a text"),
        (
            "tools/call",
            {"name": "memory_list", "arguments": [1]},
            "params.arguments: must be an object",
        ),
        ("initialize", {}, "params.protocolVersion: missing (a text)"),
        ("tools/list", {"cursor": 5}, "params.cursor: must be a text"),
        ("tools/list", [5], "tools/list takes params: an object with cursor, _meta"),
        ("tools/list", {"_meta": 5}, "params._meta: must be an object"),
        ("tools/call", {"name": "memory_list", "_meta": 5}, "params._meta: must be an object"),
        (
            "initialize",
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}},
            "params.clientInfo: must be an object with a name and a version",
        ),
        # (These were the SDK's "Invalid request parameters", or for ping a 400 with the id
        # null that blamed batches: review.)
        ("ping", [1], "ping takes params: an object with _meta"),
        ("server/discover", "x", "server/discover takes params: an object with _meta"),
        (
            "tools/call",
            {"name": "memory_list", "_meta": {"progressToken": [1, 2]}},
            "params._meta.progressToken: must be a text or an integer",
        ),
        (
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {"sampling": [1]},
                "clientInfo": {"name": "c", "version": "1"},
            },
            "params.capabilities.sampling: must be an object",
        ),
    ],
)
def test_http_wrong_params_are_said_plainly(client, method, params, problem):
    """The SDK answered "Invalid request parameters" and nothing more (review)."""
    _, key = keyed_agent(f"params-{uuid.uuid4().hex[:8]}")
    request = {"jsonrpc": "2.0", "id": 7, "method": method}
    if params is not None:
        request["params"] = params
    response = post_mcp(client, key, request)
    assert response.status_code == 200, response.content
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {"code": -32602, "message": f"Invalid params: {problem}"},
    }


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (
            {"jsonrpc": "2.0", "id": 7, "method": "completion/complete", "params": {}},
            {"code": -32601, "message": "Method not found", "data": "completion/complete"},
        ),
        (
            {"jsonrpc": "2.0", "id": 7, "method": "resources/list"},
            {"code": -32601, "message": "Method not found", "data": "resources/list"},
        ),
        (
            {"jsonrpc": "1.0", "id": 7, "method": "ping"},
            {"code": -32600, "message": 'Invalid Request: jsonrpc: must be "2.0"'},
        ),
        (
            {"jsonrpc": "2.0", "id": 7, "method": 5},
            {"code": -32600, "message": "Invalid Request: method: must be a text"},
        ),
    ],
)
def test_http_a_request_not_served_is_answered_by_its_id_with_why(client, request_, error):
    """(A method not served, with params not of it, was "Invalid request parameters" and
    nothing more; an invalid request whose id could be read was answered to the id null:
    review.)"""
    _, key = keyed_agent(f"unserved-{uuid.uuid4().hex[:8]}")
    response = post_mcp(client, key, request_)
    assert response.json() == {"jsonrpc": "2.0", "id": 7, "error": error}
    assert response.status_code == (200 if error["code"] == -32601 else 400)


@pytest.mark.parametrize(
    ("method", "params", "status"),
    [("resources/list", {}, 404), ("tools/list", {"cursor": 5}, 400)],
)
def test_http_the_per_request_protocols_errors_have_its_statuses(client, method, params, status):
    """2026-07-28's requests name their protocol in their ``_meta``: its method not found is
    a 404 and its invalid params a 400, as the SDK answers them (these were 200: review)."""
    _, key = keyed_agent(f"modern-{uuid.uuid4().hex[:8]}")
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "r", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    request = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**params, "_meta": meta}}
    response = post_mcp(client, key, request)
    assert response.status_code == status, response.content
    assert response.json()["error"]["code"] == (-32601 if status == 404 else -32602)


def test_http_tools_are_listed_with_or_without_params(client):
    _, key = keyed_agent("lister")
    for params in ({}, {"cursor": None}, None):  # (a cursor of null: none, as the SDK takes it)
        request = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        if params is not None:
            request["params"] = params
        tools = post_mcp(client, key, request).json()["result"]["tools"]
        assert "memory_save" in {tool["name"] for tool in tools}


def call_tool(client, key: str, name: str, arguments: dict):
    """``POST /mcp`` of a ``tools/call`` of ``name`` with ``arguments``."""
    params = {"name": name, "arguments": arguments}
    return post_mcp(
        client, key, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    )


@pytest.mark.parametrize(
    "sent",
    [
        [{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}],  # a batch
        None,
        7,
        {"jsonrpc": "2.0", "id": 1, "params": {"secret": "do-not-echo"}},  # no method
    ],
)
def test_http_a_body_that_is_no_json_rpc_message_is_an_invalid_request(client, sent):
    # The SDK answered -32602 (invalid params) with pydantic's account of the validation,
    # quoting what was sent; JSON-RPC says -32600, and a caller needs to know what to send.
    _, key = keyed_agent(f"not-a-message-{uuid.uuid4().hex[:8]}")
    response = post_mcp(client, key, sent)
    assert response.status_code == 400
    answer = response.json()
    assert answer["jsonrpc"] == "2.0" and answer["id"] is None
    assert answer["error"]["code"] == -32600
    assert "batches are not supported" in answer["error"]["message"]
    assert "do-not-echo" not in response.content.decode()
    assert "pydantic" not in response.content.decode()


@pytest.mark.parametrize("version", [None, "2026-07-28"])
def test_http_a_notification_is_accepted_with_no_body_and_no_html_type(client, version):
    # The modern protocol's 202 said "text/html" for its empty body (Django's default).
    _, key = keyed_agent(f"notified-{version}")
    notification = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}
    headers = {"HTTP_MCP_PROTOCOL_VERSION": version} if version else {}
    response = client.post(
        "/mcp",
        json.dumps(notification),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
        HTTP_ACCEPT="application/json, text/event-stream",
        **headers,
    )
    assert response.status_code == 202, response.content
    assert response.content == b""
    assert "html" not in response.get("Content-Type", ""), response.get("Content-Type")


@pytest.mark.parametrize("depth", [65, 150, 1000, 100_000])
def test_http_json_nested_deeper_than_any_api_takes_is_an_invalid_request(client, depth):
    # 1,000 levels and more were a 500 (a RecursionError before the SDK); 65 to 299 went on
    # to the method (a tool ran with them), which every other API refuses past 64.
    agent, key = keyed_agent(f"deep-{depth}")
    nested = "[" * depth + "]" * depth
    body = '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": '
    body += f'"memory_save", "arguments": {{"content": "Deep", "metadata": {{"x": {nested}}}}}}}}}'
    response = post_mcp(client, key, body.encode())
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == -32600
    assert "nested more than 64 levels deep" in error["message"]
    assert not Memory.objects.filter(agent=agent).exists()


@pytest.mark.parametrize("request_id", [None, {"a": 1}, 1.5, True, [1]])
def test_http_a_request_whose_id_is_no_string_or_integer_is_answered(client, request_id):
    # The SDK took it for a notification: 202 and no answer, the caller left waiting.
    agent, key = keyed_agent(f"odd-id-{uuid.uuid4().hex[:8]}")
    call = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call"}
    call["params"] = {"name": "memory_save", "arguments": {"content": "Not to be saved"}}
    response = post_mcp(client, key, call)
    assert response.status_code == 400
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": "Invalid Request: id: a string or an integer"},
    }
    assert not Memory.objects.filter(agent=agent).exists()


def test_http_a_body_the_service_admits_is_not_refused_by_the_sdks_smaller_cap(client, settings):
    # The SDK's own cap (4 MB) answered a plain-text 413 to bodies the service admits.
    _, key = keyed_agent("large-body")
    response = call_tool(client, key, "memory_save", {"content": "x" * (5 * 1024 * 1024)})
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["result"]["isError"]  # (the content's own limit, as a tool error)


def test_http_a_body_that_is_no_json_is_a_parse_error(client):
    _, key = keyed_agent("not-json")
    response = post_mcp(client, key, b"{not json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32700


def test_http_memory_list_takes_a_whole_number_written_with_a_point(client):
    # JSON Schema's "integer", which memory_list publishes for its limit, admits 1.0 (a
    # JavaScript client's number): a page of one, not a protocol error (it was one, the
    # message a Python TypeError).
    agent, key = keyed_agent("float-limit")
    for content in ("The office is in Lisbon", "The team meets on Mondays"):
        memory_save(agent.as_principal(), agent=agent, content=content)
    response = call_tool(client, key, "memory_list", {"limit": 1.0})
    assert response.status_code == 200, response.content
    assert "error" not in response.json(), response.json()
    result = response.json()["result"]
    assert not result["isError"], result
    page = json.loads(result["content"][0]["text"])
    assert [m["content"] for m in page["data"]] == ["The team meets on Mondays"]
    assert page["nextCursor"]


def test_http_memory_list_refuses_a_cursor_of_another_list(client):
    """A cursor held only the last memory's place: one of another tag, or of the REST
    list, answered that list's memories past it, often none, read as the end (review). Its
    own cursors still walk the list."""
    agent, key = keyed_agent("cursor-lists")
    for content, tags in (("Lisbon office", ["office"]), ("Monday meetings", []), ("Tea", [])):
        memory_save(agent.as_principal(), agent=agent, content=content, tags=tags)

    def listed(**arguments):
        response = call_tool(client, key, "memory_list", arguments)
        assert response.status_code == 200, response.content
        return response.json()["result"]

    page = listed(limit=1)["structuredContent"]
    seen, cursor = [m["content"] for m in page["data"]], page["nextCursor"]
    while cursor:
        page = listed(limit=1, after=cursor)["structuredContent"]
        # (A tool's result leaves out what is null: the last page has no cursor.)
        seen, cursor = seen + [m["content"] for m in page["data"]], page.get("nextCursor")
    assert seen == ["Tea", "Monday meetings", "Lisbon office"]
    of_mcp = listed(limit=1)["structuredContent"]["nextCursor"]
    refused = listed(tag="office", after=of_mcp)
    assert refused["isError"], refused
    assert refused["content"][0]["text"] == f"after: {ANOTHER_LIST}", refused
    # The agent's API lists the same list: its cursor goes on here (each door named a list
    # of its own, and refused the other's: code review).
    rest = client.get("/v1/agent/memories", {"limit": 1}, HTTP_AUTHORIZATION=f"Bearer {key}").json()
    on = listed(limit=2, after=rest["nextCursor"])["structuredContent"]
    assert [m["content"] for m in on["data"]] == ["Monday meetings", "Lisbon office"]


def test_http_a_null_for_an_optional_argument_is_the_argument_left_out(client):
    """Models send ``"limit": null`` for what they do not mean to set, as their SDKs'
    optional parameters do: each such call was refused ("must be of type integer"; review).
    A null for a required argument is still refused, and nothing is saved."""
    agent, key = keyed_agent("nulls")
    saved = call_tool(
        client,
        key,
        "memory_save",
        {
            "content": "The office is in Lisbon",
            "summary": None,
            "importance": None,
            "tags": None,
            "messageIds": None,
        },
    ).json()["result"]
    assert not saved["isError"], saved
    memory = Memory.objects.get(agent=agent)
    assert (memory.importance, memory.tags, memory.summary) == (
        MEMORY_DEFAULT_IMPORTANCE,
        [],
        "",
    )
    found = call_tool(
        client, key, "memory_search", {"query": "office", "limit": None, "tags": None}
    ).json()["result"]
    assert not found["isError"], found
    assert [m["content"] for m in found["structuredContent"]["data"]] == [memory.content]
    refused = call_tool(client, key, "memory_save", {"content": None}).json()["result"]
    assert refused["isError"], refused
    assert refused["content"][0]["text"] == "content: must be of type string"
    assert Memory.objects.count() == 1


def test_http_memory_list_and_delete_treat_an_expired_memory_as_gone(client):
    # Expired, the daily prune not yet run: memory_list showed it (search did not); a
    # delete still reaches it, so that the prune does not give it a new life.
    agent, key = keyed_agent("expired-list")
    kept, _ = memory_save(agent.as_principal(), agent=agent, content="The office is in Lisbon")
    gone, _ = memory_save(agent.as_principal(), agent=agent, content="The team meets on Mondays")
    Memory.objects.filter(id=gone.id).update(
        expires_at=gone.created_at - timedelta(seconds=1), access_count=10
    )

    def call(name, arguments):
        response = call_tool(client, key, name, arguments)
        assert response.status_code == 200, response.content
        return json.loads(response.json()["result"]["content"][0]["text"])

    assert [m["id"] for m in call("memory_list", {})["data"]] == [str(kept.id)]
    assert call("memory_delete", {"id": str(gone.id)})["status"] == "deleted"
    assert list(Memory.objects.values_list("id", flat=True)) == [kept.id]


def test_http_memory_list_refuses_a_tag_longer_than_any_tag(client):
    # Compared with the stored tags it was cut to their length: a tag it is not, matched.
    agent, key = keyed_agent("long-tag")
    memory_save(agent.as_principal(), agent=agent, content="Tagged", tags=["t" * 100])
    response = call_tool(client, key, "memory_list", {"tag": "t" * 101})
    assert response.status_code == 200, response.content
    result = response.json()["result"]
    assert result["isError"], result
    assert result["structuredContent"]["code"] == "validation_error"
    assert result["content"][0]["text"].startswith("tag: ")


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"content": "x" * (settings.MEMSVC_MAX_MESSAGE_CHARS + 1)}, "content: must be at most"),
        ({"content": "x", "summary": "s" * 10_001}, "summary: must be at most 10000 characters"),
        ({"content": "x", "tags": ["a"] * 51}, "tags: must hold at most 50 items"),
        # Named and said as the REST API does ("tags.0", "'' should be non-empty": review).
        ({"content": "x", "tags": ["t" * 101]}, "tags[0]: must be at most 100 characters"),
        ({"content": ""}, "content: must not be empty"),
    ],
)
def test_http_a_refusal_of_an_argument_too_long_does_not_echo_it(client, arguments, problem):
    # The schema's own message quoted the whole value: a model that sent 100,000 characters
    # read them back twice (text and structured content) as its error.
    refused_without_echo(client, "memory_save", arguments, problem)


def test_http_a_list_too_long_is_refused_before_its_items_are_checked(client, monkeypatch):
    """The schema's check went through every item first: 1,500,000 tags took 24 s a call,
    and eight such calls held every tool thread a minute (review)."""
    import jsonschema

    def every_item_checked(errors):
        raise AssertionError("the items were checked")

    monkeypatch.setattr(jsonschema.exceptions, "best_match", every_item_checked)
    arguments = {"content": "x", "tags": [1] * 1_000}
    refused_without_echo(client, "memory_save", arguments, "tags: must hold at most 50 items")


@pytest.mark.parametrize(
    ("tool", "arguments", "problem"),
    [
        ("memory_list", {"order": "x" * 100_000}, "order: must be one of recent, popular"),
        ("memory_search", {"query": "q", "limit": "9" * 100_000}, "limit: must be of type"),
        ("memory_list", {"x" * 100_000: 1}, "x" * 63 + "…: unknown argument"),
        ("memory_list", {"limit": int("9" * 4000)}, "limit: must be at most 200"),
        ("memory_save", {"content": "x", "importance": -1}, "importance: must be at least 0"),
        ("memory_block_list", {"x": 1}, "x: takes no arguments"),
    ],
)
def test_http_a_value_of_another_kind_is_refused_without_echoing_it(
    client, tool, arguments, problem
):
    refused_without_echo(client, tool, arguments, problem)


@pytest.mark.parametrize(
    ("tool", "arguments", "argument"),
    [
        ("memory_block_append", {"label": "human", "text": "x" * 6000}, "text"),
        ("memory_block_append", {"label": "notes", "text": "x" * 6000}, "text"),  # (made now)
        ("memory_block_append", {"label": "human", "text": " \n "}, "text"),
        ("memory_block_append", {"label": "notes", "text": " \n "}, "text"),  # (not made)
        ("memory_block_replace", {"label": "human", "old": "Ada", "new": "x" * 6000}, "new"),
    ],
)
def test_http_a_block_tools_refusal_names_its_own_argument(client, tool, arguments, argument):
    """Not the agent API's field the tool fills (``append``, ``value``, ``replace``): a
    model was told to fix what it never sent (review)."""
    agent, key = keyed_agent("block-refusals")  # (its "human" block: "Name: Ada")
    result = call_tool(client, key, tool, arguments).json()["result"]
    assert result["isError"], result
    assert result["content"][0]["text"].startswith(f"{argument}: "), result
    assert list(result["structuredContent"]["details"]) == [argument]
    assert MemoryBlock.objects.get(agent=agent, label="human").value == "Name: Ada"
    assert not MemoryBlock.objects.filter(agent=agent, label="notes").exists()


def refused_without_echo(client, tool: str, arguments: dict, problem: str) -> None:
    _, key = keyed_agent("too-long")
    response = call_tool(client, key, tool, arguments)
    result = response.json()["result"]
    assert result["isError"], result
    assert result["content"][0]["text"].startswith(problem)
    assert len(response.content) < 1000
    assert not Memory.objects.exists()


def test_http_an_unknown_tool_is_named_cut_short(client):
    """Its name came back whole: 20 MB asked, 20 MB answered (review)."""
    _, key = keyed_agent("unknown-tool")
    response = call_tool(client, key, "x" * 100_000, {})
    assert response.json()["error"]["message"].startswith("Unknown tool: xxx")
    assert len(response.content) < 1000


def piped_stdio(agent: str, *calls: dict) -> tuple[subprocess.CompletedProcess, float]:
    """``memsvc mcp --agent <agent>`` given the start of a session and ``calls`` on stdin,
    which is closed once they are written (a script piping them in): the ended process, and
    the seconds it took."""
    local_agent_with_history(agent)
    start = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": agent, "version": "1"},
    }
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": start},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        *calls,
    ]
    started = time.monotonic()
    done = subprocess.run(
        [str(MEMSVC), "mcp", "--agent", agent],
        env=server_env(),
        cwd=REPO,
        input="".join(json.dumps(line) + "\n" for line in lines),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return done, time.monotonic() - started


def test_stdio_answers_the_calls_in_flight_when_the_client_closes_stdin():
    """A client that writes its requests and closes stdin (a script piping them in) was
    answered "Connection closed" for a call then done all the same (review)."""
    save = {"name": "memory_save", "arguments": {"content": "Piped fact: the key is blue"}}
    done, _ = piped_stdio(
        "piped",
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": save},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
    )
    answers = {answer["id"]: answer for answer in map(json.loads, done.stdout.splitlines())}
    assert sorted(answers) == [1, 2, 3], done.stdout
    assert "error" not in answers[2] and answers[2]["result"]["isError"] is False
    assert "tools" in answers[3]["result"]


def test_stdio_ends_at_once_after_a_call_the_client_cancelled():
    """A cancelled request gets no answer (MCP), and the end of stdin waited for one for
    120 s (review)."""
    search = {"name": "memory_search", "arguments": {"query": "billing"}}
    done, seconds = piped_stdio(
        "cancelling",
        {"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": search},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 6}},
    )
    assert seconds < 60
    assert json.loads(done.stdout.splitlines()[0])["id"] == 1
