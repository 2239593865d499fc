"""Render time of the web pages at size: ``python -m bench.pages``.

It starts a private memsvc (``bench.common``), makes a login (``memsvc user create``) and,
in this process through the services (Django set up on that server's database), a user with
``--conversations`` conversations (one message each) and one conversation of ``--messages``
messages. Then, sequentially:

- over real HTTP, with the session cookie of a login, as a browser: ``/app/`` and every
  later page of the list by its "More conversations" link; the long conversation (its latest
  50 messages) and every earlier page by its "Earlier messages" link; the conversation
  opened at its middle message (``?at=``, as a search hit links to it);
- the same pages in this process with Django's test client (view, templates and queries,
  no HTTP or gunicorn), with the number of queries of each.

Each walk is repeated ``--rounds`` times; p50 / p95 / max are printed with the 1-minute load
average, and written to ``bench-results/pages.json``.
"""

import argparse
import os
import re
import subprocess
import time
from html import unescape as html_unescape
from pathlib import Path

import httpx

from bench.common import (
    benchmark_server,
    log,
    make_client,
    memsvc_executable,
    percentile,
    private_env,
    write_json,
)

USER = "reader"
PASSWORD = "bench password, long enough"  # noqa: S105 (a throwaway server's login)
NEXT = re.compile(r'href="(\?(?:after|before)=[^"]+)"')


def memsvc(server, *args: str) -> str:
    result = subprocess.run(  # noqa: S603 (our own console script)
        [memsvc_executable(), *args],
        env=private_env(server.data_dir),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return result.stdout.strip()


def load(*, conversations: int, messages: int) -> tuple[str, str]:
    """In this process, through the services (Django set up on the server's database): the
    user's conversations, one message each, and the long one. Returns the long one's id and
    the id of its middle message."""
    from conversations.services import (
        NewMessage,
        conversation_create,
        message_append,
        messages_append,
    )
    from memsvc.api.principals import Principal

    user = Principal.user(USER)
    started = time.monotonic()
    for n in range(conversations):
        conversation = conversation_create(user, title=f"Conversation {n}")
        message_append(
            user,
            conversation=conversation,
            content=f"Message of conversation {n}: plans for the weekend",
        )
    log(f"  {conversations} conversations in {time.monotonic() - started:.0f} s")
    long = conversation_create(user, title="The long one")
    started = time.monotonic()
    ids = []
    for first in range(0, messages, 100):
        batch = [
            NewMessage(
                role="user" if n % 2 == 0 else "assistant",
                content=f"Turn {n}: " + "a few words about the trip, the dog and the weather. " * 3,
            )
            for n in range(first, min(first + 100, messages))
        ]
        ids += [m.id for m in messages_append(user, conversation=long, messages=batch)]
    log(f"  {messages} messages in {time.monotonic() - started:.0f} s")
    return str(long.id), str(ids[len(ids) // 2])


def login(url: str) -> httpx.Client:
    browser = httpx.Client(timeout=60)
    form = browser.get(f"{url}/app/login/").text
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    answer = browser.post(
        f"{url}/app/login/",
        data={"username": USER, "password": PASSWORD, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{url}/app/login/"},
    )
    if answer.status_code != 302:
        raise SystemExit(f"login failed: {answer.status_code}")
    return browser


def timed(browser: httpx.Client, url: str, params=None) -> tuple[float, str]:
    started = time.perf_counter()
    response = browser.get(url, params=params)
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise SystemExit(f"GET {url} {params}: {response.status_code}")
    return elapsed, response.text


def walk(browser, url: str, path: str) -> tuple[list[float], list[str]]:
    """Every page of a paged list, by its link to the next ("More conversations", "Earlier
    messages"): the time of each, and the path of each."""
    times, paths, query = [], [], ""
    while True:
        elapsed, html = timed(browser, f"{url}{path}{query}")
        times.append(elapsed)
        paths.append(f"{path}{query}")
        following = NEXT.search(html)
        if not following:
            return times, paths
        query = html_unescape(following.group(1))


def in_process(url_paths: dict[str, list[str]], rounds: int) -> dict[str, dict]:
    """The same pages rendered in this process by Django's test client (view, templates and
    queries; no HTTP, no gunicorn), each path once to warm up, then ``rounds`` times: the
    wall time of each rendering, the CPU time this process spent on it (Python: the view and
    the templates; less dependent on the machine's load than the wall time), the time its
    queries took (wall, PostgreSQL included) and how many there were."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    assert client.login(username=USER, password=PASSWORD)
    results = {}
    for name, paths in url_paths.items():
        for path in paths:
            client.get(path)
        wall, cpu, sql, counts = [], [], [], set()
        for _ in range(rounds):
            for path in paths:
                with CaptureQueriesContext(connection) as queries:
                    started, started_cpu = time.perf_counter(), time.process_time()
                    response = client.get(path)
                    cpu.append((time.process_time() - started_cpu) * 1000)
                    wall.append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200, (path, response.status_code)
                sql.append(sum(float(query["time"]) for query in queries) * 1000)
                counts.add(len(queries))
        results[name] = {"wall": wall, "cpu": cpu, "sql": sql, "queries": sorted(counts)}
    return results


def summary(name: str, times: list[float]) -> dict:
    row = {
        "page": name,
        "requests": len(times),
        "p50_ms": round(percentile(times, 50), 1),
        "p95_ms": round(percentile(times, 95), 1),
        "max_ms": round(max(times), 1),
    }
    log(
        f"  {name:<52} {row['requests']:>5} {row['p50_ms']:>8} {row['p95_ms']:>8} "
        f"{row['max_ms']:>8}"
    )
    return row


def rendered_summary(name: str, measured: dict) -> dict:
    row = {
        "page": name,
        "requests": len(measured["wall"]),
        "queries": measured["queries"],
        **{
            f"{kind}_{p}_ms": round(percentile(measured[kind], int(p[1:])), 1)
            for kind in ("wall", "cpu", "sql")
            for p in ("p50", "p95")
        },
    }
    log(
        f"  {name:<44} {row['requests']:>5} {row['wall_p50_ms']:>7} {row['wall_p95_ms']:>7}"
        f" {row['cpu_p50_ms']:>7} {row['cpu_p95_ms']:>7} {row['sql_p50_ms']:>7}"
        f" {row['sql_p95_ms']:>7} {','.join(map(str, row['queries'])):>7}"
    )
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pages", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5, help="times each walk is repeated")
    parser.add_argument("--keep-server", action="store_true")
    args = parser.parse_args(argv)

    client = make_client()
    with benchmark_server(
        client, url=None, api_key=None, keep=args.keep_server, agent_name="bench-pages"
    ) as (url, server):
        from bench.message_copy import setup_django
        from bench.search import database

        memsvc(server, "user", "create", USER, "--password", PASSWORD)
        with database(server.data_dir) as conn:
            setup_django(conn, server.data_dir)
        log(f"loading {args.conversations} conversations and {args.messages} messages")
        long, middle = load(conversations=args.conversations, messages=args.messages)

        # Over HTTP, as a browser: every page of both lists, by their links.
        browser = login(url)
        timed(browser, f"{url}/app/")  # warm up: templates compiled, connections open
        load_before = os.getloadavg()[0]
        lists, firsts, pages, latest, ats, paths = [], [], [], [], [], {}
        for _ in range(args.rounds):
            walked, list_paths = walk(browser, url, "/app/")
            firsts.append(walked[0])
            lists += walked
            walked, message_paths = walk(browser, url, f"/app/c/{long}/")
            latest.append(walked[0])
            pages += walked
            ats.append(timed(browser, f"{url}/app/c/{long}/", {"at": middle})[0])
        load_after = os.getloadavg()[0]
        log(f"over HTTP; load average (1 min) {load_before:.2f} before, {load_after:.2f} after")
        log(f"{'page':<54} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
        http = [
            summary(f"/app/, first page ({args.conversations} conversations)", firsts),
            summary("/app/, every page (50 a page)", lists),
            summary(f"conversation, latest page ({args.messages} messages)", latest),
            summary("conversation, every page (50 a page)", pages),
            summary("conversation opened at its middle (?at=)", ats),
        ]

        # In this process: the same pages, without HTTP and gunicorn, with their queries.
        paths = {
            "/app/, first page": ["/app/"],
            "/app/, every page": list_paths,
            "conversation, latest page": [f"/app/c/{long}/"],
            "conversation, every page": message_paths,
            "conversation opened at its middle (?at=)": [f"/app/c/{long}/?at={middle}"],
        }
        load_before_local = os.getloadavg()[0]
        local = in_process(paths, args.rounds)
        load_after_local = os.getloadavg()[0]
        log(
            f"in process (Django's test client); load average (1 min) "
            f"{load_before_local:.2f} before, {load_after_local:.2f} after"
        )
        log(
            f"{'page':<46} {'n':>5} {'wall':>7} {'':>7} {'cpu':>7} {'':>7} {'sql':>7} {'':>7}"
            f" {'queries':>7}\n{'':<46} {'':>5}" + " {:>7} {:>7}".format("p50", "p95") * 3
        )
        rendered = [rendered_summary(name, measured) for name, measured in local.items()]
        path = write_json(
            Path("bench-results") / "pages.json",
            {
                "http": http,
                "http_load_average": [load_before, load_after],
                "in_process": rendered,
                "in_process_load_average": [load_before_local, load_after_local],
                "args": vars(args),
            },
        )
        log(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
