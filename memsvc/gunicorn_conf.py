"""gunicorn settings that ``memsvc serve`` adds to its command line (``-c python:...``)."""

import threading


def post_worker_init(worker):
    """Load the embedding model in the background: the worker answers at once, and the first
    search does not pay for the model load."""
    from search.embeddings import LocalBackend, configured_backend

    backend = configured_backend()
    if isinstance(backend, LocalBackend):
        threading.Thread(target=backend.warm_up, name="embedding-warm-up", daemon=True).start()
