"""Model-agnostic contrastive fine-tuning: any BERT-family encoder → embedding model.

Example:
    >>> from neobert_embed.contrastive import load_contrastive_recipe, train_contrastive
    >>> recipe = load_contrastive_recipe("recipes/contrastive.yaml", max_steps=20)
    >>> out_dir = train_contrastive(model="bert", data={"snli": "triplets.jsonl"}, output="runs/x",
    ...                             recipe=recipe)
"""

from neobert_embed.contrastive.recipe import ContrastiveRecipe, DataSource, load_contrastive_recipe
from neobert_embed.contrastive.train import train_contrastive

__all__ = ["ContrastiveRecipe", "DataSource", "load_contrastive_recipe", "train_contrastive"]
