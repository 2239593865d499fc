"""Embedding backends. The local model runs for real; the remote ones talk HTTP to a local
test server standing in for Ollama / OpenAI (outside services, so faked at the HTTP level)."""

import importlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from agents_api.models import Memory
from search import embeddings, onnx_encoder
from search.checks import check_embedding_dimension, column_dimensions, other_vector_models
from search.embeddings import (
    EmbeddingError,
    LocalBackend,
    OllamaBackend,
    OpenAIBackend,
    WrongDimension,
    configured_backend,
    embedding_text,
    get_embedding_backend,
)
from search.onnx_encoder import OnnxSentenceEncoder
from tests.factories import AgentFactory, MessageFactory
from tests.local_http import LocalHttpServer, Reply
from tests.memsvc.test_settings import run_django


class FakeEmbeddingServer(LocalHttpServer):
    """Answers each request with ``respond(path, body) -> (status, payload)``."""

    def __init__(self, respond):
        super().__init__(lambda method, path, body: Reply(*respond(path, body)))


def fake_vector(text: str, dimension: int = 8) -> list[float]:
    rng = np.random.default_rng(abs(hash(text)) % 2**32)
    return rng.normal(size=dimension).tolist()


# --- local ------------------------------------------------------------------------------------


def test_the_local_model_loads_from_the_package_and_embeds():
    backend = LocalBackend()
    assert backend.declared_dimension() == 384
    vectors = backend.embed(
        ["I adopted a puppy", "We got a new dog from the shelter", "The stock market fell"]
    )
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    dog, puppy, stocks = vectors[1], vectors[0], vectors[2]
    assert dog @ puppy > dog @ stocks + 0.2
    assert backend.embed([]).shape == (0, 384)


def test_the_models_graphs_are_kept_where_the_setting_says(settings, tmp_path):
    """MEMSVC_MODEL_CACHE_DIR: data directories (the test suite's servers, an image) may
    share the graphs made once; a graph found there is used, not made again."""
    made = configured_backend()._load().session._model_path  # the suite's own cache
    for graph in Path(made).parent.glob("model-*.onnx"):
        (tmp_path / graph.name).write_bytes(graph.read_bytes())
    settings.MEMSVC_MODEL_CACHE_DIR = tmp_path
    encoder = LocalBackend()._load()
    assert Path(encoder.session._model_path) == tmp_path / Path(made).name


@pytest.mark.parametrize("seconds", [0.1, 0.2])
def test_a_process_that_ends_while_its_model_loads_exits_cleanly(tmp_path, seconds):
    """A process ended while ONNX Runtime was making the model's session (the background
    warm-up of `memsvc mcp`, of a web process) was aborted (SIGABRT); it now waits for it.
    (``seconds`` after ONNX Runtime's import: inside the session's making on this machine.)"""
    configured_backend().warm_up()  # the graph is made: the load is the short one
    result = run_django(
        {"MEMSVC_DATA_DIR": str(tmp_path / "data")},
        "import sys, time; from search.embeddings import warm_up_in_background;"
        "warm_up_in_background()\n"
        "while 'onnxruntime' not in sys.modules: time.sleep(0.001)\n"
        f"time.sleep({seconds})",
    )
    assert result.returncode == 0, result.stderr


def test_a_warm_up_cut_short_is_said_in_a_line_not_a_traceback(caplog):
    """A short `memsvc mcp` session ended as its model loaded: the warm-up's thread printed
    "cannot schedule new futures after interpreter shutdown" as a traceback (review)."""
    from search.embeddings import _warm_up_quietly

    class CutShort:
        def warm_up(self):
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    with caplog.at_level(logging.INFO, logger="search.embeddings"):
        _warm_up_quietly(CutShort())
    assert "warm-up stopped: cannot schedule new futures" in caplog.text


def test_the_onnx_encoder_tokenizes_as_transformers_does():
    """The encoder reads the fast tokenizer from its file, without transformers (and torch):
    the model's inputs must be the ids, masks and padding transformers' tokenizer gives."""
    from transformers import AutoTokenizer

    backend = configured_backend()
    encoder = backend._load()
    assert isinstance(encoder, OnnxSentenceEncoder)
    texts = [
        "Caroline: I went to a LGBTQ support group yesterday!",
        "",
        "Café naïve RÉSUMÉ Straße ﬁne",
        "emoji 😀🎉 and 日本語 中文 text",
        "word " * 600,  # truncated at the model's 256 tokens
        "a\u0301 tab\there\nnewline",
    ]
    tokenizer = AutoTokenizer.from_pretrained(backend._model_path())
    settings = {"padding": True, "truncation": True, "max_length": encoder.max_length}
    reference = tokenizer(texts, **settings, return_tensors="np")
    ours = encoder.tokens(texts)
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        assert np.array_equal(ours[name], reference[name]), name
    assert ours["input_ids"].shape == (len(texts), 256)
    # One text (a query), tokenized by another call: each as transformers gives it alone.
    for text in texts:
        alone = AutoTokenizer.from_pretrained(backend._model_path())(
            [text],
            padding=True,
            truncation=True,
            max_length=encoder.max_length,
            return_tensors="np",
        )
        ours = encoder.tokens([text])
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            assert np.array_equal(ours[name], alone[name]), (text[:20], name)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> Path:
    """A model cache of this module's own, its graphs made from the packaged weights by the
    first test that needs them (each export costs seconds of a slow host's CPU)."""
    return tmp_path_factory.mktemp("graphs")


def test_onnx_runtime_and_torch_give_the_same_vectors(graphs):
    texts = ["Caroline: I went to a support group", "short", "a much longer sentence " * 20]
    onnx = LocalBackend(precision="float32", runtime="onnx", cache_dir=graphs)
    torch = LocalBackend(precision="float32", runtime="torch")
    fast, reference = onnx.embed(texts), torch.embed(texts)
    assert isinstance(onnx._load(), OnnxSentenceEncoder)
    assert list(graphs.glob("*.onnx"))  # exported once, from the packaged weights
    assert np.allclose(fast, reference, atol=1e-4)
    # A second backend reuses the exported graph.
    assert np.allclose(
        LocalBackend(precision="float32", runtime="onnx", cache_dir=graphs).embed(texts), fast
    )
    assert onnx.model == torch.model == "all-MiniLM-L6-v2"


def test_int8_weights_keep_the_vectors_close_and_the_ranking(graphs):
    texts = [
        "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.",
        "Melanie: I painted a lake sunrise last year, it's special to me.",
        "Caroline: I'm keen on counseling or working in mental health.",
        "Melanie: We went camping in the mountains with the kids.",
        "Jon: I lost my job as a banker, so I'm starting a dance studio.",
    ]
    questions = [
        "When did Caroline go to the support group?",
        "What did Melanie paint?",
        "What career does Caroline want?",
        "Where did Melanie camp?",
        "What business is Jon starting?",
    ]
    int8 = LocalBackend(cache_dir=graphs)
    reference = LocalBackend(precision="float32", runtime="onnx", cache_dir=graphs)
    assert int8.model == "all-MiniLM-L6-v2@int8"  # stored with its vectors: never mixed
    quantised, exact = int8.embed(texts), reference.embed(texts)
    assert len(list(graphs.glob("*-int8.onnx"))) == 1
    cosines = (quantised * exact).sum(axis=1)
    assert cosines.min() > 0.97, cosines
    # Each question still finds its own turn first.
    for backend, turns in ((int8, quantised), (reference, exact)):
        ranking = (backend.embed(questions) @ turns.T).argmax(axis=1)
        assert ranking.tolist() == list(range(len(texts)))


def test_an_int8_vector_does_not_depend_on_the_texts_embedded_with_it(graphs):
    # The int8 graph quantises activations with one scale per input: run in a batch, a text
    # got another vector than alone (cosine 0.99), and a query is always embedded alone.
    int8 = LocalBackend(cache_dir=graphs)
    text = "I adopted a puppy named Rex last week"
    alone = int8.embed([text])[0]
    for companion in ["Wow!", "The marathon plan is going well, twenty kilometres on Sunday"]:
        together = int8.embed([companion, text, companion])[1]
        assert np.allclose(together, alone, atol=1e-6), float(together @ alone)


def test_processes_starting_together_make_the_graph_once(tmp_path, monkeypatch):
    made = []

    def slow_write(kind):
        def write(source, target):
            made.append(kind)
            time.sleep(0.2)  # long enough for the other caller to arrive meanwhile
            target.write_bytes(b"graph")

        return write

    monkeypatch.setattr(onnx_encoder, "_export", slow_write("export"))
    monkeypatch.setattr(onnx_encoder, "_quantize", slow_write("quantize"))
    model_dir = LocalBackend()._model_path()
    with ThreadPoolExecutor(max_workers=3) as pool:
        paths = list(
            pool.map(lambda _: onnx_encoder.graph_path(Path(model_dir), tmp_path, "int8"), range(3))
        )
    assert made == ["export", "quantize"]
    assert len(set(paths)) == 1 and paths[0].read_bytes() == b"graph"
    assert onnx_encoder.graph_path(Path(model_dir), tmp_path, "float32").exists()
    assert made == ["export", "quantize"]


def test_int8_needs_onnx_runtime():
    with pytest.raises(ImproperlyConfigured):
        LocalBackend(runtime="torch")
    with pytest.raises(ImproperlyConfigured):
        LocalBackend(precision="float16")


def test_the_text_embedded_names_the_speaker():
    assert embedding_text("Caroline", "I went to a support group") == (
        "Caroline: I went to a support group"
    )
    assert embedding_text("", "no speaker") == "no speaker"


def test_the_factory_builds_each_kind():
    assert isinstance(get_embedding_backend("local"), LocalBackend)
    assert isinstance(
        get_embedding_backend("ollama", model="m", base_url="http://x"), OllamaBackend
    )
    assert isinstance(get_embedding_backend("openai", model="m"), OpenAIBackend)
    with pytest.raises(ImproperlyConfigured):
        get_embedding_backend("chroma")


# --- ollama -----------------------------------------------------------------------------------


def test_ollama_embeds_in_one_call_and_learns_the_dimension():
    def respond(path, body):
        assert path == "/api/embed"
        return 200, {"embeddings": [fake_vector(text) for text in body["input"]]}

    with FakeEmbeddingServer(respond) as server:
        backend = OllamaBackend("nomic-embed-text", base_url=server.url)
        vectors = backend.embed(["a", "b", "c"])
        assert vectors.shape == (3, 8)
        assert backend.dimension == 8
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert (server.requests[0].path, server.requests[0].body) == (
        "/api/embed",
        {"model": "nomic-embed-text", "input": ["a", "b", "c"]},
    )


@pytest.mark.parametrize(("answered", "said"), [(float("nan"), "not finite"), (0.0, "zeros")])
def test_a_vector_without_a_direction_is_the_backends_failure(answered, said):
    """(Stored, NaN was the database's refusal, answered as a 400 to the client and the
    memory not saved; zeros made every score NaN, a 500 at each search: review.)"""

    def respond(path, body):
        vectors = [fake_vector(text) for text in body["input"]]
        vectors[-1] = [answered] * 8
        return 200, {"embeddings": vectors}

    with (
        FakeEmbeddingServer(respond) as server,
        pytest.raises(EmbeddingError, match=said) as excinfo,
    ):
        OllamaBackend("m", base_url=server.url).embed(["a", "b"])
    assert excinfo.value.transient is False


def test_an_older_ollama_is_asked_one_text_at_a_time():
    def respond(path, body):
        if path == "/api/embed":
            return 404, {"error": "not found"}
        return 200, {"embedding": fake_vector(body["prompt"])}

    with FakeEmbeddingServer(respond) as server:
        vectors = OllamaBackend("m", base_url=server.url).embed(["a", "b"])
    assert vectors.shape == (2, 8)
    assert [r.path for r in server.requests] == [
        "/api/embed",
        "/api/embeddings",
        "/api/embeddings",
    ]


def test_a_404_of_the_moment_does_not_make_ollama_the_old_api_for_good():
    """(One 404 from /api/embed, as Ollama answers while the model is being pulled or a proxy
    answers while it restarts, switched the process to /api/embeddings for its lifetime.)
    The old API is chosen only when it embeds the texts."""
    pulled = {"yet": False}

    def respond(path, body):
        if not pulled["yet"]:
            return 404, {"error": 'model "m" not found, try pulling it first'}
        assert path == "/api/embed"
        return 200, {"embeddings": [fake_vector(text) for text in body["input"]]}

    with FakeEmbeddingServer(respond) as server:
        backend = OllamaBackend("m", base_url=server.url)
        with pytest.raises(EmbeddingError, match="try pulling it first") as excinfo:
            backend.embed(["a"])
        assert (excinfo.value.status, excinfo.value.transient) == (404, False)
        pulled["yet"] = True
        assert backend.embed(["a", "b"]).shape == (2, 8)
    assert [r.path for r in server.requests] == ["/api/embed", "/api/embeddings", "/api/embed"]


def test_the_old_ollama_api_once_chosen_is_checked_again_after_a_while(monkeypatch):
    upgraded = {"yet": False}

    def respond(path, body):
        if path == "/api/embed" and not upgraded["yet"]:
            return 404, {"error": "404 page not found"}
        if path == "/api/embed":
            return 200, {"embeddings": [fake_vector(text) for text in body["input"]]}
        return 200, {"embedding": fake_vector(body["prompt"])}

    with FakeEmbeddingServer(respond) as server:
        backend = OllamaBackend("m", base_url=server.url)
        backend.embed(["a"])
        backend.embed(["b"])  # the old API straight away
        upgraded["yet"] = True
        monkeypatch.setattr(embeddings, "OLLAMA_LEGACY_RECHECK_SECONDS", 0.0)
        backend.embed(["c"])
    assert [r.path for r in server.requests] == [
        "/api/embed",
        "/api/embeddings",
        "/api/embeddings",
        "/api/embed",
    ]


@pytest.mark.parametrize(
    ("status", "transient"),
    [(500, True), (503, True), (429, True), (401, False), (403, False), (400, False)],
)
def test_ollama_errors_say_whether_to_retry(status, transient):
    with (
        FakeEmbeddingServer(lambda path, body: (status, {"error": "boom"})) as server,
        pytest.raises(EmbeddingError) as excinfo,
    ):
        OllamaBackend("m", base_url=server.url).embed(["a"])
    assert excinfo.value.transient is transient


@pytest.mark.parametrize(
    "answer",
    [
        {"error": "model is loading"},  # no vectors at all
        ["not", "an", "object"],
        {"embeddings": [[0.1, 0.2], [0.3]]},  # of two widths
        {"embeddings": [[0.1, 0.2]]},  # one vector for two texts
    ],
)
def test_an_answer_that_is_not_one_vector_per_text_is_an_embedding_error(answer):
    """A search falls back to keywords on an ``EmbeddingError`` (was a 500 on a KeyError or
    a numpy error); a message batch given fewer vectors than texts had its last messages
    marked embedded without a vector (never embedded again)."""
    with (
        FakeEmbeddingServer(lambda path, body: (200, answer)) as server,
        pytest.raises(EmbeddingError) as excinfo,
    ):
        OllamaBackend("m", base_url=server.url).embed(["a", "b"])
    assert not excinfo.value.transient


def test_an_unreachable_ollama_is_a_transient_error():
    with pytest.raises(EmbeddingError) as excinfo:
        OllamaBackend("m", base_url="http://127.0.0.1:9", timeout=2).embed(["a"])
    assert excinfo.value.transient


# --- openai -----------------------------------------------------------------------------------


def test_openai_uses_the_embeddings_endpoint_of_any_compatible_server():
    def respond(path, body):
        assert path == "/v1/embeddings"
        data = [
            {"object": "embedding", "index": i, "embedding": fake_vector(text, 16)}
            for i, text in enumerate(body["input"])
        ]
        # Out of order on purpose: the backend must sort by index.
        return 200, {
            "object": "list",
            "data": list(reversed(data)),
            "model": body["model"],
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }

    with FakeEmbeddingServer(respond) as server:
        backend = OpenAIBackend(
            "text-embedding-3-small", api_key="test-key", base_url=f"{server.url}/v1"
        )
        vectors = backend.embed(["first", "second"])
    expected = np.array([fake_vector("first", 16), fake_vector("second", 16)])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    assert np.allclose(vectors, expected, atol=1e-5)
    assert server.requests[0].body["model"] == "text-embedding-3-small"


@pytest.mark.parametrize(
    ("status", "transient", "refuses_caller"),
    [
        (500, True, False),
        (429, True, False),
        (401, False, True),
        (403, False, True),
        (400, False, False),
    ],
)
def test_openai_errors_say_whether_to_retry(status, transient, refuses_caller):
    """A key refused (401, 403) refuses every text alike (each was sent again alone, and
    logged, at every sweep: review)."""
    with FakeEmbeddingServer(lambda path, body: (status, {"error": {"message": "no"}})) as server:
        backend = OpenAIBackend("m", api_key="k", base_url=f"{server.url}/v1")
        with pytest.raises(EmbeddingError) as excinfo:
            backend.embed(["a"])
    assert excinfo.value.transient is transient
    assert excinfo.value.refuses_caller is refuses_caller


@pytest.mark.parametrize(
    "answer",
    [{"error": "overloaded"}, {"data": [{"object": "embedding", "index": 0, "embedding": [0.5]}]}],
)
def test_an_openai_answer_that_is_not_one_vector_per_text_is_an_embedding_error(answer):
    with FakeEmbeddingServer(lambda path, body: (200, answer)) as server:
        backend = OpenAIBackend("m", api_key="k", base_url=f"{server.url}/v1")
        with pytest.raises(EmbeddingError) as excinfo:
            backend.embed(["a", "b"])
    assert not excinfo.value.transient


# --- the width of the vectors -----------------------------------------------------------------


def ollama_of_width(widths: list[int]):
    """A stand-in Ollama whose model makes vectors of ``widths[0]`` (changed at will)."""
    return FakeEmbeddingServer(
        lambda path, body: (
            200,
            {"embeddings": [fake_vector(text, widths[0]) for text in body["input"]]},
        )
    )


def openai_of_width(widths: list[int]):
    def respond(path, body):
        data = [
            {"object": "embedding", "index": i, "embedding": fake_vector(text, widths[0])}
            for i, text in enumerate(body["input"])
        ]
        return 200, {"object": "list", "data": data, "model": body["model"]}

    return FakeEmbeddingServer(respond)


@pytest.mark.parametrize(
    ("serve", "backend"),
    [
        (ollama_of_width, lambda url: OllamaBackend("m", base_url=url, expected_dimension=8)),
        (
            openai_of_width,
            lambda url: OpenAIBackend("m", api_key="k", base_url=f"{url}/v1", expected_dimension=8),
        ),
    ],
    ids=["ollama", "openai"],
)
def test_vectors_of_another_width_than_the_database_holds_are_an_embedding_error(
    serve, backend, caplog
):
    """The model behind the URL swapped for one of another width at run time (the start-up
    check saw the first): its vectors can be neither stored nor compared."""
    widths = [8]
    with serve(widths) as server:
        remote = backend(server.url)
        assert remote.embed(["a", "b"]).shape == (2, 8)
        widths[0] = 16
        with pytest.raises(WrongDimension) as excinfo:
            remote.embed(["a", "b"])
    assert isinstance(excinfo.value, EmbeddingError)
    assert excinfo.value.transient  # the service's state, not a text's
    assert "'m' answered 16-dimensional vectors where MEMORY_EMBEDDING_DIMENSION is 8" in str(
        excinfo.value
    )
    assert [r.levelname for r in caplog.records if r.name == "search.embeddings"] == ["ERROR"]


def test_the_configured_backend_expects_the_width_of_the_columns(settings):
    # (The process's backend made first: made after the settings changed, as the first
    # test of a process to ask for it, it was an ollama one for every later test there.)
    process_backend = configured_backend()
    with ollama_of_width([2 * settings.MEMORY_EMBEDDING_DIMENSION]) as server:
        settings.MEMORY_EMBEDDING_BACKEND = "ollama"
        settings.OLLAMA_BASE_URL = server.url
        backend = configured_backend.__wrapped__()  # (not the process's)
        assert backend.expected_dimension == settings.MEMORY_EMBEDDING_DIMENSION
        with pytest.raises(WrongDimension):
            backend.embed(["a"])
    assert configured_backend() is process_backend
    assert process_backend.expected_dimension == settings.MEMORY_EMBEDDING_DIMENSION


def test_asking_an_openai_server_its_width_does_not_ask_for_a_width_afterwards():
    """(The start-up probe's width was sent as ``dimensions`` with every later request, which
    models that cannot shorten their vectors, and servers without the parameter, refuse.)"""
    with openai_of_width([16]) as server:
        backend = OpenAIBackend("m", api_key="k", base_url=f"{server.url}/v1")
        assert backend.dimension == 16
        backend.embed(["a"])
    assert ["dimensions" in r.body for r in server.requests] == [False, False]


# --- start-up check ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_model_of_another_width_than_the_column_stops_start_up():
    check_embedding_dimension(configured_backend())  # the default fits

    def respond(path, body):
        return 200, {"embeddings": [fake_vector(text, 768) for text in body["input"]]}

    with (
        FakeEmbeddingServer(respond) as server,
        pytest.raises(
            ImproperlyConfigured, match=r"768-dimensional.*MEMORY_EMBEDDING_DIMENSION's 384"
        ),
    ):
        check_embedding_dimension(OllamaBackend("nomic-embed-text", base_url=server.url))
    # The same when the backend itself refuses the width it is answered.
    with (
        FakeEmbeddingServer(respond) as server,
        pytest.raises(
            ImproperlyConfigured, match=r"768-dimensional.*MEMORY_EMBEDDING_DIMENSION's 384"
        ),
    ):
        check_embedding_dimension(
            OllamaBackend("nomic-embed-text", base_url=server.url, expected_dimension=384)
        )


@pytest.mark.django_db
def test_a_width_setting_the_columns_do_not_have_stops_start_up(settings):
    """Every embedding is checked against MEMORY_EMBEDDING_DIMENSION: it must be the
    columns' (was: not checked, the setting only made the columns of a new database)."""
    settings.MEMORY_EMBEDDING_DIMENSION = 768
    with pytest.raises(
        ImproperlyConfigured,
        match=r"MEMORY_EMBEDDING_DIMENSION is 768 but the database column message.embedding holds 384",
    ):
        check_embedding_dimension(configured_backend())


def resize_column(table: str, width: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"ALTER TABLE {table} ALTER COLUMN embedding TYPE vector({width}) USING NULL"
        )


@pytest.mark.django_db
def test_a_memory_column_of_another_width_stops_start_up():
    resize_column("memory", 8)  # (rolled back with the test's transaction)
    with pytest.raises(ImproperlyConfigured, match=r"column memory.embedding holds 8"):
        check_embedding_dimension(configured_backend())


@pytest.mark.django_db
def test_a_migration_makes_the_memory_and_tool_record_columns_as_wide_as_the_messages():
    """0004 and 0009 made them vector(384) whatever the configured width: with any other
    model (Ollama's default makes 768), no memory or tool record could be saved."""
    resize_column("memory", 8)
    resize_column("tool_record", 8)
    memory = Memory.objects.create(agent=AgentFactory(), content="Alice skates")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE memory SET embedding = %s::vector, embedding_model = 'old', embedded_at = now()",
            [str([0.5] * 8)],
        )
    migration = importlib.import_module(
        "agents_api.migrations.0018_vector_columns_as_wide_as_messages"
    )
    with connection.schema_editor() as editor:
        migration.as_wide_as_messages(None, editor)
    assert column_dimensions() == dict.fromkeys(("message", "memory", "tool_record"), 384)
    memory = Memory.objects.get(id=memory.id)
    assert (memory.embedding, memory.embedding_model, memory.embedded_at) == (None, "", None)
    check_embedding_dimension(configured_backend())


def test_a_new_database_has_every_vector_column_of_the_configured_width(tmp_path):
    result = run_django(
        {"MEMSVC_DATA_DIR": str(tmp_path / "data"), "MEMORY_EMBEDDING_DIMENSION": "768"},
        "from django.core.management import call_command;"
        "call_command('migrate', verbosity=0);"
        "from search.checks import column_dimensions; print(sorted(column_dimensions().items()))",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str([("memory", 768), ("message", 768), ("tool_record", 768)])


def test_a_local_model_int8_cannot_run_stops_start_up(tmp_path):
    # A model that pools by its first token: ONNX Runtime here does mean pooling only.
    model = tmp_path / "cls-model"
    (model / "1_Pooling").mkdir(parents=True)
    (model / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    (model / "modules.json").write_text("[]")
    with pytest.raises(ImproperlyConfigured, match="use float32 precision"):
        check_embedding_dimension(LocalBackend(str(model)))
    LocalBackend(str(model), precision="float32").check_runtime()  # torch can run it


@pytest.mark.django_db
def test_vectors_of_another_model_are_found_at_start_up(settings):
    backend = configured_backend()
    MessageFactory()  # not embedded yet: nothing to say
    current = MessageFactory()
    assert other_vector_models(backend) == []
    vector = [0.5] * settings.MEMORY_EMBEDDING_DIMENSION
    current.embedding, current.embedding_model = vector, backend.model
    current.embedded_at = current.created_at
    current.save()
    assert other_vector_models(backend) == []
    MessageFactory(
        embedding=vector, embedding_model="all-MiniLM-L6-v2", embedded_at=current.created_at
    )
    assert other_vector_models(backend) == ["all-MiniLM-L6-v2"]


def test_a_model_that_is_nowhere_stops_in_words_not_a_traceback(tmp_path, monkeypatch):
    """(An unknown model at float32 precision ended ``serve`` and ``reindex`` in a 93-line
    traceback of the hub's download: review.)"""
    from django.core.exceptions import ImproperlyConfigured

    from search.embeddings import LocalBackend

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    backend = LocalBackend(str(tmp_path / "no-such-model"), precision="float32")
    with pytest.raises(ImproperlyConfigured, match="cannot be loaded"):
        backend._torch_encoder()
