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
from neobert_embed.model_files import CheckedModel
from neobert_embed.sentence import QUERY_PROMPT

#: An index of passages is first searched for ``k`` x this many passages; queries whose passages name fewer
#: than ``k`` documents are searched again, twice as deep, until they do or the index has no more.
PASSAGE_DEPTH = 4


@dataclass(frozen=True)
class Hit:
    """One search result: a document; in an index of passages (``index build --passages``), ranked and scored
    by its best passage, whose characters ``text[span[0]:span[1]]`` are ``span``."""

    rank: int
    score: float
    doc_id: str
    title: str
    text: str
    span: tuple[int, int] | None = None

    @property
    def passage_fields(self) -> dict[str, list[int]]:
        """``{"span": [start, end]}`` for a hit found through a passage, else nothing (JSON output)."""
        return {"span": list(self.span)} if self.span is not None else {}


def spec_of(manifest: IndexManifest) -> IndexSpec:
    """The :class:`IndexSpec` an index was built with, as far as searching needs it."""
    tuned = next(iter(manifest.search_params), None)
    return IndexSpec(manifest.index_type, manifest.factory, manifest.precision, manifest.binary, tuned, 0)


def encoder_for(manifest: IndexManifest, directory: Path, model: str | Path | CheckedModel | None = None,
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
    name: str | CheckedModel
    if model is not None:
        name = model if isinstance(model, CheckedModel) else str(model)
    elif manifest.model_path and Path(manifest.model_path).exists():
        name = manifest.model_path
    else:
        name = manifest.model
    from neobert_embed.inference.light import exported_runtime

    backend = backend or exported_runtime(str(name)) or "torch"
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
        self.documents_of = self.store.passage_documents() if self.manifest.passages is not None else None
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
        if self.documents_of is not None:
            return self._best_passages(vectors, k)
        scores, rows = self.search_vectors(vectors, k)
        results = []
        for score_row, id_row in zip(scores, rows, strict=True):
            found = id_row >= 0  # -1 pads missing hits
            documents = self.store.get(id_row[found])
            results.append([Hit(rank, float(score), doc.doc_id, doc.title, doc.text) for rank, (score, doc)
                            in enumerate(zip(score_row[found], documents, strict=True), start=1)])
        return results


    def _best_passages(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """Top-``k`` documents by their best passage (MaxP): passages searched ``PASSAGE_DEPTH`` x ``k`` deep,
        deeper for the queries whose passages named fewer than ``k`` documents."""
        depth = min(self.manifest.vectors, k * PASSAGE_DEPTH)
        best: list[list[tuple[float, int]]] = [[] for _ in range(len(vectors))]
        todo = np.arange(len(vectors))
        while len(todo):
            scores, rows = self.search_vectors(vectors[todo], depth)
            for query, score_row, id_row in zip(todo.tolist(), scores, rows, strict=True):
                best[query] = first_per_document(score_row, id_row, self.documents_of, k)
            short = np.asarray([len(best[q]) < k for q in todo.tolist()], dtype=bool)
            if depth >= self.manifest.vectors:
                break
            todo, depth = todo[short], min(self.manifest.vectors, depth * 2)
        return [self._passage_hits(found) for found in best]

    def _passage_hits(self, found: list[tuple[float, int]]) -> list[Hit]:
        """Hits of (score, passage row) pairs, best first: each passage's document, with the passage's span."""
        passages = self.store.passages([row for _, row in found])
        documents = self.store.get([document for document, _, _ in passages])
        return [Hit(rank, float(score), doc.doc_id, doc.title, doc.text, (start, end))
                for rank, ((score, _), (_, start, end), doc) in enumerate(zip(found, passages, documents, strict=True),
                                                                         start=1)]


def first_per_document(scores: np.ndarray, rows: np.ndarray, documents_of: np.ndarray,
                       k: int) -> list[tuple[float, int]]:
    """The best passage of each of the first ``k`` documents in a best-first passage ranking (MaxP).

    Example:
        >>> first_per_document(np.array([.9, .8, .7]), np.array([4, 5, 0]), np.array([0, 0, 0, 0, 1, 1]), 2)
        [(0.9, 4), (0.7, 0)]
    """
    seen: set[int] = set()
    found = []
    for score, row in zip(scores.tolist(), rows.tolist(), strict=True):
        if row < 0:
            break
        document = int(documents_of[row])
        if document not in seen:
            seen.add(document)
            found.append((score, row))
            if len(found) == k:
                break
    return found


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
