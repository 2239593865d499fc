"""memsvc.concurrency: under ASGI, at most as many requests at work as the pool has
connections; the others wait their turn, none is refused."""

import asyncio

from django.http import HttpResponse

from memsvc.concurrency import ConcurrencyLimitMiddleware


def test_requests_beyond_the_pool_size_wait_their_turn(settings):
    settings.DB_POOL_SIZE = 2
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


def test_under_wsgi_or_without_a_pool_it_only_passes_requests_on(settings):
    settings.DB_POOL_SIZE = 2
    middleware = ConcurrencyLimitMiddleware(lambda request: HttpResponse("sync"))
    assert middleware(object()).content == b"sync"

    settings.DB_POOL_SIZE = 0

    async def view(request):
        return HttpResponse("async")

    assert asyncio.run(ConcurrencyLimitMiddleware(view)(object())).content == b"async"
