"""gunicorn settings that ``memsvc serve`` adds to its command line (``-c python:...``)."""

import logging


class QueryValuesHidden(logging.Filter):
    """The access log's line (uvicorn's: client, method, path with its query, version,
    status) with the query's names only: a key, a token or a password a client put in the
    address, and what a person searched for (``/app/search/?q=``), were kept in clear
    (review)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) > 2 and isinstance(args[2], str):
            path, asked, query = args[2].partition("?")
            if asked:
                names = "&".join(f"{part.partition('=')[0][:40]}=…" for part in query.split("&"))
                record.args = (*args[:2], f"{path}?{names}", *args[3:])
        return True


def post_worker_init(worker):
    """Load the embedding model and start the MCP transport in the background: the worker
    answers at once, and the first search or MCP call does not pay for the load. Its access
    log shows no query's values (``QueryValuesHidden``)."""
    from agents_api.mcp_server import http as mcp_http
    from search.embeddings import warm_up_in_background

    logging.getLogger("uvicorn.access").addFilter(QueryValuesHidden())
    warm_up_in_background()
    mcp_http.warm_up_in_background()


def when_ready(server):
    """Said once the web server listens, so that a client that reads it can call (``memsvc
    serve`` said it as it started the web server, a second or more before: review)."""
    from memsvc.supervisor import log

    for listener in server.LISTENERS:
        log(f"serving on {listener}")
