"""The paper's InfoNCE loss, built from sentence-transformers' ranking losses.

Why wrap instead of rewrite: ``MultipleNegativesRankingLoss`` with ``scale = 1 / temperature``
already computes exactly the paper's objective: the cosine similarity of every query with every
positive *and every hard negative* of the batch, divided by the temperature, under one softmax
per query (``directions=("query_to_doc",)``, ``partition_mode="joint"``). Adding the
``doc_to_query`` direction with ``per_direction`` partitions gives the symmetric variant (the mean
of both cross-entropies); the cached class is the GradCache version with identical values; and
``MatryoshkaLoss`` sums the loss over truncated embedding sizes. The tests check these claims
against an independent computation.

Example:
    >>> loss = build_contrastive_loss(model, ContrastiveRecipe(temperature=0.05, cached=True))
    >>> loss(features, labels=None)   # inside SentenceTransformerTrainer
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neobert_embed.contrastive.recipe import ContrastiveRecipe
from neobert_embed.errors import UserInputError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from torch import nn

DEFAULT_MINI_BATCH = 32


def build_contrastive_loss(model: SentenceTransformer, recipe: ContrastiveRecipe) -> nn.Module:
    """InfoNCE (cosine / temperature) with the recipe's options: symmetric, cached, Matryoshka.

    Example:
        >>> build_contrastive_loss(model, ContrastiveRecipe()).temperature
        0.07
    """
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MatryoshkaLoss,
        MultipleNegativesRankingLoss,
    )

    kwargs = {
        "scale": 1.0 / recipe.temperature,
        "directions": ("query_to_doc", "doc_to_query") if recipe.symmetric else ("query_to_doc",),
        "partition_mode": "per_direction" if recipe.symmetric else "joint",
        "gather_across_devices": recipe.gather_across_devices,
    }
    if recipe.cached:
        loss = CachedMultipleNegativesRankingLoss(
            model, mini_batch_size=recipe.mini_batch_size or DEFAULT_MINI_BATCH,
            mini_batch_num_tokens=recipe.mini_batch_tokens, **kwargs)
    else:
        loss = MultipleNegativesRankingLoss(model, **kwargs)
    if recipe.matryoshka_dims:
        width = model.get_embedding_dimension()
        too_wide = [d for d in recipe.matryoshka_dims if d > width]
        if too_wide:
            raise UserInputError(f"recipe key 'matryoshka_dims': {too_wide} exceed the model's embedding "
                                 f"size {width}")
        loss = MatryoshkaLoss(model, loss, matryoshka_dims=list(recipe.matryoshka_dims))
    return loss
