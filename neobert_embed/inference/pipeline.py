"""The one path from texts to vectors: tokenize once, ahead of the model; batch by length and tokens; rows back in order.

Why: a forward pass is only as fast as what feeds it. sentence-transformers' ``encode`` tokenizes each
batch just before its forward, so the model waits for the tokenizer and the tokenizer for the model,
and this toolkit used to tokenize every text a second time to count what was truncated. On a GPU that
costs most of the job on a GPU (docs/performance.md, "Why the encoding path is built as it is"). This
module does what
text-embeddings-inference's queue and infinity's batch handler do, once, for every command that encodes:

1. :func:`tokenize` tokenizes each text once, exactly as the model's own ``preprocess`` would (its
   prompts, lower-casing, truncation at ``max_seq_length``), in chunks of input order, on a worker
   thread that stays :data:`CHUNKS_AHEAD` chunks ahead of the model (a bounded queue). The texts are
   held unpadded (:class:`~neobert_embed.inference.tokenized.Tokenized`) and, where the tokenizer has
   one, come straight from its Rust tokenizer, checked against ``preprocess`` first (many times
   ``preprocess``'s speed: docs/performance.md). The same call says which texts
   were cut, so truncation is counted without tokenizing again.
2. :func:`plan_batches` orders a chunk's texts by token count and cuts them into batches: at most
   ``max_texts`` texts (the ``--batch-size`` on a CPU), at most ``max_tokens`` padded tokens (the
   budget on a GPU and in the server), and with ``min_fill`` a short text never pads up to a long one.
3. :meth:`EncodePipeline.forward` pads one batch to its longest text and runs the model's modules
   (its pooling, ``Normalize`` and ``truncate_dim`` as ``encode`` applies them). On a GPU the inputs go
   from pinned memory without waiting, the vectors come back into pinned memory, and the host waits
   once per chunk, not once per batch. On a CPU with several threads, batches run side by side, one
   thread each (:data:`SIDE_BY_SIDE`; why: see :func:`~neobert_embed.inference.runtime.spreads_on`).
4. Rows are written back in input order; a row that is not finite stops the job, naming it.
5. :meth:`EncodePipeline.chunks` hands the vectors over a chunk at a time (``encode`` of a file writes
   them as they come, never holding the matrix), and on a CPU the memory a chunk's batches freed goes
   back to the system before the next (:mod:`~neobert_embed.inference.native_memory`).

The vectors are those of ``SentenceTransformer.encode`` up to the rounding of a different batch
composition (exactly the same arithmetic per text for NeoBERT and the un-padded BERT family, whose
texts attend to their own tokens only).

:func:`install` attaches it to a loaded model, whose class
(:class:`~neobert_embed.inference.embedding_model.EmbeddingModel`) runs it as ``encode`` for the calls
where each row depends on its own text only (float32 sentence embeddings, a prompt, normalization);
other calls (int8 output, token embeddings, a process pool) run sentence-transformers' ``encode``
unchanged (:func:`pipelined`). The light runtime runs the same loop (:func:`encode_chunks`), and the
server plans its merged requests with :func:`plan_batches` and runs them with the engine's ``forward``.

Example:
    >>> pipeline = EncodePipeline(model)
    >>> pipeline.encode(["a cat", "a dog on a mat"], prompt=None, batch_size=32).shape
    (2, 384)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

import numpy as np

from neobert_embed.errors import UserInputError
from neobert_embed.inference.fast_tokenizer import FastTokenizer
from neobert_embed.inference.native_memory import release_freed_memory
from neobert_embed.inference.tokenized import Padding, Tokenized

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

#: Texts tokenized per call: enough for the tokenizer's own threads to share the work and for a
#: length sort to leave little padding, few enough that the first forward starts early.
CHUNK_TEXTS = 2048
#: Tokenized chunks waiting for the model at most (the queue's bound: memory stays flat).
CHUNKS_AHEAD = 1
#: Padded tokens per batch on a GPU when batches are cut by tokens (text-embeddings-inference's
#: ``max_batch_tokens`` is 16,384; a larger batch amortizes the per-layer kernel launches).
GPU_BATCH_TOKENS = 65536
#: Padded tokens per batch on a CPU, on top of ``--batch-size`` texts: 32 texts of 512 tokens (the batches
#: of a BERT-window model are unchanged), so 32 texts of 4,096 tokens run as 8 batches of 4 and never
#: hold a 32 x 4,096 attention at once (docs/performance.md, "Long inputs").
CPU_BATCH_TOKENS = 16384
#: How batches run on a multi-core CPU (what ``used:`` lines and records say).
SIDE_BY_SIDE = "batches side by side, one per thread"
#: ``encode`` arguments and the values under which each row depends on its own text only; a call
#: with any other value runs sentence-transformers' ``encode`` (:func:`pipelined`). ``prompt``, ``prompt_name``,
#: ``normalize_embeddings``, ``batch_size``, ``show_progress_bar``, ``convert_to_*`` and (without a Router)
#: ``task`` are handled here.
PIPELINED_DEFAULTS: dict[str, tuple[object, ...]] = {
    "output_value": ("sentence_embedding",),
    "precision": ("float32",),
    "pool": (None,),
    "device": (None,),
    "chunk_size": (None,),
    "truncate_dim": (None,),
}
#: The other ``encode`` arguments the pipeline honours; a call with an argument outside both runs
#: sentence-transformers' ``encode`` (which names what it does not know).
HANDLED_ARGUMENTS = ("prompt", "prompt_name", "batch_size", "show_progress_bar", "convert_to_numpy",
                     "convert_to_tensor", "normalize_embeddings", "task")


#: The tokenizer's output that maps overflow rows to their text (dropped before the forward).
_OVERFLOW_KEY = "overflow_to_sample_mapping"


#: Texts tokenized both ways before the direct tokenizer is trusted with a model and prompt: the
#: first call's first few and its longest few (by characters), and one text twice the length limit.
PROBE_TEXTS = 8


def tokenize(model: SentenceTransformer, texts: Sequence[str], prompt: str | None = None,
             lock: contextlib.AbstractContextManager | None = None) -> Tokenized:
    """Tokenize ``texts`` with ``prompt`` exactly as ``model.encode`` would, once, counting truncation.

    Where the model's tokenizer has a Rust tokenizer, the ids come from it directly
    (:class:`~neobert_embed.inference.fast_tokenizer.FastTokenizer`: a fraction of ``preprocess``'s
    Python, docs/performance.md), once a probe of the first call (its first and longest texts, and
    a text twice the length limit) gave exactly ``preprocess``'s ids, mask, type ids, padding, lengths
    and truncation; the verdict holds for that model, prompt and tokenizer settings, whatever the size
    of later calls (a server's one-text batches included). Otherwise (another input module, a chat
    template, a custom ``preprocess``) every call goes through :func:`tokenize_with_preprocess`, under
    ``lock`` when given (a transformers fast tokenizer must not be entered by two threads at once).

    Example:
        >>> tokenize(model, ["a cat", "word " * 600]).truncated
        1
    """
    texts = list(texts)
    direct = _direct_tokenizer(model)
    if (direct is not None and direct.verdicts.get(prompt, True) is not False and texts
            and all(isinstance(text, str) for text in texts)):
        tokenized = _checked_direct(model, direct, texts, prompt, lock)
        if tokenized is not None:
            return tokenized
    with lock or contextlib.nullcontext():
        return tokenize_with_preprocess(model, texts, prompt)


@dataclasses.dataclass
class _Agreement:
    """What a probe of ``preprocess`` showed for one prompt: the keys it returns and its per-call values."""

    keys: tuple[str, ...]
    shared: dict[str, object]


@dataclasses.dataclass
class _Direct:
    """A model's direct tokenizer, the settings it was made for, and per prompt: its agreement, or False."""

    settings: tuple
    tokenizer: FastTokenizer
    verdicts: dict[str | None, _Agreement | bool] = dataclasses.field(default_factory=dict)


def _checked_direct(model: SentenceTransformer, direct: _Direct, texts: list[str],
                    prompt: str | None, lock: contextlib.AbstractContextManager | None) -> Tokenized | None:
    """``texts`` through the direct tokenizer; None (and the prompt's verdict False) when its first
    call's probe differs from ``preprocess``."""
    tokenized = direct.tokenizer.tokenize([prompt + text for text in texts] if prompt else texts)
    agreement = direct.verdicts.get(prompt)
    if agreement is None:
        with lock or contextlib.nullcontext():
            agreement = _probe(model, direct.tokenizer, texts, tokenized, prompt)
        direct.verdicts[prompt] = agreement
        if agreement is False:
            logger.info("%s: its Rust tokenizer called directly differs from preprocess; tokenizing through "
                        "preprocess", type(model[0]).__name__)
    if not isinstance(agreement, _Agreement):
        return None
    return dataclasses.replace(tokenized, values={key: tokenized.values[key] for key in agreement.keys},
                               shared=agreement.shared)


def _probe(model: SentenceTransformer, fast: FastTokenizer, texts: list[str], tokenized: Tokenized,
           prompt: str | None) -> _Agreement | bool:
    """Compare ``tokenized``'s first and longest rows, and a text twice the length limit (truncation shows
    whatever the call holds), with what ``preprocess`` gives for them."""
    probe = np.unique(np.concatenate([np.arange(min(PROBE_TEXTS, len(texts))),
                                      np.argsort([-len(text) for text in texts], kind="stable")[:PROBE_TEXTS]]))
    overlong = "a " * (2 * fast.max_seq_length)
    reference = tokenize_with_preprocess(model, [*(texts[row] for row in probe), overlong], prompt)
    cut = fast.tokenize([(prompt or "") + overlong])
    rows = np.arange(len(probe))
    if not (_same_tokens(tokenized, probe, reference, rows)
            and _same_tokens(cut, np.zeros(1, dtype=np.int64), reference, rows[-1:] + 1)
            and cut.truncated == 1):
        return False
    return _Agreement(tuple(reference.values), reference.shared)


def _same_tokens(mine: Tokenized, rows: np.ndarray, reference: Tokenized, reference_rows: np.ndarray) -> bool:
    """``mine``'s ``rows`` are ``reference``'s ``reference_rows``: ids, mask, type ids, lengths, padding."""
    if mine.padding != reference.padding or not np.array_equal(mine.lengths[rows], reference.lengths[reference_rows]):
        return False
    ours, theirs = mine.batch(rows), reference.batch(reference_rows)
    return all(key in mine.values and np.array_equal(ours[key], theirs[key]) for key in reference.values)


_DIRECT: weakref.WeakKeyDictionary[object, _Direct | None] = weakref.WeakKeyDictionary()
_DIRECT_LOCK = threading.Lock()


def _direct_tokenizer(model: SentenceTransformer) -> _Direct | None:
    """The model's direct tokenizer, made again when its length, sides or pad token change."""
    tokenizer = getattr(model, "tokenizer", None)
    limit = getattr(model, "max_seq_length", None)
    if tokenizer is None or not limit:
        return None
    settings = (int(limit), getattr(tokenizer, "padding_side", None), getattr(tokenizer, "truncation_side", None),
                getattr(tokenizer, "pad_token_id", None))
    with _DIRECT_LOCK:
        direct = _DIRECT.get(tokenizer)
        if direct is None or direct.settings != settings:
            fast = FastTokenizer.of(tokenizer, int(limit))
            direct = _Direct(settings, fast) if fast is not None else None
            _DIRECT[tokenizer] = direct
    return direct


def tokenize_with_preprocess(model: SentenceTransformer, texts: Sequence[str],
                             prompt: str | None = None) -> Tokenized:
    """``texts`` through the model's own ``preprocess``, asked for per-text lists, not a padded tensor
    (see :class:`Tokenized`), and for the tokenizer's overflow rows, which mark the texts that were
    longer than ``max_seq_length`` (their first row is the truncated text ``encode`` reads). An input
    module that takes no such options is tokenized plainly and a text filling ``max_seq_length`` is
    counted as cut.

    Example:
        >>> tokenize_with_preprocess(model, ["a cat", "word " * 600]).truncated
        1
    """
    features = _preprocess(model, list(texts), prompt)
    mapping = features.pop(_OVERFLOW_KEY, None)
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
        rows = {key: _first_rows(value, first) for key, value in rows.items()}
    details = {"padding": Padding.of(getattr(model, "tokenizer", None)), "shared": shared}
    if isinstance(rows["attention_mask"], list):
        tokenized = Tokenized.from_lists(rows, **details)
    else:
        arrays = {key: value.numpy() for key, value in rows.items()}
        tokenized = Tokenized.from_padded(arrays, arrays["attention_mask"], **details)
    if cut is None:
        cut = tokenized.lengths >= int(model.max_seq_length or 1 << 30)
    return dataclasses.replace(tokenized, truncated=int(cut.sum()), cut=cut, lost_tokens=lost)


def _overflow_tokens(model: SentenceTransformer, mask: list | torch.Tensor, first: np.ndarray) -> int | None:
    """Tokens of text in the overflow rows (every row but each text's first), less their special tokens."""
    specials = getattr(getattr(model, "tokenizer", None), "num_special_tokens_to_add", None)
    if specials is None:
        return None
    lengths = np.asarray([sum(row) for row in mask] if isinstance(mask, list) else mask.sum(dim=1).numpy())
    overflow = np.ones(len(lengths), dtype=bool)
    overflow[first] = False
    return int(lengths[overflow].sum()) - int(overflow.sum()) * int(specials(pair=False))


#: What ``tokenize`` asks of ``preprocess``: per-text lists, unpadded, and the overflow rows.
_RAGGED_KWARGS = {"text": {"return_overflowing_tokens": True, "padding": False}, "common": {"return_tensors": None}}


def _preprocess(model: SentenceTransformer, texts: list[str], prompt: str | None) -> dict[str, object]:
    try:
        return dict(model.preprocess(texts, prompt=prompt, processing_kwargs=_RAGGED_KWARGS))
    except TypeError:  # an input module whose preprocess takes no processing_kwargs
        return dict(model.preprocess(texts, prompt=prompt))


def _first_rows(value: list | torch.Tensor, first: np.ndarray) -> list | torch.Tensor:
    if isinstance(value, list):
        return [value[index] for index in first.tolist()]
    return value[first]


def _is_rows(value: object) -> bool:
    """One entry per text: a 2-D tensor, or a list of per-text lists."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.dim() == 2
    return isinstance(value, list) and bool(value) and isinstance(value[0], (list, tuple))


def plan_batches(lengths: Sequence[int] | np.ndarray, *, max_texts: int | None = None,
                 max_tokens: int | None = None, min_fill: float = 0.0, padded: bool = True) -> list[np.ndarray]:
    """Cut texts of token counts ``lengths`` into batches, longest first: the one batching rule.

    A batch takes the next text while it holds fewer than ``max_texts`` texts, its padded size
    (texts × its longest; with ``padded=False``, for an engine that un-pads, its real tokens, as
    text-embeddings-inference counts them) stays within ``max_tokens``, and the text is at least ``min_fill`` × its
    longest (padding then wastes at most 1/``min_fill`` of a padded model's compute). Every batch holds
    at least one text; equal lengths keep their input order.

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
    :data:`CPU_BATCH_TOKENS` padded tokens, so a batch of long texts does not hold 32 x 4,096 tokens of
    activations at once.

    Example:
        >>> [b.tolist() for b in plan_cpu_batches([4096] * 5, 32)]
        [[0, 1, 2, 3], [4]]
    """
    return plan_batches(lengths, max_texts=batch_size, max_tokens=CPU_BATCH_TOKENS)


class Engine(Protocol):
    """What :func:`encode_chunks` (the one encoding loop) and the server need of a runtime: the torch
    engine (:class:`EncodePipeline`) or the light runtime's (:class:`~neobert_embed.inference.light.LightModel`).

    ``tokenize`` is the engine's tokenizer (truncating at ``max_seq_length``, counting what it cut);
    ``forward`` turns one padded batch into float32 sentence vectors on the host; ``encode_chunk``
    plans a tokenized chunk into batches and runs them (the torch engine overlaps them on a GPU and
    runs them side by side on a CPU); ``release`` hands back what a chunk's batches freed.
    """

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


def encode_chunks(engine: Engine, texts: Sequence[str], *, prompt: str | None = None, batch_size: int = 32,
                  normalize: bool = False, on_truncated: Callable[[int], None] | None = None,
                  on_lost_tokens: Callable[[int | None], None] | None = None) -> Iterator[np.ndarray]:
    """THE encoding loop, for every runtime: the vectors of ``texts`` one chunk of :data:`CHUNK_TEXTS` rows
    at a time, in input order. Each chunk is tokenized once, ahead of the model (a worker thread), planned
    and run by ``engine``; a row that is not finite stops the job naming it; what the chunk freed goes back
    to the system before the next, so a long job's resident memory stays flat. ``on_truncated(n)`` is
    called once the last chunk is done, with how many texts were cut at ``max_seq_length``, and
    ``on_lost_tokens(n)`` with how many tokens lay past the cuts (None: the tokenizer did not say).

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
    """Vectors of texts already tokenized (float32, rows in order) through :func:`encode_chunks`' loop (the
    engine's plan, the CPU token budget, the finiteness stop, the release), with no tokenization: the passages
    of long documents, cut from one tokenization of each document (:mod:`neobert_embed.index.passages`).
    ``name_row(i)`` names row ``i`` in the error when its vector is not finite.

    Example:
        >>> encode_tokenized(engine_of(model), passages, batch_size=32).shape
        (96, 384)
    """
    chunks = _run_chunks(engine, iter([(0, tokenized)]), batch_size, normalize,
                         name_row or (lambda row: f"input row {row + 1}"))
    return collect(chunks, len(tokenized), engine.dimension)


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
        _check_finite(vectors, start, name_row)
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
    ready: queue.Queue[tuple[int, Tokenized] | BaseException | None] = queue.Queue(maxsize=CHUNKS_AHEAD)
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


class EncodePipeline:
    """The torch :class:`Engine` of one loaded SentenceTransformer (see the module docstring).

    Args:
        model: the model, at its compute precision (:func:`~neobert_embed.inference.runtime.load_inference_model`).
        side_by_side: on a multi-core CPU, run batches side by side, one thread each.
        max_batch_tokens: the padded-token budget of a batch on a GPU (:data:`GPU_BATCH_TOKENS`).
        unpads: the encoder skips pad tokens itself (NeoBERT, or BERT-family layers made un-padded),
            so a server's batch budget counts real tokens.
    """

    def __init__(self, model: SentenceTransformer, *, side_by_side: bool = False,
                 max_batch_tokens: int = GPU_BATCH_TOKENS, unpads: bool = False) -> None:
        self.model = model
        self.side_by_side = side_by_side
        self.max_batch_tokens = max_batch_tokens
        self.unpads = unpads
        #: one fast tokenizer must not be entered by two threads at once ("Already borrowed")
        self.tokenizer_lock = threading.RLock()

    def __deepcopy__(self, memo: dict[int, object]) -> EncodePipeline:
        """A copy of the model (``auto``'s trial of a precision that replaces layers) gets its own pipeline."""
        import copy

        return EncodePipeline(copy.deepcopy(self.model, memo), side_by_side=self.side_by_side,
                              max_batch_tokens=self.max_batch_tokens, unpads=self.unpads)

    @property
    def on_gpu(self) -> bool:
        return self.model.device.type != "cpu"

    @property
    def max_seq_length(self) -> int:
        """Inputs are truncated to this many tokens."""
        return int(self.model.max_seq_length)

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        self.model.max_seq_length = int(value)

    @property
    def dimension(self) -> int:
        """Width of the sentence vectors."""
        return int(self.model.get_embedding_dimension())

    @property
    def normalizes(self) -> bool:
        """True when the model's pipeline ends in a Normalize module (its outputs are unit vectors)."""
        return any(type(module).__name__ == "Normalize" for module in self.model)

    def tokenize(self, texts: Sequence[str], prompt: str | None) -> Tokenized:
        """``texts`` as the model's ``encode`` tokenizes them (:func:`tokenize`); safe from any thread."""
        return tokenize(self.model, texts, prompt, self.tokenizer_lock)

    def release(self) -> None:
        """On a CPU, hand the memory a chunk's activations freed back to the system."""
        if not self.on_gpu:
            release_freed_memory()

    def plan(self, tokenized: Tokenized, batch_size: int) -> list[np.ndarray]:
        """Batches of a chunk: ``batch_size`` texts each on a CPU (as ``encode``), within :data:`CPU_BATCH_TOKENS`
        padded tokens; on a GPU by tokens only
        (``max_batch_tokens``), since a GPU's speed depends on the tokens in a batch, not its texts."""
        if self.on_gpu:
            return plan_batches(tokenized.lengths, max_tokens=self.max_batch_tokens)
        return plan_cpu_batches(tokenized.lengths, batch_size)

    def forward(self, features: dict[str, np.ndarray | object], *, normalize: bool = False) -> np.ndarray:
        """Sentence embeddings of one padded batch, float32 on the host."""
        return self.device_vectors(features, normalize=normalize).cpu().numpy()

    def device_vectors(self, features: dict[str, np.ndarray | object], *, normalize: bool = False) -> torch.Tensor:
        """Sentence embeddings of one padded batch (float32, on the model's device, not yet on the host: what
        a chunk's batches queue on a GPU, and what ``benchmarks/gpu.py`` times as the forward alone)."""
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

    def encode(self, texts: Sequence[str], *, prompt: str | None = None, batch_size: int = 32,
               normalize: bool = False, advance: Callable[[int], None] | None = None,
               on_truncated: Callable[[int], None] | None = None,
               on_lost_tokens: Callable[[int | None], None] | None = None) -> np.ndarray:
        """Vectors of ``texts`` (float32, (n, dimension), rows in input order); see the module docstring.

        ``advance(n)`` is told as rows are done; ``on_truncated(n)`` once, with how many texts were cut,
        and ``on_lost_tokens(n)`` with how many tokens lay past the cuts (None: the tokenizer did not say).
        """
        chunks = encode_chunks(self, texts, prompt=prompt, batch_size=batch_size, normalize=normalize,
                               on_truncated=on_truncated, on_lost_tokens=on_lost_tokens)
        return collect(chunks, len(texts), self.dimension, advance)

    def chunks(self, texts: Sequence[str], *, prompt: str | None = None, batch_size: int = 32,
               normalize: bool = False, on_truncated: Callable[[int], None] | None = None,
               on_lost_tokens: Callable[[int | None], None] | None = None) -> Iterator[np.ndarray]:
        """:func:`encode_chunks` through this engine."""
        return encode_chunks(self, texts, prompt=prompt, batch_size=batch_size, normalize=normalize,
                             on_truncated=on_truncated, on_lost_tokens=on_lost_tokens)

    def encode_tokenized(self, tokenized: Tokenized, *, batch_size: int = 32, normalize: bool = False) -> np.ndarray:
        """:func:`encode_tokenized` through this engine: texts already tokenized (the passages of long documents)."""
        return encode_tokenized(self, tokenized, batch_size=batch_size, normalize=normalize)

    def encode_chunk(self, tokenized: Tokenized, batch_size: int, normalize: bool) -> np.ndarray:
        """The vectors of one tokenized chunk (rows in its order): planned, then run on the GPU without
        waiting per batch, or on the CPU's threads."""
        batches = self.plan(tokenized, batch_size)
        if self.on_gpu:
            return self._run_on_gpu(tokenized, batches, normalize)
        out = np.empty((len(tokenized), self.dimension), dtype=np.float32)
        if self.side_by_side and len(batches) > 1 and _threads() > 1:
            results = _run_side_by_side(lambda rows: self._host_vectors(tokenized, rows, normalize), batches)
        else:
            results = [self._host_vectors(tokenized, rows, normalize) for rows in batches]
        for rows, vectors in zip(batches, results, strict=True):
            out[rows] = vectors
        return out

    def _host_vectors(self, tokenized: Tokenized, rows: np.ndarray, normalize: bool) -> np.ndarray:
        return self.forward(tokenized.batch(rows), normalize=normalize)

    def _run_on_gpu(self, tokenized: Tokenized, batches: list[np.ndarray], normalize: bool) -> np.ndarray:
        """Every batch of a chunk queued on the GPU, each result copied into one pinned host buffer without
        waiting; the host waits once, for the chunk's last copy."""
        import torch

        staged = torch.empty((len(tokenized), self.dimension), dtype=torch.float32).pin_memory()
        order = np.concatenate(batches)
        cursor = 0
        for rows in batches:
            vectors = self.device_vectors(_pinned(tokenized.batch(rows)), normalize=normalize)
            staged[cursor:cursor + len(rows)].copy_(vectors, non_blocking=True)
            cursor += len(rows)
        torch.cuda.synchronize(self.model.device)
        out = np.empty_like(staged.numpy())
        out[order] = staged.numpy()
        return out


def _to_device(value: object, device: torch.device) -> object:
    import torch

    if isinstance(value, np.ndarray):
        value = torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    return value


def _pinned(features: dict[str, np.ndarray | object]) -> dict[str, object]:
    """Row arrays as pinned host tensors, so their copy to the GPU does not make the host wait."""
    import torch

    return {key: torch.from_numpy(np.ascontiguousarray(value)).pin_memory() if isinstance(value, np.ndarray)
            else value for key, value in features.items()}


def _check_finite(vectors: np.ndarray, start: int, name_row: Callable[[int], str]) -> None:
    finite = np.isfinite(vectors).all(axis=1)
    if finite.all():
        return
    row = start + int(np.argmin(finite))  # fp16 overflow, damaged weights: stop rather than store NaN
    raise UserInputError(f"{name_row(row)}: the model produced NaN or Inf values; nothing was written. "
                         "Encode in --precision fp32, or check the model's weights")


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _run_side_by_side(run: Callable[[np.ndarray], np.ndarray], batches: list[np.ndarray]) -> list[np.ndarray]:
    """``run`` over ``batches`` on the CPU's threads, each batch on one thread of its own."""
    import torch

    threads = torch.get_num_threads()
    workers = min(threads, len(batches))

    def one(rows: np.ndarray) -> np.ndarray:
        torch.set_num_threads(max(1, threads // workers))  # this worker's own operators
        return run(rows)

    try:
        return list(_pool(workers).map(one, batches))
    finally:
        torch.set_num_threads(threads)


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    """One pool per worker count, kept for the process (its threads idle between calls)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="neobert-embed-batch")


# --- model.encode through the pipeline ----------------------------------------------------------


def install(model: SentenceTransformer, *, side_by_side: bool = False,
            max_batch_tokens: int = GPU_BATCH_TOKENS, unpads: bool = False) -> EncodePipeline:
    """Attach an :class:`EncodePipeline` to ``model``: the engine its ``encode`` runs when it is an
    :class:`~neobert_embed.inference.embedding_model.EmbeddingModel` (what the loader builds), and the one
    the toolkit's own callers use (:func:`engine_of`). Nothing of the instance's methods is replaced.

    ``copy.deepcopy(model)`` gets a copy with its own pipeline. :func:`uninstall` detaches it.

    Example:
        >>> pipeline = install(model, side_by_side=True)
        >>> model.encode(texts, batch_size=32).shape   # tokenized once, ahead, length-batched
        (1024, 384)
    """
    pipeline = EncodePipeline(model, side_by_side=side_by_side, max_batch_tokens=max_batch_tokens, unpads=unpads)
    vars(model)["_neobert_embed_pipeline"] = pipeline
    return pipeline


def uninstall(model: SentenceTransformer) -> None:
    """Undo :func:`install`: ``model.encode`` is sentence-transformers' own again."""
    vars(model).pop("_neobert_embed_pipeline", None)


def pipeline_for(model: SentenceTransformer) -> EncodePipeline:
    """The model's installed pipeline, or a plain one (no batches side by side) for a model loaded elsewhere."""
    return pipeline_of(model) or EncodePipeline(model)


def encode_with(model: SentenceTransformer | Engine, texts: Sequence[str], *, prompt: str | None,
                batch_size: int = 32, normalize: bool = False, advance: Callable[[int], None] | None = None,
                on_truncated: Callable[[int], None] | None = None,
                on_lost_tokens: Callable[[int | None], None] | None = None) -> np.ndarray:
    """Vectors of ``texts`` through ``model``'s pipeline (float32, rows in input order): the matrix of
    :func:`chunks_with`'s chunks.

    Example:
        >>> encode_with(model, ["a cat"], prompt="query: ").shape
        (1, 384)
    """
    chunks = chunks_with(model, texts, prompt=prompt, batch_size=batch_size, normalize=normalize,
                         on_truncated=on_truncated, on_lost_tokens=on_lost_tokens)
    return collect(chunks, len(texts), int(model.get_embedding_dimension()), advance)


def chunks_with(model: SentenceTransformer | Engine, texts: Sequence[str], *, prompt: str | None,
                batch_size: int = 32, normalize: bool = False,
                on_truncated: Callable[[int], None] | None = None,
                on_lost_tokens: Callable[[int | None], None] | None = None) -> Iterator[np.ndarray]:
    """The vectors of ``texts`` through ``model``'s engine (:func:`engine_of`), one chunk of rows at a time
    in input order (:func:`encode_chunks`, the same loop for the torch and the light runtime).

    Example:
        >>> sum(len(vectors) for vectors in chunks_with(model, texts, prompt=None))
        5000
    """
    yield from encode_chunks(engine_of(model), texts, prompt=prompt, batch_size=batch_size, normalize=normalize,
                             on_truncated=on_truncated, on_lost_tokens=on_lost_tokens)


def engine_of(model: SentenceTransformer | Engine) -> Engine:
    """The :class:`Engine` that encodes for ``model``: a light model is its own; a SentenceTransformer's
    is the pipeline its loader gave it (:func:`install`), else a plain one.

    Example:
        >>> engine_of(load_inference_model("runs/minilm-onnx", backend="onnx").model).unpads
        False
    """
    if hasattr(model, "encode_chunk"):
        return model  # type: ignore[return-value]
    return pipeline_for(model)  # type: ignore[arg-type]


def collect(chunks: Iterator[np.ndarray], rows: int, dimension: int,
            advance: Callable[[int], None] | None = None) -> np.ndarray:
    """The ``rows`` × ``dimension`` float32 matrix of ``chunks`` (consecutive rows, in order); ``advance(n)``
    is told after each chunk.

    Example:
        >>> collect(iter([np.ones((2, 3)), np.zeros((1, 3))]), 3, 3).sum()
        6.0
    """
    out = np.empty((rows, dimension), dtype=np.float32)
    start = 0
    for vectors in chunks:
        out[start:start + len(vectors)] = vectors
        start += len(vectors)
        if advance is not None:
            advance(len(vectors))
    if start != rows:
        raise ValueError(f"the chunks held {start} rows, not {rows}")
    return out


def pipeline_of(model: SentenceTransformer) -> EncodePipeline | None:
    """The pipeline :func:`install` gave ``model`` (the one bound to this very object), else None."""
    pipeline = vars(model).get("_neobert_embed_pipeline")
    return pipeline if isinstance(pipeline, EncodePipeline) and pipeline.model is model else None


def pipelined_encode(model: SentenceTransformer, inputs: object, *args: object, **kwargs: object) -> object:
    """``SentenceTransformer.encode`` through the model's pipeline for a list of texts and the arguments
    :func:`pipelined` accepts; any other call is sentence-transformers' own ``encode``."""
    from sentence_transformers import SentenceTransformer

    pipeline = pipeline_of(model)
    batch_size = kwargs.get("batch_size", 32)
    if (pipeline is None or args or not pipelined(model, inputs, kwargs)
            or not isinstance(batch_size, int) or batch_size < 1):
        return SentenceTransformer.encode(model, inputs, *args, **kwargs)  # type: ignore[arg-type]
    texts: list[str] = inputs  # type: ignore[assignment]
    vectors = pipeline.encode(texts, prompt=_prompt(model, kwargs), batch_size=batch_size,
                              normalize=bool(kwargs.get("normalize_embeddings", False)))
    if kwargs.get("convert_to_tensor"):
        import torch

        return torch.from_numpy(vectors)
    if kwargs.get("convert_to_numpy", True):
        return vectors
    import torch

    return list(torch.from_numpy(vectors))


def pipelined(model: SentenceTransformer, inputs: object, kwargs: dict[str, object]) -> bool:
    """The one rule for which ``encode`` calls the engine runs: a non-empty list of strings; every argument
    in :data:`PIPELINED_DEFAULTS` (at a value listed there) or :data:`HANDLED_ARGUMENTS`; ``task`` only
    for a model without a Router module (for which it changes nothing).

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
    return all(kwargs.get(name, allowed[0]) in allowed for name, allowed in PIPELINED_DEFAULTS.items())


def _prompt(model: SentenceTransformer, kwargs: dict[str, object]) -> str | None:
    """The prompt ``encode`` would prepend: ``prompt``, else ``prompt_name``'s, else the model's default."""
    from neobert_embed.sentence import resolve_prompt

    if kwargs.get("prompt") is not None:
        return str(kwargs["prompt"])
    name = kwargs.get("prompt_name")
    return resolve_prompt(model, name if isinstance(name, str) else None, required="prompt_name") or None
