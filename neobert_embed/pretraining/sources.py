"""Where pretraining documents come from: text, JSON-lines and parquet files, or HF datasets.

Why: a corpus is read twice (once to learn a vocabulary, once to tokenize) and possibly resumed
mid-way, so reading must be deterministic and every bad record must be reported with its file and
line before hours are spent on it.

Formats:
    ``.txt`` (or any other name): UTF-8 text, one document per non-blank line;
    ``.jsonl`` / ``.json``: one JSON object per line, the document in ``text_field``;
    ``.parquet``: a string column ``text_field``;
    a directory: every such file inside, in name order;
    anything else: a Hugging Face dataset id (``streaming`` for web-scale sets such as
    ``tiiuae/falcon-refinedweb``, whose documents are in the ``content`` field).

Example:
    >>> for text in iter_documents("corpus.jsonl", text_field="text"):
    ...     print(len(text))
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from neobert_embed.errors import UserInputError, located
from neobert_embed.files import iter_jsonl, iter_text_lines

JSON_SUFFIXES = (".jsonl", ".json")
FILE_SUFFIXES = (".txt", ".text", ".jsonl", ".json", ".parquet")


def corpus_files(corpus: Path) -> list[Path]:
    """The files a local corpus consists of (one file, or the supported files of a directory)."""
    if corpus.is_file():
        return [corpus]
    files = sorted(p for p in corpus.rglob("*") if p.is_file() and p.suffix.lower() in FILE_SUFFIXES)
    if not files:
        raise UserInputError(f"{corpus}: directory holds no .txt, .jsonl or .parquet files")
    return files


def source_fingerprint(corpus: str, text_field: str) -> str:
    """A short id of the corpus content (sizes and modification times of local files, or the dataset
    id) so a resumed preparation can refuse a corpus that changed underneath it."""
    path = Path(corpus)
    if path.exists():
        parts = [f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in corpus_files(path)]
    else:
        parts = [f"hf:{corpus}"]
    return hashlib.sha256("\n".join([text_field, *parts]).encode()).hexdigest()[:16]


def iter_documents(corpus: str | Path, text_field: str = "text", split: str = "train",
                   streaming: bool = False) -> Iterator[str]:
    """Yield every document of ``corpus`` in a fixed order; errors name the file and line."""
    path = Path(corpus)
    if path.exists():
        for file in corpus_files(path):
            yield from _iter_file(file, text_field)
        return
    yield from _iter_hf_dataset(str(corpus), text_field, split, streaming)


def _iter_file(path: Path, text_field: str) -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix in JSON_SUFFIXES:
        for line, record in iter_jsonl(path):
            if text_field not in record:
                raise located(path, line, f"field {text_field!r} is missing (keys: {sorted(record)[:8]}); "
                              "pass --text-field to name the field holding the document")
            text = record[text_field]
            if not isinstance(text, str):
                raise located(path, line, f"field {text_field!r} must be a string, got {type(text).__name__}")
            if text.strip():
                yield text
    elif suffix == ".parquet":
        yield from _iter_parquet(path, text_field)
    else:
        for line, text in iter_text_lines(path):
            if "\x00" in text:
                raise located(path, line, "contains NUL bytes: this is not a text file; give a UTF-8 "
                              ".txt (one document per line), .jsonl or .parquet corpus")
            yield text


def _iter_parquet(path: Path, text_field: str) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserInputError(f"{path}: not a readable parquet file ({exc})") from None
    columns = handle.schema_arrow.names
    if text_field not in columns:
        raise UserInputError(f"{path}: column {text_field!r} not found (columns: {columns}); "
                             "pass --text-field to name the text column")
    row = 0
    for batch in handle.iter_batches(columns=[text_field], batch_size=4096):
        for text in batch.column(0).to_pylist():
            row += 1
            if text is not None and not isinstance(text, str):
                raise UserInputError(f"{path}: row {row}: column {text_field!r} must hold strings")
            if text and text.strip():
                yield text


def _iter_hf_dataset(name: str, text_field: str, split: str, streaming: bool) -> Iterator[str]:
    import datasets

    try:
        dataset = datasets.load_dataset(name, split=split, streaming=streaming)
    except Exception as exc:  # datasets raises many unrelated types for "cannot load"
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserInputError(
            f"{name}: not a local file or directory, and not loadable as a Hugging Face dataset "
            f"({first_line}); check the path, or the dataset id and your network/HF_HUB_OFFLINE"
        ) from None
    columns = dataset.column_names or []
    if columns and text_field not in columns:
        raise UserInputError(f"{name}: field {text_field!r} not found (fields: {columns}); "
                             "pass --text-field")
    for record in dataset:
        text = record.get(text_field)
        if isinstance(text, str) and text.strip():
            yield text
