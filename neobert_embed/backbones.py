"""The backbone registry: the encoders the paper compares, as data.

Why: the fair comparison (contrastive fine-tuning, MTEB) must treat every backbone the same
way; the few things that legitimately differ (hub id, usable length, RoBERTa's position offset)
are kept here as data instead of being scattered as ``if "roberta" in name`` checks.

Example:
    >>> BACKBONES["roberta"].hub_id
    'FacebookAI/roberta-base'
    >>> resolve_model_name("neobert")
    'chandar-lab/NeoBERT'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# Model types whose position ids start after the pad id (RoBERTa: 514 slots, 512 usable).
POSITIONS_AFTER_PAD = frozenset({"roberta", "xlm-roberta", "camembert"})


@dataclass(frozen=True)
class Backbone:
    """One registered encoder: ``key`` (``--model bert``), the ``hub_id`` of its weights and
    ``max_length``, the longest input it was pretrained on (all are mean-pooled, as in the paper)."""

    key: str
    hub_id: str
    max_length: int


BACKBONES: dict[str, Backbone] = {
    b.key: b
    for b in (
        Backbone("bert", "google-bert/bert-base-uncased", 512),
        Backbone("bert-large", "google-bert/bert-large-uncased", 512),
        Backbone("roberta", "FacebookAI/roberta-base", 512),
        Backbone("roberta-large", "FacebookAI/roberta-large", 512),
        Backbone("nomicbert", "nomic-ai/nomic-bert-2048", 2048),  # native NomicBERT class in transformers 5
        Backbone("modernbert", "answerdotai/ModernBERT-base", 8192),
        Backbone("modernbert-large", "answerdotai/ModernBERT-large", 8192),
        Backbone("neobert", "chandar-lab/NeoBERT", 4096),  # native class in neobert_embed, no remote code
    )
}


def usable_max_length(config: PretrainedConfig) -> int:
    """Longest input an encoder can take, from its config: its positions, less the pad offset of
    the :data:`POSITIONS_AFTER_PAD` families.

    Example:
        >>> from transformers import RobertaConfig
        >>> usable_max_length(RobertaConfig())
        512
    """
    positions = getattr(config, "max_position_embeddings", None) or 512
    if getattr(config, "model_type", "") in POSITIONS_AFTER_PAD:
        positions -= (getattr(config, "pad_token_id", 1) or 0) + 1
    return int(positions)


def first_position(config: PretrainedConfig) -> int:
    """The position id of a text's first token: after the pad id for the :data:`POSITIONS_AFTER_PAD`
    families (RoBERTa: 2), else 0 (what an un-padded stream's positions start from).

    Example:
        >>> from transformers import RobertaConfig
        >>> first_position(RobertaConfig(pad_token_id=1))
        2
    """
    if getattr(config, "model_type", "") in POSITIONS_AFTER_PAD:
        return (getattr(config, "pad_token_id", 1) or 0) + 1
    return 0


def resolve_model_name(name_or_path: str) -> str:
    """Map a registry key to its hub id; anything else (hub id, local path) passes through.

    Example:
        >>> resolve_model_name("bert")
        'google-bert/bert-base-uncased'
        >>> resolve_model_name("./runs/my-model")
        './runs/my-model'
    """
    backbone = BACKBONES.get(name_or_path)
    return backbone.hub_id if backbone else name_or_path
