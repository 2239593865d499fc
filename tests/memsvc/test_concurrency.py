"""memsvc.concurrency: under ASGI, at most half as many requests at work as the pool has
connections; the others wait their turn, none is refused."""

import asyncio

from django.http import HttpResponse

from memsvc.concurrency import ConcurrencyLimitMiddleware
from tests.memsvc.test_settings import run_django


def test_requests_beyond_half_the_pool_size_wait_their_turn(settings):
    settings.DB_POOL_SIZE = 4
    at_work, most = 0, 0

    async def view(request):
        nonlocal at_work, most
        at_work += 1
        most = max(most, at_work)
        await asyncio.sleep(0.05)
        at_work -= 1
        return HttpResponse("ok")

    middleware = ConcurrencyLimitMiddleware(view)

    async def many():
        return await asyncio.gather(*(middleware(object()) for _ in range(7)))

    responses = asyncio.run(many())
    assert [r.status_code for r in responses] == [200] * 7
    assert most == 2


def test_the_web_processes_asgi_application_waits_in_the_event_loop(tmp_path):
    """With a pool, the middleware comes first and Django calls it as a coroutine: the views
    after it run in a thread, and it waits in the event loop."""
    result = run_django(
        {"MEMSVC_DATA_DIR": str(tmp_path / "data"), "MEMSVC_DB_POOL_SIZE": "4"},
        "from django.conf import settings; print(settings.MIDDLEWARE[0]);"
        "from memsvc.asgi import application; from asgiref.sync import iscoroutinefunction;"
        "print(type(application._middleware_chain).__name__,"
        " iscoroutinefunction(application._middleware_chain))",
    )
    assert result.returncode == 0, result.stderr
    first, chain = result.stdout.splitlines()
    assert first == "memsvc.concurrency.ConcurrencyLimitMiddleware"
    assert chain.endswith("True")


def test_without_a_pool_it_is_not_there(settings):
    assert "memsvc.concurrency.ConcurrencyLimitMiddleware" not in settings.MIDDLEWARE
