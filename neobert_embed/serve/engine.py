"""The one model instance of a server process: prompts, token counts and batched forward passes.

Why: every request must be encoded exactly as ``SentenceTransformer.encode`` would encode it (the
model's own prompts, max_seq_length, pooling and Normalize module), yet requests from many clients
share one forward pass. The forward pass therefore goes through the model's own ``preprocess`` and
modules, as ``encode`` does inside (:meth:`~neobert_embed.inference.pipeline.EncodePipeline.embed_batch`,
the bulk commands' pipeline), once per prompt present in a merged batch; NeoBERT and the BERT family
drop the padding of a mixed-length batch inside the model (their un-padded path).

Example:
    >>> engine = Embedder(load_inference_model("sentence-transformers/all-MiniLM-L6-v2", "fp32"), "minilm")
    >>> engine.count_tokens(["a cat"], engine.prompt_for(None))
    [4]
    >>> engine.forward(["a cat", "a dog"], [None, None]).shape
    (2, 384)
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from neobert_embed.inference.runtime import InferenceModel

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


class Embedder:
    """Wraps a loaded SentenceTransformer for the server (thread-confined: call ``forward`` from
    one worker thread only)."""

    def __init__(self, served: InferenceModel, name: str) -> None:
        self.served = served
        self.model: SentenceTransformer = served.model
        self.name = name
        # A private copy for counting in request threads: a fast tokenizer shared with the model
        # thread (which sets truncation on it) fails with "Already borrowed" under concurrency.
        self.counter = copy.deepcopy(self.model.tokenizer)
        self._count_lock = threading.Lock()
        self._loop_counter = copy.deepcopy(self.model.tokenizer)  # used by the event-loop thread only
        self.max_seq_length = int(self.model.max_seq_length)
        self.dimension = int(self.model.get_embedding_dimension())

    def set_max_seq_length(self, length: int) -> None:
        """Truncate inputs at ``length`` tokens (a ``--max-input-tokens`` below the model's own)."""
        self.model.max_seq_length = int(length)
        self.max_seq_length = int(length)

    @property
    def normalizes(self) -> bool:
        """True when the model's pipeline ends in a Normalize module (its outputs are unit vectors)."""
        return any(type(module).__name__ == "Normalize" for module in self.model)

    @property
    def unpads(self) -> bool:
        """True when the encoder skips pad tokens itself (NeoBERT), so mixed lengths cost no padding."""
        auto_model = getattr(self.model[0], "auto_model", None)
        return getattr(getattr(auto_model, "config", None), "model_type", None) == "neobert"

    def prompt_for(self, prompt_name: str | None) -> str | None:
        """The prompt ``encode(prompt_name=...)`` would use; None means the model's default prompt.

        Example:
            >>> engine.prompt_for("query")
            'query: '
        """
        from neobert_embed.sentence import resolve_prompt

        return resolve_prompt(self.model, prompt_name, required="prompt_name") or None

    def count_tokens(self, texts: Sequence[str], prompt: str | None, *, on_loop: bool = False) -> list[int]:
        """Tokens of each (prompted) text with special tokens, before truncation.

        Thread-safe; ``on_loop=True`` uses a tokenizer reserved for the event-loop thread (small
        requests are counted there: cheaper than a hop to a worker thread).

        Example:
            >>> engine.count_tokens(["hello world", ""], None)
            [4, 2]
        """
        full = [prompt + text for text in texts] if prompt else list(texts)
        kwargs = dict(add_special_tokens=True, truncation=False, return_attention_mask=False,
                      return_token_type_ids=False, verbose=False)
        if on_loop:
            return [len(row) for row in self._loop_counter(full, **kwargs)["input_ids"]]
        with self._count_lock:
            ids = self.counter(full, **kwargs)["input_ids"]
        return [len(row) for row in ids]

    def forward(self, texts: Sequence[str], prompts: Sequence[str | None]) -> np.ndarray:
        """Embed ``texts`` (``prompts[i]`` is text i's prompt) in one pass per distinct prompt.

        Returns the model's sentence embeddings as float32 (n, dimension), in input order.

        Example:
            >>> engine.forward(["what is faiss?", "FAISS is a library"], ["query: ", None]).shape
            (2, 384)
        """
        from neobert_embed.inference.pipeline import pipeline_for

        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        groups: dict[str | None, list[int]] = {}
        for row, prompt in enumerate(prompts):
            groups.setdefault(prompt, []).append(row)
        pipeline = pipeline_for(self.model)
        for prompt, rows in groups.items():
            out[rows] = pipeline.embed_batch([texts[r] for r in rows], prompt)
        return out
