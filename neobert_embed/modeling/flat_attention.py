"""Un-padded attention for any transformers encoder, through transformers' own attention interface.

Why: sentence-transformers already knows how to train un-padded: its ``Transformer`` module can
tokenize a batch into one flat token stream (``DataCollatorWithFlattening``: ``input_ids`` of shape
(1, tokens), ``position_ids`` restarting at each text, ``cu_seq_lens_q`` the texts' offsets), its
pooling reads each text's own tokens from ``cu_seq_lens_q``, and GradCache cuts mini-batches from
it. It only does so with a flash-attn kernel, which does not install on a CPU, nor anywhere without
a compiler matching the GPU. Every encoder the contrastive recipe takes (BERT, RoBERTa, NomicBERT,
ModernBERT, and NeoBERT) calls its attention through ``ALL_ATTENTION_FUNCTIONS``, so registering one
more function there, :func:`flat_attention_forward` under the name :data:`FLAT_ATTENTION`, gives all
of them the flat stream on every device, with the dispatch NeoBERT's own forward uses
(:func:`~neobert_embed.modeling.attention.attention_kernel_for`):

=========================================  ===============================================
where                                      kernel
=========================================  ===============================================
CPU (any dtype)                            ``sdpa_varlen``: one SDPA call per group of
                                           equal-length texts, no mask
CUDA sm80+, fp16/bf16                      PyTorch's ``varlen_attn`` (flash varlen, shipped
                                           with torch ≥ 2.10), one call per layer
  … with attention dropout in training     flash-attn's ``flash_attn_varlen_func`` where
                                           installed (it has dropout), else one SDPA call
                                           over the texts padded for attention only
CUDA fp32, older GPUs                      ``sdpa_varlen``
=========================================  ===============================================

The Linear layers, norms and feed-forward blocks run on the real tokens only, forward and backward
(autograd flows through the flat stream as through any tensor); dropout follows ``module.training``.
Given a padded batch instead (inference, GLUE), the function takes the 2-D padding mask transformers
hands flash kernels and attends over the real tokens the same way (the Linear layers then see pads).

Example:
    >>> register_flat_attention()
    >>> bert.set_attn_implementation(FLAT_ATTENTION)
    >>> out = bert(input_ids=flat_ids, position_ids=positions, cu_seq_lens_q=offsets, max_length_q=longest)
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from neobert_embed.modeling.attention import (
    VarlenBatch,
    attention_kernel_for,
    build_varlen_batch,
    compute_dtype,
    flash_attn_installed,
    varlen_attention,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: The name :func:`flat_attention_forward` is registered under in transformers' attention interface.
FLAT_ATTENTION = "neobert_embed_varlen"


@functools.lru_cache(maxsize=1)
def register_flat_attention() -> str:
    """Register :func:`flat_attention_forward` (and flash's 2-D mask convention) with transformers under
    :data:`FLAT_ATTENTION`; idempotent. Returns the name, for ``set_attn_implementation``.

    It adds a name and changes none: models asking for ``sdpa``, ``eager`` or ``flash_attention_2``
    run as before.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(FLAT_ATTENTION, flat_attention_forward)
    AttentionMaskInterface.register(FLAT_ATTENTION, flash_attention_mask)
    return FLAT_ATTENTION


def flat_kernel(device: torch.device, dtype: torch.dtype, head_dim: int, dropout: float) -> str:
    """The kernel a flat stream attends with on ``device`` in ``dtype`` (see the module's table).

    Example:
        >>> flat_kernel(torch.device("cpu"), torch.bfloat16, 64, 0.1)
        'sdpa_varlen'
    """
    kernel = attention_kernel_for("auto", device, dtype, head_dim, unpad=True, packed=True)
    if kernel == "native_varlen" and dropout:
        return "flash_attn" if flash_attn_installed() else "padded"
    return kernel


class _PlanCache:
    """The plan of the last stream seen, reused by every layer of one forward (they all receive the
    same ``cu_seq_lens_q`` or mask tensor, its ``source``). Holding the source keeps its identity
    from being reused while it is cached."""

    key: tuple | None = None
    plan: VarlenBatch | None = None

    def get(self, source: torch.Tensor, offsets: Callable[[], torch.Tensor], tokens: int, kernel: str,
            device: torch.device) -> VarlenBatch:
        if self.key is None or self.key[0] is not source or self.key[1:] != (tokens, kernel):
            plan = build_varlen_batch(None, offsets(), (1, tokens), device=device,
                                      backend="sdpa_varlen" if kernel == "padded" else kernel, layout="documents")
            self.key, self.plan = (source, tokens, kernel), plan
        return self.plan


_PLANS = _PlanCache()


def flat_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           sliding_window: int | None = None, cu_seq_lens_q: torch.Tensor | None = None,
                           **kwargs: object) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: (batch, heads, length, head_dim) q/k/v in, the
    (batch, length, heads, head_dim) output and no weights out.

    ``cu_seq_lens_q`` (a flat stream, batch 1): each text attends to its own tokens. Without it,
    ``attention_mask`` is flash's 2-D padding mask or None (no padding), and each row is one text.
    ``sliding_window`` is flash's convention (ModernBERT's local layers pass half the window + 1).
    """
    batch, heads, length, head_dim = query.shape
    if key.shape[1] != heads:
        raise ValueError(f"{FLAT_ATTENTION} attention needs as many key heads as query heads "
                         f"({key.shape[1]} vs {heads})")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(f"{FLAT_ATTENTION} attention takes a 2-D padding mask, got shape "
                         f"{tuple(attention_mask.shape)}")
    window = None if sliding_window is None else int(sliding_window) - 1
    q, k, v = (x.transpose(1, 2).reshape(batch * length, heads, head_dim) for x in (query, key, value))
    # under autocast the products run in its dtype; a rotary embedding computed in fp32 may have promoted q/k
    dtype = compute_dtype(query.device, query.dtype)
    kernel = flat_kernel(query.device, dtype, head_dim, dropout)
    if kernel in ("native_varlen", "flash_attn"):  # not autocast ops: one dtype, the kernel's
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    token_index = None
    if cu_seq_lens_q is not None:
        source = cu_seq_lens_q
        offsets = lambda: cu_seq_lens_q.to(query.device)  # noqa: E731
    else:
        mask = attention_mask if attention_mask is not None else torch.ones(batch, length, device=query.device)
        source = mask
        offsets = lambda: F.pad(mask.sum(1).cumsum(0), (1, 0)).to(torch.int32)  # noqa: E731
        if attention_mask is not None and not bool(attention_mask.all()):
            token_index = attention_mask.reshape(-1).nonzero().squeeze(1)
            q, k, v = q[token_index], k[token_index], v[token_index]
    plan = _PLANS.get(source, offsets, q.shape[0], kernel, query.device)
    if kernel == "padded":
        out = _padded_for_attention(q, k, v, plan.cu_seqlens, scaling, window, dropout)
    else:
        out = varlen_attention(q, k, v, plan, scale=scaling, window=window, dropout=dropout)
    if token_index is not None:
        out = out.new_zeros(batch * length, heads, head_dim).index_copy(0, token_index, out)
    return out.view(batch, length, heads, head_dim), None


def _padded_for_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                          scale: float | None, window: int | None, dropout: float) -> torch.Tensor:
    """One SDPA call over the texts of a flat stream padded to the longest for attention only
    (a GPU kernel with dropout where ``varlen_attn`` has none); the output is flat again."""
    lengths = offsets[1:] - offsets[:-1]
    longest = int(lengths.max())
    texts = lengths.numel()
    tokens = torch.arange(q.shape[0], device=q.device)
    text_of = torch.searchsorted(offsets[1:].long(), tokens, right=True)
    slot = text_of * longest + tokens - offsets[:-1].long()[text_of]

    def padded(x: torch.Tensor) -> torch.Tensor:
        grid = x.new_zeros(texts * longest, *x.shape[1:]).index_copy(0, slot, x)
        return grid.view(texts, longest, *x.shape[1:]).transpose(1, 2)

    real = torch.arange(longest, device=q.device)[None, :] < lengths[:, None]
    mask = real[:, None, None, :]
    if window is not None:
        position = torch.arange(longest, device=q.device)
        mask = mask & ((position[:, None] - position[None, :]).abs() <= window)
    out = F.scaled_dot_product_attention(padded(q), padded(k), padded(v), attn_mask=mask, dropout_p=dropout,
                                         scale=scale)
    return out.transpose(1, 2).reshape(texts * longest, *q.shape[1:]).index_select(0, slot)


class _StreamHooks:
    """The pair of hooks :func:`unpadded_encoder` puts on an encoder: the pre-hook turns a padded batch
    into one flat stream of its real tokens, the hook puts the output back in the padded layout."""

    def __init__(self, position_offset: int) -> None:
        self.position_offset = position_offset
        self.pending: list[tuple[int, int, torch.Tensor] | None] = []

    def flatten(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:  # by name (input_ids, attention_mask … in the forward's order)
            kwargs = {**dict(zip(inspect.signature(module.forward).parameters, args, strict=False)), **kwargs}
            args = ()
        kwargs = dict(kwargs)
        mask, ids = kwargs.get("attention_mask"), kwargs.get("input_ids")
        if (mask is None or ids is None or mask.dim() != 2 or kwargs.get("inputs_embeds") is not None
                or kwargs.get("position_ids") is not None):
            self.pending.append(None)  # nothing this hook knows how to flatten: the forward runs as asked
            return args, kwargs
        batch, length = mask.shape
        real = mask.bool()
        index = real.reshape(-1).nonzero().squeeze(1)
        lengths = real.sum(1)
        offsets = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
        for name, value in list(kwargs.items()):
            if isinstance(value, torch.Tensor) and value.shape == (batch, length):
                kwargs[name] = value.reshape(-1)[index].unsqueeze(0)
        longest = int(lengths.max())
        kwargs.update(attention_mask=None, cu_seq_lens_q=offsets, cu_seq_lens_k=offsets, max_length_q=longest,
                      max_length_k=longest,
                      position_ids=((real.cumsum(1) - 1).reshape(-1)[index] + self.position_offset).unsqueeze(0))
        self.pending.append((batch, length, index))
        return args, kwargs

    def repad(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> object:
        layout = self.pending.pop()
        if layout is None:
            return output
        batch, length, index = layout
        flat = output[0]
        hidden = flat.new_zeros(batch * length, flat.shape[-1]).index_copy(0, index, flat[0]).view(batch, length, -1)
        pooler = getattr(module, "pooler", None)
        if isinstance(output, tuple):
            return (hidden, *((pooler(hidden),) if pooler is not None and len(output) > 1 else output[1:2]), *output[2:])
        output["last_hidden_state"] = hidden
        if pooler is not None and output.get("pooler_output") is not None:
            output["pooler_output"] = pooler(hidden)  # it read the first token of the stream, not of each text
        return output


@contextlib.contextmanager
def unpadded_encoder(model: PreTrainedModel) -> Iterator[None]:
    """Inside the block, the encoder of ``model`` (its ``base_model``) runs padded batches on their real
    tokens only: one flat stream (``cu_seq_lens_q``), forward and backward, then its output is put back
    in the padded layout (zeros at pads; a BERT pooler recomputed from each text's first token), so
    heads that read the first token, or pool with the mask, work unchanged. For GLUE's
    ``AutoModelForSequenceClassification`` and any other head over a transformers encoder.

    Positions restart at each text (RoBERTa's families: after the pad id,
    :func:`~neobert_embed.backbones.first_position`). Calls that pass ``inputs_embeds`` or
    ``position_ids`` run as asked.

    Example:
        >>> with unpadded_encoder(classifier):
        ...     trainer.train()
    """
    from neobert_embed.backbones import first_position
    from neobert_embed.modeling.model import NeoBERTPreTrainedModel

    base = model.base_model
    previous = model.config._attn_implementation
    flat_interface = not isinstance(model, NeoBERTPreTrainedModel)  # NeoBERT's forward takes the stream itself
    if flat_interface:
        model.set_attn_implementation(register_flat_attention())
    hooks = _StreamHooks(first_position(model.config))
    handles = (base.register_forward_pre_hook(hooks.flatten, with_kwargs=True),
               base.register_forward_hook(hooks.repad, with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        if flat_interface:
            model.set_attn_implementation(previous)
