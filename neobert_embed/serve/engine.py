"""The server's one engine, whatever runtime runs the model (torch, or an export's light runtime).

Why: requests must be encoded as ``SentenceTransformer.encode`` would (prompts, max_seq_length,
pooling, Normalize), yet share forward passes: a request is tokenized once when it comes, and the
batcher's merged rows run in one forward per prompt present.

Example:
    >>> engine = Embedder(load_inference_model("sentence-transformers/all-MiniLM-L6-v2", "fp32"))
    >>> rows = engine.tokenize(["a cat", "a dog"], engine.prompt_for(None))
    >>> engine.forward([(rows, 0), (rows, 1)], [None, None]).shape
    (2, 384)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from neobert_embed.errors import UserInputError
from neobert_embed.inference.pipeline import Engine, engine_of
from neobert_embed.inference.runtime import InferenceModel
from neobert_embed.inference.tokenized import Tokenized

#: One row of a tokenized request: the request's tokens and the row's index in them.
Row = tuple[Tokenized, int]


class Embedder:
    """The served model, truncating inputs at ``max_input_tokens`` (default: the model's max_seq_length):
    ``tokenize`` is safe from any thread; ``forward`` runs on the batcher's one model thread."""

    def __init__(self, served: InferenceModel, max_input_tokens: int | None = None) -> None:
        self.served, self.model = served, served.model
        self.engine: Engine = engine_of(served.model)
        self.dimension = int(self.engine.dimension)
        self.normalizes, self.unpads = self.engine.normalizes, self.engine.unpads
        own = int(self.engine.max_seq_length)
        if max_input_tokens is not None and max_input_tokens > own:
            raise UserInputError(f"--max-input-tokens {max_input_tokens} is more than the model's max_seq_length "
                                 f"{own}: the model cannot read longer inputs")
        self.max_seq_length = max_input_tokens or own
        if self.max_seq_length < own:  # the user asked for a shorter limit: truncation cuts there too
            self.engine.max_seq_length = self.max_seq_length

    def prompt_for(self, prompt_name: str | None) -> str | None:
        """The prompt ``encode(prompt_name=...)`` would use (None: the model's default): ``'query: '``."""
        from neobert_embed.sentence import resolve_prompt

        return resolve_prompt(self.model, prompt_name, required="prompt_name") or None

    def tokenize(self, texts: Sequence[str], prompt: str | None) -> Tokenized:
        """A request's texts with ``prompt``, tokenized once (``cut`` says which were truncated)."""
        return self.engine.tokenize(list(texts), prompt)

    def forward(self, rows: Sequence[Row], prompts: Sequence[str | None]) -> np.ndarray:
        """Embed ``rows`` (``prompts[i]`` is row i's) in one pass per distinct prompt, in input order."""
        out = np.empty((len(rows), self.dimension), dtype=np.float32)
        groups: dict[str | None, list[int]] = {}
        for index, prompt in enumerate(prompts):
            groups.setdefault(prompt, []).append(index)
        for members in groups.values():
            batch = Tokenized.gather([rows[index] for index in members])
            out[members] = self.engine.forward(batch.batch(np.arange(len(members))))
        return out
