"""Render time of the web pages at size: ``python -m bench.pages``.

It starts a private memsvc (``bench.common``), makes a login (``memsvc user create``) and,
through the APIs, a user with ``--conversations`` conversations (one message each) and one
conversation of ``--messages`` messages (an agent acting for the user appends them in bulk).
Then a logged-in client (session cookie, as a browser) times, sequentially, over real HTTP:

- ``/app/`` (the first page of the list) and every later page reached by its "More" link;
- the long conversation's page (its first 50 messages), every later page, and the page
  opened at a message in its middle (``?at=``, as a search hit links to it).

Each kind is requested ``--rounds`` times; p50 / p95 / max are printed with the 1-minute load
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
    api_call,
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
NEXT = re.compile(r'href="\?after=([^"]+)"')


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


def load(client: httpx.Client, url: str, token: str, *, conversations: int, messages: int):
    """The user's conversations and the long one; returns the long one's id."""
    user = {"Authorization": f"Bearer {token}"}
    started = time.monotonic()
    for n in range(conversations):
        created = api_call(
            client,
            "POST",
            f"{url}/v1/user/conversations",
            expect=201,
            json_body={"title": f"Conversation {n}"},
            headers=user,
        ).json()
        api_call(
            client,
            "POST",
            f"{url}/v1/user/conversations/{created['id']}/messages",
            expect=201,
            json_body={"content": f"Message of conversation {n}: plans for the weekend"},
            headers=user,
        )
    log(f"  {conversations} conversations in {time.monotonic() - started:.0f} s")
    agent_id = api_call(client, "GET", f"{url}/v1/agent/me").json()["id"]
    long = api_call(
        client,
        "POST",
        f"{url}/v1/user/conversations",
        expect=201,
        json_body={"title": "The long one", "agentId": agent_id},
        headers=user,
    ).json()["id"]
    started = time.monotonic()
    for first in range(0, messages, 100):
        batch = [
            {
                "role": "user" if n % 2 == 0 else "assistant",
                "content": f"Turn {n}: "
                + "a few words about the trip, the dog and the weather. " * 3,
            }
            for n in range(first, min(first + 100, messages))
        ]
        api_call(
            client,
            "POST",
            f"{url}/v1/agent/conversations/{long}/messages",
            expect=201,
            json_body={"messages": batch},
        )
    log(f"  {messages} messages in {time.monotonic() - started:.0f} s")
    return long


def message_at(client, url: str, token: str, conversation: str, index: int) -> str:
    """The id of the conversation's ``index``-th message (through the user API's pages)."""
    params, seen = {"limit": 200}, 0
    while True:
        page = api_call(
            client,
            "GET",
            f"{url}/v1/user/conversations/{conversation}/messages",
            params=params,
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        if index < seen + len(page["data"]):
            return page["data"][index - seen]["id"]
        seen += len(page["data"])
        params = {"limit": 200, "after": page["nextCursor"]}


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


def walk(browser, url: str) -> list[float]:
    """Every page of a paged list, by its "More" link: the time of each."""
    times, params = [], None
    while True:
        elapsed, html = timed(browser, url, params)
        times.append(elapsed)
        following = NEXT.search(html)
        if not following:
            return times
        params = {"after": html_unescape(following.group(1))}


def summary(name: str, times: list[float]) -> dict:
    row = {
        "page": name,
        "requests": len(times),
        "p50_ms": round(percentile(times, 50), 1),
        "p95_ms": round(percentile(times, 95), 1),
        "max_ms": round(max(times), 1),
    }
    log(
        f"  {name:<44} {row['requests']:>5} {row['p50_ms']:>8} {row['p95_ms']:>8} {row['max_ms']:>8}"
    )
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5, help="times each walk is repeated")
    parser.add_argument("--keep-server", action="store_true")
    args = parser.parse_args(argv)

    client = make_client()
    with benchmark_server(
        client, url=None, api_key=None, keep=args.keep_server, agent_name="bench-pages"
    ) as (url, server):
        memsvc(server, "user", "create", USER, "--password", PASSWORD)
        token = memsvc(server, "token", USER)
        log(f"loading {args.conversations} conversations and {args.messages} messages")
        long = load(client, url, token, conversations=args.conversations, messages=args.messages)
        browser = login(url)
        timed(browser, f"{url}/app/")  # warm up: templates compiled, connections open
        middle = message_at(client, url, token, long, args.messages // 2)
        load_before = os.getloadavg()[0]
        rows, lists, firsts, pages, ats, conversation_pages = [], [], [], [], [], []
        for _ in range(args.rounds):
            walked = walk(browser, f"{url}/app/")
            firsts.append(walked[0])
            lists += walked
            walked = walk(browser, f"{url}/app/c/{long}/")
            conversation_pages.append(walked[0])
            pages += walked
            ats.append(timed(browser, f"{url}/app/c/{long}/", {"at": middle})[0])
        load_after = os.getloadavg()[0]
        log(f"{'page':<46} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
        rows.append(summary(f"/app/ first page ({args.conversations} conversations)", firsts))
        rows.append(summary("/app/ every page (50 a page)", lists))
        rows.append(
            summary(f"conversation first page ({args.messages} messages)", conversation_pages)
        )
        rows.append(summary("conversation every page (50 a page)", pages))
        rows.append(summary("conversation opened at its middle message (?at=)", ats))
        log(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after")
        path = write_json(
            Path("bench-results") / "pages.json",
            {"rows": rows, "load_average": [load_before, load_after], "args": vars(args)},
        )
        log(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
