"""A sentence-transformers model run by ONNX Runtime, in float32 or with int8 weights.

- ``float32``: the same vectors as PyTorch (to 1e-4), faster on CPU.
- ``int8``: the weights of the linear layers quantised to int8, per output channel; the
  activations are quantised on the fly, and attention, normalisation and pooling stay in
  float32. Faster again, for vectors very close to the float32 ones. How much faster and
  how close: docs/benchmarks.md, "The local model in int8".

The graphs are made once from the model's own weights on disk (no download) and cached
in ``MEMSVC_MODEL_CACHE_DIR`` (``<MEMSVC_DATA_DIR>/models``); tokenisation and mean pooling are done here exactly as
sentence-transformers does them for models with mean pooling.
"""

import fcntl
import hashlib
import json
import logging
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

from memsvc.env import usable_directory

logger = logging.getLogger(__name__)

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
PRECISIONS = ("int8", "float32")
# Part of each cached graph's name: a change to how graphs are made makes new ones.
GRAPH_VERSION = 2


def supports(model_dir: Path) -> bool:
    """True for a local sentence-transformers model that pools by mean and normalises, with
    its fast tokenizer's file (``tokenizer.json``)."""
    try:
        pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
        modules = json.loads((model_dir / "modules.json").read_text())
    except (OSError, ValueError):
        return False
    if not (model_dir / "tokenizer.json").is_file():
        return False
    kinds = [module.get("type", "").rsplit(".", 1)[-1] for module in modules]
    return pooling.get("pooling_mode_mean_tokens") is True and kinds == [
        "Transformer",
        "Pooling",
        "Normalize",
    ]


def _fingerprint(model_dir: Path) -> str:
    weights = sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin"))
    digest = hashlib.sha256(f"{GRAPH_VERSION}:{model_dir.resolve()}".encode())
    for path in weights:
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:{int(stat.st_mtime)}".encode())
    return digest.hexdigest()[:16]


def _export(model_dir: Path, target: Path) -> None:
    """Write the transformer of ``model_dir`` as ONNX to ``target`` (atomically)."""
    import torch
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Loading weights" on a server's stderr

    class LastHiddenState(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    # Plain (eager) attention exports to plain MatMul/Softmax nodes, which ONNX Runtime runs
    # a little faster than the exported scaled-dot-product attention.
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    sample = AutoTokenizer.from_pretrained(model_dir)(["an example"], return_tensors="pt")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        # The tracer's warnings (Python values turned into constants) are about this model's
        # shapes, which the dynamic axes below cover: only noise at a first start.
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", message="Exporting aten::index operator")
            torch.onnx.export(
                LastHiddenState(model),
                tuple(sample[name] for name in INPUTS),
                tmp,
                input_names=list(INPUTS),
                output_names=["last_hidden_state"],
                dynamic_axes={
                    name: {0: "batch", 1: "tokens"} for name in [*INPUTS, "last_hidden_state"]
                },
                opset_version=17,
                dynamo=False,
            )
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _quantize(source: Path, target: Path) -> None:
    """Write ``source`` with int8 weights to ``target`` (atomically).

    Only the MatMuls by a weight matrix are quantised; the two per attention head that
    multiply activations by activations lose too much and stay in float32. The weights get
    one scale per output channel and 7 bits (``reduce_range``): without VNNI (the machines
    of this kind have been AVX2-only AMD as well as Intel with VNNI), the u8 x s8 products
    of the full range can saturate, and one graph must give the same vectors on both.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(source))
    weights = {initializer.name for initializer in graph.graph.initializer}
    by_weight = [
        node.name
        for node in graph.graph.node
        if node.op_type == "MatMul" and any(name in weights for name in node.input)
    ]
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".onnx.tmp")
    os.close(fd)
    # The quantiser logs a line per activation it leaves in float32, and advice on
    # pre-processing (on the root logger): dozens of lines at a first start that say what
    # the docstring says.
    quiet = _DropMessages(
        ("Quantization parameters for tensor", "Please consider to run pre-processing")
    )
    logging.getLogger().addFilter(quiet)
    try:
        quantize_dynamic(
            source,
            tmp,
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=True,
            op_types_to_quantize=["MatMul"],
            nodes_to_quantize=by_weight,
        )
        os.replace(tmp, target)
    finally:
        logging.getLogger().removeFilter(quiet)
        Path(tmp).unlink(missing_ok=True)


class _DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


def graph_file(model_dir: Path, cache_dir: Path, precision: str) -> Path:
    """Where the ONNX graph of ``model_dir`` at ``precision`` is kept, made or not."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    stem = f"{model_dir.name}-{_fingerprint(model_dir)}"
    return cache_dir / (f"{stem}.onnx" if precision == "float32" else f"{stem}-int8.onnx")


def graph_path(model_dir: Path, cache_dir: Path, precision: str) -> Path:
    """The cached ONNX graph of ``model_dir`` at ``precision``, made on first use."""
    wanted = graph_file(model_dir, cache_dir, precision)
    if wanted.exists():
        return wanted
    float32 = graph_file(model_dir, cache_dir, "float32")
    int8 = graph_file(model_dir, cache_dir, "int8")
    usable_directory(cache_dir, "MEMSVC_MODEL_CACHE_DIR")
    # Web and worker processes start together: one makes the graph, the others wait for it.
    with float32.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not float32.exists():
            logger.info("exporting %s to ONNX at %s (once)", model_dir, float32)
            _export(model_dir, float32)
        if precision == "int8" and not int8.exists():
            logger.info("quantising %s to int8 at %s (once)", float32, int8)
            _quantize(float32, int8)
    return wanted


def _pad_token(model_dir: Path) -> str:
    """The model's padding token, as its tokenizer's settings name it."""
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    pad = config.get("pad_token") or "[PAD]"
    return pad["content"] if isinstance(pad, dict) else pad


class OnnxSentenceEncoder:
    def __init__(
        self,
        model_dir: Path,
        cache_dir: Path,
        *,
        threads: int | None = None,
        precision: str = "float32",
    ):
        import onnxruntime
        from tokenizers import Tokenizer

        config = json.loads((model_dir / "sentence_bert_config.json").read_text())
        self.max_length = int(config.get("max_seq_length", 256))
        # The fast tokenizer transformers' AutoTokenizer wraps, read from its file without
        # transformers, whose import pulls in torch: 2 s of every process's first embedding.
        # Truncated and padded as sentence-transformers asks it to (the same ids: a test).
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_length)
        self.tokenizer.enable_padding(pad_id=self.tokenizer.token_to_id(_pad_token(model_dir)))
        self.dimension = int(
            json.loads((model_dir / "1_Pooling" / "config.json").read_text())[
                "word_embedding_dimension"
            ]
        )
        graph = graph_path(model_dir, cache_dir, precision)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads or min(4, os.cpu_count() or 1)
        # With more than one thread, ONNX Runtime's pool threads spin after each run, waiting
        # for more work: that takes the cores from PostgreSQL just when a search needs them
        # (docs/benchmarks.md, "Where a search's time goes"). `memsvc serve` gives web
        # processes one thread, which has no pool, so this is for the rest.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = onnxruntime.InferenceSession(
            str(graph), options, providers=["CPUExecutionProvider"]
        )
        self.needs_token_types = "token_type_ids" in {i.name for i in self.session.get_inputs()}
        # The int8 graph quantises its activations with one scale for the whole input
        # (ONNX Runtime's dynamic quantisation): a text run with others gets another vector
        # than alone (cosine 0.99 with itself), and a query is always run alone. So int8
        # runs one text at a time: a text's vector is its own, whatever was embedded beside
        # it, and stored texts meet queries on the same terms (LoCoMo hybrid hit@5 0.679 ->
        # 0.687-0.689, semantic 0.411 -> 0.423; docs/benchmarks.md). float32 batches.
        self.one_text_at_a_time = precision == "int8"

    def tokens(self, texts: list[str]) -> dict[str, np.ndarray]:
        """The model's inputs for ``texts``: token ids, attention mask and token types, each
        padded to the longest text of the batch.

        One text (every query) is tokenized holding the GIL, a few microseconds: the batch's
        call gives the GIL up and takes it back, which waited for a switch while a request
        thread ran Python (a query's embedding beside a busy thread 5.1 -> 3.8 ms,
        docs/benchmarks.md, 2026-12-07)."""
        if len(texts) == 1:
            encodings = [self.tokenizer.encode(texts[0])]
        else:
            encodings = self.tokenizer.encode_batch(texts)
        return {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Normalised mean-pooled vectors, in the order of ``texts``."""
        # Batches of similar lengths pad less (sentence-transformers does the same).
        if self.one_text_at_a_time:
            batch_size = 1
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            chosen = order[start : start + batch_size]
            feed = self.tokens([texts[i] for i in chosen])
            if not self.needs_token_types:
                del feed["token_type_ids"]
            [hidden] = self.session.run(None, feed)
            mask = feed["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            vectors[chosen] = pooled / np.clip(norms, 1e-12, None)
        return vectors
