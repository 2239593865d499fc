"""Search stores its data on the rows it indexes (``Message.embedding``, ``search_vector``).

This app owns the embedding backends, the hybrid search selectors and the Celery tasks that
fill those columns; it has no tables of its own yet.
"""
