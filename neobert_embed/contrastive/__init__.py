"""Model-agnostic contrastive fine-tuning: any BERT-family encoder → embedding model.

Names load on first use, so the command line's ``--help`` stays light.

Example:
    >>> from neobert_embed.contrastive import load_contrastive_recipe, train_contrastive
    >>> recipe = load_contrastive_recipe("recipes/contrastive.yaml", max_steps=20)
    >>> out_dir = train_contrastive(model="bert", data={"snli": "triplets.jsonl"}, output="runs/x",
    ...                             recipe=recipe)
"""

from __future__ import annotations

from neobert_embed.lazy import lazy_exports

_EXPORTS = {"ContrastiveRecipe": ".recipe", "DataSource": ".recipe", "load_contrastive_recipe": ".recipe",
            "train_contrastive": ".train"}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
