"""The web server's worker process: uvicorn's, taking new connections one at a time.

gunicorn's workers share its listening socket, and asyncio takes every connection waiting
there at each wake-up (as many as the socket's backlog): clients that connect together, as
a pool of kept-alive connections does, all went to the worker that woke first. Under
``bench.load``'s 16 clients one web process served every request while the other idled
(38 s of CPU against 3), and one process's interpreter was the whole web server's limit.
Taking one connection per wake-up, each worker takes its turn: the one less busy wakes
first (docs/benchmarks.md, "Connections shared by the web processes").
"""

import socket

from uvicorn_worker import UvicornWorker


class _QueueKept(socket.socket):
    """A copy of a listening socket whose ``listen`` keeps the queue gunicorn gave it: the
    backlog asyncio is given also sets how many connections it takes at a wake-up, and it
    calls ``listen`` with it."""

    queue: int

    def listen(self, backlog=None):
        super().listen(self.queue)


class OneConnectionAtATimeWorker(UvicornWorker):
    """``uvicorn_worker.UvicornWorker`` taking one new connection at each wake-up."""

    async def _serve(self) -> None:
        shared = self.sockets
        self.sockets = [_one_at_a_time(listener, queue=self.cfg.backlog) for listener in shared]
        self.config.backlog = 1  # (asyncio's accept loop: one a wake-up)
        try:
            await super()._serve()
        finally:
            self.sockets = shared


def _one_at_a_time(listener, *, queue: int) -> _QueueKept:
    copy = _QueueKept(
        listener.family, listener.type, listener.proto, fileno=socket.dup(listener.fileno())
    )
    copy.queue = queue
    return copy
