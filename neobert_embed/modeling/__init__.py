"""NeoBERT as a native transformers architecture: config, encoder, MLM and classification heads.

The classes are loaded on first access, so modules of this package that need no torch (the
``convert`` command's options, say) keep the command line light. Any access to a class, like any
import of transformers after ``import neobert_embed``, registers NeoBERT with the Auto classes
(:mod:`neobert_embed.modeling.auto`).

Example:
    >>> from neobert_embed.modeling import NeoBERTConfig, NeoBERTModel
    >>> model = NeoBERTModel(NeoBERTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2))
"""

from __future__ import annotations

import importlib

from neobert_embed.lazy import lazy_exports

_HOMES = {
    "NeoBERTConfig": "neobert_embed.modeling.configuration",
    "NeoBERTForMaskedLM": "neobert_embed.modeling.model",
    "NeoBERTForSequenceClassification": "neobert_embed.modeling.model",
    "NeoBERTModel": "neobert_embed.modeling.model",
    "NeoBERTPreTrainedModel": "neobert_embed.modeling.model",
}

__all__ = sorted(_HOMES)

__getattr__ = lazy_exports(__name__, _HOMES, before=lambda: importlib.import_module("neobert_embed.modeling.auto"))
