"""The one model of a server process, whatever runs it: prompts, one tokenization per request, batched forwards.

Why: every request must be encoded exactly as ``SentenceTransformer.encode`` would encode it (the
model's own prompts, max_seq_length, pooling and Normalize module), yet requests from many clients
share one forward pass. Both runtimes stand behind one
:class:`~neobert_embed.inference.pipeline.Engine` (the torch pipeline, or the light runtime of an
export), so the server has one engine: a request is tokenized once when it comes
(:meth:`Embedder.tokenize`: its token counts and the ids the forward reads), and the batcher's merged
rows go to the engine's ``forward`` in one pass per prompt present. An engine that un-pads (NeoBERT,
the BERT family's un-padded layers) is filled by real tokens, as text-embeddings-inference does.

Example:
    >>> engine = Embedder(load_inference_model("sentence-transformers/all-MiniLM-L6-v2", "fp32"), "minilm")
    >>> rows = engine.tokenize(["a cat", "a dog"], engine.prompt_for(None))
    >>> rows.lengths.tolist()
    [4, 4]
    >>> engine.forward([(rows, 0), (rows, 1)], [None, None]).shape
    (2, 384)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from neobert_embed.inference.pipeline import Engine, engine_of
from neobert_embed.inference.runtime import InferenceModel
from neobert_embed.inference.tokenized import Tokenized

#: One row of a tokenized request: the request's tokens and the row's index in them.
Row = tuple[Tokenized, int]


class Embedder:
    """The served model: ``tokenize`` is safe from any thread; ``forward`` runs on the batcher's one
    model thread."""

    def __init__(self, served: InferenceModel, name: str) -> None:
        self.served = served
        self.model = served.model
        self.name = name
        self.engine: Engine = engine_of(served.model)
        self.dimension = int(self.engine.dimension)

    @property
    def max_seq_length(self) -> int:
        """Inputs are truncated to this many tokens (the model's, or a shorter ``--max-input-tokens``)."""
        return int(self.engine.max_seq_length)

    def set_max_seq_length(self, length: int) -> None:
        """Truncate inputs at ``length`` tokens (a ``--max-input-tokens`` below the model's own; at start-up)."""
        self.engine.max_seq_length = int(length)

    @property
    def normalizes(self) -> bool:
        """True when the model's pipeline ends in a Normalize module (its outputs are unit vectors)."""
        return self.engine.normalizes

    @property
    def unpads(self) -> bool:
        """True when the encoder skips pad tokens itself, so mixed lengths cost no padding."""
        return self.engine.unpads

    def prompt_for(self, prompt_name: str | None) -> str | None:
        """The prompt ``encode(prompt_name=...)`` would use; None means the model's default prompt.

        Example:
            >>> engine.prompt_for("query")
            'query: '
        """
        from neobert_embed.sentence import resolve_prompt

        return resolve_prompt(self.model, prompt_name, required="prompt_name") or None

    def tokenize(self, texts: Sequence[str], prompt: str | None) -> Tokenized:
        """A request's texts with ``prompt``, tokenized once as ``encode`` would (truncated at
        ``max_seq_length``; ``cut`` says which were longer).

        Example:
            >>> engine.tokenize(["hello world", "word " * 600], None).lengths.tolist()
            [4, 256]
        """
        return self.engine.tokenize(list(texts), prompt)

    def forward(self, rows: Sequence[Row], prompts: Sequence[str | None]) -> np.ndarray:
        """Embed tokenized ``rows`` (``prompts[i]`` is row i's prompt) in one pass per distinct prompt.

        Returns the model's sentence embeddings as float32 (n, dimension), in input order.
        """
        out = np.empty((len(rows), self.dimension), dtype=np.float32)
        groups: dict[str | None, list[int]] = {}
        for index, prompt in enumerate(prompts):
            groups.setdefault(prompt, []).append(index)
        for members in groups.values():
            batch = Tokenized.gather([rows[index] for index in members])
            out[members] = self.engine.forward(batch.batch(np.arange(len(members))))
        return out
