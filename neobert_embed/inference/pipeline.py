"""The one path from texts to vectors, for every runtime (:func:`encode_chunks`; examples on each function).

Why: sentence-transformers' ``encode`` tokenizes each batch just before its forward, so the model waits for
the tokenizer and the tokenizer for the model (docs/performance.md). Like text-embeddings-inference's queue,
this tokenizes ahead on a worker thread, batches by length and tokens (:func:`plan_batches`) and runs the
batches through an :class:`Engine`: :class:`EncodePipeline` (torch) or the light runtime's ``LightModel``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

import numpy as np

from neobert_embed.errors import UserInputError
from neobert_embed.inference.fast_tokenizer import FastTokenizer
from neobert_embed.inference.tokenized import Padding, Tokenized
from neobert_embed.native_memory import release_freed_memory

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

#: Texts tokenized per call: enough for a length sort to leave little padding, few enough that the
#: first forward starts early.
CHUNK_TEXTS = 2048
#: Padded tokens per batch on a GPU (text-embeddings-inference's ``max_batch_tokens`` is 16,384; a larger
#: batch amortizes the per-layer kernel launches).
GPU_BATCH_TOKENS = 65536
#: Padded tokens per batch on a CPU, on top of ``--batch-size`` texts: 32 texts of 512 tokens, so 32 texts
#: of 4,096 tokens run as 8 batches of 4 (docs/performance.md, "Long inputs").
CPU_BATCH_TOKENS = 16384
#: How batches run on a multi-core CPU (what ``used:`` lines and records say).
SIDE_BY_SIDE = "batches side by side, one per thread"
#: ``encode`` arguments and the values under which each row depends on its own text only; a call with any
#: other value runs sentence-transformers' ``encode`` (:func:`pipelined`).
PIPELINED_DEFAULTS: dict[str, tuple[object, ...]] = {
    "output_value": ("sentence_embedding",), "precision": ("float32",), "pool": (None,), "device": (None,),
    "chunk_size": (None,), "truncate_dim": (None,)}
#: The other ``encode`` arguments the engine honours; a call with an argument outside both runs
#: sentence-transformers' ``encode`` (which names what it does not know).
HANDLED_ARGUMENTS = ("prompt", "prompt_name", "batch_size", "show_progress_bar", "convert_to_numpy",
                     "convert_to_tensor", "normalize_embeddings", "task")
#: What the Rust tokenizer must tokenize exactly as ``preprocess`` does, with each prompt, before it is
#: used: short, long, unicode, odd whitespace, empty; :class:`DirectTokenizer` adds an overlong text.
PROBE_TEXTS = ("a cat", "The quick brown fox jumps over the lazy dog. " * 12, "Ünïcödé naïve café, 東京 🙂 Ελληνικά",
               "  leading,\ttabs\nand  double  spaces  ", "", "don't stop-believing: C++ & e-mail@x.org 3.14%")

#: One HF fast tokenizer must not be entered by two threads at once ("Already borrowed"); ``preprocess`` is
#: the fallback path, so one lock for the process costs nothing measurable and keeps engines plain values.
_PREPROCESS_LOCK = threading.RLock()
#: What ``preprocess`` is asked for: per-text lists, unpadded, and the overflow rows.
_RAGGED_KWARGS = {"text": {"return_overflowing_tokens": True, "padding": False}, "common": {"return_tensors": None}}


@dataclasses.dataclass(frozen=True)
class _Agreement:
    """The keys ``preprocess`` returns for a prompt, and its per-call values (``prompt_length``, ``modality``)."""

    keys: tuple[str, ...]
    shared: dict[str, object]


class DirectTokenizer:
    """A model's tokenizer, decided once: its Rust tokenizer called directly (:class:`FastTokenizer`, a
    fraction of ``preprocess``'s time) for each prompt with which it gives exactly ``preprocess``'s output
    on :data:`PROBE_TEXTS` and a text twice the length limit; ``preprocess`` otherwise. The model's prompts
    are checked at load, another prompt on its first use, all again when the length, sides or pad token change.

    Example:
        >>> DirectTokenizer(model).tokenize(model, ["a cat", "word " * 600], None).truncated
        1
    """

    def __init__(self, model: SentenceTransformer) -> None:
        self._decide(model)

    def _decide(self, model: SentenceTransformer) -> None:
        self.settings = _tokenizer_settings(model)
        tokenizer, limit = getattr(model, "tokenizer", None), self.settings[0]
        self.fast = FastTokenizer.of(tokenizer, limit) if tokenizer is not None and limit else None
        self.agreements: dict[str | None, _Agreement | None] = {}
        for prompt in {None, *(getattr(model, "prompts", None) or {}).values()}:
            self._agreement(model, prompt)

    def tokenize(self, model: SentenceTransformer, texts: Sequence[str], prompt: str | None) -> Tokenized:
        """``texts`` with ``prompt`` as ``model.encode`` tokenizes them, once, counting truncation; any thread."""
        texts = list(texts)
        with _PREPROCESS_LOCK:
            if self.settings != _tokenizer_settings(model):
                self._decide(model)
            strings = bool(texts) and all(isinstance(text, str) for text in texts)
            fast, agreement = self.fast, self._agreement(model, prompt) if strings else None
            if agreement is None:
                return tokenize_with_preprocess(model, texts, prompt)
        tokenized = fast.tokenize([prompt + text for text in texts] if prompt else texts)
        return dataclasses.replace(tokenized, values={key: tokenized.values[key] for key in agreement.keys},
                                   shared=agreement.shared)

    def _agreement(self, model: SentenceTransformer, prompt: str | None) -> _Agreement | None:
        if prompt not in self.agreements:
            self.agreements[prompt] = self._check(model, prompt) if self.fast is not None else None
        return self.agreements[prompt]

    def _check(self, model: SentenceTransformer, prompt: str | None) -> _Agreement | None:
        texts = [*PROBE_TEXTS, "a " * (2 * self.fast.max_seq_length)]
        try:
            reference = tokenize_with_preprocess(model, texts, prompt)
        except (UserInputError, TypeError, ValueError):  # no plain-text preprocess: every call then says why
            return None
        mine = self.fast.tokenize([(prompt or "") + text for text in texts])
        if (mine.padding == reference.padding and np.array_equal(mine.lengths, reference.lengths)
                and np.array_equal(mine.cut, reference.cut)
                and all(key in mine.values and np.array_equal(mine.values[key], values)
                        for key, values in reference.values.items())):
            return _Agreement(tuple(reference.values), reference.shared)
        logger.info("%s: its Rust tokenizer called directly differs from preprocess (prompt %r); tokenizing "
                    "through preprocess", type(model[0]).__name__, prompt)
        return None


def _tokenizer_settings(model: SentenceTransformer) -> tuple:
    """What the direct tokenizer is made for: the length limit, the tokenizer's sides and pad token."""
    tokenizer = getattr(model, "tokenizer", None)
    return (int(getattr(model, "max_seq_length", None) or 0), getattr(tokenizer, "padding_side", None),
            getattr(tokenizer, "truncation_side", None), getattr(tokenizer, "pad_token_id", None))


def tokenize_with_preprocess(model: SentenceTransformer, texts: Sequence[str],
                             prompt: str | None = None) -> Tokenized:
    """``texts`` through the model's own ``preprocess``, asked for per-text lists and for the tokenizer's
    overflow rows, which mark the texts longer than ``max_seq_length`` (their first row is what ``encode``
    reads). An input module that takes no such options is tokenized plainly and a text filling
    ``max_seq_length`` is counted as cut.

    Example:
        >>> tokenize_with_preprocess(model, ["a cat", "word " * 600]).truncated
        1
    """
    texts = list(texts)
    ragged = {"processing_kwargs": _RAGGED_KWARGS} if _takes_processing_kwargs(type(model[0])) else {}
    features = dict(model.preprocess(texts, prompt=prompt, **ragged))
    mapping = features.pop("overflow_to_sample_mapping", None)  # overflow rows -> their text
    rows = {key: value for key, value in features.items() if _is_rows(value)}
    shared = {key: value for key, value in features.items() if key not in rows}
    if "attention_mask" not in rows:
        raise UserInputError(f"{type(model[0]).__name__} returns no attention_mask: this model's inputs "
                             "cannot be batched by length; encode it with sentence-transformers directly")
    cut, lost = None, None
    if mapping is not None:
        samples = np.asarray(mapping, dtype=np.int64)
        _, first = np.unique(samples, return_index=True)  # each text's first row: what encode reads
        cut = np.bincount(samples) > 1  # a text cut once or more: its overflow rows
        lost = _overflow_tokens(model, rows["attention_mask"], first)
        rows = {key: [value[index] for index in first.tolist()] if isinstance(value, list) else value[first]
                for key, value in rows.items()}
    details = {"padding": Padding.of(getattr(model, "tokenizer", None)), "shared": shared}
    if isinstance(rows["attention_mask"], list):
        tokenized = Tokenized.from_lists(rows, **details)
    else:
        arrays = {key: value.numpy() for key, value in rows.items()}
        tokenized = Tokenized.from_padded(arrays, arrays["attention_mask"], **details)
    if cut is None:
        cut = tokenized.lengths >= int(model.max_seq_length or 1 << 30)
    return dataclasses.replace(tokenized, truncated=int(cut.sum()), cut=cut, lost_tokens=lost)


@functools.cache
def _takes_processing_kwargs(module_class: type) -> bool:
    """Whether an input module's ``preprocess`` takes ``processing_kwargs`` (sentence-transformers'
    ``Transformer`` does; an older or custom module may not)."""
    preprocess = getattr(module_class, "preprocess", None)
    return preprocess is not None and "processing_kwargs" in inspect.signature(preprocess).parameters


def _overflow_tokens(model: SentenceTransformer, mask: list | torch.Tensor, first: np.ndarray) -> int | None:
    """Tokens of text in the overflow rows (every row but each text's first), less their special tokens."""
    specials = getattr(getattr(model, "tokenizer", None), "num_special_tokens_to_add", None)
    if specials is None:
        return None
    lengths = np.asarray([sum(row) for row in mask] if isinstance(mask, list) else mask.sum(dim=1).numpy())
    overflow = np.delete(lengths, first)
    return int(overflow.sum()) - len(overflow) * int(specials(pair=False))


def _is_rows(value: object) -> bool:
    """One entry per text: a 2-D tensor, or a list of per-text lists."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.dim() == 2
    return isinstance(value, list) and bool(value) and isinstance(value[0], (list, tuple))


def plan_batches(lengths: Sequence[int] | np.ndarray, *, max_texts: int | None = None,
                 max_tokens: int | None = None, min_fill: float = 0.0, padded: bool = True) -> list[np.ndarray]:
    """Cut texts of token counts ``lengths`` into batches, longest first: the one batching rule.

    A batch takes the next text while it holds fewer than ``max_texts`` texts, its padded size (texts ×
    its longest; with ``padded=False``, for an engine that un-pads, its real tokens, as
    text-embeddings-inference counts them) stays within ``max_tokens``, and the text is at least
    ``min_fill`` × its longest. Every batch holds at least one text; equal lengths keep their input order.

    Example:
        >>> [b.tolist() for b in plan_batches([3, 9, 4, 9], max_tokens=20)]
        [[1, 3], [2, 0]]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    batches: list[list[int]] = []
    longest = total = 0
    for row in order.tolist():
        count = len(batches[-1]) if batches else 0
        size = (count + 1) * longest if padded else total + int(lengths[row])
        fits = (bool(batches) and (max_texts is None or count < max_texts)
                and (max_tokens is None or size <= max_tokens)
                and lengths[row] >= min_fill * longest)
        if fits:
            batches[-1].append(row)
            total += int(lengths[row])
        else:
            batches.append([row])
            longest = total = int(lengths[row])
    return [np.asarray(batch, dtype=np.int64) for batch in batches]


def plan_cpu_batches(lengths: Sequence[int] | np.ndarray, batch_size: int) -> list[np.ndarray]:
    """A chunk's batches on a CPU, for every runtime: ``batch_size`` texts each (as ``encode``), within
    :data:`CPU_BATCH_TOKENS` padded tokens.

    Example:
        >>> [b.tolist() for b in plan_cpu_batches([4096] * 5, 32)]
        [[0, 1, 2, 3], [4]]
    """
    return plan_batches(lengths, max_texts=batch_size, max_tokens=CPU_BATCH_TOKENS)


class Engine(Protocol):
    """What :func:`encode_chunks` and the server need of a runtime: ``tokenize`` truncates at
    ``max_seq_length`` and counts what it cut; ``forward`` turns one padded batch into float32 vectors on the
    host; ``encode_chunk`` plans a tokenized chunk into batches and runs them; ``release`` hands back what a
    chunk's batches freed."""

    max_seq_length: int

    @property
    def dimension(self) -> int: ...

    @property
    def normalizes(self) -> bool: ...

    @property
    def unpads(self) -> bool: ...

    def tokenize(self, texts: Sequence[str], prompt: str | None) -> Tokenized: ...

    def forward(self, features: dict[str, np.ndarray | object], *, normalize: bool = False) -> np.ndarray: ...

    def encode_chunk(self, tokenized: Tokenized, batch_size: int, normalize: bool) -> np.ndarray: ...

    def release(self) -> None: ...


def encode(engine: Engine, texts: Sequence[str], *, prompt: str | None = None, batch_size: int = 32,
           normalize: bool = False, advance: Callable[[int], None] | None = None,
           on_truncated: Callable[[int], None] | None = None,
           on_lost_tokens: Callable[[int | None], None] | None = None) -> np.ndarray:
    """The (texts, dimension) float32 matrix of :func:`encode_chunks`; ``advance(n)`` is told after each chunk.

    Example:
        >>> encode(engine_of(model), ["a cat"], prompt="query: ").shape
        (1, 384)
    """
    out = np.empty((len(texts), engine.dimension), dtype=np.float32)
    start = 0
    for vectors in encode_chunks(engine, texts, prompt=prompt, batch_size=batch_size, normalize=normalize,
                                 on_truncated=on_truncated, on_lost_tokens=on_lost_tokens):
        out[start:start + len(vectors)] = vectors
        start += len(vectors)
        if advance is not None:
            advance(len(vectors))
    return out


def encode_chunks(engine: Engine, texts: Sequence[str], *, prompt: str | None = None, batch_size: int = 32,
                  normalize: bool = False, on_truncated: Callable[[int], None] | None = None,
                  on_lost_tokens: Callable[[int | None], None] | None = None) -> Iterator[np.ndarray]:
    """THE encoding loop: the vectors of ``texts`` one chunk of :data:`CHUNK_TEXTS` rows at a time, in input
    order, each tokenized ahead on a worker thread; a row that is not finite stops the job naming it.
    ``on_truncated(n)`` is told at the end how many texts were cut at ``max_seq_length``, ``on_lost_tokens(n)``
    how many tokens lay past the cuts (None: the tokenizer did not say).

    Example:
        >>> [len(vectors) for vectors in encode_chunks(engine, texts_5000)]
        [2048, 2048, 904]
    """
    def name_row(row: int) -> str:
        return f"input row {row + 1} ({str(texts[row])[:60]!r})"

    yield from _run_chunks(engine, _tokenized_chunks(engine, texts, prompt), batch_size, normalize, name_row,
                           on_truncated=on_truncated, on_lost_tokens=on_lost_tokens)


def encode_tokenized(engine: Engine, tokenized: Tokenized, *, batch_size: int = 32, normalize: bool = False,
                     name_row: Callable[[int], str] | None = None) -> np.ndarray:
    """Vectors of texts already tokenized (the passages of long documents, :mod:`neobert_embed.index.passages`)
    through :func:`encode_chunks`' loop without its tokenization; ``name_row(i)`` names a non-finite row.

    Example:
        >>> encode_tokenized(engine_of(model), passages, batch_size=32).shape
        (96, 384)
    """
    (vectors,) = _run_chunks(engine, iter([(0, tokenized)]), batch_size, normalize,
                             name_row or (lambda row: f"input row {row + 1}"))
    return vectors


def _run_chunks(engine: Engine, tokenized_chunks: Iterator[tuple[int, Tokenized]], batch_size: int,
                normalize: bool, name_row: Callable[[int], str], *,
                on_truncated: Callable[[int], None] | None = None,
                on_lost_tokens: Callable[[int | None], None] | None = None) -> Iterator[np.ndarray]:
    """The loop's body over (first row, tokenized chunk) pairs: run, check, release, count what was cut."""
    truncated, lost = 0, 0
    for start, tokenized in tokenized_chunks:
        truncated += tokenized.truncated
        lost = None if lost is None or tokenized.lost_tokens is None else lost + tokenized.lost_tokens
        vectors = engine.encode_chunk(tokenized, batch_size, normalize)
        finite = np.isfinite(vectors).all(axis=1)
        if not finite.all():  # fp16 overflow, damaged weights: stop rather than store NaN
            raise UserInputError(f"{name_row(start + int(np.argmin(finite)))}: the model produced NaN or Inf "
                                 "values; nothing was written. Encode in --precision fp32, or check the model's weights")
        engine.release()
        yield vectors
    if on_truncated is not None:
        on_truncated(truncated)
    if on_lost_tokens is not None:
        on_lost_tokens(lost if truncated else 0)


def _tokenized_chunks(engine: Engine, texts: Sequence[str], prompt: str | None) -> Iterator[tuple[int, Tokenized]]:
    """(first row, tokenized chunk) in input order, tokenized on a worker thread ahead of the caller."""
    starts = list(range(0, len(texts), CHUNK_TEXTS))
    if len(starts) <= 1:  # one chunk: nothing to overlap
        yield from ((start, engine.tokenize(texts[start:start + CHUNK_TEXTS], prompt)) for start in starts)
        return
    ready: queue.Queue[tuple[int, Tokenized] | BaseException | None] = queue.Queue(maxsize=1)  # memory stays flat
    stop = threading.Event()

    def produce() -> None:
        try:
            for start in starts:
                if stop.is_set():
                    return
                ready.put((start, engine.tokenize(texts[start:start + CHUNK_TEXTS], prompt)))
            ready.put(None)
        except BaseException as exc:  # handed to the consumer, which raises it
            ready.put(exc)

    worker = threading.Thread(target=produce, name="neobert-embed-tokenize", daemon=True)
    worker.start()
    try:
        while (item := ready.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            with contextlib.suppress(queue.Empty):
                ready.get_nowait()
            worker.join(timeout=0.05)


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """How the loader runs a model's batches: ``side_by_side`` on a multi-core CPU (one thread each; why:
    :func:`~neobert_embed.inference.runtime.spreads_on`); ``max_batch_tokens`` padded per batch on a GPU;
    ``unpads``: the encoder skips pad tokens itself, so a server's batch budget counts real tokens."""

    side_by_side: bool = False
    max_batch_tokens: int = GPU_BATCH_TOKENS
    unpads: bool = False


class EncodePipeline:
    """The torch :class:`Engine` of a SentenceTransformer: its tokenizer (:class:`DirectTokenizer`), its
    modules' forward (with ``truncate_dim``, as ``encode``) and the plan of a chunk (on a GPU by tokens,
    overlapped; on a CPU ``batch_size`` texts, side by side). A loaded ``EmbeddingModel`` brings its options.

    Example:
        >>> engine = EncodePipeline(model, side_by_side=True)
        >>> engine.encode_chunk(engine.tokenize(["a cat"], None), 32, False).shape
        (1, 384)
    """

    def __init__(self, model: SentenceTransformer, **options: object) -> None:
        self.model = model
        self.options = dataclasses.replace(getattr(model, "engine_options", None) or EngineOptions(), **options)
        self.direct = getattr(model, "direct_tokenizer", None) or DirectTokenizer(model)

    side_by_side = property(lambda self: self.options.side_by_side)
    unpads = property(lambda self: self.options.unpads)
    on_gpu = property(lambda self: self.model.device.type != "cpu")
    dimension = property(lambda self: int(self.model.get_embedding_dimension()))

    @property
    def max_seq_length(self) -> int:
        """Inputs are truncated to this many tokens (the model's; set it on the model or here)."""
        return int(self.model.max_seq_length)

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        self.model.max_seq_length = int(value)

    #: True when the model's modules hold a Normalize module (its outputs are unit vectors).
    normalizes = property(lambda self: any(type(module).__name__ == "Normalize" for module in self.model))

    def tokenize(self, texts: Sequence[str], prompt: str | None) -> Tokenized:
        return self.direct.tokenize(self.model, texts, prompt)

    def release(self) -> None:
        """On a CPU, hand the memory a chunk's activations freed back to the system."""
        if not self.on_gpu:
            release_freed_memory()

    def plan(self, tokenized: Tokenized, batch_size: int) -> list[np.ndarray]:
        """A chunk's batches: by tokens only on a GPU (its speed depends on the tokens in a batch), else
        :func:`plan_cpu_batches`."""
        if self.on_gpu:
            return plan_batches(tokenized.lengths, max_tokens=self.options.max_batch_tokens)
        return plan_cpu_batches(tokenized.lengths, batch_size)

    def forward(self, features: dict[str, np.ndarray | object], *, normalize: bool = False) -> np.ndarray:
        """Sentence embeddings of one padded batch, float32 on the host."""
        return self.device_vectors(features, normalize=normalize).cpu().numpy()

    def device_vectors(self, features: dict[str, np.ndarray | object], *, normalize: bool = False) -> torch.Tensor:
        """Sentence embeddings of one padded batch, float32 on the model's device (what ``benchmarks/gpu.py``
        times as the forward alone)."""
        import torch
        from torch.nn import functional

        device = self.model.device
        inputs = {key: _to_device(value, device) for key, value in features.items()}
        with torch.inference_mode():
            embeddings = self.model(inputs)["sentence_embedding"]
            if self.model.truncate_dim:
                embeddings = embeddings[:, :self.model.truncate_dim]
            if normalize:
                embeddings = functional.normalize(embeddings.float(), p=2, dim=1)
            return embeddings.float()

    def encode_chunk(self, tokenized: Tokenized, batch_size: int, normalize: bool) -> np.ndarray:
        """The vectors of one tokenized chunk (rows in its order)."""
        import torch

        batches = self.plan(tokenized, batch_size)
        if self.on_gpu:
            return self._run_on_gpu(tokenized, batches, normalize)
        out = np.empty((len(tokenized), self.dimension), dtype=np.float32)

        def run(rows: np.ndarray) -> np.ndarray:
            return self.forward(tokenized.batch(rows), normalize=normalize)

        if self.side_by_side and len(batches) > 1 and torch.get_num_threads() > 1:
            results = _run_side_by_side(run, batches)
        else:
            results = map(run, batches)
        for rows, vectors in zip(batches, results, strict=True):
            out[rows] = vectors
        return out

    def _run_on_gpu(self, tokenized: Tokenized, batches: list[np.ndarray], normalize: bool) -> np.ndarray:
        """Every batch queued on the GPU, each result copied into one pinned host buffer without waiting."""
        import torch

        staged = torch.empty((len(tokenized), self.dimension), dtype=torch.float32).pin_memory()
        cursor = 0
        for rows in batches:
            pinned = {key: torch.from_numpy(np.ascontiguousarray(value)).pin_memory()
                      if isinstance(value, np.ndarray) else value for key, value in tokenized.batch(rows).items()}
            vectors = self.device_vectors(pinned, normalize=normalize)
            staged[cursor:cursor + len(rows)].copy_(vectors, non_blocking=True)
            cursor += len(rows)
        torch.cuda.synchronize(self.model.device)
        out = np.empty_like(staged.numpy())
        out[np.concatenate(batches)] = staged.numpy()
        return out


def _to_device(value: object, device: torch.device) -> object:
    import torch

    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    return value


def _run_side_by_side(run: Callable[[np.ndarray], np.ndarray], batches: list[np.ndarray]) -> list[np.ndarray]:
    """``run`` over ``batches`` on the CPU's threads, each batch on one thread of its own."""
    import torch

    threads = torch.get_num_threads()
    workers = min(threads, len(batches))
    try:
        return list(_pool(workers, max(1, threads // workers)).map(run, batches))
    finally:
        torch.set_num_threads(threads)  # the count threads started later take: the caller's (see _pool)


@functools.cache
def _pool(workers: int, threads_each: int) -> ThreadPoolExecutor:
    """One pool per shape, kept for the process (its threads idle between calls). Each worker sets its own
    intra-op thread count once, when it starts: under OpenMP that count belongs to the calling thread (the
    caller's is unchanged), but torch also keeps the last count set as the one later threads start with,
    which :func:`_run_side_by_side` gives back to the caller's."""
    import torch

    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="neobert-embed-batch",
                              initializer=torch.set_num_threads, initargs=(threads_each,))


def engine_of(model: SentenceTransformer | Engine) -> Engine:
    """The :class:`Engine` that encodes for ``model``: a light model is its own; a SentenceTransformer's is an
    :class:`EncodePipeline` with the options and tokenizer its loader gave it (a plain one elsewhere).

    Example:
        >>> engine_of(load_inference_model("runs/my-embedder", "fp32").model).unpads
        True
    """
    if hasattr(model, "encode_chunk"):
        return model  # type: ignore[return-value]
    return EncodePipeline(model)  # type: ignore[arg-type]


def pipelined(model: SentenceTransformer, inputs: object, kwargs: dict[str, object]) -> bool:
    """The one rule for which ``encode`` calls the engine runs: a non-empty list of strings; every argument
    in :data:`PIPELINED_DEFAULTS` (at a value listed there) or :data:`HANDLED_ARGUMENTS`; ``task`` only for
    a model without a Router module (for which it changes nothing); a positive int ``batch_size``.

    Example:
        >>> pipelined(model, ["a cat"], {"batch_size": 8}), pipelined(model, ["a cat"], {"precision": "int8"})
        (True, False)
    """
    if not isinstance(inputs, list) or not inputs or not all(isinstance(text, str) for text in inputs):
        return False
    if any(name not in PIPELINED_DEFAULTS and name not in HANDLED_ARGUMENTS for name in kwargs):
        return False
    if kwargs.get("task") is not None and any(type(module).__name__ == "Router" for module in model):
        return False
    batch_size = kwargs.get("batch_size", 32)
    if not isinstance(batch_size, int) or batch_size < 1:
        return False
    return all(kwargs.get(name, allowed[0]) in allowed for name, allowed in PIPELINED_DEFAULTS.items())
