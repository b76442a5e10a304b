"""Encoding many texts on a multi-core CPU: whole batches side by side, one thread each.

Why: a small encoder's batch is too little work to keep several threads busy inside each operator.
Between the matrix products, PyTorch runs most element-wise operators (GELU, LayerNorm, residual
additions, the copies around attention) on one thread below its 32,768-element grain, and every
parallel region makes its threads wait for each other. Encoding independent batches at the same
time, each on one thread, keeps every core inside its own batch. all-MiniLM-L6-v2, 1,024 mixed
STS-B / AG News texts, 2 cores (AMD EPYC, AVX2, fp32): 133.9 → 150.8 texts/s, median of 9
interleaved passes (1.13×; ``benchmarks/cpu_inference.py`` has the figures per backend). Each
vector is its batch's own, computed as one thread computes it: the same vectors up to fp32
rounding of the thread count.

:func:`spread_batches` is applied by :func:`~neobert_embed.inference.runtime.load_inference_model`
to every torch model on a CPU, so every command that encodes many texts (``encode``, ``index``,
``mine-negatives``, ``mteb``, ``compare``) runs it. It changes nothing where it could change a
result or cannot help: one thread, one batch, a GPU, or an ``encode`` call asking for more than
float32 sentence embeddings (``precision="int8"`` calibrates on the whole call; token embeddings;
a multi-process pool) runs sentence-transformers' ``encode`` unchanged. A model loaded with one
torch thread is not changed at all (:func:`~neobert_embed.inference.runtime.spreads_on`); otherwise
the thread count is read again at each call (``torch.set_num_threads``) and restored after it.

Example:
    >>> spread_batches(model)                   # in place, once
    >>> model.encode(texts, batch_size=32)      # 1,024 texts: 32 batches, 2 at a time on 2 cores
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

DEFAULT_BATCH_SIZE = 32  # sentence-transformers' own default for ``encode``
#: ``encode`` arguments and the values under which every row depends on its own text only; with any
#: other value the call runs unchanged. The arguments not listed (``prompt``, ``prompt_name``,
#: ``normalize_embeddings``, ``truncate_dim``, ``convert_to_*``, ``task``) act on each row alone.
SPREADABLE_DEFAULTS: dict[str, tuple[object, ...]] = {
    "output_value": ("sentence_embedding",),
    "precision": ("float32",),
    "pool": (None,),
    "device": (None, "cpu"),
    "chunk_size": (None,),
}
#: One fast tokenizer must not be entered by two threads at once (it fails with "Already
#: borrowed" while another thread sets its truncation); tokenizing is ~2% of an encode.
_PREPROCESS_LOCK = threading.Lock()


def spread_batches(model: SentenceTransformer) -> None:
    """Make ``model.encode`` (and so ``encode_query``/``encode_document``) run its batches side by
    side on the CPU's threads, one thread per batch (in place; see the module docstring).

    Both methods are bound to ``model``, so ``copy.deepcopy(model)`` gets a copy that spreads its own
    batches. :func:`gather_batches` undoes it.
    """
    model.encode = types.MethodType(_spread_encode, model)  # type: ignore[method-assign]
    model.preprocess = types.MethodType(_locked_preprocess, model)  # type: ignore[method-assign]


def gather_batches(model: SentenceTransformer) -> None:
    """Undo :func:`spread_batches`: ``model`` encodes one batch after another again."""
    for name, function in (("encode", _spread_encode), ("preprocess", _locked_preprocess)):
        if _bound_to(model, name, function):
            delattr(model, name)


def spreads_batches(model: SentenceTransformer) -> bool:
    """True when :func:`spread_batches` was applied to ``model``."""
    return _bound_to(model, "encode", _spread_encode)


def _bound_to(model: SentenceTransformer, name: str, function: object) -> bool:
    """True when ``model``'s own attribute ``name`` is ``function`` bound to it."""
    bound = vars(model).get(name)
    return isinstance(bound, types.MethodType) and bound.__func__ is function


def _locked_preprocess(self: SentenceTransformer, *args: object, **kwargs: object) -> dict[str, object]:
    with _PREPROCESS_LOCK:
        return type(self).preprocess(self, *args, **kwargs)  # type: ignore[arg-type]


def _spread_encode(self: SentenceTransformer, inputs: object, *args: object, **kwargs: object) -> object:
    """``SentenceTransformer.encode`` with the batches of a long list of texts run side by side.

    Call it from one thread at a time, as every command does (a server runs model work on its one
    model thread): the thread count it sets and restores is the process's.
    """
    import torch

    plain = type(self).encode
    threads = torch.get_num_threads()
    batch_size = kwargs.get("batch_size", DEFAULT_BATCH_SIZE)
    if (args or threads < 2 or self.device.type != "cpu" or not isinstance(batch_size, int) or batch_size < 1
            or not _spreadable(inputs, kwargs) or len(inputs) <= batch_size):  # type: ignore[arg-type]
        return plain(self, inputs, *args, **kwargs)  # type: ignore[arg-type]
    texts: list[str] = inputs  # type: ignore[assignment]
    order = sorted(range(len(texts)), key=lambda row: -len(texts[row]))  # longest first, like encode
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    workers = min(threads, len(batches))
    each = {**kwargs, "show_progress_bar": False}

    def encode_batch(rows: list[int]) -> object:
        torch.set_num_threads(max(1, threads // workers))  # per thread: this worker's own operators
        return plain(self, [texts[row] for row in rows], **each)  # type: ignore[arg-type]

    try:
        results = list(_pool(workers).map(encode_batch, batches))
    finally:
        torch.set_num_threads(threads)
    return _in_input_order(results, [row for rows in batches for row in rows])


def _spreadable(inputs: object, kwargs: dict[str, object]) -> bool:
    """True for a list of texts and arguments under which each row depends only on its own text."""
    if not isinstance(inputs, list) or not all(isinstance(text, str) for text in inputs):
        return False
    return all(kwargs.get(name, allowed[0]) in allowed for name, allowed in SPREADABLE_DEFAULTS.items())


def _in_input_order(results: Sequence[object], rows: Sequence[int]) -> object:
    """The batches' outputs (arrays, tensors or lists of row tensors) as one, row ``i`` = input ``i``."""
    import torch

    inverse = np.argsort(np.asarray(rows))
    if all(isinstance(result, np.ndarray) for result in results):
        return np.concatenate(results)[inverse]  # type: ignore[arg-type]
    if all(isinstance(result, torch.Tensor) for result in results):
        return torch.cat(results)[torch.as_tensor(inverse, device=results[0].device)]  # type: ignore[arg-type, union-attr]
    flat = [row for result in results for row in result]  # type: ignore[attr-defined]
    return [flat[position] for position in inverse]


@functools.cache
def _pool(workers: int) -> ThreadPoolExecutor:
    """One pool per worker count, kept for the process (its threads idle between calls)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="neobert-embed-batch")
