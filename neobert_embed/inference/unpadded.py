"""Un-padded inference for BERT-family encoders: only real tokens go through the Linear layers.

Why: a batch of texts is padded to its longest text, and a BERT layer spends ~80% of its CPU time
in Linear layers that multiply every padded position as if it were a token. Length-sorted batching
(what ``SentenceTransformer.encode`` does) still adds 11% padded positions to the real tokens of
1,024 mixed STS-B/AG News texts, and 48% to those of 256 of them. NeoBERT in this toolkit never pads (:mod:`neobert_embed.modeling`);
this module gives Hugging Face's own BERT, RoBERTa and XLM-RoBERTa models the same treatment at
inference, without a new model class: the embeddings run as the library computes them, then the
hidden states of the real tokens are gathered into one ``(tokens, hidden)`` matrix; each layer runs
its own Linear/LayerNorm/activation modules on that matrix, and attention runs on it too, each
text attending to its own tokens through NeoBERT's un-padded kernel
(:func:`~neobert_embed.modeling.attention.varlen_attention`: one SDPA call per group of equal-length
texts, no mask; on a CUDA GPU in fp16/bf16, PyTorch's ``varlen_attn``, one call per layer, and in
fp32 there the library's own forward). The result is the library's padded forward up to fp32 rounding (every MiniLM
sentence vector at cosine 1.0000000), at 1.30× the texts/s on the 1,024 texts above (1 thread, AMD
EPYC, fp32; see ``benchmarks/cpu_inference.py``). Attending per text instead of over the padded
batch with a padding mask skips the padded scores: half the attention work on those texts (Σ n²
against batch × longest², with batches sorted by characters, not tokens), 1.11× the texts/s in bf16
at 1 thread on an AMD EPYC with avx512_bf16 (interleaved A/B, medians of 5), the same in fp32.

It is applied by :func:`~neobert_embed.inference.runtime.load_inference_model`, so every command
that encodes (``encode``, ``index``, ``mine-negatives``, ``serve``, ``mteb``, ``compare``) runs it,
at every compute precision: the layers' own modules are called, so autocast and
:class:`~neobert_embed.inference.kernels.Int8Linear` apply as in the padded forward. Where the
Linear layers are packed bf16 ones (``bf16`` on a CPU with bf16 units), each output block adds the
residual inside its product and the residual stream between blocks is bf16 (:func:`_residual_block`).
A call asking for anything beyond the last hidden state (hidden states of every layer, attentions,
``inputs_embeds``, ``position_ids``) runs the library's forward unchanged, and so does a batch without
padding, except with packed layers (its texts then get the same bf16 stream as any other batch's).

Example:
    >>> unpad_encoders(sentence_model)          # in place; the encoders it changed
    ['BertModel']
    >>> vectors = sentence_model.encode(texts)  # same vectors, fewer FLOPs
"""

from __future__ import annotations

import types
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
    """Make every supported encoder inside ``model`` run un-padded (in place); returns their class
    names (empty when there is none, e.g. NeoBERT, which is un-padded already, or MPNet).

    The new forward is bound to its encoder, so ``copy.deepcopy(model)`` (``auto``'s int8 trial)
    gets a copy that runs its own layers. :func:`restore_padded` undoes it.
    """
    changed = []
    for module in model.modules():
        if supports_unpadded(module):
            module.forward = types.MethodType(_unpadded_forward, module)  # type: ignore[method-assign]
            changed.append(type(module).__name__)
    return changed


def restore_padded(model: nn.Module) -> None:
    """Undo :func:`unpad_encoders`: every encoder inside ``model`` runs the library's forward again."""
    for module in model.modules():
        bound = vars(module).get("forward")
        if isinstance(bound, types.MethodType) and bound.__func__ is _unpadded_forward:
            del module.forward


def _unpadded_forward(self: nn.Module, input_ids: torch.Tensor | None = None,
                      attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                      **kwargs: object) -> BaseModelOutput:
    """The encoder's forward on the real tokens only (see the module docstring)."""
    padded_forward = type(self).forward
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
    """The attention kernel for this batch (NeoBERT's dispatch, :func:`attention_kernel_for`): on a CUDA
    GPU in fp16/bf16 PyTorch's ``varlen_attn``, one call per layer; other CUDA inputs ``padded``, which
    runs the library's own forward (one masked SDPA call, never a call per length); the CPU
    ``sdpa_varlen``, one call per group of equal-length texts."""
    dtype = compute_dtype(attention_mask.device, encoder.embeddings.word_embeddings.weight.dtype)
    head_dim = encoder.encoder.layer[0].attention.self.attention_head_size
    return attention_kernel_for("auto", attention_mask.device, dtype, head_dim, unpad=True)


def _runs_packed_bf16(encoder: nn.Module) -> bool:
    """Whether every output block's product of ``encoder`` is a packed bf16 layer (``--precision bf16``
    on a CPU with bf16 units: inference only, so the blocks' dropout is the identity)."""
    return all(isinstance(block.dense, PackedBf16Linear)
               for layer in encoder.encoder.layer for block in (layer.attention.output, layer.output))


def _residual_block(block: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """BERT's output block, ``LayerNorm(dense(x) + residual)`` (``BertSelfOutput``, ``BertOutput``).

    Where the product is a packed bf16 layer, the bias and the residual addition run inside it
    (:meth:`~neobert_embed.inference.kernels.PackedBf16Linear.forward_add`) and the residual stream
    between blocks is kept in bf16: each block's sum is formed in fp32 and rounded once, and the
    LayerNorm computes in fp32 on it. That removes a mixed-dtype addition and the casts
    of each block's input; on all-MiniLM-L6-v2 (1,024 texts, AMD EPYC with avx512_bf16) 1.03× the
    texts/s at 1 thread and 1.02× at 2 (medians of 7 interleaved passes), with every vector at cosine
    ≥ 0.99995 of fp32 (mean 0.999975; the fp32 stream: 0.999987). Elsewhere the block runs as is.
    """
    if isinstance(block.dense, PackedBf16Linear):
        return block.LayerNorm(block.dense.forward_add(x, residual))
    return block(x, residual)


def _attend(attention: nn.Module, hidden: torch.Tensor, plan: VarlenBatch) -> torch.Tensor:
    """Self-attention of the real tokens ``hidden`` (tokens, width), each text attending to its own
    tokens only (:func:`~neobert_embed.modeling.attention.varlen_attention`, NeoBERT's un-padded
    kernel): no padded scores, no mask, no scatter to a padded batch and back."""
    heads, head_dim = attention.num_attention_heads, attention.attention_head_size
    query, key, value = (projection(hidden).view(-1, heads, head_dim)
                         for projection in (attention.query, attention.key, attention.value))
    context = varlen_attention(query, key, value, plan, scale=attention.scaling)
    return context.reshape(-1, heads * head_dim)
