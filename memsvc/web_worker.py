"""The web server's worker process: uvicorn's, taking new connections one at a time.

gunicorn's workers share its listening socket, and asyncio takes every connection waiting
there at each wake-up (as many as the socket's backlog): clients that connect together, as
a pool of kept-alive connections does, all went to the worker that woke first. Under
``bench.load``'s 16 clients one web process served every request while the other idled
(38 s of CPU against 3). Here a worker takes one connection at a wake-up and then lets the
others run (``sched_yield``): each worker woken by the same connections takes its turn, also
on a busy machine, where the one that ran first took them all (docs/benchmarks.md,
"Connections shared by the web processes").
"""

import os
import socket

from uvicorn_worker import UvicornWorker


class _OneAtATime(socket.socket):
    """A copy of a listening socket that keeps the queue gunicorn gave it whatever
    ``listen`` asks (asyncio calls it with the backlog it is given, which also sets how many
    connections it takes at a wake-up), and gives the processor to the other workers after
    each connection it takes."""

    queue: int

    def listen(self, backlog=None):
        super().listen(self.queue)

    def accept(self):
        taken = super().accept()
        os.sched_yield()
        return taken


class OneConnectionAtATimeWorker(UvicornWorker):
    """``uvicorn_worker.UvicornWorker`` taking one new connection at each wake-up."""

    # asyncio's loop, whose accept and listen go through the socket object (uvloop's call
    # the descriptor itself: its queue would be one connection long).
    CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "loop": "asyncio"}

    async def _serve(self) -> None:
        shared = self.sockets
        self.sockets = [_one_at_a_time(listener, queue=self.cfg.backlog) for listener in shared]
        self.config.backlog = 1  # (asyncio's accept loop: one a wake-up)
        try:
            await super()._serve()
        finally:
            self.sockets = shared


def _one_at_a_time(listener, *, queue: int) -> _OneAtATime:
    copy = _OneAtATime(
        listener.family, listener.type, listener.proto, fileno=socket.dup(listener.fileno())
    )
    copy.queue = queue
    return copy
