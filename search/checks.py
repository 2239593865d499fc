"""Start-up checks of the search configuration."""

import sys

from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from search.embeddings import EmbeddingBackend, EmbeddingError, LocalBackend, configured_backend


def column_dimension() -> int:
    """The width of ``message.embedding`` in the database (pgvector keeps it as the typmod)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT atttypmod FROM pg_attribute "
            "WHERE attrelid = 'message'::regclass AND attname = 'embedding'"
        )
        return cursor.fetchone()[0]


def check_embedding_dimension(backend: EmbeddingBackend | None = None) -> None:
    """Refuse to start when the model's vectors do not fit the database column, or when a
    local model cannot run at the configured precision.

    A remote backend that cannot be reached now is not an error here (it may come back);
    a backend that answers with the wrong width is.
    """
    backend = backend or configured_backend()
    if isinstance(backend, LocalBackend):
        backend.check_runtime()  # an int8 model ONNX Runtime cannot run stops start-up too
    try:
        dimension = backend.dimension
    except EmbeddingError:
        return
    expected = column_dimension()
    if dimension != expected:
        raise ImproperlyConfigured(
            f"the embedding model {backend.model!r} ({backend.name}) makes {dimension}-dimensional "
            f"vectors but the database column holds {expected}: set MEMORY_EMBEDDING_DIMENSION "
            f"and MEMORY_EMBEDDING_MODEL to match, migrate the column, then `memsvc reindex --all`"
        )


def other_vector_models(backend: EmbeddingBackend | None = None) -> list[str]:
    """Models of stored vectors other than the configured one (a few at most).

    Semantic search compares only vectors of the configured model, so after a change of
    model or precision the older vectors are skipped until ``memsvc reindex --all``
    (keywords still find every message). One probe at start-up: it may read the table.
    """
    backend = backend or configured_backend()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT embedding_model FROM ("
            "SELECT embedding_model FROM message WHERE embedding_model NOT IN ('', %s) LIMIT 1000"
            ") other ORDER BY 1",
            [backend.model],
        )
        return [model for (model,) in cursor.fetchall()]


def warn_about_other_vector_models(backend: EmbeddingBackend | None = None) -> None:
    """Say at start-up when stored vectors need ``memsvc reindex --all``."""
    backend = backend or configured_backend()
    others = other_vector_models(backend)
    if others:
        print(
            f"memsvc: warning: some messages have vectors of {', '.join(others)}, not of "
            f"{backend.model}; semantic search skips them until `memsvc reindex --all`",
            file=sys.stderr,
            flush=True,
        )
