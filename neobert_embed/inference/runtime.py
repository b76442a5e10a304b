"""Loading a model to run at a compute precision (:func:`load_inference_model`, :func:`load`), and ``auto``'s
measured choice of that precision (:func:`choose_precision`).

Why measured: which precision is fastest depends on the machine and the model (docs/performance.md), and
which is *safe* on the model's numbers. ``fp32`` runs as saved; ``bf16``/``fp16`` run the matrix products
under autocast (:func:`apply_precision`); ``int8`` runs int8 Linear layers (CPU only; ``auto`` never takes
it, at cosine ≈ 0.997 to fp32). The choice is kept per machine and model, so restarts agree.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from neobert_embed.errors import UserInputError
from neobert_embed.files import atomic_write_json, read_json_object_or_none
from neobert_embed.machine import (
    Machine,
    check_compute_precision,
    check_precision_fits,
    describe_cpu,
    describe_machine,
)
from neobert_embed.model_files import CheckedModel
from neobert_embed.native_memory import release_freed_memory

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from neobert_embed.inference.light import LightModel

logger = logging.getLogger(__name__)

BACKENDS = ("torch", "onnx", "openvino")
#: ``auto``'s sample on a CPU: at least AUTO_SAMPLE texts, repeated up to AUTO_SAMPLE_MAX until they hold
#: AUTO_SAMPLE_CHARS characters (a few short texts time mostly per-call overhead, docs/performance.md).
AUTO_SAMPLE, AUTO_SAMPLE_MAX, AUTO_SAMPLE_CHARS = 32, 512, 32_000
#: ``auto``'s sample on a GPU: a few of the engine's token-budgeted batches (32 texts are all kernel launches).
AUTO_SAMPLE_GPU = 4096
#: Where ``auto``'s choices are kept (a directory; default ``$XDG_CACHE_HOME/neobert-embed``).
CACHE_VARIABLE = "NEOBERT_EMBED_CACHE"
#: How much faster than fp32 another precision must be, so that timing noise does not flip a job between two.
AUTO_MIN_SPEEDUP = 1.15


@dataclass(frozen=True)
class Tolerance:
    """How close to fp32 a precision's sentence vectors must stay (cosine per text)."""

    mean: float
    minimum: float

    def admits(self, mean: float, minimum: float) -> bool:
        """True when both the mean and the worst text's cosine reach the bar."""
        return mean >= self.mean and minimum >= self.minimum


AUTO_TOLERANCE = Tolerance(mean=0.9999, minimum=0.999)

#: ``auto``'s sample when a command has no texts of its own (``serve``): questions to paragraphs.
BUILTIN_SAMPLE = (
    "how do I reset my password?",
    "A man is playing a guitar on stage.",
    "What is the capital of Australia?",
    "The cat sat on the mat.",
    "Stocks fell sharply on Tuesday after the central bank raised interest rates by half a point, "
    "its largest increase in two decades, citing persistent inflation.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "error: cannot open shared object file: No such file or directory",
    "Return the number of items in a container.",
    "The committee will meet next week to review the proposal and vote on the final budget, which "
    "includes funding for new research facilities, scholarships and the renovation of the library.",
    "best hiking trails near lake tahoe",
    "Two dogs are running through a field of tall grass while their owner watches from the fence.",
    "def parse(path): read a JSON document and return its records as a list of dictionaries",
    "The patient presented with fever, cough and shortness of breath for three days.",
    "cheap flights to tokyo in april",
    "In 1969, Apollo 11 landed on the Moon, and Neil Armstrong became the first person to walk on its "
    "surface while Michael Collins orbited above in the command module.",
    "Why is the sky blue?",
)


@dataclass(frozen=True)
class Trial:
    """One precision measured by ``auto``: texts per second and cosine to fp32 on the sample."""

    precision: str
    texts_per_second: float
    cosine_mean: float
    cosine_min: float


@dataclass(frozen=True)
class PrecisionChoice:
    """The compute precision a model runs at (never ``auto``), what was ``requested``, the ``reason`` (the unit
    and measured figures, or "asked for"), the ``machine``, ``auto``'s ``trials``, and the ``layout`` this
    toolkit gave its batches (un-padded layers, batches side by side; None when neither)."""

    precision: str
    requested: str
    reason: str
    machine: str
    trials: tuple[Trial, ...] = field(default=())
    layout: str | None = None

    @property
    def description(self) -> str:
        """``bf16 (avx512_bf16: 1.9× fp32, …); un-padded BertModel layers``: what ``used:`` lines show."""
        return f"{self.precision} ({self.reason})" + (f"; {self.layout}" if self.layout else "")

    def to_json(self) -> dict[str, object]:
        """The record form stored in OUTPUT.json, index manifests and mteb metadata."""
        return {"precision": self.precision, "requested": self.requested, "reason": self.reason,
                "machine": self.machine, "trials": [vars(trial) for trial in self.trials],
                "layout": self.layout or "as the model runs"}


@dataclass
class InferenceModel:
    """A model set to compute at :attr:`choice` (an EmbeddingModel, or for an export a
    :class:`~neobert_embed.inference.light.LightModel`) and the fingerprint of its fp32 weights."""

    model: SentenceTransformer | LightModel
    choice: PrecisionChoice
    backend: str = "torch"
    fingerprint: str | None = None

    @property
    def precision(self) -> str:
        """The precision it computes in."""
        return self.choice.precision


def model_fingerprint(model: SentenceTransformer) -> str:
    """``WEIGHTS-SETTINGS``: a hash of every parameter and buffer of a SentenceTransformer (fp32, as saved)
    and one of what else decides its vectors (:func:`pipeline_settings`).

    Why: a fingerprint, not a name, decides whether a model matches an index (a path can be retrained in
    place; the same weights pooled otherwise give other vectors); an export records its source's.

    Example:
        >>> model_fingerprint(load_sentence_model("runs/my-embedder"))
        'b1946ac92492d234-5e0c1f9a'
    """
    import torch

    digest = hashlib.blake2b(digest_size=8)
    for name, tensor in model.state_dict().items():
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tuple(value.shape)}|{value.dtype}".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy())  # hashed in place, not copied first
    settings = json.dumps(pipeline_settings(model), sort_keys=True, default=str)
    return f"{digest.hexdigest()}-{hashlib.blake2b(settings.encode(), digest_size=4).hexdigest()}"


#: The parts of a fast tokenizer's ``tokenizer.json`` that decide its ids (padding and truncation are
#: set per call by transformers, and the batch's padding does not reach the pooled vectors).
TOKENIZER_PARTS = ("normalizer", "pre_tokenizer", "model", "post_processor", "added_tokens")


def pipeline_settings(model: SentenceTransformer) -> list[dict[str, object]]:
    """What decides a SentenceTransformer's vectors besides its weights: each module's kind and saved settings,
    ``do_lower_case`` and the tokenizer (:data:`TOKENIZER_PARTS`); not ``max_seq_length`` (set per command).

    Example:
        >>> [part["module"] for part in pipeline_settings(model)]
        ['Transformer', 'Pooling', 'Normalize']
    """
    parts: list[dict[str, object]] = []
    for module in model:
        part: dict[str, object] = {"module": type(module).__name__}
        if hasattr(module, "get_config_dict"):
            part["config"] = module.get_config_dict()
        if hasattr(module, "do_lower_case"):
            part["do_lower_case"] = bool(module.do_lower_case)
        backend = getattr(getattr(module, "tokenizer", None), "backend_tokenizer", None)
        if backend is not None:
            saved = json.loads(backend.to_str())
            part["tokenizer"] = {key: saved.get(key) for key in TOKENIZER_PARTS}
        parts.append(part)
    return parts


def fingerprints_match(recorded: str | None, current: str | None) -> bool:
    """Whether fingerprint ``current`` is the ``recorded`` one: equal, or ``recorded`` is of the weights alone
    (an index built before the settings were hashed) and they agree.

    Example:
        >>> fingerprints_match("b1946ac92492d234", "b1946ac92492d234-5e0c1f9a")
        True
    """
    if recorded is None or current is None:
        return False
    return recorded == current or ("-" not in recorded and current.split("-")[0] == recorded)


def apply_precision(model: SentenceTransformer, precision: str, machine: Machine) -> None:
    """Set ``model`` (fp32, as loaded) to compute at ``precision`` on ``machine``, in place: its Linear layers
    replaced where the precision does (:func:`replaces_layers`), and its ``autocast``, which
    :class:`~neobert_embed.inference.embedding_model.EmbeddingModel`'s forward enters.

    Example:
        >>> apply_precision(model, "int8", describe_machine())
    """
    from neobert_embed.inference.kernels import (
        AUTOCAST_DTYPES,
        hold_linears_in,
        pack_linears_bf16,
        quantize_linears_int8,
    )

    autocast = precision
    if precision == "int8":
        quantize_linears_int8(model)
        autocast = "bf16" if machine.bf16_units else "fp32"
    elif replaces_layers(precision, machine):
        if machine.is_cpu:
            pack_linears_bf16(model)
        else:  # a GPU: the weights in the compute dtype, no cast inside each forward
            hold_linears_in(model, precision)
    device_type = "cpu" if machine.is_cpu else machine.device.split(":")[0]
    model.autocast = (device_type, autocast) if autocast in AUTOCAST_DTYPES else None


def replaces_layers(precision: str, machine: Machine) -> bool:
    """True when :func:`apply_precision` replaces the model's Linear layers, which cannot be undone (``auto``
    tries it on a copy): int8; bf16 on a CPU that packs it; bf16/fp16 on a GPU (weights held in that dtype)."""
    from neobert_embed.inference.kernels import packed_bf16_available

    if precision == "int8":
        return True
    if not machine.is_cpu:  # a GPU holds its Linear weights in bf16/fp16 (kernels.hold_linears_in)
        return precision in ("bf16", "fp16")
    return precision == "bf16" and bool(machine.bf16_units) and packed_bf16_available()


def spreads_on(machine: Machine, precision: str) -> bool:
    """True when a model computing at ``precision`` on ``machine`` runs batches side by side: on a CPU with more
    than one torch thread, except int8 on int8 units (``torch._int_mm`` ran slower so).

    Why: a small encoder's batch is too little work to keep several threads busy inside each operator
    (docs/performance.md, "Batches side by side").
    """
    return machine.is_cpu and machine.threads > 1 and not (precision == "int8" and machine.int8_units)


def trial_texts(sample_texts: Sequence[str], machine: Machine) -> list[str]:
    """What ``auto`` times each precision on (see :data:`AUTO_SAMPLE`, :data:`AUTO_SAMPLE_GPU`), taken evenly.

    Example:
        >>> len(trial_texts(["a", "b"], describe_machine("cuda")))
        4096
    """
    texts = [text for text in sample_texts if text.strip()] or list(BUILTIN_SAMPLE)
    if not machine.is_cpu:
        return [texts[i % len(texts)] for i in range(AUTO_SAMPLE_GPU)]
    count = AUTO_SAMPLE
    while count < AUTO_SAMPLE_MAX and sum(map(len, _spread(texts, count))) < AUTO_SAMPLE_CHARS:
        count *= 2
    return _spread(texts, count)


def _spread(texts: Sequence[str], count: int) -> list[str]:
    """``count`` texts taken evenly through ``texts``, repeated where there are fewer."""
    return [texts[int(i * len(texts) / count)] for i in range(count)]


def _timed_encode(model: SentenceTransformer, texts: list[str], batch_size: int) -> tuple[np.ndarray, float]:
    """Vectors of ``texts`` and their texts/s: the faster of two passes, since the first call of each batch
    shape pays one-time costs (CUDA kernel loading, oneDNN kernels per shape) a short warm-up does not meet."""
    import torch

    best = float("inf")
    with torch.inference_mode():
        for _ in range(2):
            start = time.perf_counter()
            vectors = model.encode(texts, batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True)
            best = min(best, time.perf_counter() - start)  # encode returns numpy: the device is synchronized
    return np.asarray(vectors, dtype=np.float32), len(texts) / max(best, 1e-9)


def cosine_to(reference: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of ``vectors`` to ``reference`` (the same texts).

    Example:
        >>> cosine_to(np.eye(2), np.eye(2)).tolist()
        [1.0, 1.0]
    """
    reference = np.asarray(reference, dtype=np.float64)
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(reference, axis=1) * np.linalg.norm(vectors, axis=1)
    return (reference * vectors).sum(axis=1) / np.maximum(norms, 1e-30)


def candidates_for(machine: Machine) -> list[str]:
    """The precisions ``auto`` tries on ``machine`` besides fp32 (only those with units behind them)."""
    if not machine.is_cpu:
        return ["bf16", "fp16"] if machine.bf16_units else ["fp16"]
    return [name for name, unit in (("bf16", machine.bf16_units), ("int8", machine.int8_units)) if unit]


def choose_precision(model: SentenceTransformer, sample_texts: Sequence[str], machine: Machine,
                     batch_size: int = 32, tolerance: Tolerance = AUTO_TOLERANCE) -> PrecisionChoice:
    """Measure fp32 and each candidate on ``sample_texts``; the fastest within ``tolerance`` wins. ``model`` is
    left at fp32 (a precision that replaces layers is tried on a copy).

    Example:
        >>> choose_precision(model, texts[:64], describe_machine()).precision
        'bf16'
    """
    candidates = candidates_for(machine)
    if not candidates:
        return PrecisionChoice("fp32", "auto", "no bf16 or int8 matrix units on this "
                               f"{'CPU' if machine.is_cpu else 'device'}", machine.summary())
    texts = trial_texts(sample_texts, machine)
    reference, fp32_speed = _timed_encode(model, texts, batch_size)
    trials = [Trial("fp32", round(fp32_speed, 1), 1.0, 1.0)]
    for precision in candidates:
        trial_model = copy.deepcopy(model) if replaces_layers(precision, machine) else model
        apply_precision(trial_model, precision, machine)
        try:
            vectors, speed = _timed_encode(trial_model, texts, batch_size)
        finally:
            if trial_model is model:
                apply_precision(model, "fp32", machine)
        cosine = cosine_to(reference, vectors)
        trials.append(Trial(precision, round(speed, 1), round(float(cosine.mean()), 6), round(float(cosine.min()), 6)))
    admitted = [trial for trial in trials if trial.precision == "fp32" or (
        tolerance.admits(trial.cosine_mean, trial.cosine_min) and trial.texts_per_second >= AUTO_MIN_SPEEDUP * fp32_speed)]
    best = max(admitted, key=lambda trial: trial.texts_per_second)
    if best.precision == "fp32":
        rejected = "; ".join(f"{trial.precision} {trial.texts_per_second / fp32_speed:.2f}× at cosine ≥ "
                             f"{trial.cosine_min:.5f}" for trial in trials[1:])
        reason = (f"no other precision was ≥ {AUTO_MIN_SPEEDUP}× faster within cosine {tolerance.mean} (mean) / "
                  f"{tolerance.minimum} (min) of fp32 ({rejected}; on {len(texts)} texts)")
    else:
        unit = machine.bf16_units if best.precision in ("bf16", "fp16") else machine.int8_units
        reason = (f"{unit}: {best.texts_per_second / fp32_speed:.2f}× fp32, cosine to fp32 ≥ {best.cosine_min:.5f}, "
                  f"mean {best.cosine_mean:.5f}, on {len(texts)} texts")
    return PrecisionChoice(best.precision, "auto", reason, machine.summary(), tuple(trials))


def precision_cache() -> Path:
    """The file ``auto``'s choices are kept in (:data:`CACHE_VARIABLE`, else the user's cache directory)."""
    root = os.environ.get(CACHE_VARIABLE)
    if root:
        return Path(root) / "precision.json"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "neobert-embed" / "precision.json"


def _remembered_choice(model: SentenceTransformer, sample_texts: Sequence[str], machine: Machine, batch_size: int,
                       fingerprint: str) -> PrecisionChoice:
    """``auto``'s choice for this machine, model and torch version: kept from an earlier start, else measured now
    and kept, so restarts agree."""
    import torch

    key = hashlib.blake2b(json.dumps([machine.summary(), fingerprint, torch.__version__, batch_size,
                                      AUTO_MIN_SPEEDUP, vars(AUTO_TOLERANCE)]).encode(), digest_size=8).hexdigest()
    cache = precision_cache()
    kept = read_json_object_or_none(cache) or {}
    entry = kept.get(key)
    if isinstance(entry, dict):
        try:
            trials = tuple(Trial(**trial) for trial in entry["trials"])
            return PrecisionChoice(entry["precision"], "auto", f"{entry['reason']}; measured at an earlier start",
                                   entry["machine"], trials)
        except (KeyError, TypeError):
            pass  # an entry of another version: measured again
    choice = choose_precision(model, sample_texts, machine, batch_size)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(cache, {**kept, key: choice.to_json()})
    except OSError as exc:  # a read-only home: the choice holds for this start only
        logger.warning("auto precision not kept in %s (%s): the next start measures again", cache, exc)
    return choice


def load_inference_model(source: str | Path | CheckedModel, precision: str = "auto", *, device: str | None = None,
                         max_seq_length: int | None = None, revision: str | None = None,
                         sample_texts: Sequence[str] | None = None, batch_size: int = 32, fingerprint: bool = False,
                         backend: str = "torch",
                         agree: Callable[[Callable[[], PrecisionChoice]], PrecisionChoice] | None = None,
                         unpadded: bool = True, spread: bool = True) -> InferenceModel:
    """Load ``source`` (a name, path or preflight's :class:`~neobert_embed.model_files.CheckedModel`) as an
    :class:`~neobert_embed.inference.embedding_model.EmbeddingModel` computing at ``precision`` (``auto``:
    measured on ``sample_texts``, else :data:`BUILTIN_SAMPLE`), with its own prompts, length, pooling and
    normalization, its engine's options and its tokenizer decided here.

    ``fingerprint`` hashes the fp32 weights first. ``backend="onnx"|"openvino"`` runs an export through the
    light runtime (no torch; ``precision`` auto/fp32, or int8 for the quantized file). ``agree`` runs the
    measurement on one process of a job and hands its result to all (``functools.partial(on_main, world)``
    under torchrun). ``unpadded=False`` keeps BERT's padded forward (the benchmarks' baseline);
    ``spread=False`` never runs batches side by side (``serve``, whose batcher forms its own batches).

    Example:
        >>> loaded = load_inference_model("runs/my-embedder", "bf16")
        >>> loaded.choice.description
        'bf16 (asked for)'
    """
    check_compute_precision(precision)
    if backend not in BACKENDS:
        raise UserInputError(f"--backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend != "torch":  # the light runtime: no torch, transformers or sentence-transformers
        return _load_exported(source, precision, backend, device, max_seq_length)
    require_torch_stack()  # process-wide settings (native_memory.bound_native_memory) are the CLI's, not a library call's
    machine = describe_machine(device)
    check_precision_fits(precision, machine)
    from neobert_embed.inference.embedding_model import EmbeddingModel
    from neobert_embed.inference.pipeline import SIDE_BY_SIDE, DirectTokenizer, EngineOptions
    from neobert_embed.inference.unpadded import unpad_encoders
    from neobert_embed.sentence import load_sentence_model

    model = load_sentence_model(source if isinstance(source, CheckedModel) else str(source), max_seq_length,
                                device=device or machine.device, revision=revision, model_class=EmbeddingModel)
    model.eval()
    digest = model_fingerprint(model) if fingerprint else None
    encoders = unpad_encoders(model) if unpadded else []
    layout = f"un-padded {', '.join(sorted(set(encoders)))} layers" if encoders else None
    config = getattr(getattr(model[0], "auto_model", None), "config", None)
    unpads = bool(encoders) or getattr(config, "model_type", None) == "neobert"  # NeoBERT drops padding itself
    model.direct_tokenizer = DirectTokenizer(model)
    model.engine_options = EngineOptions(side_by_side=spread and spreads_on(machine, "fp32"), unpads=unpads)
    if precision == "auto":  # measured through the engine (model.encode), each trial on a copy of its own
        measure = functools.partial(_remembered_choice, model, sample_texts or BUILTIN_SAMPLE, machine, batch_size,
                                    digest or model_fingerprint(model))
        choice = agree(measure) if agree is not None else measure()
    else:
        choice = PrecisionChoice(precision, precision, "asked for", machine.summary())
    apply_precision(model, choice.precision, machine)
    model.engine_options = replace(model.engine_options, side_by_side=spread and spreads_on(machine, choice.precision))
    if model.engine_options.side_by_side:
        layout = "; ".join(filter(None, (layout, SIDE_BY_SIDE)))
    choice = replace(choice, layout=layout)
    release_freed_memory()  # what the measurement's copies and trial batches held
    logger.debug("compute precision: %s on %s", choice.description, machine.summary())
    return InferenceModel(model, choice, "torch", digest)


def load(name_or_path: str | Path, precision: str = "auto", *, device: str | None = None,
         max_seq_length: int | None = None, backend: str = "torch") -> SentenceTransformer | LightModel:
    """The public way to load a model to encode with: a ``SentenceTransformer`` whose ``encode``,
    ``encode_query`` and ``encode_document`` (so mteb's and sentence-transformers' utilities too) run the
    toolkit's engine at ``precision``; ``backend="onnx"|"openvino"`` gives an export's light model.
    Its precision is ``model.compute_precision``.

    Example:
        >>> model = neobert_embed.load("sentence-transformers/all-MiniLM-L6-v2", precision="fp32")
        >>> model.encode_query(["how do I reset my password?"]).shape
        (1, 384)
    """
    loaded = load_inference_model(name_or_path, precision, device=device, max_seq_length=max_seq_length,
                                  backend=backend)
    loaded.model.compute_precision = loaded.choice  # type: ignore[union-attr]
    return loaded.model


def require_torch_stack() -> None:
    """Refuse, in one line naming what to install, a torch backend in an environment set up for the light
    runtime only (no torch, transformers or sentence-transformers)."""
    try:
        import sentence_transformers  # noqa: F401  (imports torch and transformers too)
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise UserInputError(f"--backend torch needs torch, transformers and sentence-transformers ({exc}): install "
                             "them (`pip install torch transformers sentence-transformers`, or `make install`), or "
                             "run a model written by `neobert-embed export` with --backend onnx|openvino") from None


def _load_exported(source: str | Path, precision: str, backend: str, device: str | None,
                   max_seq_length: int | None) -> InferenceModel:
    """An ``export`` output run through the light runtime (fp32 graph, or its int8 file); no torch imported."""
    from neobert_embed.inference.light import default_threads, load_light_model

    if precision not in ("auto", "fp32", "int8"):
        raise UserInputError(f"--backend {backend} runs the exported graph as saved; --precision {precision} is "
                             "for the torch backend (use auto, fp32, or int8 for the quantized export)")
    threads = default_threads()
    model = load_light_model(str(source), backend, threads=threads, device=device, quantized=precision == "int8")
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length
    runtime = model.runner.description.split(" (")[0]
    machine = describe_cpu(threads, runtime) if device in (None, "cpu") else describe_machine(device)
    choice = PrecisionChoice("int8" if precision == "int8" else "fp32", precision,
                             f"exported graph on {model.description}", machine.summary())
    return InferenceModel(model, choice, backend, model.source_fingerprint)
