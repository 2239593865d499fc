"""Start-up checks of the search configuration."""

import sys

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from search.embeddings import (
    EmbeddingBackend,
    EmbeddingError,
    LocalBackend,
    WrongDimension,
    configured_backend,
)

# The tables whose ``embedding`` column holds the configured model's vectors.
VECTOR_TABLES = ("message", "memory", "tool_record")


def column_dimensions() -> dict[str, int]:
    """The width of each table's ``embedding`` column in the database (pgvector keeps it as
    the typmod)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attrelid::regclass::text, atttypmod FROM pg_attribute "
            "WHERE attrelid = ANY(%s::regclass[]) AND attname = 'embedding'",
            [list(VECTOR_TABLES)],
        )
        return dict(cursor.fetchall())


def check_embedding_dimension(backend: EmbeddingBackend | None = None) -> None:
    """Refuse to start when the vector columns are not as wide as
    ``MEMORY_EMBEDDING_DIMENSION`` (every embedding is checked against it:
    ``WrongDimension``), when the model's vectors are not either, or when a local model
    cannot run at the configured precision.

    A remote backend that cannot be reached now is not an error here (it may come back);
    a backend that answers with the wrong width is.
    """
    backend = backend or configured_backend()
    if isinstance(backend, LocalBackend):
        backend.check_runtime()  # an int8 model ONNX Runtime cannot run stops start-up too
    expected = settings.MEMORY_EMBEDDING_DIMENSION
    columns = column_dimensions()
    for table in VECTOR_TABLES:
        if columns[table] != expected:
            raise ImproperlyConfigured(
                f"MEMORY_EMBEDDING_DIMENSION is {expected} but the database column "
                f"{table}.embedding holds {columns[table]}: the tables were made for another "
                "model; set it back, or make them as wide: `memsvc reindex --resize` (the service "
                "stopped)"
            )
    check_model_width(backend)


def check_model_width(backend: EmbeddingBackend | None = None, *, must_answer=False) -> None:
    """Refuse when the model's vectors are not ``MEMORY_EMBEDDING_DIMENSION`` wide; with
    ``must_answer`` also when a remote model cannot be asked now (before ``memsvc reindex
    --resize`` drops every vector: it dropped them for a model of the old width, and
    refused only afterwards: code review)."""
    backend = backend or configured_backend()
    expected = settings.MEMORY_EMBEDDING_DIMENSION
    try:
        dimension = backend.dimension
    except WrongDimension as exc:
        dimension = exc.width
    except EmbeddingError as exc:
        if must_answer:
            raise ImproperlyConfigured(
                f"the embedding model {backend.model!r} ({backend.name}) could not be asked "
                f"the width of its vectors ({exc}): nothing was changed"
            ) from None
        return
    if dimension != expected:
        raise ImproperlyConfigured(
            f"the embedding model {backend.model!r} ({backend.name}) makes {dimension}-dimensional "
            f"vectors, not MEMORY_EMBEDDING_DIMENSION's {expected}: set MEMORY_EMBEDDING_DIMENSION "
            "and MEMORY_EMBEDDING_MODEL to match, then `memsvc reindex --resize`"
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
