"""Start-up checks of the search configuration."""

from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from search.embeddings import EmbeddingBackend, EmbeddingError, configured_backend


def column_dimension() -> int:
    """The width of ``message.embedding`` in the database (pgvector keeps it as the typmod)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT atttypmod FROM pg_attribute "
            "WHERE attrelid = 'message'::regclass AND attname = 'embedding'"
        )
        return cursor.fetchone()[0]


def check_embedding_dimension(backend: EmbeddingBackend | None = None) -> None:
    """Refuse to start when the model's vectors do not fit the database column.

    A remote backend that cannot be reached now is not an error here (it may come back);
    a backend that answers with the wrong width is.
    """
    backend = backend or configured_backend()
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
