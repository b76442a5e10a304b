"""The server's model when it is an export run without torch: :class:`~neobert_embed.serve.engine.Embedder`'s
methods over a :class:`~neobert_embed.inference.light.LightModel`.

Why: ``serve --backend onnx|openvino`` should start without importing torch, transformers or
sentence-transformers (~7 s on a 2-core machine), yet reuse the app, the dynamic batcher and the
index registry unchanged. They call the engine's methods only, so this class gives them the same
ones: token counts (the model's tokenizer, untruncated), the prompt rule, and one forward pass per
distinct prompt of a merged batch. The graph runs padded (NeoBERT's export included), so the
batcher keeps its padded-model fill rule.

Example:
    >>> engine = LightEmbedder(load_inference_model("runs/minilm-onnx", backend="onnx"), "minilm")
    >>> engine.forward(["a cat", "a dog"], [None, "query: "]).shape
    (2, 384)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from neobert_embed.inference.runtime import InferenceModel

if TYPE_CHECKING:
    from neobert_embed.inference.light import LightModel


class LightEmbedder:
    """An exported model for the server; ``forward`` and ``count_tokens`` are safe from any thread
    (the light tokenizer is never changed while in use)."""

    unpads = False  # the exported graph computes over the padded batch

    def __init__(self, served: InferenceModel, name: str) -> None:
        self.served = served
        self.model: LightModel = served.model  # type: ignore[assignment]  (backend onnx/openvino)
        self.name = name
        self.dimension = int(self.model.get_embedding_dimension())

    @property
    def max_seq_length(self) -> int:
        """Inputs are truncated to this many tokens (the model's, or a shorter ``--max-input-tokens``)."""
        return self.model.max_seq_length

    def set_max_seq_length(self, length: int) -> None:
        """Truncate inputs at ``length`` tokens (a ``--max-input-tokens`` below the model's own)."""
        self.model.max_seq_length = int(length)

    @property
    def normalizes(self) -> bool:
        """True when the model's pipeline ends in a Normalize module (its outputs are unit vectors)."""
        return self.model.normalizes

    def prompt_for(self, prompt_name: str | None) -> str | None:
        """The prompt ``encode(prompt_name=...)`` would use; None means the model's default prompt."""
        from neobert_embed.sentence import resolve_prompt

        return resolve_prompt(self.model, prompt_name, required="prompt_name") or None

    def count_tokens(self, texts: Sequence[str], prompt: str | None, *, on_loop: bool = False) -> list[int]:
        """Tokens of each (prompted) text with special tokens, before truncation (``on_loop``: accepted
        for the app, which passes it; any thread may count here)."""
        return self.model.tokenizer.count([prompt + text for text in texts] if prompt else list(texts))

    def forward(self, texts: Sequence[str], prompts: Sequence[str | None]) -> np.ndarray:
        """Embed ``texts`` (``prompts[i]`` is text i's prompt) in one pass per distinct prompt; float32
        (n, dimension) in input order."""
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        groups: dict[str | None, list[int]] = {}
        for row, prompt in enumerate(prompts):
            groups.setdefault(prompt, []).append(row)
        for prompt, rows in groups.items():
            out[rows] = self.model.embed([texts[r] for r in rows], prompt)
        return out
