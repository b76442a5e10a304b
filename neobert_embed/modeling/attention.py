"""NeoBERT attention behind one interface: un-padded (varlen) and padded SDPA.

Why: real batches mix lengths. The padded path (the reference) runs every linear layer and the
attention over pad tokens; the un-padded path drops them once per forward, runs the linear layers
on real tokens only, and attends within each document:

* CUDA with ``flash-attn`` installed (fp16/bf16): ``flash_attn_varlen_func`` over ``cu_seqlens``;
* otherwise (CPU, or no flash-attn): one SDPA call per group of equal-length documents (exact —
  no padding inside a call — and fastest on CPU; a group of one is a zero-copy slice).

flash-attn is imported lazily, inside :func:`_flash_varlen`, never at module import.

Example:
    >>> batch = build_varlen_batch(torch.tensor([[1, 1, 0], [1, 1, 1]]), None, (2, 3))
    >>> batch.cu_seqlens.tolist(), batch.max_seqlen
    ([0, 2, 5], 3)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class AttentionGroup:
    """Documents of one length attended in one SDPA call.

    ``start`` is set for a single document (a contiguous slice of the token axis); ``index``
    (documents × length) gathers several equal-length documents otherwise.
    """

    length: int
    start: int | None = None
    index: torch.Tensor | None = None


@dataclass(frozen=True)
class VarlenBatch:
    """Where the real tokens of a (batch, length) input are and which document each belongs to.

    Attributes:
        token_index: flat indices (into batch × length) of the kept tokens; None when all are kept.
        position_ids: RoPE position of every kept token (int64, (tokens,)).
        cu_seqlens: int32 (documents + 1,) cumulative document lengths over the kept tokens.
        max_seqlen: longest document.
        groups: equal-length document groups for the SDPA fallback.
        restore: permutation putting the concatenated group outputs back in token order (None
            when they already are).
    """

    token_index: torch.Tensor | None
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    groups: tuple[AttentionGroup, ...]
    restore: torch.Tensor | None

    @property
    def num_tokens(self) -> int:
        return int(self.cu_seqlens[-1])


def _check_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> None:
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D with at least 2 entries, got shape {tuple(cu_seqlens.shape)}")
    if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != total:
        raise ValueError(
            f"cu_seqlens must start at 0 and end at batch*length = {total} (it covers the flattened "
            f"input), got {int(cu_seqlens[0])} … {int(cu_seqlens[-1])}"
        )
    if bool((cu_seqlens[1:] < cu_seqlens[:-1]).any()):
        raise ValueError("cu_seqlens must be non-decreasing")


def _groups(lengths: list[int], starts: list[int]) -> tuple[tuple[AttentionGroup, ...], torch.Tensor | None]:
    """Group non-empty documents by length (a lone document is a slice, several are gathered);
    also return the permutation restoring token order after concatenating the group outputs
    (None when the groups are already in token order)."""
    by_length: dict[int, list[int]] = {}
    for doc, length in enumerate(lengths):
        if length:
            by_length.setdefault(length, []).append(doc)
    if all(len(docs) == 1 for docs in by_length.values()):
        ordered = sorted(docs[0] for docs in by_length.values())
        return tuple(AttentionGroup(lengths[d], start=starts[d]) for d in ordered), None
    groups, order = [], []
    for length, docs in by_length.items():
        index = torch.tensor([starts[d] for d in docs]).unsqueeze(1) + torch.arange(length)
        groups.append(AttentionGroup(length, start=starts[docs[0]]) if len(docs) == 1
                      else AttentionGroup(length, index=index))
        order.append(index.reshape(-1))
    flat_order = torch.cat(order)
    restore = torch.empty_like(flat_order)
    restore[flat_order] = torch.arange(flat_order.numel())
    return tuple(groups), restore


def build_varlen_batch(
    attention_mask: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    shape: tuple[int, int],
    position_ids: torch.Tensor | None = None,
    device: torch.device | None = None,
) -> VarlenBatch:
    """Plan the un-padded forward of a (batch, length) input.

    Documents are the rows of the batch, or — for packed pretraining rows — the spans given by
    ``cu_seqlens`` over the flattened batch × length tokens. Tokens whose ``attention_mask`` is 0
    are dropped. Positions default to the offset within the row (the original NeoBERT's
    convention for right-padded batches) or within the packed document.

    Example:
        >>> plan = build_varlen_batch(None, torch.tensor([0, 2, 5], dtype=torch.int32), (1, 5))
        >>> plan.position_ids.tolist()
        [0, 1, 0, 1, 2]
    """
    batch, length = shape
    total = batch * length
    device = device or (attention_mask.device if attention_mask is not None else None)
    flat = torch.arange(total, device=device)
    if cu_seqlens is None:
        segment_starts = torch.arange(batch, device=device) * length
        doc_of_token = flat // length
    else:
        cu_seqlens = cu_seqlens.to(device=device, dtype=torch.int64)
        _check_cu_seqlens(cu_seqlens, total)
        segment_starts = cu_seqlens[:-1]
        doc_of_token = torch.searchsorted(cu_seqlens[1:], flat, right=True)
    if position_ids is None:
        positions = flat - segment_starts[doc_of_token]
    else:
        positions = position_ids.to(device).reshape(-1).long()
    token_index = None
    if attention_mask is not None and not bool(attention_mask.all()):
        token_index = attention_mask.reshape(-1).nonzero().squeeze(1).to(device)
        positions, doc_of_token = positions[token_index], doc_of_token[token_index]
    lengths = torch.bincount(doc_of_token, minlength=segment_starts.numel())
    new_cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=device)
    new_cu[1:] = torch.cumsum(lengths, 0)
    host_lengths = lengths.tolist()
    groups, restore = _groups(host_lengths, new_cu[:-1].tolist())
    groups = tuple(AttentionGroup(g.length, g.start, None if g.index is None else g.index.to(device))
                   for g in groups)
    restore = None if restore is None else restore.to(device)
    return VarlenBatch(token_index, positions, new_cu, max(host_lengths, default=0), groups, restore)


@functools.lru_cache(maxsize=1)
def _flash_varlen() -> Callable | None:
    """flash-attn's varlen kernel, or None when the package is not installed."""
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: VarlenBatch) -> torch.Tensor:
    """Bidirectional attention within each document of un-padded (tokens, heads, head_dim) q/k/v.

    Example:
        >>> plan = build_varlen_batch(torch.tensor([[1, 0], [1, 1]]), None, (2, 2))
        >>> q = torch.randn(3, 2, 4)
        >>> varlen_attention(q, q, q, plan).shape
        torch.Size([3, 2, 4])
    """
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and _flash_varlen() is not None:
        return _flash_varlen()(q, k, v, batch.cu_seqlens, batch.cu_seqlens, batch.max_seqlen,
                               batch.max_seqlen, dropout_p=0.0, causal=False)
    outputs = []
    for group in batch.groups:
        if group.index is None:
            span = slice(group.start, group.start + group.length)
            q_g, k_g, v_g = q[span].unsqueeze(0), k[span].unsqueeze(0), v[span].unsqueeze(0)
        else:
            q_g, k_g, v_g = q[group.index], k[group.index], v[group.index]
        attended = F.scaled_dot_product_attention(q_g.transpose(1, 2), k_g.transpose(1, 2), v_g.transpose(1, 2))
        outputs.append(attended.transpose(1, 2).reshape(-1, attended.shape[1], attended.shape[-1]))
    # One concatenation (not a copy per document): on a busy CPU every extra parallel region costs.
    out = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    return out if batch.restore is None else out[batch.restore]


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
