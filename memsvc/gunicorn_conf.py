"""gunicorn settings that ``memsvc serve`` adds to its command line (``-c python:...``)."""


def post_worker_init(worker):
    """Load the embedding model in the background: the worker answers at once, and the first
    search does not pay for the model load."""
    from search.embeddings import warm_up_in_background

    warm_up_in_background()
