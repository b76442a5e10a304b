"""FAISS indexing: encode corpora into searchable indexes, search them, and judge them.

The Python API mirrors the ``neobert-embed index`` commands; names load on first use, so the
command line's ``--help`` does not import faiss or numpy.

Example:
    >>> from neobert_embed.index import build_index, add_documents, open_index, evaluate_index
    >>> build_index("runs/my-embedder", "corpus.jsonl", "runs/my-index", index_type="auto")
    >>> add_documents("runs/my-index", "more.jsonl", on_duplicate="replace")
    >>> with open_index("runs/my-index") as index:
    ...     hits = index.search(["what is faiss?"], k=10)[0]
    >>> evaluate_index("runs/my-index", "tasks/my-retrieval")["ndcg_at_10"]
"""

from __future__ import annotations

from neobert_embed.lazy import lazy_exports

_EXPORTS = {
    "add_documents": ".add",
    "BuildOptions": ".build", "ChunkDone": ".build", "build_index": ".build",
    "CorpusFields": ".documents", "read_corpus": ".documents",
    "evaluate_index": ".evaluate",
    "IndexManifest": ".manifest", "read_manifest": ".manifest",
    "Hit": ".search", "SearchIndex": ".search", "open_index": ".search",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
