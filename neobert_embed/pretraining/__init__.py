"""MLM pretraining of NeoBERT on DeepSpeed (``neobert-embed pretrain``).

Public API (imported lazily so ``neobert-embed --help`` stays instant):

Example:
    >>> from neobert_embed.pretraining import load_pretrain_recipe, prepare_corpus, pretrain, export_checkpoint
    >>> corpus = prepare_corpus("docstrings.jsonl", "runs/prepared", tokenizer="train", vocab_size=4096)
    >>> result = pretrain(load_pretrain_recipe("recipes/pretrain-tiny.yaml"), corpus.path, "runs/tiny")
    >>> export_checkpoint("runs/tiny", "models/neobert-tiny")
"""

from __future__ import annotations

from neobert_embed.lazy import lazy_exports

_EXPORTS = {
    "load_pretrain_recipe": "neobert_embed.pretraining.recipe",
    "PretrainRecipe": "neobert_embed.pretraining.recipe",
    "prepare_corpus": "neobert_embed.pretraining.prepare",
    "load_prepared": "neobert_embed.pretraining.prepared",
    "pretrain": "neobert_embed.pretraining.train",
    "PretrainResult": "neobert_embed.pretraining.train",
    "export_checkpoint": "neobert_embed.pretraining.export",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
