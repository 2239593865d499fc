"""gunicorn settings that ``memsvc serve`` adds to its command line (``-c python:...``)."""


def post_worker_init(worker):
    """Load the embedding model and start the MCP transport in the background: the worker
    answers at once, and the first search or MCP call does not pay for the load."""
    from agents_api.mcp_server import http as mcp_http
    from search.embeddings import warm_up_in_background

    warm_up_in_background()
    mcp_http.warm_up_in_background()


def when_ready(server):
    """Said once the web server listens, so that a client that reads it can call (``memsvc
    serve`` said it as it started the web server, a second or more before: review)."""
    from memsvc.supervisor import log

    for listener in server.LISTENERS:
        log(f"serving on {listener}")
