"""At most as many requests of a web process at work as it has database connections.

Under ASGI each request runs its (synchronous) view in a thread of its own, with no bound:
64 clients would be 64 threads sharing the process's pool of ``MEMSVC_DB_POOL_SIZE``
connections, and a request that waited more than the pool's timeout for one would fail.
Here the excess waits before it starts, in the event loop (a socket and a coroutine, no
thread), and goes in as soon as another request is done. Under WSGI, or without a pool,
this middleware does nothing.
"""

import asyncio

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings


class ConcurrencyLimitMiddleware:
    async_capable = True
    sync_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.limit = settings.DB_POOL_SIZE
        self.semaphore: asyncio.Semaphore | None = None  # made in the server's event loop
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._limited(request)
        return self.get_response(request)

    async def _limited(self, request):
        if not self.limit:
            return await self.get_response(request)
        if self.semaphore is None:
            self.semaphore = asyncio.Semaphore(self.limit)
        async with self.semaphore:
            return await self.get_response(request)
