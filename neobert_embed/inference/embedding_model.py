"""The model the toolkit hands users and third-party libraries (:class:`EmbeddingModel`).

Why a subclass: mteb, sentence-transformers' utilities (``mine_hard_negatives``, evaluators) and user code
call ``model.encode`` / ``encode_query`` / ``encode_document``; the loader builds this class, so those calls
get the toolkit's engine with no method replaced on an instance. A call the engine does not handle goes to
sentence-transformers' own ``encode`` by one visible rule (:func:`~neobert_embed.inference.pipeline.pipelined`).
"""

from __future__ import annotations

import torch
from sentence_transformers import SentenceTransformer

from neobert_embed.inference.kernels import AUTOCAST_DTYPES
from neobert_embed.inference.pipeline import DirectTokenizer, EngineOptions, encode, engine_of, pipelined


class EmbeddingModel(SentenceTransformer):
    """A ``SentenceTransformer`` that encodes lists of texts through its engine
    (:func:`~neobert_embed.inference.pipeline.engine_of`) and computes at its precision; saved and reloaded as
    any SentenceTransformer.

    Example:
        >>> model = neobert_embed.load("sentence-transformers/all-MiniLM-L6-v2", precision="fp32")
        >>> model.encode_query(["how do I reset my password?"]).shape
        (1, 384)
    """

    #: How the engine runs this model's batches, and its tokenizer decided at load (set by the loader).
    engine_options: EngineOptions | None = None
    direct_tokenizer: DirectTokenizer | None = None
    #: ``(device type, "bf16" | "fp16")``: the forward runs its matrix products under autocast
    #: (:func:`~neobert_embed.inference.runtime.apply_precision`); None: as the weights are.
    autocast: tuple[str, str] | None = None

    def forward(self, input, **kwargs):  # noqa: A002, ANN001, ANN003, ANN201  (sentence-transformers' signature)
        if self.autocast is None:
            return super().forward(input, **kwargs)
        device_type, precision = self.autocast
        with torch.autocast(device_type, dtype=AUTOCAST_DTYPES[precision]):
            output = super().forward(input, **kwargs)
        for key in ("sentence_embedding", "token_embeddings"):  # callers see the dtype they expect
            value = output.get(key)
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                output[key] = value.float()
        return output

    def encode(self, inputs=None, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN201  (sentence-transformers' signature)
        if args or not pipelined(self, inputs, kwargs):
            return super().encode(inputs, *args, **kwargs)
        if self.direct_tokenizer is None:  # built without the loader: decided on the first call, kept
            self.direct_tokenizer = DirectTokenizer(self)
        vectors = encode(engine_of(self), inputs, prompt=self._prompt(kwargs), batch_size=kwargs.get("batch_size", 32),
                         normalize=bool(kwargs.get("normalize_embeddings", False)))
        if kwargs.get("convert_to_tensor"):
            return torch.from_numpy(vectors)
        return vectors if kwargs.get("convert_to_numpy", True) else list(torch.from_numpy(vectors))

    def _prompt(self, kwargs: dict[str, object]) -> str | None:
        """The prompt ``encode`` would prepend: ``prompt``, else ``prompt_name``'s, else the model's default."""
        from neobert_embed.sentence import resolve_prompt

        if kwargs.get("prompt") is not None:
            return str(kwargs["prompt"])
        name = kwargs.get("prompt_name")
        return resolve_prompt(self, name if isinstance(name, str) else None, required="prompt_name") or None
