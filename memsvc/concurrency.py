"""At most half as many requests of a web process at work as its pool has connections.

Under ASGI each request runs its (synchronous) view in a thread of its own, with no bound:
64 clients would be 64 threads sharing the process's pool of ``MEMSVC_DB_POOL_SIZE``
connections, and a request that waited more than the pool's timeout for one would fail.
Here the excess waits before it starts, in the event loop (a socket and a coroutine, no
thread), and goes in as soon as another request is done. Half, because a request gives its
connection back only once its response is sent (Django's ``request_finished``), after it
left this middleware: the other half are for requests finishing so.

Settings list it only with a pool (the web processes). It is async only: Django then runs
everything after it, views included, in the request's thread, and it waits in the event
loop. (Under WSGI, Django would give each request an event loop of its own, and so a
semaphore of its own: no limit, no harm.)
"""

import asyncio
import weakref

from asgiref.sync import markcoroutinefunction
from django.conf import settings


class ConcurrencyLimitMiddleware:
    async_capable = True
    sync_capable = False

    def __init__(self, get_response):
        self.get_response = get_response
        self.limit = max(1, settings.DB_POOL_SIZE // 2)
        self.semaphores: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        markcoroutinefunction(self)

    async def __call__(self, request):
        loop = asyncio.get_running_loop()
        semaphore = self.semaphores.get(loop)
        if semaphore is None:
            semaphore = self.semaphores[loop] = asyncio.Semaphore(self.limit)
        async with semaphore:
            return await self.get_response(request)
