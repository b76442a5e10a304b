"""NeoBERT attention behind one interface: which kernel runs, and the un-padded plan it runs on.

Why: real batches mix lengths and packed pretraining rows hold many documents. The padded path
(the reference) runs every linear layer and the attention over pad tokens; the un-padded paths
drop them once per forward, run the linear layers on real tokens only, and attend within each
document. Which kernel does that best depends on the device and dtype, so the choice is made
once per forward by :func:`choose_attention_backend` (a pure function of the request, device
type, compute dtype and what is installed) from ``config.attention_backend``:

========================  =============================================================
``attention_backend``     kernel that runs
========================  =============================================================
``auto`` (default)        no padding and no packing: ``padded`` (plain SDPA, no mask);
                          otherwise CUDA fp16/bf16 on a flash-capable GPU (sm80+, head
                          size ≤ 256 and a multiple of 8): ``native_varlen`` (``flash_attn``
                          where only the flash-attn package has a varlen kernel); other
                          CUDA inputs (fp32, older GPUs): ``padded`` with its key mask
                          when they are only padded (one SDPA call: a GPU pays per call,
                          not per masked score), ``sdpa_varlen`` when they hold packed
                          documents; the CPU: ``sdpa_varlen``
``varlen``                always un-pad, kernel as ``auto`` would pick for padded input
``padded``                the reference: SDPA over the padded batch, key-padding mask
``sdpa_varlen``           un-padded SDPA in the cheaper layout (see below), any device
``native_varlen``         PyTorch's own ``torch.nn.attention.varlen.varlen_attn`` (the flash
                          varlen kernel shipped with PyTorch ≥ 2.10; nothing to install)
``flash_attn``            the ``flash-attn`` package's ``flash_attn_varlen_func``: only when
                          asked for by name, and an error naming the fix if not installed
========================  =============================================================

``varlen_attn`` has a backward (``torch.library.register_autograd`` on its custom op calls
``aten._flash_attention_backward``), so training runs through it; it needs CUDA and fp16/bf16
(the kernel raises on CPU). flash-attn and xformers are never imported at module level.

``sdpa_varlen`` runs the documents in one of two layouts, picked per forward by a cost rule
measured on CPU with ``benchmarks/attention_layouts.py`` (1 thread, 4 heads × 32 and
12 heads × 64, forward + backward):

* ``documents``: one SDPA call per group of equal-length documents (exact, no masking, no wasted
  scores: Σ n² score entries, but one call — plus a gather — per distinct length);
* ``rows``: packed rows kept whole, one SDPA call per group of equal-length rows with a
  block-diagonal boolean mask (Σ T² scores, most of them masked, but one call for all full rows).

    cost = CALL_COST · calls + GATHER_COST · gathered_tokens
           + Σ_tiles tile_length² · (MASKED_SCORE_COST if the tile holds several documents else 1)

in units of one unmasked score entry, with CALL_COST = 3·10⁴, GATHER_COST = 100 and
MASKED_SCORE_COST = 1.5; ``gathered_tokens`` counts tokens copied into non-contiguous groups
plus, when the groups are out of token order, every token once more for the restoring
permutation. On 35 packed shapes (rows of 128–1024 tokens, mean documents 4–384 tokens) the rule
picked the faster layout 33 times, and cost at most 1.22× the better one when it did not. In
practice: rows of ≤ 256 tokens → ``rows`` (one call; 2–3× faster than per-length groups with
12 × 64 heads), rows of ≥ 512 with many documents → ``documents`` (masking T² scores costs more). The cheaper layout wins; ``rows`` is only a
candidate when every row boundary is a document boundary (true for this toolkit's packing).

Example:
    >>> batch = build_varlen_batch(torch.tensor([[1, 1, 0], [1, 1, 1]]), None, (2, 3))
    >>> batch.cu_seqlens.tolist(), batch.max_seqlen
    ([0, 2, 5], 3)
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from neobert_embed.errors import UserInputError

#: What ``config.attention_backend`` accepts (see the module docstring).
ATTENTION_BACKENDS = ("auto", "varlen", "padded", "sdpa_varlen", "native_varlen", "flash_attn")
#: The kernels :func:`choose_attention_backend` resolves a request to.
KERNELS = ("padded", "sdpa_varlen", "native_varlen", "flash_attn")
LAYOUTS = ("auto", "documents", "rows")

# The layout cost rule's constants, in units of one unmasked attention score entry; measured by
# benchmarks/attention_layouts.py (forward + backward, 1 thread; see the module docstring).
#: One extra SDPA call (its slicing, call and share of the concatenation).
CALL_COST = 3.0e4
#: Gathering one token into a non-contiguous group (and scattering its gradient back).
GATHER_COST = 100.0
#: A score entry computed under a boolean mask.
MASKED_SCORE_COST = 1.5
_FLASH_DTYPES = (torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=1)
def native_varlen_available() -> bool:
    """Whether this PyTorch ships ``torch.nn.attention.varlen`` (2.10+), without importing it."""
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


@functools.lru_cache(maxsize=1)
def flash_attn_installed() -> bool:
    """Whether the ``flash-attn`` package is importable (it is never imported to find out)."""
    return importlib.util.find_spec("flash_attn") is not None


def flash_capable(device: torch.device, head_dim: int) -> bool:
    """A GPU the flash varlen kernels run on: CUDA sm80+ and a head size they support."""
    if device.type != "cuda" or head_dim % 8 or head_dim > 256:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def choose_attention_backend(
    requested: str,
    device_type: str,
    dtype: torch.dtype,
    *,
    unpad: bool,
    packed: bool = False,
    flash_capable_gpu: bool = True,
    native_available: bool = True,
    flash_attn_available: bool = False,
) -> str:
    """The kernel (one of :data:`KERNELS`) that runs a forward, from ``config.attention_backend``.

    A pure function, so the dispatch can be checked for any device without that device.

    Args:
        requested: ``config.attention_backend`` (one of :data:`ATTENTION_BACKENDS`).
        device_type: ``"cpu"``, ``"cuda"`` …: where the weights are.
        dtype: the compute dtype (the autocast dtype when autocast is on, else the weights').
        unpad: the input has padding or packed documents (``auto`` runs plain SDPA otherwise).
        packed: the input holds packed documents (``cu_seqlens``), which a key mask cannot express.
        flash_capable_gpu: the GPU runs flash kernels (sm80+, head size ≤ 256, multiple of 8).
        native_available: PyTorch ships ``torch.nn.attention.varlen``.
        flash_attn_available: the ``flash-attn`` package is installed.

    Raises:
        UserInputError: a kernel asked for by name cannot run here (the message names the fix).

    Example:
        >>> choose_attention_backend("auto", "cuda", torch.bfloat16, unpad=True)
        'native_varlen'
        >>> choose_attention_backend("auto", "cuda", torch.float32, unpad=True)
        'padded'
        >>> choose_attention_backend("auto", "cpu", torch.bfloat16, unpad=True)
        'sdpa_varlen'
    """
    if requested not in ATTENTION_BACKENDS:
        raise UserInputError(f"attention_backend {requested!r} is not one of {ATTENTION_BACKENDS}")
    gpu_half = device_type == "cuda" and dtype in _FLASH_DTYPES and flash_capable_gpu
    if requested in ("native_varlen", "flash_attn"):
        if not gpu_half:
            raise UserInputError(
                f"attention_backend {requested!r} needs a CUDA GPU (sm80+, head size ≤ 256 and a multiple "
                f"of 8) and fp16/bf16 weights or autocast; got {device_type} {str(dtype).removeprefix('torch.')}. "
                "Use attention_backend='auto'")
        if requested == "flash_attn" and not flash_attn_available:
            raise UserInputError("attention_backend 'flash_attn' needs the flash-attn package: "
                                 "pip install flash-attn, or use attention_backend='auto' (PyTorch's own kernel)")
        if requested == "native_varlen" and not native_available:
            raise UserInputError("attention_backend 'native_varlen' needs PyTorch ≥ 2.10 "
                                 "(torch.nn.attention.varlen); upgrade torch or use attention_backend='auto'")
        return requested
    if requested in ("padded", "sdpa_varlen"):
        return requested
    if requested == "auto" and not unpad:
        return "padded"
    if gpu_half and (native_available or flash_attn_available):
        return "native_varlen" if native_available else "flash_attn"
    # one call per distinct length is cheap on a CPU and hundreds of launches per layer on a GPU
    if requested == "auto" and device_type == "cuda" and not packed:
        return "padded"
    return "sdpa_varlen"


def compute_dtype(device: torch.device, weight_dtype: torch.dtype) -> torch.dtype:
    """The dtype matrix products run in on ``device``: autocast's when it is on, else the weights'."""
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else weight_dtype


def attention_kernel_for(requested: str, device: torch.device, dtype: torch.dtype, head_dim: int, *,
                         unpad: bool, packed: bool = False) -> str:
    """:func:`choose_attention_backend` with what this machine has filled in (the GPU's capability,
    PyTorch's varlen kernel, the flash-attn package): the one dispatch NeoBERT's forward and the
    un-padded BERT-family forward (:mod:`neobert_embed.inference.unpadded`) share.

    Example:
        >>> attention_kernel_for("auto", torch.device("cpu"), torch.float32, 64, unpad=True)
        'sdpa_varlen'
    """
    return choose_attention_backend(
        requested, device.type, dtype, unpad=unpad, packed=packed,
        flash_capable_gpu=flash_capable(device, head_dim), native_available=native_varlen_available(),
        flash_attn_available=flash_attn_installed())


@dataclass(frozen=True)
class AttentionGroup:
    """Equal-length tiles (documents, or whole packed rows) attended in one SDPA call.

    ``start`` is set when the ``count`` tiles are consecutive on the token axis (a zero-copy
    view); ``index`` (count × length) gathers them otherwise. ``mask`` (count, 1, length, length)
    is the block-diagonal document mask of packed rows (None: every tile is one document).
    """

    length: int
    count: int = 1
    start: int | None = None
    index: torch.Tensor | None = None
    mask: torch.Tensor | None = None


@dataclass(frozen=True)
class VarlenBatch:
    """Where the real tokens of a (batch, length) input are and which document each belongs to.

    Attributes:
        token_index: flat indices (into batch × length) of the kept tokens; None when all are kept.
        position_ids: RoPE position of every kept token (int64, (tokens,)).
        cu_seqlens: int32 (documents + 1,) cumulative document lengths over the kept tokens, on the
            model's device (what the flash varlen kernels take).
        max_seqlen: longest document (for the GPU kernels of rows: the row length, an upper bound).
        groups: the SDPA calls of ``sdpa_varlen`` (empty for the flash kernels).
        restore: permutation putting the concatenated group outputs back in token order (None
            when they already are).
        backend: the kernel that runs (one of :data:`KERNELS` other than ``padded``).
        layout: ``documents`` | ``rows``: how ``sdpa_varlen`` tiles the tokens.
    """

    token_index: torch.Tensor | None
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    groups: tuple[AttentionGroup, ...]
    restore: torch.Tensor | None
    backend: str = "sdpa_varlen"
    layout: str = "documents"

    @property
    def num_tokens(self) -> int:
        return int(self.cu_seqlens[-1])

    @property
    def kernel_calls(self) -> int:
        """Attention kernel calls per layer (one for the flash kernels)."""
        return len(self.groups) if self.backend == "sdpa_varlen" else 1


def _check_cu_seqlens_shape(cu_seqlens: torch.Tensor) -> None:
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D with at least 2 entries, got shape {tuple(cu_seqlens.shape)}")


def _checked_longest(cu_seqlens: torch.Tensor, lengths: torch.Tensor, total: int) -> int:
    """The longest document, with ``cu_seqlens``' checks, in ONE read-back from the device (each read
    waits for the GPU's queue: the checks alone were three)."""
    first, last, decreasing, longest = torch.stack([
        cu_seqlens[0], cu_seqlens[-1], (cu_seqlens[1:] < cu_seqlens[:-1]).any().long(), lengths.max()]).tolist()
    if first != 0 or last != total:
        raise ValueError(f"cu_seqlens must start at 0 and end at batch*length = {total} (it covers the flattened "
                         f"input), got {first} … {last}")
    if decreasing:
        raise ValueError("cu_seqlens must be non-decreasing")
    return longest


@dataclass(frozen=True)
class _Tiling:
    """A candidate layout on the host: tiles (contiguous token spans) and their documents."""

    lengths: list[int]
    starts: list[int]
    documents: list[list[int]]  # per tile: its documents' lengths (one entry: no mask needed)

    def groups(self) -> tuple[list[tuple[int, list[int], bool]], bool]:
        """Per tile length (first appearance first): (length, tiles, tiles are consecutive on the
        token axis); and whether the groups, concatenated, are already in token order."""
        by_length: dict[int, list[int]] = {}
        for tile, length in enumerate(self.lengths):
            if length:
                by_length.setdefault(length, []).append(tile)
        groups, cursor, in_order = [], 0, True
        for length, tiles in by_length.items():
            starts = [self.starts[t] for t in tiles]
            consecutive = all(b - a == length for a, b in zip(starts, starts[1:], strict=False))
            in_order = in_order and consecutive and starts[0] == cursor
            cursor += length * len(tiles)
            groups.append((length, tiles, consecutive))
        return groups, in_order

    def cost(self) -> float:
        """The measured cost rule (module docstring), in unmasked score entries."""
        groups, in_order = self.groups()
        gathered = sum(length * len(tiles) for length, tiles, consecutive in groups if not consecutive)
        if not in_order:
            gathered += sum(self.lengths)  # the restoring permutation touches every token
        scores = sum(n * n * (MASKED_SCORE_COST if len(docs) > 1 else 1.0)
                     for n, docs in zip(self.lengths, self.documents, strict=True))
        return CALL_COST * len(groups) + GATHER_COST * gathered + scores


def _tiling_for(lengths: list[int], doc_rows: list[int], rows: int) -> _Tiling:
    per_row: list[list[int]] = [[] for _ in range(rows)]
    for length, row in zip(lengths, doc_rows, strict=True):
        if length:
            per_row[row].append(length)
    row_lengths = [sum(docs) for docs in per_row]
    return _Tiling(row_lengths, list(itertools.accumulate(row_lengths, initial=0))[:-1], per_row)


def _block_diagonal(tiles: list[list[int]], device: torch.device | None) -> torch.Tensor | None:
    """(tiles, 1, length, length) True within a document; None when every tile is one document."""
    if all(len(docs) <= 1 for docs in tiles):
        return None
    ids = torch.stack([torch.repeat_interleave(torch.arange(len(docs)), torch.tensor(docs)) for docs in tiles]).to(device)
    return (ids[:, :, None] == ids[:, None, :]).unsqueeze(1)


def _plan_groups(tiling: _Tiling, device: torch.device | None) -> tuple[tuple[AttentionGroup, ...], torch.Tensor | None]:
    """One SDPA group per tile length; also the permutation restoring token order after
    concatenating the group outputs (None when the groups already cover the tokens in order)."""
    placement, in_order = tiling.groups()
    groups, order = [], []
    for length, tiles, consecutive in placement:
        starts = [tiling.starts[t] for t in tiles]
        mask = _block_diagonal([tiling.documents[t] for t in tiles], device)
        index = torch.tensor(starts).unsqueeze(1) + torch.arange(length)
        if consecutive:
            groups.append(AttentionGroup(length, len(tiles), start=starts[0], mask=mask))
        else:
            groups.append(AttentionGroup(length, len(tiles), index=index.to(device), mask=mask))
        order.append(index.reshape(-1))
    if in_order:
        return tuple(groups), None
    flat_order = torch.cat(order)
    restore = torch.empty_like(flat_order)
    restore[flat_order] = torch.arange(flat_order.numel())
    return tuple(groups), restore.to(device)


def _aligned_to_rows(cu_seqlens: list[int], batch: int, length: int) -> bool:
    boundaries = set(cu_seqlens)
    return all(r * length in boundaries for r in range(1, batch))


def build_varlen_batch(
    attention_mask: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    shape: tuple[int, int],
    position_ids: torch.Tensor | None = None,
    device: torch.device | None = None,
    *,
    backend: str = "sdpa_varlen",
    layout: str = "auto",
) -> VarlenBatch:
    """Plan the un-padded forward of a (batch, length) input for kernel ``backend``.

    Documents are the rows of the batch, or — for packed pretraining rows — the spans given by
    ``cu_seqlens`` over the flattened batch × length tokens. Tokens whose ``attention_mask`` is 0
    are dropped. Positions default to the offset within the row (the original NeoBERT's
    convention for right-padded batches) or within the packed document. For ``sdpa_varlen``,
    ``layout`` ``auto`` picks ``documents`` or ``rows`` by the cost rule; ``documents`` /
    ``rows`` force one (``rows`` needs every row boundary to be a document boundary).

    Example:
        >>> plan = build_varlen_batch(None, torch.tensor([0, 2, 5], dtype=torch.int32), (1, 5))
        >>> plan.position_ids.tolist(), plan.kernel_calls
        ([0, 1, 0, 1, 2], 2)
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")
    batch, length = shape
    total = batch * length
    device = device or (attention_mask.device if attention_mask is not None else None)
    flat = torch.arange(total, device=device)
    if cu_seqlens is None:
        segment_starts = torch.arange(batch, device=device) * length
        doc_of_token = flat // length
    else:
        cu_seqlens = cu_seqlens.to(device=device, dtype=torch.int64)
        _check_cu_seqlens_shape(cu_seqlens)
        segment_starts = cu_seqlens[:-1]  # checked with the longest document below (one read-back); the
        # clamp keeps a bad cu_seqlens from indexing past its documents before that check raises
        doc_of_token = torch.searchsorted(cu_seqlens[1:], flat, right=True).clamp_(max=segment_starts.numel() - 1)
    positions = (flat - segment_starts[doc_of_token] if position_ids is None
                 else position_ids.to(device).reshape(-1).long())
    token_index = None
    if attention_mask is not None:  # one read-back (nonzero's count) also tells whether anything is masked
        token_index = attention_mask.reshape(-1).nonzero().squeeze(1).to(device)
        if token_index.numel() == total:
            token_index = None
        else:
            positions, doc_of_token = positions[token_index], doc_of_token[token_index]
    lengths = torch.bincount(doc_of_token, minlength=segment_starts.numel())
    new_cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=device)
    new_cu[1:] = torch.cumsum(lengths, 0)
    # A GPU kernel takes an upper bound on the longest document: the row length for rows (exact for a
    # batch padded to its longest text) needs no read-back; packed documents read it with their checks.
    max_seqlen = length if cu_seqlens is None else _checked_longest(cu_seqlens, lengths, total)
    if backend != "sdpa_varlen":
        return VarlenBatch(token_index, positions, new_cu, max_seqlen, (), None, backend, "documents")
    host_lengths = lengths.tolist()
    max_seqlen = max(host_lengths, default=0)
    tiling = _Tiling(host_lengths, new_cu[:-1].tolist(), [[n] for n in host_lengths])  # one tile per document
    chosen = "documents"
    if (cu_seqlens is not None and layout == "auto") or layout == "rows":
        original = [0, total] if cu_seqlens is None else cu_seqlens.tolist()
        if not _aligned_to_rows(original, batch, length):
            if layout == "rows":
                raise ValueError("layout 'rows' needs every row boundary to be a document boundary")
        else:
            doc_rows = [start // length for start in original[:-1]]
            rows = _tiling_for(host_lengths, doc_rows, batch)
            if layout == "rows" or rows.cost() < tiling.cost():
                tiling, chosen = rows, "rows"
    groups, restore = _plan_groups(tiling, device)
    return VarlenBatch(token_index, positions, new_cu, max_seqlen, groups, restore, backend, chosen)


@functools.lru_cache(maxsize=1)
def load_native_varlen() -> Callable[..., torch.Tensor]:
    """PyTorch's ``varlen_attn`` (imported on first use; tests substitute a reference kernel)."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn


@functools.lru_cache(maxsize=1)
def load_flash_attn() -> Callable[..., torch.Tensor]:
    """flash-attn's ``flash_attn_varlen_func`` (only when ``attention_backend='flash_attn'``)."""
    from flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func


def _band(length: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """(length, length) True where two tokens are at most ``window`` apart (None: no window, or the
    window covers every pair of a ``length``-token document)."""
    if window is None or window >= length - 1:
        return None
    position = torch.arange(length, device=device)
    return (position[:, None] - position[None, :]).abs() <= window


def _sdpa_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch, scale: float,
                 window: int | None = None, dropout: float = 0.0) -> torch.Tensor:
    outputs = []
    for group in batch.groups:
        if group.index is None:
            span = slice(group.start, group.start + group.count * group.length)
            shape = (group.count, group.length, *q.shape[1:])
            q_g, k_g, v_g = q[span].view(shape), k[span].view(shape), v[span].view(shape)
        else:
            q_g, k_g, v_g = q[group.index], k[group.index], v[group.index]
        mask, band = group.mask, _band(group.length, window, q.device)
        if band is not None:
            mask = band if mask is None else mask & band
        attended = F.scaled_dot_product_attention(q_g.transpose(1, 2), k_g.transpose(1, 2), v_g.transpose(1, 2),
                                                  attn_mask=mask, dropout_p=dropout, scale=scale)
        outputs.append(attended.transpose(1, 2).reshape(-1, attended.shape[1], attended.shape[-1]))
    if not outputs:  # every token masked: nothing to attend
        return torch.empty_like(q)
    # One concatenation (not a copy per document): on a busy CPU every extra parallel region costs.
    out = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    return out if batch.restore is None else out[batch.restore]


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch,
                     scale: float | None = None, *, window: int | None = None, dropout: float = 0.0) -> torch.Tensor:
    """Bidirectional attention within each document of un-padded (tokens, heads, head_dim) q/k/v,
    with the kernel the plan was built for (``batch.backend``); ``scale`` defaults to 1/√head_dim.

    ``window``: a token attends only to tokens at most this far away (ModernBERT's local layers;
    flash's ``window_size=(window, window)``). ``dropout``: attention-probability dropout (training);
    PyTorch's ``varlen_attn`` has none, so a plan for ``native_varlen`` refuses it (the caller picks
    another kernel: :mod:`neobert_embed.modeling.flat_attention`).

    Example:
        >>> plan = build_varlen_batch(torch.tensor([[1, 0], [1, 1]]), None, (2, 2))
        >>> q = torch.randn(3, 2, 4)
        >>> varlen_attention(q, q, q, plan).shape
        torch.Size([3, 2, 4])
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if batch.backend in ("native_varlen", "flash_attn"):
        # q/k are strided views of the rotated [q | k] pairs; the flash kernels need only a unit
        # last stride, but a contiguous copy (tokens × hidden, small next to the GEMMs) keeps every
        # backend (flash, cuDNN) on its documented layout.
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    window_size = {} if window is None else {"window_size": (window, window)}
    if batch.backend == "native_varlen":
        if dropout:
            raise ValueError("PyTorch's varlen_attn has no attention dropout; plan this forward for another kernel")
        return load_native_varlen()(q, k, v, batch.cu_seqlens, batch.cu_seqlens, batch.max_seqlen,
                                    batch.max_seqlen, scale=scale, **window_size)
    if batch.backend == "flash_attn":
        return load_flash_attn()(q, k, v, batch.cu_seqlens, batch.cu_seqlens, batch.max_seqlen,
                                 batch.max_seqlen, dropout_p=dropout, softmax_scale=scale, causal=False,
                                 **window_size)
    return _sdpa_varlen(q, k, v, batch, scale, window, dropout)


def padded_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """The reference: SDPA over (batch, length, heads, head_dim) with a key-padding mask.

    Pad positions still get (meaningless) outputs, as in the original implementation.

    Example:
        >>> q = torch.randn(2, 3, 2, 4)
        >>> padded_attention(q, q, q, torch.tensor([[1, 1, 0], [1, 1, 1]])).shape
        torch.Size([2, 3, 2, 4])
    """
    mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask)
    return out.transpose(1, 2)
