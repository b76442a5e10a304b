"""``index build``: encode a corpus into a FAISS index, chunk by chunk, resumably.

Why: encoding a large corpus takes hours and machines get interrupted. The build works in
``.OUTPUT.partial`` beside it: the corpus is first imported into the SQLite store (validating ids and fields
with file and line), then encoded in chunks, each persisted as a shard and marked finished in the
store. ``--resume`` continues after the last finished chunk. Only when every vector is encoded is
the index trained on a sample, filled, calibrated against exact search, and moved to ``OUTPUT`` in
one rename, so ``OUTPUT`` is either absent, the previous index, or the complete new one.

Example:
    >>> manifest = build_index("runs/my-embedder", "corpus.jsonl", "runs/my-index")
    >>> manifest.documents, manifest.factory
    (7600, 'Flat')
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from neobert_embed.console import document_progress
from neobert_embed.distributed import World, barrier, init_world, on_main
from neobert_embed.errors import UserInputError
from neobert_embed.files import check_free_space, remove_debris, replace_directory
from neobert_embed.index.documents import CorpusFields, read_corpus
from neobert_embed.index.encoder import IndexEncoder, Truncation, load_encoder
from neobert_embed.index.factory import (
    IndexSpec,
    as_codes,
    check_options,
    choose_index_spec,
    create_index,
    write_faiss_index,
)
from neobert_embed.index.integrity import with_checksums
from neobert_embed.index.manifest import (
    INDEX_NAME,
    STORE_NAME,
    Calibration,
    IndexManifest,
    PassageSettings,
    write_manifest,
)
from neobert_embed.index.ondisk import IVFDATA_NAME, build_on_disk, check_on_disk, train_index
from neobert_embed.index.passages import PassageEncoder, read_spans, write_spans
from neobert_embed.index.preflight import check_factory_for_corpus, count_documents
from neobert_embed.index.rerank import (
    RERANK_K_FACTOR,
    RERANK_NAME,
    needs_rerank,
    with_rerank,
    write_rerank_vectors,
)
from neobert_embed.index.store import DocumentStore
from neobert_embed.index.tuning import CALIBRATION_QUERIES, RECALL_TARGET, calibrate, exact_neighbours
from neobert_embed.locks import LockHolder
from neobert_embed.machine import COMPUTE_PRECISIONS, check_compute_precision
from neobert_embed.model_files import CheckedModel, check_model_files, embedding_dimension
from neobert_embed.outputs import check_output_directory
from neobert_embed.records import INDEX_BUILD_STATE, INDEX_MANIFEST
from neobert_embed.runs import (
    Interrupted,
    adopt_unfinished,
    check_resume,
    claimed_directory,
    partial_directory,
)
from neobert_embed.sentence import DOCUMENT_PROMPT
from neobert_embed.shards import ShardDirectory
from neobert_embed.sources import fingerprint

if TYPE_CHECKING:
    from neobert_embed.index.factory import FaissIndex

SAMPLE_SEED = 0
# What the encoded chunks depend on. The index type, factory and stored precision are not part of
# it: chunks are float32 vectors whatever index is built from them, so a build that failed at the
# FAISS step resumes with another --factory without encoding again. The compute precision the
# chunks were encoded at is (as ``compute_precision`` in the state): a resumed ``auto`` build reuses
# it rather than measuring again, so every chunk comes from the same arithmetic.
RESUME_KEYS = ("model", "corpus", "text_field", "id_field", "title_field", "row_ids", "split",
               "chunk_size", "max_seq_length")
INDEX_OWNED = (IVFDATA_NAME,)  # written beside the files the manifest lists (an on-disk index's inverted lists)

log = logging.getLogger(__name__)


SHARDS_DIR = "shards"  # an unfinished build's encoded chunks, inside its partial directory


class BuildOptions(BaseModel):
    """Everything ``index build`` accepts, checked (the defaults are :func:`build_index`'s); the
    result-relevant part is saved for ``--resume``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str
    corpus: str
    text_field: str
    id_field: str
    title_field: str | None
    row_ids: bool
    split: str
    index_type: str
    factory: str | None
    precision: str
    compute_precision: str
    chunk_size: int = Field(gt=0)
    batch_size: int = Field(gt=0)
    max_seq_length: int | None = Field(gt=0)
    device: str | None
    revision: str | None
    on_disk: bool
    backend: str | None = None
    passages: bool = False
    stride: int | None = Field(default=None, gt=0)

    @property
    def fields(self) -> CorpusFields:
        """How corpus records map to id, text and title."""
        return CorpusFields(self.text_field, self.id_field, self.title_field, self.row_ids, self.split)


@dataclass(frozen=True)
class ChunkDone:
    """Reported to ``on_chunk`` after each chunk is persisted."""

    chunk: int
    n_chunks: int
    documents_encoded: int
    documents_total: int


#: ``(first_row, vectors)``: one block of a corpus's vectors, as the vector store hands them out.
Block = tuple[int, np.ndarray]

def _shards(partial: Path) -> ShardDirectory:
    """The encoded chunks of the unfinished build in ``partial``."""
    return ShardDirectory(partial / SHARDS_DIR)


def _adopt_legacy_partial(output: Path) -> None:
    """A build interrupted under the earlier, visible name ``OUTPUT.partial`` resumes with its encoded chunks."""
    adopt_unfinished(output.with_name(output.name + ".partial"), output, INDEX_BUILD_STATE)


def _prepare_partial(output: Path, state: dict[str, Any], resume: bool, overwrite: bool) -> Path:
    """Create, reuse (``resume``) or refuse the work directory; refuse to clobber a finished index."""
    partial = partial_directory(output)
    if INDEX_MANIFEST.exists(output) and not overwrite:
        raise UserInputError(f"{output} already holds an index; add documents with `neobert-embed index "
                             "add`, choose another --output, or pass --overwrite to rebuild it")
    if partial.exists():
        if resume and not overwrite and check_resume(
                partial, state, record=INDEX_BUILD_STATE, hint="rerun with the same inputs, or use --overwrite to start over"):
            return partial
        encoded = INDEX_BUILD_STATE.exists(partial) and (partial / SHARDS_DIR).is_dir() \
            and bool(_shards(partial).finished())
        if encoded and not overwrite:
            raise UserInputError(f"{partial} holds an interrupted build with encoded chunks; pass --resume "
                                 "to continue it or --overwrite to discard it")
        shutil.rmtree(partial)
    INDEX_BUILD_STATE.write(partial, state)
    return partial


def _import_corpus(store: DocumentStore, options: BuildOptions, show_progress: bool) -> int:
    """Read the corpus into the store once (validating it); a resumed build skips a finished import."""
    if not store.import_finished(options.corpus):
        with document_progress(show_progress) as progress:
            task = progress.add_task("reading corpus", total=None)
            store.import_documents(read_corpus(options.corpus, options.fields), source=options.corpus,
                                   progress=lambda n: progress.update(task, completed=n))
    total = store.total_rows()
    if total == 0:
        raise UserInputError(f"{options.corpus}: the corpus is empty (no documents); check the file and "
                             "--text-field")
    return total


def _encode_chunks(store: DocumentStore, shards: ShardDirectory, encoder: IndexEncoder,
                   options: BuildOptions, total: int, show_progress: bool,
                   on_chunk: Callable[[ChunkDone], None] | None, world: World = World(),
                   splitter: PassageEncoder | None = None) -> int:
    """Encode this rank's unfinished chunks (all of them in one process); a chunk is finished once its shard exists."""
    n_chunks = math.ceil(total / options.chunk_size)
    finished = shards.finished()
    todo = world.my_chunks(n_chunks, finished)
    label = f"encoding documents (rank 0 of {world.size})" if world.distributed else "encoding documents"
    cut = encoder.truncation = Truncation()
    with document_progress(show_progress and world.is_main) as progress:
        task = progress.add_task(label, total=total, completed=min(total, len(finished) * options.chunk_size))
        for chunk in todo:
            first = chunk * options.chunk_size
            documents = store.documents_between(first, first + options.chunk_size)
            advance = lambda n: progress.advance(task, n * world.size)  # noqa: E731
            if splitter is not None:  # the chunk's passages: their spans first, the vectors mark it finished
                passages = splitter.encode(documents, advance=advance).offset(first)
                write_spans(shards.directory, chunk, passages.spans)
                vectors = passages.vectors
            else:
                vectors = encoder.encode_in_length_order([d.encoded_text for d in documents], DOCUMENT_PROMPT,
                                                         advance=advance)
            shards.write(chunk, vectors)
            if on_chunk is not None:
                on_chunk(ChunkDone(chunk, n_chunks, first + len(documents), total))
    encoder.truncation = None
    warning = cut.warning(sum(min(options.chunk_size, total - c * options.chunk_size) for c in todo),
                          int(encoder.model.max_seq_length))
    if warning:
        log.warning("%s%s", warning, f" (rank {world.rank}'s chunks)" if world.distributed else "")
    return n_chunks


def _sample_rows(total: int, size: int, seed: int) -> np.ndarray:
    if size >= total:
        return np.arange(total, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(total, size=size, replace=False)).astype(np.int64)


def _trained(spec: IndexSpec, dimension: int, sample: Callable[[np.ndarray], np.ndarray], total: int,
             report: dict | None) -> FaissIndex:
    """An empty ``spec`` index trained on a seeded sample; ``report`` gets the sample size and time."""
    index, seconds = train_index(spec, dimension, sample, _sample_rows(total, spec.train_size, SAMPLE_SEED))
    if report is not None:
        report.update(train_vectors=min(total, spec.train_size) if spec.train_size else 0,
                      train_seconds=round(seconds, 3))
    return index


def held_out_rows(spec: IndexSpec, total: int) -> int:
    """How many of the last vectors a graph index (HNSW) keeps out until it is calibrated.

    A vector stored in a graph is linked to its neighbours and finds them through those links, so
    its recall says little about an unseen query's (:mod:`neobert_embed.index.tuning`); other
    indexes are calibrated on a sample of their stored vectors and hold nothing back.

    Example:
        >>> held_out_rows(choose_index_spec("hnsw", 10_000, 384), 10_000), held_out_rows(ivf_spec, 10_000)
        (512, 0)
    """
    return min(CALIBRATION_QUERIES, total // 4) if spec.tuned_parameter == "efSearch" else 0


def _rows_below(blocks: Iterable[Block], limit: int) -> Iterator[Block]:
    """The ``(first_row, vectors)`` blocks cut to rows ``< limit``."""
    for first_row, block in blocks:
        if first_row < limit:
            yield first_row, block[:limit - first_row]


def fill_index(spec: IndexSpec, dimension: int, blocks: Callable[[], Iterable[Block]],
               sample: Callable[[np.ndarray], np.ndarray], total: int, report: dict | None = None,
               hold_out: int = 0) -> FaissIndex:
    """Create ``spec``, train it on a seeded sample of the vectors, and add every block.

    Shared with the benchmark so measured indexes are built exactly as ``index build`` builds them.

    Args:
        blocks: returns a fresh iterator of ``(first_row, vectors)``.
        sample: returns the vectors at sorted rows.
        report: receives ``train_vectors`` and ``train_seconds``.
        hold_out: leave out the last ``hold_out`` rows (:func:`held_out_rows`); the caller adds them
            after :func:`calibrate_index` has used them as unseen queries.

    Example:
        >>> index = fill_index(spec, 384, lambda: [(0, x)], lambda rows: x[rows], len(x))
    """
    index = _trained(spec, dimension, sample, total, report)
    for _, block in _rows_below(blocks(), total - hold_out):
        index.add(as_codes(spec, np.asarray(block, dtype=np.float32)))
    return index


def calibration_queries(blocks: Callable[[], Iterable[Block]], sample: Callable[[np.ndarray], np.ndarray],
                        total: int, held_out: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Calibration queries and their exact top-10: a seeded sample of the indexed vectors (each
    excluding itself), or the last ``held_out`` rows against the rows before them.

    Example:
        >>> rows, queries, exact = calibration_queries(lambda: [(0, x)], lambda r: x[r], len(x))
    """
    if held_out:
        rows = np.arange(total - held_out, total, dtype=np.int64)
        queries = sample(rows)
        indexed = total - held_out
        return rows, queries, exact_neighbours(queries, _rows_below(blocks(), indexed), k=min(10, indexed))
    rows = _sample_rows(total, CALIBRATION_QUERIES, SAMPLE_SEED + 1)
    queries = sample(rows)
    return rows, queries, exact_neighbours(queries, blocks(), k=min(10, max(1, total - 1)), query_rows=rows)


def calibrate_index(index: FaissIndex, spec: IndexSpec, blocks: Callable[[], Iterable[Block]],
                    sample: Callable[[np.ndarray], np.ndarray], total: int,
                    queries: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                    held_out: int = 0) -> tuple[dict[str, int], Calibration]:
    """Calibrate the search parameter on queries the index has not seen against brute-force search.

    Exact float indexes need no calibration (their recall is 1 by construction); every other index,
    quantized flat ones included, is measured. ``queries`` reuses :func:`calibration_queries`;
    ``held_out``: the index lacks the last rows (:func:`fill_index`), which become the queries.

    Example:
        >>> params, calibration = calibrate_index(index, spec, lambda: [(0, x)], lambda r: x[r], len(x))
    """
    if spec.factory == "Flat":
        return {}, Calibration(parameter=None, value=None, recall_at_10=1.0, target=RECALL_TARGET, queries=0)
    rows, vectors, exact = queries or calibration_queries(blocks, sample, total, held_out)
    return calibrate(index, spec, vectors, rows, exact)


def _import_and_check(partial: Path, opts: BuildOptions, dimension: int, show_progress: bool) -> int:
    """Rank 0: import the corpus into the store and refuse an index type the corpus cannot train."""
    with DocumentStore(partial / STORE_NAME) as store:
        total = _import_corpus(store, opts, show_progress)
        if opts.factory is not None:  # before encoding: corpora that could not be counted earlier
            check_factory_for_corpus(opts.factory, total, dimension)
    if opts.passages:  # the index is sized by its passages, counted as the documents are encoded
        log.info("index: chosen for the passages of %d documents once they are encoded", total)
    else:
        log.info("index: %s", _build_spec(opts, total, dimension).reason)   # before the long encoding
    return total


def _build_spec(opts: BuildOptions, total: int, dimension: int) -> IndexSpec:
    """The index to build; with ``--on-disk``, ``auto`` means IVF-PQ (the memory-bounded choice).
    Its ``reason`` is the line the user is shown and the manifest keeps (``index_choice``)."""
    on_disk_auto = opts.on_disk and opts.index_type == "auto" and opts.factory is None
    spec = choose_index_spec("ivfpq" if on_disk_auto else opts.index_type, total, dimension, opts.precision,
                             opts.factory)
    if on_disk_auto:
        spec = dataclasses.replace(spec, reason=f"ivfpq: auto with --on-disk, product-quantized codes keep "
                                                f"{total:,} vectors' memory bounded")
    if opts.on_disk:
        check_on_disk(spec)
    return spec


def _encode(partial: Path, opts: BuildOptions, encoder: IndexEncoder, show_progress: bool,
            on_chunk: Callable[[ChunkDone], None] | None, world: World,
            splitter: PassageEncoder | None = None) -> tuple[int, int]:
    """Import (rank 0), then encode the missing chunks (every rank its share); returns (rows, chunks)."""
    total = on_main(world, lambda: _import_and_check(partial, opts, encoder.dimension, show_progress))
    with DocumentStore(partial / STORE_NAME, read_only=True) as store:
        n_chunks = _encode_chunks(store, _shards(partial), encoder, opts, total, show_progress,
                                  on_chunk, world, splitter)
    barrier(world)
    return total, n_chunks


def _fill_and_write(partial: Path, opts: BuildOptions, dimension: int, total: int,
                    n_chunks: int) -> tuple[IndexSpec, dict, Any, dict[str, Any]]:
    """Once every shard exists: train on a sample, fill, calibrate and write the FAISS index (``total``
    vectors: one per document, or with ``--passages`` the passages the shards hold)."""
    shards = _shards(partial)
    missing = sorted(set(range(n_chunks)) - shards.finished())
    if missing:
        raise RuntimeError(f"{partial}: chunks {missing[:10]} were not encoded (a rank failed); rerun with --resume")
    spec = _build_spec(opts, total, dimension)
    blocks = functools.partial(shards.blocks, n_chunks)
    sample = (functools.partial(shards.gather, starts=shards.starts(n_chunks)) if opts.passages
              else functools.partial(shards.gather, chunk_size=opts.chunk_size))
    details: dict[str, Any] = {"on_disk": opts.on_disk,
                               "rerank_k_factor": RERANK_K_FACTOR if needs_rerank(spec.factory) else None}
    hold_out = 0 if opts.on_disk else held_out_rows(spec, total)
    if opts.on_disk:
        index = build_on_disk(_trained(spec, dimension, sample, total, details), spec, blocks(), partial)
    else:
        index = fill_index(spec, dimension, blocks, sample, total, report=details, hold_out=hold_out)
    if details["rerank_k_factor"]:
        write_rerank_vectors(partial / RERANK_NAME, blocks(), total, dimension)
    searchable = with_rerank(index, partial, details["rerank_k_factor"])
    params, calibration = calibrate_index(searchable, spec, blocks, sample, total, held_out=hold_out)
    if hold_out:  # the graph's calibration queries, now that they have served
        index.add(as_codes(spec, sample(np.arange(total - hold_out, total, dtype=np.int64))))
    if not opts.on_disk:
        write_faiss_index(index, partial / INDEX_NAME)
    return spec, params, calibration, details


def _store_passages(partial: Path, n_chunks: int) -> int:
    """Rank 0: the shards' passages, in chunk order, into the store (their FAISS ids); returns how many."""
    with DocumentStore(partial / STORE_NAME) as store:
        if not store.has_passages():  # a resumed build that stopped after this step has them already
            spans = read_spans(_shards(partial).directory)
            if len(spans) != sum(len(block) for _, block in _shards(partial).blocks(n_chunks)):
                raise UserInputError(f"{partial}: the encoded chunks' passages and vectors differ in number (chunks "
                                     "encoded without --passages?); rebuild with --overwrite")
            store.add_passages(spans)
        return store.vector_count()


def _finish(partial: Path, output: Path, opts: BuildOptions, encoder: IndexEncoder, total: int,
            n_chunks: int, splitter: PassageEncoder | None = None) -> IndexManifest:
    """Rank 0: build the FAISS index from the shards, write the manifest, move ``partial`` to ``output``."""
    vectors = _store_passages(partial, n_chunks) if splitter is not None else total
    spec, params, calibration, details = _fill_and_write(partial, opts, encoder.dimension, vectors, n_chunks)
    if splitter is not None:
        log.info("index: %s", spec.reason)
        details["passages"] = PassageSettings(window=splitter.window, stride=splitter.stride)
    manifest = IndexManifest(
        model=opts.model, model_path=encoder.path, model_revision=encoder.revision,
        model_fingerprint=encoder.fingerprint, dimension=encoder.dimension,
        similarity=encoder.similarity, normalized=encoder.normalized,
        max_seq_length=int(encoder.model.max_seq_length), prompts=encoder.prompts,
        compute_precision=encoder.compute_precision,
        compute=encoder.choice.to_json() if encoder.choice is not None else None,
        index_type=spec.index_type, factory=spec.factory, precision=spec.precision, binary=spec.binary,
        index_choice=spec.reason, search_params=params, calibration=calibration, documents=total,
        vectors=vectors, sources=[opts.corpus], **details)
    manifest = with_checksums(partial, manifest)
    write_manifest(partial, manifest)
    _shards(partial).remove()
    INDEX_BUILD_STATE.path(partial).unlink()
    replace_directory(partial, output)
    return manifest


def build_index(model: str | Path, corpus: str | Path, output: str | Path, *, text_field: str = "text",
                id_field: str = "_id", title_field: str | None = "title", row_ids: bool = False,
                split: str = "train", index_type: str = "auto", factory: str | None = None,
                precision: str = "float32", compute_precision: str = "auto", chunk_size: int = 8192,
                batch_size: int = 32, max_seq_length: int | None = None, device: str | None = None,
                revision: str | None = None, on_disk: bool = False, resume: bool = False,
                overwrite: bool = False, show_progress: bool = True,
                on_chunk: Callable[[ChunkDone], None] | None = None, wait: bool = True,
                backend: str | None = None, passages: bool = False, stride: int | None = None) -> IndexManifest:
    """Encode ``corpus`` with ``model`` into a searchable index directory ``output``.

    Before any model is loaded, the output (absent, empty, or an index: never a directory with
    other content), the model's files, ``max_seq_length`` and ``factory`` (against the corpus
    size) are checked. One writer at a time: a second build or add of ``output`` waits (or fails
    at once with ``wait=False``).

    Args:
        model: model name/path (``load_sentence_model`` rules); its "document" prompt is applied.
        corpus: ``.jsonl``, ``.parquet``, ``.txt`` or a Hugging Face dataset.
        output: index directory to create (``index.faiss``, ``documents.sqlite``, ``manifest.json``).
        text_field, id_field, title_field, row_ids, split: how corpus records map to documents
            (:class:`~neobert_embed.index.documents.CorpusFields`; a title is prepended to its text).
        index_type, factory: the FAISS index (``auto`` picks by corpus size), or a factory string.
        precision: how vectors are stored (``float32``, ``float16``, ``int8``, ``binary``...).
        compute_precision: the model's compute precision (``auto`` measures this machine).
        chunk_size, batch_size: documents per persisted chunk / per forward pass.
        max_seq_length: truncate documents to this many tokens (default: the model's own).
        device, revision: where the model runs; the hub revision of the model.
        on_disk: IVF only: memory-mapped inverted lists (``index.ivfdata``).
        resume: continue an interrupted build of the same inputs from its last finished chunk.
        overwrite: replace an existing index / discard an interrupted build.
        on_chunk: called after each persisted chunk (progress hooks; raising stops the build).
        wait: wait for another writer of ``output``; False fails at once.
        backend: ``torch``, ``onnx`` or ``openvino``; None runs a ``neobert-embed export`` directory on
            its own runtime without torch (:mod:`neobert_embed.inference.light`), any other model on torch.
        passages: index every token: a document longer than the model's window is cut into overlapping
            passages, and search ranks documents by their best passage (:mod:`neobert_embed.index.passages`).
        stride: with ``passages``, tokens between passage starts (default: a quarter-window overlap).

    Raises:
        Interrupted: on Ctrl-C (a ``KeyboardInterrupt``); finished chunks are kept for ``resume``.

    Example:
        >>> build_index("runs/my-embedder", "news.jsonl", "runs/news-index", index_type="hnsw",
        ...             title_field="title")
    """
    opts = BuildOptions(model=str(model), corpus=str(corpus), text_field=text_field, id_field=id_field,
                        title_field=title_field, row_ids=row_ids, split=split, index_type=index_type,
                        factory=factory, precision=precision, compute_precision=compute_precision,
                        chunk_size=chunk_size, batch_size=batch_size, max_seq_length=max_seq_length,
                        device=device, revision=revision, on_disk=on_disk, backend=backend, passages=passages,
                        stride=stride)
    if stride is not None and not passages:
        raise UserInputError("--stride sets the step between passages; pass it with --passages")
    output = Path(output)
    world = init_world()
    checked: list[CheckedModel] = []  # rank 0's inspected model files, handed to its loader
    with contextlib.ExitStack() as held:
        def checked_and_locked() -> None:  # rank 0 only: the other ranks wait for its verdict, not on the lock
            checked.append(_preflight(opts, output, overwrite, resume))
            held.enter_context(claimed_directory(output, command="neobert-embed index build", wait=wait,
                                                 on_stale=lambda holder: _report_stale(holder, output),
                                                 **_claim(opts, overwrite)))
            _adopt_legacy_partial(output)

        on_main(world, checked_and_locked)
        model = checked[0] if checked else opts.model
        return _build_locked(opts, model, output, resume, overwrite, show_progress, on_chunk, world)


def _sample_texts(opts: BuildOptions, count: int = 32) -> list[str]:
    """The first ``count`` document texts, for ``--precision auto`` to measure on."""
    return [document.encoded_text for document in itertools.islice(read_corpus(opts.corpus, opts.fields), count)]


def _preflight(opts: BuildOptions, output: Path, overwrite: bool, resume: bool = False) -> CheckedModel:
    """Every check that needs no model weights (the factory is checked against the corpus size
    here when the model's width can be read from its files, else again after the import), and the
    free space for the encoded vectors, which are on disk before the index is (a fresh build only:
    a resumed one has some of them already)."""
    check_compute_precision(opts.compute_precision)
    check_output_directory(output, **_claim(opts, overwrite))
    checked = check_model_files(opts.model, opts.max_seq_length, "--max-length")
    dimension = embedding_dimension(opts.model)
    check_options(opts.index_type, opts.precision, opts.factory, dimension or 8)
    documents = count_documents(opts.corpus)
    if opts.factory is not None and documents is not None and dimension is not None:
        check_factory_for_corpus(opts.factory, documents, dimension)
    if not resume and documents is not None and dimension is not None:
        check_free_space(output, documents * dimension * 4, what=f"the float32 vectors of {documents} documents")
    return checked


def _claim(opts: BuildOptions, overwrite: bool) -> dict[str, Any]:
    """What makes a directory this build's output (see :func:`~neobert_embed.runs.claimed_directory`)."""
    return dict(record=INDEX_MANIFEST, inputs=[opts.corpus, opts.model], what="index",
                replace="--overwrite" if overwrite else None, owned=INDEX_OWNED)


def _report_stale(holder: LockHolder, output: Path) -> None:
    remove_debris(output)
    kept = " (its encoded chunks are kept: pass --resume to continue)" if partial_directory(output).is_dir() else ""
    print(f"note: an earlier writer of {output}, {holder.describe()}, stopped without finishing{kept}",
          file=sys.stderr, flush=True)


def _build_locked(opts: BuildOptions, model: str | CheckedModel, output: Path, resume: bool, overwrite: bool, show_progress: bool,
                  on_chunk: Callable[[ChunkDone], None] | None, world: World) -> IndexManifest:
    recorded = (INDEX_BUILD_STATE.read(partial_directory(output)) or {}) if resume else {}
    precision = recorded.get("compute_precision", "auto") if opts.compute_precision == "auto" else opts.compute_precision
    if precision not in COMPUTE_PRECISIONS:  # only a damaged build state can hold another one
        raise UserInputError(f"{INDEX_BUILD_STATE.path(partial_directory(output))}: damaged "
                             f"{INDEX_BUILD_STATE.holds} (compute_precision {precision!r} is not one of "
                             f"{', '.join(COMPUTE_PRECISIONS)}); {INDEX_BUILD_STATE.fix}")
    encoder = load_encoder(model, device=world.device(opts.device), batch_size=opts.batch_size,
                           max_seq_length=opts.max_seq_length, revision=opts.revision, precision=precision,
                           sample_texts=_sample_texts(opts) if precision == "auto" else None,
                           agree=functools.partial(on_main, world), backend=opts.backend)
    check_options(opts.index_type, opts.precision, opts.factory, encoder.dimension)
    if opts.factory is not None:
        create_index(choose_index_spec("auto", 1, encoder.dimension, factory=opts.factory), encoder.dimension)
    splitter = PassageEncoder(encoder, opts.stride) if opts.passages else None
    state = {**opts.model_dump(include=set(RESUME_KEYS)), "corpus_fingerprint": fingerprint(opts.corpus, opts.split),
             "model_fingerprint": encoder.fingerprint, "compute_precision": encoder.compute_precision}
    if splitter is not None:  # a build of whole documents keeps the state it always had
        state.update(passages={"window": splitter.window, "stride": splitter.stride})
    partial = on_main(world, lambda: _prepare_partial(output, state, resume, overwrite))
    try:
        total, n_chunks = _encode(partial, opts, encoder, show_progress, on_chunk, world, splitter)
    except KeyboardInterrupt:
        with DocumentStore(partial / STORE_NAME, read_only=True) as store:
            total = store.total_rows()
        encoded = min(total, len(_shards(partial).finished()) * opts.chunk_size)
        raise Interrupted(f"{encoded} of {total} documents encoded; finished chunks are kept in "
                          f"{partial}") from None
    return on_main(world, lambda: _finish(partial, output, opts, encoder, total, n_chunks, splitter))
