"""The shared browser setup itself: Debian's Chromium opens a page of a second origin, and
reads from the live server what the test wrote to the database."""

from conversations.services import conversation_create
from memsvc.api.principals import Principal


def test_chromium_opens_a_second_origin_and_the_live_server(
    page, live_server, static_site, alice, tmp_path
):
    (tmp_path / "index.html").write_text("<title>second origin</title><p id=hello>hello</p>")
    page.goto(static_site(tmp_path))
    assert page.title() == "second origin"
    assert page.inner_text("#hello") == "hello"

    conversation_create(Principal.user(alice.id), title="Written by the test")
    page.goto(f"{live_server.url}/v1/health")
    titles = page.evaluate(
        """async (authorization) => {
            const response = await fetch("/v1/user/conversations", {headers: {authorization}});
            return (await response.json()).data.map((conversation) => conversation.title);
        }""",
        alice.auth_headers()["HTTP_AUTHORIZATION"],
    )
    assert titles == ["Written by the test"]
