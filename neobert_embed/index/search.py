"""``index search``: query an index with the model (and query prompt) it was built with.

Why: a query must be encoded exactly like the documents' counterpart at build time: same weights
(checked by fingerprint, a different model is refused), the manifest's "query" prompt, the same
normalization; and replaced documents must never come back.

Example:
    >>> with open_index("runs/news-index") as index:
    ...     for hit in index.search(["oil prices fall"], k=3)[0]:
    ...         print(hit.rank, round(hit.score, 3), hit.doc_id, hit.text[:40])
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from neobert_embed.errors import UserInputError
from neobert_embed.index.encoder import IndexEncoder, load_encoder
from neobert_embed.index.factory import IndexSpec, SearchableIndex, exclusion_selector, search_vectors
from neobert_embed.index.integrity import open_faiss, open_store
from neobert_embed.index.manifest import IndexManifest, read_manifest
from neobert_embed.index.rerank import with_rerank
from neobert_embed.sentence import QUERY_PROMPT


@dataclass(frozen=True)
class Hit:
    """One search result."""

    rank: int
    score: float
    doc_id: str
    title: str
    text: str


def spec_of(manifest: IndexManifest) -> IndexSpec:
    """The :class:`IndexSpec` an index was built with, as far as searching needs it."""
    tuned = next(iter(manifest.search_params), None)
    return IndexSpec(manifest.index_type, manifest.factory, manifest.precision, manifest.binary, tuned, 0)


def encoder_for(manifest: IndexManifest, directory: Path, model: str | Path | None = None,
                device: str | None = None, batch_size: int = 32, loaded: IndexEncoder | None = None,
                precision: str | None = None, backend: str | None = None) -> IndexEncoder:
    """Load the index's model (or ``model``), refuse it if its weights differ, use the saved prompts.

    ``loaded`` is an already-loaded model (a server's), checked like a loaded one. The model
    computes at ``precision``, by default the one the index's documents were encoded at (its
    manifest's ``compute_precision``), so queries and documents come from the same arithmetic.
    ``backend`` None runs an export (``neobert-embed export``) on its own runtime without torch, where
    the graph computes as saved (fp32 unless ``precision`` is int8): its fingerprint is that of the
    weights it was exported from, so an index built with those weights accepts it.

    Example:
        >>> encoder = encoder_for(read_manifest(d), d, model="runs/other")  # raises if different
    """
    if model is not None:
        name = str(model)
    elif manifest.model_path and Path(manifest.model_path).exists():
        name = manifest.model_path
    else:
        name = manifest.model
    from neobert_embed.inference.light import exported_runtime

    backend = backend or exported_runtime(name) or "torch"
    recorded = manifest.compute_precision if backend == "torch" else "auto"  # a graph computes as saved
    try:
        encoder = loaded or load_encoder(name, device=device, batch_size=batch_size,
                                         max_seq_length=manifest.max_seq_length, revision=manifest.model_revision,
                                         precision=precision or recorded, backend=backend)
    except UserInputError as exc:
        raise UserInputError(f"{directory}: cannot load the index's model: {exc}. If the model moved, "
                             "pass --model with its new location") from None
    encoder.check_matches(manifest, directory)
    encoder.prompts = dict(manifest.prompts)
    if loaded is None and precision is None and backend == "torch":  # the used: line says where it came from
        encoder.choice = replace(encoder.choice, requested="index",
                                 reason="the index's own, recorded at build")
    return encoder


class SearchIndex:
    """An opened index: FAISS vectors, the document store and the matching encoder."""

    def __init__(self, directory: str | Path, model: str | Path | None = None, device: str | None = None,
                 batch_size: int = 32, encoder: IndexEncoder | None = None, precision: str | None = None,
                 backend: str | None = None) -> None:
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        self.spec = spec_of(self.manifest)
        index = open_faiss(self.directory, self.manifest)  # before the model: fail fast
        self.faiss_index: SearchableIndex = with_rerank(index, self.directory, self.manifest.rerank_k_factor)
        self.store = open_store(self.directory, self.manifest)
        self.excluded = exclusion_selector(self.store.deleted_rows())  # once: its hash set is not free
        try:
            self.encoder = encoder_for(self.manifest, self.directory, model, device, batch_size, loaded=encoder,
                                       precision=precision, backend=backend)
        except BaseException:
            self.store.close()
            raise

    def __enter__(self) -> SearchIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the document store."""
        self.store.close()

    def search_vectors(self, vectors: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` (scores, FAISS rows) for already-encoded query vectors (-1 pads missing hits)."""
        return search_vectors(self.faiss_index, self.spec, vectors, k, self.manifest.search_params,
                              self.excluded)

    def search(self, queries: list[str], k: int = 10) -> list[list[Hit]]:
        """Encode ``queries`` with the query prompt and return their top-``k`` documents.

        Example:
            >>> index.search(["who won the match?"], k=1)[0][0].doc_id
            'n1043'
        """
        if k < 1:
            raise UserInputError(f"--k must be at least 1, got {k}")
        return self.hits(self.encoder.encode(list(queries), QUERY_PROMPT), k)

    def hits(self, vectors: np.ndarray, k: int = 10) -> list[list[Hit]]:
        """Top-``k`` documents for already-encoded query vectors (encoded as :meth:`search` does).

        Example:
            >>> index.hits(index.encoder.encode(["who won?"], "query"), k=1)[0][0].doc_id
            'n1043'
        """
        scores, rows = self.search_vectors(vectors, k)
        results = []
        for score_row, id_row in zip(scores, rows, strict=True):
            found = id_row >= 0  # -1 pads missing hits
            documents = self.store.get(id_row[found])
            results.append([Hit(rank, float(score), doc.doc_id, doc.title, doc.text) for rank, (score, doc)
                            in enumerate(zip(score_row[found], documents, strict=True), start=1)])
        return results


def open_index(directory: str | Path, model: str | Path | None = None, device: str | None = None,
               batch_size: int = 32, encoder: IndexEncoder | None = None,
               precision: str | None = None, backend: str | None = None) -> SearchIndex:
    """Open an index for searching; ``model`` overrides the manifest's path but must be the same model.

    ``encoder`` reuses an already-loaded model (refused, like ``model``, if its weights differ);
    ``precision`` overrides the compute precision the index was built at and ``backend`` the runtime
    (:func:`encoder_for`: by default an export's own, without torch).

    Example:
        >>> index = open_index("runs/news-index")
        >>> index.manifest.documents
        7600
    """
    return SearchIndex(directory, model=model, device=device, batch_size=batch_size, encoder=encoder,
                       precision=precision, backend=backend)
