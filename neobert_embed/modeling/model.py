"""NeoBERT encoder, MLM head and sequence classifier, native to this package (no remote code).

Why: the official ``chandar-lab/NeoBERT`` code hard-imports xformers, computes over padding and
cannot be saved under transformers 5. These classes keep its exact parameter names and math
(so the official checkpoint loads with no missing/unexpected keys and gives the same numbers)
while dropping pad tokens before every linear layer (see :mod:`.attention`).

Layout (parameter names are the official ones):
``encoder`` (token embedding) → ``transformer_encoder.{i}``: pre-norm blocks
(``attention_norm`` → ``qkv`` laid out per head → RoPE → attention → ``wo``;
``ffn_norm`` → ``ffn.w12`` / ``ffn.w3`` SwiGLU) → ``layer_norm``; the MLM head is ``decoder``.

Example:
    >>> config = NeoBERTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2)
    >>> model = NeoBERTModel(config).eval()
    >>> out = model(torch.tensor([[101, 7592, 102, 0]]), torch.tensor([[1, 1, 1, 0]]))
    >>> out.last_hidden_state.shape
    torch.Size([1, 4, 32])
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput, SequenceClassifierOutput
from transformers.utils import ModelOutput, logging

from neobert_embed.errors import UserInputError
from neobert_embed.modeling.attention import (
    attention_kernel_for,
    build_varlen_batch,
    compute_dtype,
    padded_attention,
    varlen_attention,
)
from neobert_embed.modeling.configuration import NeoBERTConfig, swiglu_hidden_size
from neobert_embed.modeling.rotary import RotaryEmbedding, apply_rotary
from neobert_embed.registration import register_unless_circular

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
logger = logging.get_logger(__name__)


class SwiGLU(nn.Module):
    """``w3(silu(a) * b)`` with ``a, b`` the first and second halves of ``w12(x)`` (gate first)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.w12 = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.w3 = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(gate) * value)


class NeoBERTLayer(GradientCheckpointingLayer):
    """One pre-norm block; works on padded (batch, length, hidden) or un-padded (tokens, hidden)."""

    def __init__(self, config: NeoBERTConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.ffn = SwiGLU(config.hidden_size, swiglu_hidden_size(config.intermediate_size))
        self.attention_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.ffn_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)

    def forward(self, x: torch.Tensor, rotations: torch.Tensor, attend: Attend) -> torch.Tensor:
        leading = x.shape[:-1]
        # The official checkpoint lays qkv out per head: (…, heads, [q | k | v] of head_dim each).
        qkv = self.qkv(self.attention_norm(x)).view(*leading, self.num_heads, 3, self.head_dim)
        qk = apply_rotary(qkv[..., :2, :], rotations)
        attended = attend(qk[..., 0, :], qk[..., 1, :], qkv[..., 2, :])
        x = x + self.wo(attended.reshape(*leading, self.num_heads * self.head_dim))
        return x + self.ffn(self.ffn_norm(x))


class NeoBERTPreTrainedModel(PreTrainedModel):
    """Shared loading/initialisation logic; ``base_model_prefix = "model"`` as in the checkpoint."""

    config_class = NeoBERTConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["NeoBERTLayer"]
    _supports_sdpa = True
    # transformers' attention interface: NeoBERT takes flat token streams (``cu_seq_lens_q``, what
    # ``DataCollatorWithFlattening`` and sentence-transformers' un-padding pass) under any implementation,
    # runs the flash-attn package's varlen kernel under ``flash_attention_2`` and its own dispatch otherwise
    _supports_attention_backend = True
    _supports_flash_attn = True
    _keys_to_ignore_on_load_unexpected = [r"^decoder\."]

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        """``PreTrainedModel.from_pretrained``, but a wrong-shaped tensor is an error NAMING the key.

        transformers only says "look at the report above" when shapes mismatch; here the
        message lists each key with its checkpoint and expected shapes.
        ``ignore_mismatched_sizes=True`` keeps transformers' behaviour (re-initialise them).
        """
        if kwargs.get("ignore_mismatched_sizes"):
            return super().from_pretrained(*args, **kwargs)
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, ignore_mismatched_sizes=True, output_loading_info=True,
                                              **kwargs)
        if info["mismatched_keys"]:
            details = "; ".join(f"{key}: checkpoint {tuple(found)} vs model {tuple(expected)}"
                                for key, found, expected in sorted(info["mismatched_keys"]))
            raise UserInputError(
                f"checkpoint {args[0] if args else kwargs.get('pretrained_model_name_or_path')!s} has "
                f"tensors of the wrong shape for this config: {details}. Check that config.json "
                "matches the weights (hidden_size, intermediate_size, vocab_size …)"
            )
        return (model, info) if want_info else model

    def _init_weights(self, module: nn.Module) -> None:
        """Official init: uniform ±range for embedding and linear layers, normal for the classifier."""
        config = self.config
        if isinstance(module, NeoBERTForSequenceClassification):
            for layer in (module.dense, module.classifier):
                init.normal_(layer.weight, mean=0.0, std=config.classifier_init_range)
                init.zeros_(layer.bias)
        elif isinstance(module, nn.Linear):
            init.uniform_(module.weight, -config.decoder_init_range, config.decoder_init_range)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.uniform_(module.weight, -config.embedding_init_range, config.embedding_init_range)
        elif isinstance(module, nn.RMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, RotaryEmbedding):  # a non-persistent buffer: rebuilt after meta-device loading
            init.copy_(module.inv_freq, module.compute_inv_freq(seq_len=None)[0])


class NeoBERTModel(NeoBERTPreTrainedModel):
    """The NeoBERT encoder (official class name ``NeoBERT``)."""

    def __init__(self, config: NeoBERTConfig) -> None:
        super().__init__(config)
        self.encoder = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.rotary = RotaryEmbedding(config)
        self.transformer_encoder = nn.ModuleList(NeoBERTLayer(config) for _ in range(config.num_hidden_layers))
        self.layer_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.encoder = value

    def attention_kernel(self, attention_mask: torch.Tensor | None, cu_seqlens: torch.Tensor | None) -> str:
        """The kernel this input runs on (``padded`` | ``sdpa_varlen`` | ``native_varlen`` | ``flash_attn``).

        Resolved once per forward from ``config.attention_backend`` by
        :func:`~neobert_embed.modeling.attention.choose_attention_backend`, for the device of the
        weights and the compute dtype (autocast's when autocast is on).
        ``attn_implementation="eager"`` means ``padded``.

        Example:
            >>> model.attention_kernel(torch.tensor([[1, 1, 0]]), None)   # on CPU
            'sdpa_varlen'
        """
        implementation = self.config._attn_implementation or ""
        requested = self.config.attention_backend
        if implementation == "eager":
            requested = "padded"
        elif implementation.startswith("flash_attention") and requested in ("auto", "varlen"):
            requested = "flash_attn"
        if requested == "padded" and cu_seqlens is not None:
            raise ValueError("packed documents (cu_seqlens) need the varlen attention path; "
                             "set config.attention_backend to 'auto' or 'varlen'")
        device = self.encoder.weight.device
        dtype = compute_dtype(device, self.encoder.weight.dtype)
        unpad = cu_seqlens is not None or (attention_mask is not None and not bool(attention_mask.all()))
        return attention_kernel_for(requested, device, dtype, self.config.head_dim, unpad=unpad,
                                    packed=cu_seqlens is not None)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        position_ids: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
        cu_seq_lens_q: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **ignored: Any,
    ) -> BaseModelOutput | tuple:
        """Encode a batch.

        Args:
            input_ids: (batch, length) token ids (or pass ``inputs_embeds`` (batch, length, hidden)).
            attention_mask: (batch, length) 1 for real tokens, 0 for padding (right padding, as the
                tokenizer produces). With padding, pad tokens are dropped before every linear
                layer (un-padded path) unless ``config.attention_backend == "padded"``; the
                attention kernel is chosen once per forward (:meth:`attention_kernel`).
            position_ids: (batch, length) RoPE positions; default: the index within the row, or
                within the packed document when ``cu_seqlens`` is given.
            cu_seqlens: PACKED PRETRAINING. int32 (documents + 1,) boundaries of documents over the
                flattened batch × length tokens (starts at 0, ends at batch × length). Attention
                is then restricted to each document — no token attends across a boundary — and
                positions restart at 0 in each document. May be combined with ``attention_mask``
                (masked tokens are dropped from their document).
            cu_seq_lens_q: the same, under the name transformers' flattening collator
                (``DataCollatorWithFlattening``) and sentence-transformers' un-padding give it: a flat
                stream of texts, ``input_ids`` (1, tokens) with ``position_ids`` restarting per text.
            max_seqlen: accepted for compatibility and ignored: the longest document is computed
                from ``cu_seqlens`` after dropping masked tokens (a stale value passed to a flash
                kernel would be unsafe).
            output_hidden_states: also return (embeddings, output of each layer); pre-final-norm,
                re-padded to (batch, length, hidden).
            return_dict: return a ``BaseModelOutput`` (default) or a tuple.
            **ignored: ``token_type_ids`` and other keys tokenizers/sentence-transformers pass.

        Returns:
            ``BaseModelOutput`` whose ``last_hidden_state`` is (batch, length, hidden) after the
            final RMSNorm; un-padded runs return zeros at pad positions.
        """
        output_hidden_states = output_hidden_states or self.config.output_hidden_states
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        if cu_seqlens is None:
            cu_seqlens = cu_seq_lens_q
        batch, length = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        device = self.encoder.weight.device
        states: list[torch.Tensor] = []
        kernel = self.attention_kernel(attention_mask, cu_seqlens)
        if kernel == "padded":
            hidden = self.encoder(input_ids) if inputs_embeds is None else inputs_embeds
            last = length - 1 if position_ids is None else None  # known here: no read back from the device
            if position_ids is None:
                position_ids = torch.arange(length, device=device).expand(batch, length)
            rotations = self._rotations(position_ids, last)
            if attention_mask is not None and bool(attention_mask.all()):
                attention_mask = None  # same result, lets SDPA pick its fastest kernel
            attend = functools.partial(padded_attention, attention_mask=attention_mask)
            hidden = self._run_layers(hidden, rotations, attend, states if output_hidden_states else None)
            hidden = self.layer_norm(hidden)
        else:
            plan = build_varlen_batch(attention_mask, cu_seqlens, (batch, length), position_ids, device,
                                      backend=kernel)
            tokens = self._embed_real_tokens(input_ids, inputs_embeds, plan.token_index)
            rotations = self._rotations(plan.position_ids, plan.max_seqlen - 1 if position_ids is None else None)
            attend = functools.partial(varlen_attention, batch=plan)
            token_states: list[torch.Tensor] = []
            tokens = self._run_layers(tokens, rotations, attend, token_states if output_hidden_states else None)
            hidden = _repad(self.layer_norm(tokens), plan.token_index, batch, length)
            states = [_repad(state, plan.token_index, batch, length) for state in token_states]
        hidden_states = tuple(states) if output_hidden_states else None
        result = BaseModelOutput(last_hidden_state=hidden, hidden_states=hidden_states)
        return result if return_dict else result.to_tuple()  # a tuple of the fields that are set

    def _rotations(self, position_ids: torch.Tensor, last: int | None = None) -> torch.Tensor:
        """RoPE rotations; warns once when positions exceed the trained context without scaling.

        ``last`` is the largest position when the caller knows it on the host (positions it made
        itself): reading it from a GPU tensor would make the host wait for the device every forward.
        """
        limit = self.config.max_position_embeddings
        if self.rotary.rope_type != "default" or not position_ids.numel():
            return self.rotary(position_ids)
        last = int(position_ids.max()) if last is None else last
        if last >= limit:
            logger.warning_once(
                f"NeoBERT got positions up to {last} but was trained on {limit}; "
                "quality degrades beyond that. Truncate inputs, or set rope_scaling "
                '(e.g. {"rope_type": "yarn", "factor": 2.0}) in the config.'
            )
        return self.rotary(position_ids)

    def _embed_real_tokens(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None,
                           token_index: torch.Tensor | None) -> torch.Tensor:
        """(tokens, hidden) embeddings of the kept tokens only (pad rows are never looked up)."""
        if inputs_embeds is not None:
            flat = inputs_embeds.reshape(-1, inputs_embeds.shape[-1])
            return flat if token_index is None else flat[token_index]
        flat_ids = input_ids.reshape(-1)
        return self.encoder(flat_ids if token_index is None else flat_ids[token_index.to(flat_ids.device)])

    def _run_layers(self, x: torch.Tensor, rotations: torch.Tensor, attend: Attend,
                    states: list[torch.Tensor] | None) -> torch.Tensor:
        for layer in self.transformer_encoder:
            if states is not None:
                states.append(x)
            x = layer(x, rotations, attend)
        if states is not None:
            states.append(x)
        return x


def _repad(tokens: torch.Tensor, token_index: torch.Tensor | None, batch: int, length: int) -> torch.Tensor:
    """Scatter un-padded (tokens, hidden) back to (batch, length, hidden), zeros at padding."""
    if token_index is None:
        return tokens.reshape(batch, length, -1)
    full = tokens.new_zeros(batch * length, tokens.shape[-1])
    return full.index_copy(0, token_index, tokens).reshape(batch, length, -1)


class _NeoBERTWithHead(NeoBERTPreTrainedModel):
    """Why: every head runs the encoder the same way and differs only in what it computes from the
    output, so the forward signature (which transformers' Trainer reads) is written once."""

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        labels: torch.Tensor | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> ModelOutput | tuple:
        """The head's output; accepts every keyword of :meth:`NeoBERTModel.forward` (``position_ids``,
        ``cu_seqlens``, ``max_seqlen`` for packed pretraining rows …)."""
        return_dict = self.config.return_dict if return_dict is None else return_dict
        result = self._head(self.model(input_ids, attention_mask, return_dict=True, **kwargs), labels)
        return result if return_dict else result.to_tuple()

    def _head(self, output: BaseModelOutput, labels: torch.Tensor | None) -> ModelOutput:
        raise NotImplementedError


class NeoBERTForMaskedLM(_NeoBERTWithHead):
    """NeoBERT with its MLM head ``decoder`` (official class name ``NeoBERTLMHead``)."""

    _keys_to_ignore_on_load_unexpected: list[str] = []

    def __init__(self, config: NeoBERTConfig) -> None:
        super().__init__(config)
        self.model = NeoBERTModel(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.decoder

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.decoder = value

    def _head(self, output: BaseModelOutput, labels: torch.Tensor | None) -> MaskedLMOutput:
        """Logits over the vocabulary; with ``labels`` (-100 = ignore) also the mean MLM loss."""
        logits = self.decoder(output.last_hidden_state)
        loss = None if labels is None else F.cross_entropy(
            logits.view(-1, logits.shape[-1]).float(), labels.reshape(-1).to(logits.device), ignore_index=-100)
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=output.hidden_states)


class NeoBERTForSequenceClassification(_NeoBERTWithHead):
    """[CLS] → dropout → dense → tanh → dropout → classifier (the official head layout)."""

    def __init__(self, config: NeoBERTConfig) -> None:
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = NeoBERTModel(config)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def _head(self, output: BaseModelOutput, labels: torch.Tensor | None) -> SequenceClassifierOutput:
        """Logits (batch, num_labels); with ``labels`` the loss for ``config.problem_type``
        (inferred like transformers does: regression for 1 label, single-label for integer labels).
        """
        x = self.dropout(output.last_hidden_state[:, 0])
        logits = self.classifier(self.dropout(torch.tanh(self.dense(x))))
        loss = None if labels is None else self._loss(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=output.hidden_states)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.config.problem_type is None:
            if self.num_labels == 1:
                self.config.problem_type = "regression"
            elif labels.dtype in (torch.long, torch.int):
                self.config.problem_type = "single_label_classification"
            else:
                self.config.problem_type = "multi_label_classification"
        if self.config.problem_type == "regression":
            return F.mse_loss(logits.squeeze(-1).float(), labels.float().view(-1))
        if self.config.problem_type == "single_label_classification":
            return F.cross_entropy(logits.view(-1, self.num_labels).float(), labels.view(-1))
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


register_unless_circular()  # last: the classes above exist now (see neobert_embed.registration)
