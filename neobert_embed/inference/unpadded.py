"""Un-padded inference for BERT-family encoders (:func:`unpad_encoders`): only real tokens go through the
Linear layers.

Why: a batch is padded to its longest text, and a BERT layer spends most of its CPU time in Linear layers
that multiply every padded position as if it were a token (docs/performance.md). NeoBERT never pads; this
gives Hugging Face's BERT, RoBERTa and XLM-RoBERTa the same at inference: the real tokens are gathered into
one ``(tokens, hidden)`` matrix, each layer runs its own modules on it, and each text attends to its own
tokens through NeoBERT's un-padded kernel. The vectors are the padded forward's up to fp32 rounding.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
from torch import nn

from neobert_embed.inference.kernels import PackedBf16Linear
from neobert_embed.modeling.attention import (
    VarlenBatch,
    attention_kernel_for,
    build_varlen_batch,
    compute_dtype,
    varlen_attention,
)

if TYPE_CHECKING:
    from transformers.modeling_outputs import BaseModelOutput

#: Encoder classes whose layers are BERT's (self-attention with query/key/value Linear layers,
#: an output block with residual LayerNorm, an intermediate and an output feed-forward block) and
#: whose embeddings take ``input_ids``/``token_type_ids`` and compute their own positions.
UNPADDED_ENCODERS = ("BertModel", "RobertaModel", "XLMRobertaModel", "CamembertModel")
#: Arguments that ask for more than the last hidden state: such calls run the library's forward.
_PADDED_ONLY = ("inputs_embeds", "position_ids", "output_hidden_states", "output_attentions", "cache",
                "encoder_hidden_states", "encoder_attention_mask", "use_cache")


def supports_unpadded(encoder: nn.Module) -> bool:
    """True for an encoder-only BERT-family model whose layers this module knows how to run.

    Example:
        >>> supports_unpadded(BertModel(BertConfig()))
        True
    """
    config = getattr(encoder, "config", None)
    if type(encoder).__name__ not in UNPADDED_ENCODERS or config is None:
        return False
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return False
    if getattr(config, "output_hidden_states", False) or getattr(config, "output_attentions", False):
        return False
    layers = getattr(getattr(encoder, "encoder", None), "layer", None)
    return isinstance(layers, nn.ModuleList) and all(_is_bert_layer(layer) for layer in layers)


def _is_bert_layer(layer: nn.Module) -> bool:
    attention = getattr(layer, "attention", None)
    self_attention = getattr(attention, "self", None)
    return (all(hasattr(self_attention, name) for name in ("query", "key", "value", "scaling",
                                                          "num_attention_heads", "attention_head_size"))
            and hasattr(attention, "output") and hasattr(layer, "intermediate") and hasattr(layer, "output"))


def unpad_encoders(model: nn.Module) -> list[str]:
    """Make every supported encoder inside ``model`` an instance of its :func:`unpadded_class` (in place, as
    ``torch.nn.utils.parametrize`` does); returns their class names. :func:`restore_padded` undoes it.

    Example:
        >>> unpad_encoders(sentence_model)
        ['BertModel']
    """
    changed = []
    for module in model.modules():
        if supports_unpadded(module) and type(module).forward is not _unpadded_forward:
            module.__class__ = unpadded_class(type(module))
            changed.append(type(module).__name__)
    return changed


def restore_padded(model: nn.Module) -> None:
    """Undo :func:`unpad_encoders`: every encoder inside ``model`` is of the library's class again."""
    for module in model.modules():
        if type(module).forward is _unpadded_forward:
            module.__class__ = type(module).__bases__[0]


@functools.cache
def unpadded_class(encoder_class: type[nn.Module]) -> type[nn.Module]:
    """``encoder_class`` with the un-padded forward, under the same module and name: a saved config names the
    library's class, and transformers finds what its class records (its output registry is keyed by name).

    Example:
        >>> unpadded_class(BertModel).__bases__, unpadded_class(BertModel).__name__
        ((<class 'transformers.models.bert.modeling_bert.BertModel'>,), 'BertModel')
    """
    names = {"__module__": encoder_class.__module__, "__qualname__": encoder_class.__qualname__}
    return type(encoder_class.__name__, (encoder_class,), {"forward": _unpadded_forward, **names})


def _unpadded_forward(self: nn.Module, input_ids: torch.Tensor | None = None,
                      attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                      **kwargs: object) -> BaseModelOutput:
    """The encoder's forward on the real tokens only (see the module docstring)."""
    padded_forward = type(self).__bases__[0].forward
    asks_more = any(kwargs.get(name) not in (None, False) for name in _PADDED_ONLY)
    packed = _runs_packed_bf16(self)
    # a batch without padding gains nothing here, except where the layers are packed: it then runs the
    # same bf16 residual stream as every other batch, so a text's vector does not depend on its neighbours
    kernel = None if input_ids is None or attention_mask is None or asks_more else _kernel(self, attention_mask)
    if kernel in (None, "padded") or (bool(attention_mask.all()) and not packed):
        return padded_forward(self, input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids, **kwargs)
    from transformers.modeling_outputs import BaseModelOutput

    batch, length = input_ids.shape
    # texts longest first, so that texts of one length are neighbours and each attention call takes a
    # view of the token matrix (no gather, no restoring permutation)
    order = torch.argsort(attention_mask.sum(1), descending=True, stable=True)
    plan = build_varlen_batch(attention_mask[order], None, (batch, length), backend=kernel, layout="documents")
    grid = order[:, None] * length + torch.arange(length, device=order.device)  # sorted slot -> batch*length
    real = grid.reshape(-1)  # the real tokens, in the plan's order (all of them in a batch without padding)
    if plan.token_index is not None:
        real = real.index_select(0, plan.token_index)
    embedded = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
    width = embedded.shape[-1]
    hidden = embedded.reshape(batch * length, width).index_select(0, real)
    if packed:
        hidden = hidden.to(torch.bfloat16)  # the residual stream (see _residual_block)
    for layer in self.encoder.layer:
        attended = _attend(layer.attention.self, hidden, plan)
        hidden = _residual_block(layer.attention.output, attended, hidden)
        hidden = _residual_block(layer.output, layer.intermediate(hidden), hidden)
    full = embedded.new_zeros(batch * length, width).index_copy_(0, real, hidden.to(embedded.dtype))
    return BaseModelOutput(last_hidden_state=full.view(batch, length, width))


def _kernel(encoder: nn.Module, attention_mask: torch.Tensor) -> str:
    """The attention kernel for this batch (NeoBERT's dispatch, :func:`attention_kernel_for`); ``padded``
    (CUDA in fp32) runs the library's own forward."""
    dtype = compute_dtype(attention_mask.device, encoder.embeddings.word_embeddings.weight.dtype)
    head_dim = encoder.encoder.layer[0].attention.self.attention_head_size
    return attention_kernel_for("auto", attention_mask.device, dtype, head_dim, unpad=True)


def _runs_packed_bf16(encoder: nn.Module) -> bool:
    """Whether every output block's product of ``encoder`` is a packed bf16 layer (bf16 on a CPU with units)."""
    return all(isinstance(block.dense, PackedBf16Linear)
               for layer in encoder.encoder.layer for block in (layer.attention.output, layer.output))


def _residual_block(block: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """BERT's output block, ``LayerNorm(dense(x) + residual)``. Where the product is a packed bf16 layer, the
    bias and residual addition run inside it (:meth:`~neobert_embed.inference.kernels.PackedBf16Linear.forward_add`)
    and the residual stream between blocks stays bf16 (each sum formed in fp32, rounded once)."""
    if isinstance(block.dense, PackedBf16Linear):
        return block.LayerNorm(block.dense.forward_add(x, residual))
    return block(x, residual)


def _attend(attention: nn.Module, hidden: torch.Tensor, plan: VarlenBatch) -> torch.Tensor:
    """Self-attention of the real tokens ``hidden`` (tokens, width), each text attending to its own tokens only."""
    heads, head_dim = attention.num_attention_heads, attention.attention_head_size
    query, key, value = (projection(hidden).view(-1, heads, head_dim)
                         for projection in (attention.query, attention.key, attention.value))
    context = varlen_attention(query, key, value, plan, scale=attention.scaling)
    return context.reshape(-1, heads * head_dim)
