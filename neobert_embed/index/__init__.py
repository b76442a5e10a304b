"""FAISS indexing: encode corpora into searchable indexes, search them, and judge them.

The Python API mirrors the ``neobert-embed index`` commands.

Example:
    >>> from neobert_embed.index import build_index, add_documents, open_index, evaluate_index
    >>> build_index("runs/my-embedder", "corpus.jsonl", "runs/my-index", index_type="auto")
    >>> add_documents("runs/my-index", "more.jsonl", on_duplicate="replace")
    >>> with open_index("runs/my-index") as index:
    ...     hits = index.search(["what is faiss?"], k=10)[0]
    >>> evaluate_index("runs/my-index", "tasks/my-retrieval")["ndcg_at_10"]
"""

from neobert_embed.index.add import add_documents
from neobert_embed.index.build import BuildInterrupted, BuildOptions, ChunkDone, build_index
from neobert_embed.index.corpus import CorpusFields, read_corpus
from neobert_embed.index.evaluate import evaluate_index
from neobert_embed.index.manifest import IndexManifest, read_manifest
from neobert_embed.index.search import Hit, SearchIndex, open_index

__all__ = ["BuildInterrupted", "BuildOptions", "ChunkDone", "CorpusFields", "Hit", "IndexManifest",
           "SearchIndex", "add_documents", "build_index", "evaluate_index", "open_index", "read_corpus",
           "read_manifest"]
