"""neobert-embed: build and judge text-embedding models.

Importing the package is light (no torch, no transformers) and arranges for the NeoBERT
architecture to be registered with transformers' Auto classes as soon as transformers loads, so
``AutoModel.from_pretrained("chandar-lab/NeoBERT")`` works without ``trust_remote_code`` while
``neobert-embed --help`` answers at once (see :mod:`neobert_embed.registration`).

Example:
    >>> import neobert_embed
    >>> model = neobert_embed.load("sentence-transformers/all-MiniLM-L6-v2", precision="auto")
    >>> model.encode_query(["how do I reset my password?"]).shape
    (1, 384)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from neobert_embed.lazy import lazy_exports
from neobert_embed.registration import register_when_transformers_loads

if TYPE_CHECKING:
    from neobert_embed.inference.runtime import load
    from neobert_embed.sentence import load_sentence_model

register_when_transformers_loads()

__all__ = ["load", "load_sentence_model"]
__version__ = "0.1.0"

__getattr__ = lazy_exports(__name__, {"load": ".inference.runtime", "load_sentence_model": ".sentence"})
