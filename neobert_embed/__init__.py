"""neobert-embed: build and judge text-embedding models.

Importing the package registers the NeoBERT architecture with transformers' Auto classes, so
``AutoModel.from_pretrained("chandar-lab/NeoBERT")`` works without ``trust_remote_code``.

Example:
    >>> import neobert_embed
    >>> model = neobert_embed.load_sentence_model("neobert")
"""

from neobert_embed import modeling  # noqa: F401  (Auto-class registration)
from neobert_embed.sentence import load_sentence_model

__all__ = ["load_sentence_model"]
__version__ = "0.1.0"
