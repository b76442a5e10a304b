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

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from neobert_embed.errors import UserInputError
from neobert_embed.index.manifest import IndexManifest
from neobert_embed.inference.runtime import fingerprints_match, model_fingerprint
from neobert_embed.model_files import CheckedModel
from neobert_embed.sentence import DOCUMENT_PROMPT, QUERY_PROMPT, resolve_prompt

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from neobert_embed.inference.light import LightModel
    from neobert_embed.inference.runtime import PrecisionChoice

PROMPT_KINDS = (QUERY_PROMPT, DOCUMENT_PROMPT)
SUPPORTED_SIMILARITIES = ("cosine", "dot")


def _revision(model: SentenceTransformer) -> str | None:
    auto_model = getattr(model[0], "auto_model", None)
    return getattr(getattr(auto_model, "config", None), "_commit_hash", None)


@dataclass
class Truncation:
    """What encoding whole documents cut: how many were longer than the model's window, and how many of their
    tokens lay past it (None when the tokenizer does not say), summed over a build's chunks.

    Example:
        >>> cut = Truncation()
        >>> cut.add_documents(2); cut.add_tokens(700)
        >>> cut.warning(10, 256)[:60]
        "2 of 10 documents are longer than the model's window (256 to"
    """

    documents: int = 0
    tokens: int | None = 0

    def add_documents(self, count: int) -> None:
        self.documents += count

    def add_tokens(self, count: int | None) -> None:
        self.tokens = None if self.tokens is None or count is None else self.tokens + count

    def warning(self, total: int, window: int) -> str | None:
        """The line ``index build`` prints when documents were cut (None when none was)."""
        if not self.documents:
            return None
        lost = f"{self.tokens:,} tokens past it are" if self.tokens is not None else "the text past it is"
        return (f"{self.documents:,} of {total:,} documents are longer than the model's window ({window} tokens) "
                f"and were cut there: {lost} not indexed and cannot be found; pass --passages to index every "
                "token (overlapping passages, documents ranked by their best one)")


@dataclass
class IndexEncoder:
    """A loaded model (a SentenceTransformer, or an export's light model) plus what the manifest needs
    to know about it."""

    model: SentenceTransformer | LightModel
    name: str
    path: str | None
    revision: str | None
    fingerprint: str
    similarity: str
    prompts: dict[str, str] = field(default_factory=dict)
    batch_size: int = 32
    choice: PrecisionChoice | None = None
    #: while set (``index build``), what :meth:`encode_in_length_order` cut at the window is counted here
    truncation: Truncation | None = None

    @property
    def compute_precision(self) -> str:
        """The precision the model's forward runs in (``fp32`` when nothing else was applied)."""
        return self.choice.precision if self.choice is not None else "fp32"

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
        # None only for an index whose manifest predates recording every side: the model's default then, as at build
        vectors = self.model.encode(texts, batch_size=self.batch_size, prompt=self.prompts.get(kind),
                                    normalize_embeddings=self.normalized, convert_to_numpy=True,
                                    show_progress_bar=False)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_in_length_order(self, texts: list[str], kind: str,
                               advance: Callable[[int], None] | None = None) -> np.ndarray:
        """Encode a chunk through the model's pipeline (tokenized once and ahead, length-batched,
        :mod:`neobert_embed.inference.pipeline`), reporting progress as its parts are done.

        Example:
            >>> encoder.encode_in_length_order(chunk_texts, "document", advance=bar.advance).shape
            (8192, 384)
        """
        from neobert_embed.inference.pipeline import encode, engine_of
        from neobert_embed.sentence import resolve_prompt

        prompt = self.prompts.get(kind)  # None (an old manifest): the model's default, as encode applies it
        prompt = resolve_prompt(self.model, None) if prompt is None else prompt
        cut = self.truncation
        counted = dict(on_truncated=cut.add_documents, on_lost_tokens=cut.add_tokens) if cut is not None else {}
        return encode(engine_of(self.model), texts, prompt=prompt or None, batch_size=self.batch_size,
                           normalize=self.normalized, advance=advance, **counted)

    def matches(self, manifest: IndexManifest) -> bool:
        """Whether this is the model the index was built with: its fingerprint (weights, pooling, normalization,
        tokenizer: :func:`~neobert_embed.inference.runtime.model_fingerprint`) and dimension.

        Example:
            >>> encoder.matches(read_manifest("runs/news-index"))
            True
        """
        return fingerprints_match(manifest.model_fingerprint, self.fingerprint) and self.dimension == manifest.dimension

    def check_matches(self, manifest: IndexManifest, index_dir: str | Path) -> None:
        """Refuse to use this model with an index built by another one.

        Example:
            >>> encoder.check_matches(read_manifest("runs/news-index"), "runs/news-index")
        """
        if self.matches(manifest):
            return
        raise UserInputError(
            f"{index_dir}: this index was built with model {manifest.model!r} (fingerprint "
            f"{manifest.model_fingerprint}, {manifest.dimension}-d) but the model given is "
            f"{self.name!r} (fingerprint {self.fingerprint}, {self.dimension}-d): its vectors are not "
            "comparable. Search with the model the index was built with, or rebuild the index "
            "with this model."
        )


def load_encoder(name_or_path: str | Path | CheckedModel, *, device: str | None = None, batch_size: int = 32,
                 max_seq_length: int | None = None, revision: str | None = None, precision: str = "auto",
                 sample_texts: list[str] | None = None,
                 agree: Callable[[Callable[[], PrecisionChoice]], PrecisionChoice] | None = None,
                 backend: str | None = None) -> IndexEncoder:
    """Load a model for indexing at compute ``precision`` and read its prompts and similarity.

    The fingerprint is of the fp32 weights as saved, so the same model matches its index whatever
    precision it computes in; ``auto`` measures on ``sample_texts`` (a few of the corpus's texts),
    once for all ranks when ``agree`` is given (see :func:`~neobert_embed.inference.runtime.load_inference_model`).
    ``backend`` None runs a ``neobert-embed export`` directory on its own runtime without torch
    (:mod:`neobert_embed.inference.light`; its fingerprint is that of the weights it was exported
    from, so it matches their index) and any other model on torch.

    Example:
        >>> encoder = load_encoder("sentence-transformers/all-MiniLM-L6-v2", batch_size=64, precision="fp32")
        >>> encoder.similarity, encoder.prompts
        ('cosine', {})
    """
    from neobert_embed.inference.light import exported_runtime
    from neobert_embed.inference.runtime import load_inference_model

    backend = backend or exported_runtime(str(name_or_path)) or "torch"
    source = name_or_path if isinstance(name_or_path, CheckedModel) else str(name_or_path)
    loaded = load_inference_model(source, precision, device=device, max_seq_length=max_seq_length,
                                  revision=revision, sample_texts=sample_texts, batch_size=batch_size,
                                  fingerprint=True, agree=agree, backend=backend)
    model = loaded.model
    if backend != "torch" and loaded.fingerprint is None:
        raise UserInputError(f"{name_or_path}: this export does not record the fingerprint of the weights it came "
                             "from (it predates it), so no index can tell whether it matches; export the model "
                             "again with `neobert-embed export MODEL --output DIR --overwrite`")
    similarity = getattr(model, "similarity_fn_name", None) or "cosine"
    if similarity not in SUPPORTED_SIMILARITIES:
        raise UserInputError(f"model {name_or_path!r} uses {similarity!r} similarity; indexes support "
                             f"{' and '.join(SUPPORTED_SIMILARITIES)} models")
    local = Path(str(name_or_path))
    return IndexEncoder(
        model=model,
        name=str(name_or_path),
        path=str(local.resolve()) if local.exists() else None,
        revision=revision or (_revision(model) if backend == "torch" else None),
        fingerprint=loaded.fingerprint or model_fingerprint(model),
        similarity=similarity,
        prompts={kind: resolve_prompt(model, kind) for kind in PROMPT_KINDS},  # '' = none, recorded as such
        batch_size=batch_size,
        choice=loaded.choice,
    )
