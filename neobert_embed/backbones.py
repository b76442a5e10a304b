"""The backbone registry: the encoders the paper compares, as data.

Why: the fair comparison (contrastive fine-tuning, MTEB) must treat every backbone the same
way; the few things that legitimately differ (hub id, usable length, tokenizer quirks) are kept
here in one table instead of being scattered as ``if "roberta" in name`` checks.

Example:
    >>> BACKBONES["roberta"].hub_id
    'FacebookAI/roberta-base'
    >>> resolve_model_name("neobert")
    'chandar-lab/NeoBERT'
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Backbone:
    """One registered encoder.

    Attributes:
        key: short name used on the command line (``--model bert``).
        hub_id: Hugging Face hub id the weights come from.
        max_length: longest input the encoder was pretrained on (positions it can use).
        pooling: how token states become one vector; ``mean`` for every backbone (the paper).
        quirks: human-readable notes on tokenizer/model differences that code relies on.
        tokenizer_kwargs: extra arguments for the tokenizer (none needed today; kept for users).
    """

    key: str
    hub_id: str
    max_length: int
    pooling: str = "mean"
    quirks: tuple[str, ...] = ()
    tokenizer_kwargs: dict = field(default_factory=dict)


BACKBONES: dict[str, Backbone] = {
    b.key: b
    for b in (
        Backbone("bert", "google-bert/bert-base-uncased", 512,
                 quirks=("pad id 0", "uses token_type_ids")),
        Backbone("bert-large", "google-bert/bert-large-uncased", 512,
                 quirks=("pad id 0", "uses token_type_ids")),
        Backbone("roberta", "FacebookAI/roberta-base", 512,
                 quirks=("pad id 1", "positions offset by pad id: 514 slots, 512 usable",
                         "no token_type_ids")),
        Backbone("roberta-large", "FacebookAI/roberta-large", 512,
                 quirks=("pad id 1", "positions offset by pad id: 514 slots, 512 usable",
                         "no token_type_ids")),
        Backbone("nomicbert", "nomic-ai/nomic-bert-2048", 2048,
                 quirks=("native NomicBERT class in transformers 5 (no remote code)",
                         "bert-base-uncased tokenizer")),
        Backbone("modernbert", "answerdotai/ModernBERT-base", 8192,
                 quirks=("no token_type_ids", "pad id 50283")),
        Backbone("modernbert-large", "answerdotai/ModernBERT-large", 8192,
                 quirks=("no token_type_ids", "pad id 50283")),
        Backbone("neobert", "chandar-lab/NeoBERT", 4096,
                 quirks=("native class in neobert_embed (no remote code)",
                         "bert-base-uncased tokenizer: pad 0, [CLS] 101, [SEP] 102, [MASK] 103")),
    )
}


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
