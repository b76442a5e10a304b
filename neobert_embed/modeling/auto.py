"""The one place NeoBERT is registered with transformers' Auto classes.

Why: registering ``model_type="neobert"`` with ``AutoConfig``, ``AutoModel``,
``AutoModelForMaskedLM`` and ``AutoModelForSequenceClassification`` lets the official checkpoint
load without ``trust_remote_code`` even though its ``config.json`` carries an ``auto_map`` to
remote code: transformers prefers a registered local class. Importing this module registers
(idempotently); :mod:`neobert_embed.registration` imports it as soon as transformers loads.

Example:
    >>> import neobert_embed.modeling.auto
    >>> from transformers import AutoModel
    >>> model = AutoModel.from_pretrained("chandar-lab/NeoBERT")   # our NeoBERTModel
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
)

from neobert_embed.modeling.configuration import NeoBERTConfig
from neobert_embed.modeling.model import (
    NeoBERTForMaskedLM,
    NeoBERTForSequenceClassification,
    NeoBERTModel,
)

AutoConfig.register("neobert", NeoBERTConfig, exist_ok=True)
AutoModel.register(NeoBERTConfig, NeoBERTModel, exist_ok=True)
AutoModelForMaskedLM.register(NeoBERTConfig, NeoBERTForMaskedLM, exist_ok=True)
AutoModelForSequenceClassification.register(NeoBERTConfig, NeoBERTForSequenceClassification, exist_ok=True)
