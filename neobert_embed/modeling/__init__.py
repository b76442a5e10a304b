"""NeoBERT as a native transformers architecture: config, encoder, MLM and classification heads.

Importing this package registers ``model_type="neobert"`` with ``AutoConfig``, ``AutoModel``,
``AutoModelForMaskedLM`` and ``AutoModelForSequenceClassification`` (the only import-time side
effect), so the official checkpoint loads without ``trust_remote_code`` even though its
``config.json`` carries an ``auto_map`` to remote code: transformers prefers a registered local
class over remote code.

Example:
    >>> import neobert_embed.modeling
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
    NeoBERTPreTrainedModel,
)

AutoConfig.register("neobert", NeoBERTConfig, exist_ok=True)
AutoModel.register(NeoBERTConfig, NeoBERTModel, exist_ok=True)
AutoModelForMaskedLM.register(NeoBERTConfig, NeoBERTForMaskedLM, exist_ok=True)
AutoModelForSequenceClassification.register(NeoBERTConfig, NeoBERTForSequenceClassification, exist_ok=True)

__all__ = [
    "NeoBERTConfig",
    "NeoBERTForMaskedLM",
    "NeoBERTForSequenceClassification",
    "NeoBERTModel",
    "NeoBERTPreTrainedModel",
]
