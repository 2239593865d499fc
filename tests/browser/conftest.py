"""Browser tests: a real Chromium (Debian's package, /usr/bin/chromium) driven by Playwright,
against memsvc served live on the test database.

What the tests here get:

- ``live_server`` (pytest-django's): memsvc in a thread on a free port of localhost, on the test
  database. A test using it runs with transactional database access, so what the test writes
  through the ORM or the services is what the server sees, and the other way around.
- ``browser``: one headless Chromium for the tests of this folder (stopped after them).
- ``page``: a new page in a fresh browser context (no cookies, no storage) for each test.
- ``static_site(directory)``: serves a folder over HTTP on a free port of 127.0.0.1, a second
  origin beside the live server (a chat frontend of its own, say); returns its URL.

Every test under tests/browser is marked ``browser``: ``pytest -m browser`` runs only them,
``-m 'not browser'`` leaves them out. Without Chromium they fail and say how to install it
(``scripts/setup`` does, as root), unless ``MEMSVC_SKIP_BROWSER_TESTS=1`` says this machine
cannot have it. ``MEMSVC_CHROMIUM`` names another Chromium binary.
"""

import functools
import shutil
import threading
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from memsvc.env import env_bool, env_str

HERE = Path(__file__).resolve().parent

# Generous: two cores are shared by Chromium, the live server, PostgreSQL and more.
TIMEOUT_MS = 20_000


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.browser)


def chromium_path() -> str:
    path = env_str("MEMSVC_CHROMIUM") or shutil.which("chromium")
    if path:
        return path
    message = (
        "No Chromium for the browser tests. Install Debian's package "
        "(`apt-get install chromium` as root; scripts/setup does it when run as root), "
        "set MEMSVC_CHROMIUM to a Chromium binary, or set MEMSVC_SKIP_BROWSER_TESTS=1 "
        "on a machine that cannot have one."
    )
    if env_bool("MEMSVC_SKIP_BROWSER_TESTS", False):
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="package")
def browser():
    from playwright.sync_api import expect, sync_playwright

    executable = chromium_path()
    expect.set_options(timeout=TIMEOUT_MS)
    # Playwright's sync API keeps an asyncio loop running in this thread from start to stop,
    # which Django takes for async code and refuses ORM calls from (SynchronousOnlyOperation).
    # The tests are plain synchronous code that only waits on the browser, so Django's guard
    # is lifted while the browser runs, which is only while this folder's tests run (package
    # scope), and put back after them.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        chromium = playwright.chromium.launch(executable_path=executable)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    yield context.new_page()
    context.close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def static_site() -> Iterator[Callable[[Path], str]]:
    servers = []

    def serve(directory: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(directory))
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        servers.append((httpd, thread))
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield serve
    for httpd, thread in servers:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
