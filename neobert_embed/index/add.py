"""``index add``: append documents to an existing index, all or nothing.

Why: corpora grow. New documents are encoded with the index's own model and prompt (a different
model is refused) and appended; an id already in the index is refused unless the user asks to
replace it (the old vector is then tombstoned and never returned again). The update is prepared
in a copy of the index directory that replaces the original only when everything succeeded, so
an error or Ctrl-C leaves the index exactly as it was. Under ``torchrun`` rank 0 takes the lock and
imports the documents, every rank encodes its share of them (as ``index build`` does), and rank 0
writes the result.

Example:
    >>> manifest = add_documents("runs/news-index", "more-news.jsonl", on_duplicate="replace")
    >>> manifest.documents, manifest.replaced
    (7650, 3)
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from neobert_embed.console import document_progress
from neobert_embed.distributed import encode_across_ranks, init_world, on_main
from neobert_embed.errors import UserInputError
from neobert_embed.files import remove_debris
from neobert_embed.index.documents import CorpusFields, read_corpus
from neobert_embed.index.encoder import IndexEncoder
from neobert_embed.index.factory import as_codes, write_faiss_index
from neobert_embed.index.integrity import check_index_files, open_faiss, open_store, with_checksums
from neobert_embed.index.manifest import (
    INDEX_NAME,
    STORE_NAME,
    IndexManifest,
    read_manifest,
    write_manifest,
)
from neobert_embed.index.passages import PassageEncoder, read_spans, write_spans
from neobert_embed.index.rerank import RERANK_NAME, append_rerank_vectors
from neobert_embed.index.search import encoder_for, spec_of
from neobert_embed.index.store import DocumentStore
from neobert_embed.model_files import check_model_files
from neobert_embed.records import INDEX_MANIFEST
from neobert_embed.runs import updated_directory
from neobert_embed.sentence import DOCUMENT_PROMPT
from neobert_embed.sources import source_format

ADD_CHUNK = 4096
ADD_SPANS = ".add-spans"  # in the work copy: the new passages' spans, one file per ADD_CHUNK rows


def add_documents(index_dir: str | Path, corpus: str | Path, *, fields: CorpusFields | None = None,
                  on_duplicate: str = "error", model: str | Path | None = None, batch_size: int = 32,
                  device: str | None = None, show_progress: bool = True, wait: bool = True,
                  precision: str | None = None, backend: str | None = None) -> IndexManifest:
    """Encode the documents of ``corpus`` and append them to the index at ``index_dir``.

    Args:
        fields: which corpus fields hold id, text and title (as for ``build_index``).
        on_duplicate: ``error`` refuses an id already indexed (naming file and line); ``replace``
            makes the new document replace the old one.
        model: where the index's model now lives, if it moved (it must be the same weights).
        wait: when another writer holds the index, wait for it (else fail at once).
        precision: compute precision; default: the one the index was built at.
        backend: the model's runtime; default: an export's own (no torch), else torch.

    Row-number ids (``fields.row_ids``, and always for ``.txt`` corpora) continue after the
    index's largest numeric id, so they never collide with documents already indexed. The whole
    read-modify-write holds the index's writer lock: concurrent adds are serialised, none is lost.

    Example:
        >>> add_documents("runs/news-index", "late.txt")
    """
    world = init_world()
    index_dir = Path(index_dir)
    if check_index_files(index_dir).on_disk:  # files at their recorded sizes before any encoding
        raise UserInputError(f"{index_dir}: an --on-disk index is built once from its shards; rebuild it with "
                             "`neobert-embed index build --on-disk` over the whole corpus")
    fields = fields or CorpusFields()
    row_ids = fields.row_ids or source_format(corpus) == "txt"
    if row_ids and on_duplicate == "replace":
        raise UserInputError("--on-duplicate replace cannot be used with row-number ids (--row-ids or a .txt "
                             "corpus): they continue after the index's largest id, so they never name an "
                             "indexed document")
    if model is not None:
        model = check_model_files(model)  # handed to the loader: the files are inspected once
    with contextlib.ExitStack() as held:   # rank 0 holds the lock and the work copy; every rank encodes
        def locked_and_staged() -> _Staged:
            work = held.enter_context(updated_directory(index_dir, record=INDEX_MANIFEST, wait=wait,
                                                        command="neobert-embed index add",
                                                        on_stale=lambda holder: remove_debris(index_dir)))
            return _stage(index_dir, work, corpus, fields, row_ids, on_duplicate)

        staged = on_main(world, locked_and_staged)
        encoder = encoder_for(staged.manifest, index_dir, model, world.device(device), batch_size,
                              precision=precision, backend=backend)
        with document_progress(show_progress and world.is_main) as progress:
            task = progress.add_task("encoding new documents", total=staged.added)
            vectors = encode_across_ranks(
                world, staged.added, lambda start, stop: _encode_rows(staged, encoder, start, stop,
                                                                      lambda n: progress.advance(task, n)),
                staged.work / ".add-shards")
        return on_main(world, lambda: _commit(staged, vectors, corpus))


@dataclasses.dataclass(frozen=True)
class _Staged:
    """A work copy of the index whose store already holds the new documents (rows ``first_row`` on)."""

    manifest: IndexManifest
    index_dir: Path
    work: Path
    first_row: int
    added: int
    replaced: int


def _stage(index_dir: Path, work: Path, corpus: str | Path, fields: CorpusFields, row_ids: bool,
           on_duplicate: str) -> _Staged:
    """Rank 0: copy the index into ``work`` and import the new documents into its store."""
    manifest = read_manifest(index_dir)
    open_store(index_dir, manifest).close()
    # the store and what the user keeps there; _commit writes index.faiss, vectors.f16.npy and the manifest
    written = [INDEX_MANIFEST.name, INDEX_NAME, RERANK_NAME]
    shutil.copytree(index_dir, work, dirs_exist_ok=True,
                    ignore=lambda folder, names: written if Path(folder) == index_dir else [])
    with DocumentStore(work / STORE_NAME) as store:
        documents = read_corpus(corpus, fields)
        if row_ids:  # row numbers continue after the index's largest numeric id
            offset = store.largest_numeric_id()
            documents = (dataclasses.replace(doc, doc_id=str(offset + int(doc.doc_id))) for doc in documents)
        result = store.import_documents(documents, str(corpus), on_duplicate, ids_are_rows=row_ids)
    if result.added == 0:
        raise UserInputError(f"{corpus}: the corpus is empty (no documents); nothing to add")
    return _Staged(manifest, index_dir, work, result.first_row, result.added, result.replaced)


def _encode_rows(staged: _Staged, encoder: IndexEncoder, start: int, stop: int,
                 advance: Callable[[int], None]) -> np.ndarray:
    """Vectors of the new documents ``start..stop`` (counted from the first new row); in an index of
    passages, their passages' (whose spans are left in the work copy for :func:`_commit`)."""
    parts = []
    settings = staged.manifest.passages
    splitter = PassageEncoder(encoder, settings.stride) if settings is not None else None
    with DocumentStore(staged.work / STORE_NAME, read_only=True) as store:
        for first in range(staged.first_row + start, staged.first_row + stop, ADD_CHUNK):
            documents = store.documents_between(first, min(staged.first_row + stop, first + ADD_CHUNK))
            if splitter is not None:
                passages = splitter.encode(documents, advance=advance).offset(first)
                write_spans(staged.work / ADD_SPANS, first, passages.spans)
                parts.append(passages.vectors)
                continue
            parts.append(encoder.encode_in_length_order([d.encoded_text for d in documents], DOCUMENT_PROMPT,
                                                        advance=advance))
    return np.concatenate(parts)


def _store_new_passages(staged: _Staged) -> None:
    """Rank 0: the new passages' spans, in row order, into the work copy's store (after the index's own)."""
    with DocumentStore(staged.work / STORE_NAME) as store:
        store.add_passages(read_spans(staged.work / ADD_SPANS))
    shutil.rmtree(staged.work / ADD_SPANS)


def _commit(staged: _Staged, vectors: np.ndarray | None, corpus: str | Path) -> IndexManifest:
    """Rank 0: add the vectors, write the index files and the manifest into the work copy."""
    manifest, work = staged.manifest, staged.work
    index = open_faiss(staged.index_dir, manifest)   # the original, checked; the copy's store has changed
    index.add(as_codes(spec_of(manifest), vectors))
    if manifest.passages is not None:
        _store_new_passages(staged)
    with DocumentStore(work / STORE_NAME, read_only=True) as store:
        updated = manifest.model_copy(update={
            "documents": store.live_count(), "vectors": store.vector_count(),
            "replaced": manifest.replaced + staged.replaced,
            "sources": [*manifest.sources, str(corpus)],
            "updated_at": datetime.now(timezone.utc)})
    if index.ntotal != updated.vectors:
        raise RuntimeError(f"index holds {index.ntotal} vectors but the store {updated.vectors}")
    write_faiss_index(index, work / INDEX_NAME)
    if manifest.rerank_k_factor:
        append_rerank_vectors(staged.index_dir / RERANK_NAME, [vectors], work / RERANK_NAME)
    updated = with_checksums(work, updated)
    write_manifest(work, updated)
    return updated
