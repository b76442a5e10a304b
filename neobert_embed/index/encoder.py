"""The model side of an index: loading, identifying and encoding with the right prompt.

Why: documents and queries must be encoded by the *same* weights, with the model's own
"document"/"query" prompts and the similarity it was trained for (cosine → normalized vectors and
inner product). A fingerprint of the weights, not the model's name, decides whether a model
matches an index: a path can be retrained in place, and two names can hold the same weights.

Example:
    >>> encoder = load_encoder("runs/my-embedder")
    >>> encoder.encode(["what is faiss?"], kind="query").shape
    (1, 384)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from neobert_embed.encoding import SLICE_BATCHES, encode_longest_first
from neobert_embed.errors import UserInputError
from neobert_embed.index.manifest import IndexManifest

PROMPT_KINDS = ("query", "document")
SUPPORTED_SIMILARITIES = ("cosine", "dot")


def model_fingerprint(model: Any) -> str:
    """Hash every parameter and buffer (names, shapes, dtypes, bytes) of a SentenceTransformer.

    Example:
        >>> model_fingerprint(load_sentence_model("runs/my-embedder"))
        'b1946ac92492d234'
    """
    import torch

    digest = hashlib.blake2b(digest_size=8)
    for name, tensor in model.state_dict().items():
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tuple(value.shape)}|{value.dtype}".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _revision(model: Any) -> str | None:
    auto_model = getattr(model[0], "auto_model", None)
    return getattr(getattr(auto_model, "config", None), "_commit_hash", None)


@dataclass
class IndexEncoder:
    """A loaded model plus what the manifest needs to know about it."""

    model: Any
    name: str
    path: str | None
    revision: str | None
    fingerprint: str
    similarity: str
    prompts: dict[str, str] = field(default_factory=dict)
    batch_size: int = 32

    @property
    def dimension(self) -> int:
        """Width of the sentence embeddings."""
        return int(self.model.get_embedding_dimension())

    @property
    def normalized(self) -> bool:
        """Cosine models get unit vectors so inner product equals cosine similarity."""
        return self.similarity == "cosine"

    def encode(self, texts: list[str], kind: str) -> np.ndarray:
        """Encode ``texts`` as ``kind`` ("query" or "document") into a float32 matrix.

        sentence-transformers sorts the texts by length inside this call, so each chunk is encoded
        length-sorted (less padding) and returned in the original order.

        Example:
            >>> encoder.encode(["first doc", "second doc"], kind="document").dtype
            dtype('float32')
        """
        vectors = self.model.encode(texts, batch_size=self.batch_size, prompt=self.prompts.get(kind),
                                    normalize_embeddings=self.normalized, convert_to_numpy=True,
                                    show_progress_bar=False)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_in_length_order(self, texts: list[str], kind: str,
                               advance: Callable[[int], None] | None = None) -> np.ndarray:
        """Encode a chunk longest-first in slices of ``SLICE_BATCHES`` batches, reporting progress.

        Why: sorting the whole chunk by length keeps padding as low as one ``encode`` call over the
        chunk would, while the slices let the progress bar move during a long chunk.

        Example:
            >>> encoder.encode_in_length_order(chunk_texts, "document", advance=bar.advance).shape
            (8192, 384)
        """
        return encode_longest_first(lambda part: self.encode(part, kind), texts, self.dimension,
                                    self.batch_size * SLICE_BATCHES, advance)

    def check_matches(self, manifest: IndexManifest, index_dir: str | Path) -> None:
        """Refuse to use this model with an index built by another one.

        Example:
            >>> encoder.check_matches(read_manifest("runs/news-index"), "runs/news-index")
        """
        if self.fingerprint == manifest.model_fingerprint and self.dimension == manifest.dimension:
            return
        raise UserInputError(
            f"{index_dir}: this index was built with model {manifest.model!r} (fingerprint "
            f"{manifest.model_fingerprint}, {manifest.dimension}-d) but the model given is "
            f"{self.name!r} (fingerprint {self.fingerprint}, {self.dimension}-d): its vectors are not "
            "comparable. Search with the model the index was built with, or rebuild the index "
            "with this model."
        )


def load_encoder(name_or_path: str | Path, *, device: str | None = None, batch_size: int = 32,
                 max_seq_length: int | None = None, revision: str | None = None) -> IndexEncoder:
    """Load a model for indexing and read its prompts and similarity.

    Example:
        >>> encoder = load_encoder("sentence-transformers/all-MiniLM-L6-v2", batch_size=64)
        >>> encoder.similarity, encoder.prompts
        ('cosine', {})
    """
    from neobert_embed.sentence import load_sentence_model

    model = load_sentence_model(str(name_or_path), max_seq_length, device=device, revision=revision)
    similarity = getattr(model, "similarity_fn_name", None) or "cosine"
    if similarity not in SUPPORTED_SIMILARITIES:
        raise UserInputError(f"model {name_or_path!r} uses {similarity!r} similarity; indexes support "
                             f"{' and '.join(SUPPORTED_SIMILARITIES)} models")
    local = Path(name_or_path)
    return IndexEncoder(
        model=model,
        name=str(name_or_path),
        path=str(local.resolve()) if local.exists() else None,
        revision=revision or _revision(model),
        fingerprint=model_fingerprint(model),
        similarity=similarity,
        prompts={kind: model.prompts[kind] for kind in PROMPT_KINDS if model.prompts.get(kind)},
        batch_size=batch_size,
    )
