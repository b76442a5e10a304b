"""Un-padded training of a SentenceTransformer: each step's texts as one flat token stream.

Why: a padded batch runs every Linear layer, norm and feed-forward block, forward and backward, on
pad tokens; on mixed-length data (SNLI sentences beside AG News articles) that is a third to a half
of the work. sentence-transformers has the whole un-padded path already (its ``Transformer`` module
flattens the tokenized texts with ``DataCollatorWithFlattening``: ``input_ids`` (1, tokens),
``position_ids`` restarting per text, ``cu_seq_lens_q`` offsets; its pooling reads each text's own
tokens; its GradCache slices mini-batches of the stream), but switches it on only with a flash-attn
kernel. :func:`training_layout` switches it on for the kernels every device has
(:mod:`neobert_embed.modeling.flat_attention`: grouped SDPA on a CPU, PyTorch's ``varlen_attn`` on a
CUDA GPU), for the five backbones of the recipe: BERT, RoBERTa (and XLM-R), NomicBERT and
ModernBERT through transformers' attention interface, NeoBERT through its own forward (which takes
``cu_seq_lens_q``). Every loss (MNRL, CachedMNRL, Matryoshka, cross-device negatives) calls the
model's forward, so all of them train on the stream.

``unpadded=False`` pads every batch as sentence-transformers does (NeoBERT: its reference padded
attention), for comparisons.

Example:
    >>> with training_layout(sentence_model, unpadded=True) as layout:
    ...     print(layout.announcement)
    ...     trainer.train()
    batches: un-padded (one flat token stream per step; attention kernel sdpa_varlen on cpu)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from neobert_embed.backbones import first_position

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

#: What the flattening collator adds to each text column, beyond ``input_ids`` and ``position_ids``.
STREAM_KEYS = frozenset({"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"})


@dataclass(frozen=True)
class BatchLayout:
    """How a run feeds its texts to the encoder: ``unpadded`` or not, and the attention kernel."""

    unpadded: bool
    kernel: str
    device: str

    @property
    def announcement(self) -> str:
        if self.unpadded:
            return (f"batches: un-padded (one flat token stream per step; attention kernel {self.kernel} "
                    f"on {self.device})")
        return f"batches: padded to each batch's longest text (attention kernel {self.kernel} on {self.device})"


def streams_texts(encoder: PreTrainedModel) -> bool:
    """Whether ``encoder`` can take a flat token stream: NeoBERT, or a model calling its attention
    through transformers' attention interface (``_supports_attention_backend``).

    Example:
        >>> streams_texts(BertModel(BertConfig()))
        True
    """
    from neobert_embed.modeling.model import NeoBERTPreTrainedModel

    return isinstance(encoder, NeoBERTPreTrainedModel) or bool(getattr(encoder, "_supports_attention_backend", False))


def _is_neobert(encoder: PreTrainedModel) -> bool:
    from neobert_embed.modeling.model import NeoBERTPreTrainedModel

    return isinstance(encoder, NeoBERTPreTrainedModel)


def _layout(encoder: PreTrainedModel, unpadded: bool, device: str, dtype: torch.dtype) -> BatchLayout:
    import torch

    from neobert_embed.modeling.flat_attention import flat_kernel

    config = encoder.config
    if not unpadded:
        kernel = "padded" if _is_neobert(encoder) else config._attn_implementation
        return BatchLayout(False, kernel, device)
    head_dim = config.hidden_size // config.num_attention_heads
    dropout = float(getattr(config, "attention_probs_dropout_prob", getattr(config, "attention_dropout", 0.0)) or 0.0)
    return BatchLayout(True, flat_kernel(torch.device(device), dtype, head_dim, dropout), device)


@contextlib.contextmanager
def training_layout(model: SentenceTransformer, unpadded: bool = True, *, device: str | None = None,
                    autocast_dtype: torch.dtype | None = None) -> Iterator[BatchLayout]:
    """Run ``model``'s batches un-padded (or padded) inside the block; restore it as it was after.

    ``device`` (``cpu``, ``cuda``; default: where the weights are now) and ``autocast_dtype`` (bf16
    under autocast; default: the weights' dtype) are where and how the steps will run, for naming the
    kernel (the kernel itself is chosen per forward). An encoder that cannot take a stream (say MPNet)
    trains padded, with a warning.

    Example:
        >>> with training_layout(model, unpadded=True) as layout:
        ...     trainer.train()
    """
    transformer = model[0]
    encoder = transformer.auto_model
    device = device or next(encoder.parameters()).device.type
    dtype = autocast_dtype or next(encoder.parameters()).dtype
    if unpadded and not streams_texts(encoder):
        logger.warning("%s does not call its attention through transformers' attention interface; training padded",
                       type(encoder).__name__)
        unpadded = False
    layout = _layout(encoder, unpadded, device, dtype)
    with contextlib.ExitStack() as stack:
        if _is_neobert(encoder):
            stack.enter_context(_neobert_backend(encoder, "auto" if unpadded else "padded"))
        elif unpadded:
            stack.enter_context(_attention_implementation(encoder))
        if unpadded:
            stack.enter_context(_flat_stream(transformer, first_position(encoder.config)))
        yield layout


@contextlib.contextmanager
def _neobert_backend(encoder: PreTrainedModel, backend: str) -> Iterator[None]:
    previous = encoder.config.attention_backend
    if previous not in ("auto", "varlen") or backend == "padded":  # a kernel asked for by name is kept
        encoder.config.attention_backend = backend if backend == "padded" else previous
    try:
        yield
    finally:
        encoder.config.attention_backend = previous


@contextlib.contextmanager
def _attention_implementation(encoder: PreTrainedModel) -> Iterator[None]:
    from neobert_embed.modeling.flat_attention import register_flat_attention

    previous = encoder.config._attn_implementation
    encoder.set_attn_implementation(register_flat_attention())
    try:
        yield
    finally:
        encoder.set_attn_implementation(previous)


@contextlib.contextmanager
def _flat_stream(transformer: Transformer, position_offset: int) -> Iterator[None]:
    """Switch on sentence-transformers' own flattening in its ``Transformer`` module.

    The one place that sets the module's flattening state (``can_flatten_inputs``, ``data_collator``,
    ``model_forward_params`` and the private ``_flatten_position_offset``, which its ``preprocess``
    reads); ``tests/test_unpadded_training.py`` fails if sentence-transformers stops reading them.
    """
    from transformers import DataCollatorWithFlattening

    names = ("can_flatten_inputs", "data_collator", "model_forward_params", "_flatten_position_offset")
    missing = object()
    saved = {name: getattr(transformer, name, missing) for name in names}
    params = transformer.model_forward_params
    transformer.data_collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)
    transformer.model_forward_params = None if params is None else set(params) | STREAM_KEYS
    transformer._flatten_position_offset = position_offset
    transformer.can_flatten_inputs = True
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(transformer, name)
            else:
                setattr(transformer, name, value)
