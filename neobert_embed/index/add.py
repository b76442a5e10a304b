"""``index add``: append documents to an existing index, all or nothing.

Why: corpora grow. New documents are encoded with the index's own model and prompt (a different
model is refused) and appended; an id already in the index is refused unless the user asks to
replace it (the old vector is then tombstoned and never returned again). The update is prepared
in a copy of the index directory that replaces the original only when everything succeeded, so
an error or Ctrl-C leaves the index exactly as it was.

Example:
    >>> manifest = add_documents("runs/news-index", "more-news.jsonl", on_duplicate="replace")
    >>> manifest.documents, manifest.replaced
    (7650, 3)
"""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from pathlib import Path

from neobert_embed.errors import UserInputError
from neobert_embed.files import atomic_directory
from neobert_embed.index.corpus import CorpusFields, read_corpus
from neobert_embed.index.distributed import refuse_distributed
from neobert_embed.index.factory import as_codes, read_faiss_index, write_faiss_index
from neobert_embed.index.manifest import INDEX_NAME, STORE_NAME, IndexManifest, read_manifest, write_manifest
from neobert_embed.index.progress import document_progress
from neobert_embed.index.rerank import RERANK_NAME, append_rerank_vectors
from neobert_embed.index.search import encoder_for, spec_of
from neobert_embed.index.store import DocumentStore

ADD_CHUNK = 4096


def add_documents(index_dir: str | Path, corpus: str | Path, *, fields: CorpusFields | None = None,
                  on_duplicate: str = "error", model: str | Path | None = None, batch_size: int = 32,
                  device: str | None = None, show_progress: bool = True) -> IndexManifest:
    """Encode the documents of ``corpus`` and append them to the index at ``index_dir``.

    Args:
        fields: which corpus fields hold id, text and title (as for ``build_index``).
        on_duplicate: ``error`` refuses an id already indexed (naming file and line); ``replace``
            makes the new document replace the old one.
        model: where the index's model now lives, if it moved (it must be the same weights).

    Example:
        >>> add_documents("runs/news-index", "late.txt")
    """
    refuse_distributed("index add")
    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    encoder = encoder_for(manifest, index_dir, model, device, batch_size)
    spec = spec_of(manifest)
    if manifest.on_disk:
        raise UserInputError(f"{index_dir}: an --on-disk index is built once from its shards; rebuild it with "
                             "`neobert-embed index build --on-disk` over the whole corpus")
    extra = [RERANK_NAME] if manifest.rerank_k_factor else []
    added_vectors: list = []
    with atomic_directory(index_dir) as work:
        for name in (INDEX_NAME, STORE_NAME, *extra):
            shutil.copy2(index_dir / name, work / name)
        index = read_faiss_index(work / INDEX_NAME, manifest.binary)
        with DocumentStore(work / STORE_NAME) as store:
            result = store.import_documents(read_corpus(corpus, fields), str(corpus), on_duplicate)
            if result.added == 0:
                raise UserInputError(f"{corpus}: the corpus is empty (no documents); nothing to add")
            end = result.first_row + result.added
            with document_progress(show_progress) as progress:
                task = progress.add_task("encoding new documents", total=result.added)
                for first in range(result.first_row, end, ADD_CHUNK):
                    documents = store.documents_between(first, min(end, first + ADD_CHUNK))
                    vectors = encoder.encode_in_length_order(
                        [d.encoded_text for d in documents], "document",
                        advance=lambda n: progress.advance(task, n))
                    index.add(as_codes(spec, vectors))
                    if extra:
                        added_vectors.append(vectors)
            updated = manifest.model_copy(update={
                "documents": store.live_count(), "vectors": store.total_rows(),
                "replaced": manifest.replaced + result.replaced,
                "sources": [*manifest.sources, str(corpus)],
                "updated_at": datetime.now(timezone.utc)})
        if index.ntotal != updated.vectors:
            raise RuntimeError(f"index holds {index.ntotal} vectors but the store {updated.vectors}")
        write_faiss_index(index, work / INDEX_NAME)
        if extra:
            append_rerank_vectors(work / RERANK_NAME, added_vectors)
        write_manifest(work, updated)
    return updated
