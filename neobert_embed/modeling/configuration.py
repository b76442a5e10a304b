"""``NeoBERTConfig``: the official ``chandar-lab/NeoBERT`` config.json, accepted unchanged.

Why: the official config stores its context length as ``max_length`` (a *generation* field that
transformers 5 refuses to save in a model config) and carries remote-code fields (``auto_map``,
``kwargs``, ``trust_remote_code`` …). This class reads all of them, maps ``max_length`` onto
``max_position_embeddings`` so ``save_pretrained`` works, and validates shapes up front so a bad
config fails at construction instead of deep inside a matmul.

Architecture switches that the official config does not spell out are fixed, not configurable:
RoPE (θ = ``rope_theta``, adjacent-pair rotation), RMSNorm and SwiGLU — there are no ``rope`` /
``rms_norm`` / ``hidden_act`` keys.

Example:
    >>> config = NeoBERTConfig(max_length=4096)            # official field name
    >>> config.max_position_embeddings
    4096
    >>> NeoBERTConfig(rope_scaling={"rope_type": "yarn", "factor": 2.0}).rope_parameters["rope_type"]
    'yarn'
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from neobert_embed.errors import UserInputError
from neobert_embed.modeling.attention import ATTENTION_BACKENDS
from neobert_embed.registration import register_unless_circular

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn")


def swiglu_hidden_size(intermediate_size: int, multiple_of: int = 8) -> int:
    """Width ``f`` of NeoBERT's SwiGLU: 2/3 of ``intermediate_size`` rounded up to a multiple of 8.

    Example:
        >>> swiglu_hidden_size(3072)
        2048
    """
    width = int(2 * intermediate_size / 3)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


class NeoBERTConfig(PretrainedConfig):
    """Configuration of a NeoBERT encoder (defaults: the released 250M model).

    Args:
        hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size: sizes;
            ``hidden_size`` must be divisible by ``num_attention_heads`` and the head size even.
        max_position_embeddings: positions RoPE is trained for (4096). The official key
            ``max_length`` is accepted as an alias and never written back.
        norm_eps: RMSNorm epsilon.
        pad_token_id: id of [PAD] (0 for the bert-base-uncased tokenizer).
        embedding_init_range, decoder_init_range, classifier_init_range: init ranges of the
            embedding (uniform), linear layers (uniform) and classifier (normal std).
        classifier_dropout: dropout of the sequence-classification head.
        rope_theta: RoPE base θ.
        rope_parameters / rope_scaling: optional RoPE scaling for inputs longer than
            ``max_position_embeddings``: ``{"rope_type": "yarn", "factor": 2.0}`` (YaRN,
            ``original_max_position_embeddings`` defaults to ``max_position_embeddings``) or
            ``{"rope_type": "dynamic", "factor": 2.0}`` (dynamic NTK: θ grows only when a batch is
            longer than ``max_position_embeddings``) or ``{"rope_type": "linear", "factor": 2.0}``.
        attention_backend: which attention kernel runs, chosen once per forward (full table in
            :mod:`neobert_embed.modeling.attention`). ``"auto"`` (default): plain SDPA when the
            batch has no padding and no packed documents; otherwise pad tokens are dropped and
            the documents attended by PyTorch's native flash ``varlen_attn`` on a CUDA GPU in
            fp16/bf16, or by SDPA (per equal-length group, or per packed row with a
            block-diagonal mask, whichever a measured cost rule says is cheaper) on CPU and in
            fp32. ``"varlen"``: always un-pad, kernel as ``auto``. ``"padded"``: the reference
            (SDPA over the padded batch with a key-padding mask; ``attn_implementation="eager"``
            also selects it). ``"sdpa_varlen"``, ``"native_varlen"``, ``"flash_attn"`` force one
            un-padded kernel (``flash_attn`` needs the flash-attn package; the flash kernels a
            CUDA sm80+ GPU and fp16/bf16).
        dim_head: official field; derived from the sizes, checked when given.
        kwargs, pretrained_model_name_or_path, trust_remote_code, auto_map: official bookkeeping
            fields, kept as they are; NeoBERT never needs remote code here.
    """

    model_type = "neobert"

    def __init__(
        self,
        hidden_size: int = 768,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        vocab_size: int = 30522,
        max_position_embeddings: int | None = None,
        norm_eps: float = 1e-5,
        pad_token_id: int = 0,
        embedding_init_range: float = 0.02,
        decoder_init_range: float = 0.02,
        classifier_init_range: float = 0.02,
        classifier_dropout: float = 0.1,
        rope_theta: float = 10000.0,
        rope_parameters: dict[str, Any] | None = None,
        attention_backend: str = "auto",
        dim_head: int | None = None,
        max_length: int | None = None,
        **kwargs: Any,
    ) -> None:
        if num_attention_heads <= 0 or hidden_size % num_attention_heads != 0:
            raise UserInputError(
                f"NeoBERTConfig: hidden_size ({hidden_size}) must be divisible by "
                f"num_attention_heads ({num_attention_heads}); change one of them"
            )
        head_dim = hidden_size // num_attention_heads
        if head_dim % 2:
            raise UserInputError(
                f"NeoBERTConfig: head size hidden_size/num_attention_heads = {head_dim} must be even "
                "for rotary embeddings; change hidden_size or num_attention_heads"
            )
        if dim_head is not None and dim_head != head_dim:
            raise UserInputError(
                f"NeoBERTConfig: dim_head ({dim_head}) disagrees with hidden_size/num_attention_heads "
                f"({head_dim}); remove dim_head or fix the sizes"
            )
        if (max_length is not None and max_position_embeddings is not None
                and max_length != max_position_embeddings):
            raise UserInputError(
                f"NeoBERTConfig: max_length ({max_length}) and max_position_embeddings "
                f"({max_position_embeddings}) disagree; give only one of them"
            )
        if attention_backend not in ATTENTION_BACKENDS:
            raise UserInputError(
                f"NeoBERTConfig: attention_backend {attention_backend!r} is not one of {ATTENTION_BACKENDS}"
            )
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings or max_length or 4096
        self.norm_eps = norm_eps
        self.embedding_init_range = embedding_init_range
        self.decoder_init_range = decoder_init_range
        self.classifier_init_range = classifier_init_range
        self.classifier_dropout = classifier_dropout
        self.rope_theta = rope_theta
        self.rope_parameters = rope_parameters
        self.attention_backend = attention_backend
        self.dim_head = head_dim
        _check_rope_scaling(kwargs.get("rope_scaling") or rope_parameters)
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        self._finish_rope_parameters()

    @property
    def head_dim(self) -> int:
        """Size of one attention head (``hidden_size // num_attention_heads``)."""
        return self.hidden_size // self.num_attention_heads

    def _finish_rope_parameters(self) -> None:
        self.rope_parameters = self.rope_parameters or {}
        self.rope_parameters.setdefault("rope_type", "default")
        self.rope_parameters.setdefault("rope_theta", self.rope_theta)
        if self.rope_parameters["rope_type"] == "yarn":
            self.rope_parameters.setdefault("original_max_position_embeddings",
                                            self.max_position_embeddings)


def _check_rope_scaling(parameters: dict[str, Any] | None) -> None:
    """Reject unsupported RoPE scaling before transformers' own (KeyError-raising) validation."""
    if not parameters:
        return
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UserInputError(
            f"NeoBERTConfig: rope_scaling/rope_parameters rope_type {rope_type!r} is not one of "
            f"{SUPPORTED_ROPE_TYPES}"
        )
    if rope_type != "default" and not parameters.get("factor"):
        raise UserInputError(
            f"NeoBERTConfig: rope_scaling of type {rope_type!r} needs a 'factor' > 1 "
            '(e.g. {"rope_type": "yarn", "factor": 2.0})'
        )


register_unless_circular()  # last: the classes above exist now (see neobert_embed.registration)
