"""The model the toolkit hands users and third-party libraries: a ``SentenceTransformer`` whose ``encode``
runs the toolkit's engine.

Why a subclass: mteb, sentence-transformers' utilities (``mine_hard_negatives``, evaluators) and user
code call ``model.encode`` / ``encode_query`` / ``encode_document``. The loader builds this class
(:func:`~neobert_embed.inference.runtime.load_inference_model`, :func:`neobert_embed.load`), so those
calls get the tokenize-ahead, length-batched loop of :mod:`neobert_embed.inference.pipeline` without
any method being replaced on an instance. A call the engine does not handle goes to
sentence-transformers' own ``encode`` by one visible rule (:func:`~neobert_embed.inference.pipeline.pipelined`:
an argument outside :data:`~neobert_embed.inference.pipeline.PIPELINED_DEFAULTS` and
:data:`~neobert_embed.inference.pipeline.HANDLED_ARGUMENTS`, or a value under which rows depend on each
other), which names what it does not know.

Example:
    >>> model = neobert_embed.load("sentence-transformers/all-MiniLM-L6-v2", precision="fp32")
    >>> model.encode_query(["how do I reset my password?"]).shape
    (1, 384)
"""

from __future__ import annotations

from sentence_transformers import SentenceTransformer

from neobert_embed.inference.pipeline import pipelined_encode


class EmbeddingModel(SentenceTransformer):
    """A ``SentenceTransformer`` that encodes lists of texts through the engine its loader attached
    (:func:`~neobert_embed.inference.pipeline.install`); saved and reloaded as any SentenceTransformer."""

    def encode(self, inputs=None, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201  (sentence-transformers' signature)
        return pipelined_encode(self, inputs, *args, **kwargs)
