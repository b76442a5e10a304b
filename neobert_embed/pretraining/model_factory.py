"""The NeoBERT that a recipe pretrains: fresh from sizes, or continued from earlier weights.

Example:
    >>> model = build_mlm_model(recipe, tokenizer)
    >>> type(model).__name__
    'NeoBERTForMaskedLM'
"""

from __future__ import annotations

import torch

from neobert_embed.errors import UserInputError
from neobert_embed.pretraining.recipe import PretrainRecipe


def build_mlm_model(recipe: PretrainRecipe, tokenizer):
    """A ``NeoBERTForMaskedLM`` for ``recipe``, its vocabulary checked against ``tokenizer``."""
    from transformers import AutoModelForMaskedLM

    from neobert_embed.modeling import NeoBERTConfig, NeoBERTForMaskedLM

    spec = recipe.model
    torch.manual_seed(recipe.training.seed)
    if spec.init_from:
        try:
            model = AutoModelForMaskedLM.from_pretrained(spec.init_from)
        except (OSError, ValueError) as exc:
            raise UserInputError(f"model.init_from {spec.init_from!r}: cannot load a masked-LM model "
                                 f"({str(exc).splitlines()[0]})") from None
        if not isinstance(model, NeoBERTForMaskedLM):
            raise UserInputError(f"model.init_from {spec.init_from!r} is a {type(model).__name__}, "
                                 "not NeoBERT; pretraining continues NeoBERT models only")
        if spec.max_length:
            model.config.max_position_embeddings = spec.max_length
        model.config.attention_backend = spec.attention_backend
    else:
        config = NeoBERTConfig(
            hidden_size=spec.hidden_size, num_hidden_layers=spec.num_hidden_layers,
            num_attention_heads=spec.num_attention_heads, intermediate_size=spec.intermediate_size,
            vocab_size=len(tokenizer), max_position_embeddings=spec.max_length or recipe.data.seq_length,
            pad_token_id=tokenizer.pad_token_id, attention_backend=spec.attention_backend)
        model = NeoBERTForMaskedLM(config)
    if len(tokenizer) > model.config.vocab_size:
        raise UserInputError(f"the corpus tokenizer has {len(tokenizer)} tokens but the model only "
                             f"{model.config.vocab_size}; prepare the corpus with the model's tokenizer")
    return model
