"""``pretrain prepare``: tokenize a corpus once into an on-disk, memory-mapped dataset.

Why: tokenizing web-scale text is slower than you want to repeat and must survive interruption.
Documents are cut into shards of ``shard_documents``; each shard is tokenized (in ``num_proc``
processes) and written atomically as an Arrow stream file — the format of Hugging Face
``datasets`` cache files, so ``datasets.Dataset.from_file(shard)`` opens it — and a rerun skips
finished shards (Ctrl-C raises :class:`~neobert_embed.runs.Interrupted`); a rerun with other settings
is refused, naming each changed key. ``corpus.json``, written last, marks the directory complete.

Layout of ``output``::

    prepare.json      what is being prepared (corpus fingerprint, tokenizer) — guards resumption
    tokenizer/        the tokenizer used (trained here when ``tokenizer="train"``)
    shards/000000.arrow …  columns ``input_ids`` (list<int32>, with [CLS]/[SEP]) and ``length``
    corpus.json       shard list and totals: present only when complete

Example:
    >>> corpus = prepare_corpus("docstrings.jsonl", "runs/prepared", tokenizer="train", vocab_size=4096)
    >>> corpus.num_documents, corpus.num_tokens
    (9120, 811532)
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import multiprocessing
import shutil
from collections.abc import Iterator
from pathlib import Path

from neobert_embed.console import progress_bar
from neobert_embed.errors import UserInputError
from neobert_embed.files import atomic_directory, atomic_path, replace_directory
from neobert_embed.pretraining.documents import iter_documents
from neobert_embed.pretraining.prepared import (
    SHARDS_DIR,
    TOKENIZER_DIR,
    PreparedCorpus,
    is_prepared,
    load_prepared,
)
from neobert_embed.pretraining.vocab import load_tokenizer, train_wordpiece
from neobert_embed.records import CORPUS_MANIFEST, CORPUS_SHARDS_KEY, PREPARE_STATE
from neobert_embed.runs import (
    Interrupted,
    adopt_unfinished,
    check_resume,
    claimed_directory,
    partial_directory,
)
from neobert_embed.sources import fingerprint

__all__ = ["prepare_corpus", "load_prepared", "is_prepared", "PreparedCorpus"]
logger = logging.getLogger(__name__)


def prepare_corpus(
    corpus: str | Path,
    output: str | Path,
    *,
    tokenizer: str = "google-bert/bert-base-uncased",
    vocab_size: int | None = None,
    text_field: str = "text",
    num_proc: int = 1,
    split: str = "train",
    streaming: bool = False,
    shard_documents: int = 20_000,
    progress: bool = True,
    wait: bool = True,
) -> PreparedCorpus:
    """Tokenize ``corpus`` into ``output`` (resuming a previous, interrupted preparation).

    ``tokenizer`` is a hub id, a local directory, or ``"train"`` (learn a WordPiece vocabulary of
    ``vocab_size`` on the corpus). Returns the prepared corpus, ready for :func:`pretrain`. One
    process prepares ``output`` at a time (``wait=False`` fails at once when another does).

    Example:
        >>> prepare_corpus("tiiuae/falcon-refinedweb", "data/refinedweb", streaming=True,
        ...                text_field="content", num_proc=16)
    """
    output = Path(output)
    if is_prepared(output):
        return load_prepared(output)
    if tokenizer == "train" and not vocab_size:
        raise UserInputError("--tokenizer train needs --vocab-size (e.g. 8192)")
    plan = {"corpus": str(corpus), "fingerprint": fingerprint(corpus, split),
            "tokenizer": str(tokenizer), "vocab_size": vocab_size, "text_field": text_field,
            "split": split, "shard_documents": shard_documents}
    documents = functools.partial(iter_documents, corpus, text_field, split, streaming)
    if next(documents(), None) is None:
        raise UserInputError(f"{corpus}: the corpus holds no documents (it is empty or only blank lines)")
    with claimed_directory(output, record=(CORPUS_MANIFEST, PREPARE_STATE), command="neobert-embed pretrain prepare",
                           inputs=[corpus], what="prepared corpus", wait=wait):  # it and its .partial
        final, output = output, _claim_partial(output, plan)
        tokenizer_dir = output / TOKENIZER_DIR
        if not tokenizer_dir.is_dir():
            if tokenizer == "train":
                logger.info("learning a %d-piece WordPiece vocabulary on %s", vocab_size, corpus)
                train_wordpiece(documents(), vocab_size, tokenizer_dir)
            else:  # whole or absent: a resume takes an existing tokenizer folder as done
                loaded = load_tokenizer(tokenizer)
                with atomic_directory(tokenizer_dir) as staged:
                    loaded.save_pretrained(str(staged))
        try:
            shards = _tokenize_shards(documents(), output, shard_documents, num_proc, progress)
        except KeyboardInterrupt:
            kept = len(list((output / SHARDS_DIR).glob("*.arrow")))
            raise Interrupted(f"{kept} finished shard(s) of {shard_documents} documents are kept in {output}; "
                              "rerunning skips them", resume_args=()) from None
        if not shards:
            raise UserInputError(f"{corpus}: no document produced any token with tokenizer {tokenizer!r}")
        num_documents = sum(count for _, count, _ in shards)
        num_tokens = sum(tokens for _, _, tokens in shards)
        CORPUS_MANIFEST.write(output, {
            CORPUS_SHARDS_KEY: [name for name, _, _ in shards], "num_documents": num_documents,
            "num_tokens": num_tokens, **plan})
        replace_directory(output, final)
        logger.info("prepared %s documents, %s tokens -> %s", f"{num_documents:,}", f"{num_tokens:,}", final)
        return load_prepared(final)


def _claim_partial(output: Path, plan: dict) -> Path:
    """The partial directory to work in. The same job's unfinished shards are resumed; a rerun
    with other options is refused (naming them); shards of a corpus that changed since (fixed
    after a bad line, say) are stale debris of this command, so they are deleted and it starts over."""
    partial = partial_directory(output)
    adopt_unfinished(output, output, PREPARE_STATE)  # an earlier version kept an unfinished one in place
    saved = PREPARE_STATE.read(partial)
    if saved is not None and saved.get("fingerprint") != plan["fingerprint"]:
        logger.info("%s changed since the unfinished preparation in %s; starting over", plan["corpus"], partial)
        shutil.rmtree(partial)
    if check_resume(partial, plan, record=PREPARE_STATE, verb="rerunning prepare",
                    hint="rerun with the same corpus and options to resume it, or choose another --output") is None:
        PREPARE_STATE.write(partial, plan)
    return partial


def _chunks(documents: Iterator[str], size: int) -> Iterator[tuple[int, list[str]]]:
    for index in itertools.count():
        chunk = list(itertools.islice(documents, size))
        if not chunk:
            return
        yield index, chunk


def _tokenize_shards(documents: Iterator[str], output: Path, shard_documents: int, num_proc: int,
                     progress: bool) -> list[tuple[str, int, int]]:
    """Tokenize every missing shard; return (file name, documents, tokens) for all shards."""
    shard_dir = output / SHARDS_DIR
    shard_dir.mkdir(parents=True, exist_ok=True)
    jobs = ((index, chunk, str(output)) for index, chunk in _chunks(documents, shard_documents))
    results = []
    workers = multiprocessing.get_context("spawn").Pool(num_proc) if num_proc > 1 else contextlib.nullcontext()
    with workers as pool, progress_bar(show=progress, transient=True) as bar:
        task = bar.add_task("tokenizing documents", total=None)
        for result in (pool.imap if pool else map)(_tokenize_shard, jobs):
            results.append(result)
            bar.advance(task, result[1])
    return [r for r in results if r[1] > 0]


@functools.cache
def _worker_tokenizer(output: str):
    """The corpus's tokenizer, loaded once per (worker) process."""
    return load_tokenizer(Path(output) / TOKENIZER_DIR)


def _tokenize_shard(job: tuple[int, list[str], str]) -> tuple[str, int, int]:
    """Tokenize one chunk of documents into ``shards/NNNNNN.arrow`` (skipped when already there)."""
    import pyarrow as pa

    index, texts, output = job
    name = f"{index:06d}.arrow"
    path = Path(output) / SHARDS_DIR / name
    if path.is_file():
        lengths = _read_lengths(path)
        return name, len(lengths), int(sum(lengths))
    encoded = _worker_tokenizer(output)(texts, add_special_tokens=True, return_attention_mask=False,
                                        return_token_type_ids=False, verbose=False)["input_ids"]
    encoded = [ids for ids in encoded if len(ids) > 2]  # drop documents with no real token
    lengths = [len(ids) for ids in encoded]
    table = pa.table({"input_ids": pa.array(encoded, type=pa.list_(pa.int32())),
                      "length": pa.array(lengths, type=pa.int32())})
    with atomic_path(path) as tmp, pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return name, len(lengths), int(sum(lengths))


def _read_lengths(path: Path) -> list[int]:
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_stream(source).read_all().column("length").to_pylist()

