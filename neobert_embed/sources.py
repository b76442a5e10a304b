"""Records from any data source, each with the place it came from.

Why: ``encode``, ``index build|add|search``, ``train-contrastive`` and ``pretrain prepare`` all
read records (JSON-like mappings) from a user's data. One reader means every command accepts every
format, and every error names the file and line (or row) the same way; each area keeps only the
validation of its own fields. Records are streamed, so a corpus may be larger than memory.

Formats, chosen by what the source is:
    ``.jsonl`` / ``.ndjson``       one JSON object per line;
    ``.json``                      a list of objects, an object holding one such list, or JSON lines;
    ``.csv``                       a header row, then one record per row (values are strings);
    ``.parquet`` / ``.pq``         one record per row;
    ``.txt`` / ``.text`` / ``.tsv`` (or no suffix)  one record per line, in the field ``text`` (or
                                   the ``text_key`` a caller reading its own text field names);
    ``-``, a FIFO, ``<(…)``        a stream, read once as text lines (JSON lines when named
                                   ``*.jsonl``), by commands that read their input once (``encode``);
    a directory                    a ``datasets.save_to_disk`` folder, else every file above inside
                                   it (recursively, in name order);
    anything else                  a Hugging Face hub dataset id (``subset``, ``split``, ``streaming``).

A :class:`Location` prints as ``file:N`` where N is the line (JSON lines, csv, text) or the row
(json lists, parquet, datasets; then the file is ``id[split]`` for a dataset).

Example:
    >>> for where, record in iter_records("corpus.jsonl"):
    ...     print(where, record["text"][:20])
    corpus.jsonl:1 The first document
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neobert_embed.errors import UserInputError, located
from neobert_embed.files import STDIN, is_stream, iter_jsonl, iter_text_lines, sha256_file, value_digest

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet",
           ".pq": "parquet", ".txt": "txt", ".text": "txt", ".tsv": "txt", "": "txt"}
ACCEPTED = ".jsonl, .ndjson, .json, .csv, .parquet or .txt (one record per line)"
HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
PARQUET_BATCH_ROWS = 8192
CSV_FIELD_LIMIT = 2**31 - 1  # the most csv.field_size_limit takes on every platform (a C long)


@dataclass(frozen=True)
class Location:
    """Where a record came from: ``source`` (a file, or ``id[split]``), its line or row ``number``
    there, and ``row``, its 1-based position among all records of the source.

    Example:
        >>> str(Location("corpus.jsonl", 12, 10))
        'corpus.jsonl:12'
    """

    source: str
    number: int
    row: int

    def __str__(self) -> str:
        return f"{self.source}:{self.number}"

    def error(self, message: str) -> UserInputError:
        """A :class:`UserInputError` prefixed with this location."""
        return located(self.source, self.number, message)


def source_format(source: str | Path, stream: bool = False) -> str:
    """The format of ``source``: a file format (``jsonl``, ``json``, ``csv``, ``parquet``, ``txt``),
    ``dataset`` (a save_to_disk folder), ``directory`` (of files) or ``hub``; a missing file or an
    unknown suffix is an error naming what is accepted.

    A stream (``-`` for stdin, a FIFO, ``<(…)``: :func:`~neobert_embed.files.is_stream`) is read
    once, line by line: as text lines, or JSON lines when its name says so. Only a caller that
    reads its input once passes ``stream=True``; for the others a stream is refused, saying why.

    Example:
        >>> source_format("docs.ndjson")
        'jsonl'
    """
    path = Path(source)
    if is_stream(source):
        return _stream_format(source, stream)
    if path.is_dir():
        saved = (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()
        return "dataset" if saved else "directory"
    if path.is_file():
        if path.suffix.lower() not in FORMATS:
            raise UserInputError(f"{path}: unknown format {path.suffix!r}; use {ACCEPTED}, a directory "
                                 "of such files, a dataset saved with save_to_disk, or a hub dataset id")
        return FORMATS[path.suffix.lower()]
    if (path.suffix and path.suffix.lower() in FORMATS) or not HUB_ID.match(str(source)):
        raise UserInputError(f"{source}: file not found; pass an existing {ACCEPTED} file, a directory, "
                             "or a hub dataset id like 'org/name'")
    return "hub"


def iter_records(source: str | Path, *, split: str = "train", subset: str | None = None,
                 streaming: bool = False, keep_blank: bool = False, text_key: str = "text",
                 columns: Sequence[str] | None = None, stream: bool = False
                 ) -> Iterator[tuple[Location, dict[str, Any]]]:
    """Yield ``(location, record)`` for every record of ``source``, in a fixed order.

    Args:
        source: a file, a directory, or a hub dataset id (see the module docstring).
        split, subset: which split (and configuration) of a dataset to read.
        streaming: stream a hub dataset instead of downloading it whole.
        keep_blank: text files only: blank lines are records too (``{"text": ""}``), so record
            ``i`` is line ``i``; by default they are skipped.
        text_key: text files only: the field a line is stored under, so a caller reading
            ``--text-field content`` reads a ``.txt`` corpus too (``{"content": line}``).
        columns: parquet files only: read just these columns (when the file has them all), so a
            caller that needs one field does not convert every column of every row.
        stream: the caller reads ``source`` once, so it may be stdin (``-``), a FIFO or a process
            substitution (see :func:`source_format`).

    Unreadable bytes, invalid JSON/CSV and unreadable parquet raise
    :class:`~neobert_embed.errors.UserInputError` naming the file and line or row.

    Example:
        >>> [record["text"] for _, record in iter_records("queries.txt")]
        ['what is a cat', 'how far is the moon']
    """
    kind = source_format(source, stream)
    if kind == "directory":
        files = _directory_files(Path(source), kind)
        if not files:
            raise UserInputError(f"{source}: the directory holds no {ACCEPTED} files and is not a dataset "
                                 "saved with save_to_disk")
        numbered = ((str(f), n, r) for f in files for n, r in _file_records(f, FORMATS[f.suffix.lower()],
                                                                              keep_blank, text_key, columns))
    elif kind in ("dataset", "hub"):
        name = f"{source}[{split}]"
        numbered = ((name, n, r) for n, r in enumerate(_dataset(str(source), kind, split, subset, streaming),
                                                        start=1))
    else:
        numbered = ((str(source), n, r) for n, r in _file_records(Path(source), kind, keep_blank, text_key,
                                                                                    columns))
    for row, (name, number, record) in enumerate(numbered, start=1):
        yield Location(name, number, row), record


def fingerprint(source: str | Path, split: str = "train") -> str:
    """A short id of a source's version: path and SHA-256 of the content of every local file (or the
    dataset id and split), so a resumed job can refuse data that changed underneath it, whatever its
    size or modification time say. A directory counts only the files :func:`iter_records` reads (no
    hidden files such as ``.DS_Store``, no files of unknown format).

    Example:
        >>> fingerprint("corpus.jsonl")
        'a3f9c2d81b7e4f60'
    """
    path = Path(source)
    files = [path] if path.is_file() else _directory_files(path, source_format(path)) if path.is_dir() else []
    parts = [f"{p.resolve()}:{sha256_file(p)}" for p in files] or [f"hub:{source}"]
    return value_digest("\n".join([f"split:{split}", *parts]), 16)


DATA_CONTENT_KEY = "data_content"


def data_content(sources: Iterable[str | Path], recorded: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"data_content": {absolute path: fingerprint}}`` of the local ``sources``, for a run's record: a
    ``--resume`` after a data file's content changed is then refused by ``check_resume``, naming the file.
    Empty when ``recorded`` (the run's record) predates it, so that such a run still resumes.

    Example:
        >>> data_content(["train.jsonl"], None)
        {'data_content': {'/home/me/train.jsonl': 'a3f9c2d81b7e4f60'}}
    """
    if recorded is not None and DATA_CONTENT_KEY not in recorded:
        return {}
    local = [Path(source) for source in sources if Path(source).exists()]
    return {DATA_CONTENT_KEY: {str(path.resolve()): fingerprint(path) for path in local}}


def _directory_files(directory: Path, kind: str) -> list[Path]:
    """The files under ``directory`` that a ``kind`` source is read from, in name order: never hidden
    ones; for a ``directory`` of files, only those of a known format (with a suffix)."""
    return [p for p in sorted(directory.rglob("*")) if p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(directory).parts)
            and (kind != "directory" or (p.suffix != "" and p.suffix.lower() in FORMATS))]


def _stream_format(source: str | Path, allowed: bool) -> str:
    """The format a stream is read in: JSON lines when its name ends so, else text lines."""
    what = "standard input" if str(source) == STDIN else "a pipe (a FIFO or process substitution), not a regular file"
    if not allowed:
        raise UserInputError(f"{source} is {what}, which can be read only once, but this command reads its input "
                             "more than once; save it to a file first and pass that file")
    kind = FORMATS.get(Path(str(source)).suffix.lower(), "txt")
    if kind not in ("txt", "jsonl"):
        raise UserInputError(f"{source} is {what}; a {kind} input is read from a file only (save it to a file "
                             "first), while a stream is read as text lines or, named *.jsonl, as JSON lines")
    return kind


def _file_records(path: Path, kind: str, keep_blank: bool, text_key: str, columns: Sequence[str] | None
                  ) -> Iterator[tuple[int, dict[str, Any]]]:
    if kind == "txt":
        return ((line, {text_key: text}) for line, text in iter_text_lines(path, keep_blank=keep_blank))
    if kind == "parquet":
        return _parquet_records(path, columns)
    readers = {"jsonl": iter_jsonl, "json": _json_records, "csv": _csv_records}
    return readers[kind](path)


def _json_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """A JSON list of objects (or ``{"key": [objects]}``), numbered by row; else JSON lines, streamed."""
    if _holds_json_lines(path):
        yield from iter_jsonl(path)
        return
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise located(path, line, "not valid UTF-8; re-encode the file as UTF-8") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if text.lstrip().startswith("["):
            raise located(path, exc.lineno, f"invalid JSON ({exc.msg}, column {exc.colno})") from None
        yield from iter_jsonl(path)  # JSON lines saved as .json
        return
    if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
        data = next(iter(data.values()))
    for row, record in enumerate(data if isinstance(data, list) else [data], start=1):
        if not isinstance(record, dict):
            raise located(path, row, f"row {row} is {type(record).__name__}, not a JSON object; a .json "
                          "file holds a list of objects (or one object holding that list)")
        yield row, record


def _holds_json_lines(path: Path) -> bool:
    """Whether a ``.json`` file is JSON lines, judged from its first non-blank line, so a large
    JSON-lines file is streamed instead of read and decoded whole: that line is a whole JSON value
    (not a list) and more follows. A list, or an object spread over several lines, is one document."""
    with open(path, "rb") as handle:
        lines = (line for line in handle if line.strip())
        first = next(lines, b"").lstrip()
        if first.startswith(b"[") or next(lines, None) is None:  # a list, or one line: parsed once, whole
            return False
        try:
            json.loads(first.decode("utf-8-sig"))
        except ValueError:  # not UTF-8 or not a whole value: parse whole, for the located error
            return False
        return True


def _csv_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of a csv file by line; an Excel byte-order mark is not part of the first column's name,
    and a cell may be as long as a document (csv refuses cells over 128 KiB by default)."""
    csv.field_size_limit(CSV_FIELD_LIMIT)
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle)
        try:
            for record in reader:
                if None in record:
                    raise located(path, reader.line_num, f"{len(record) - 1 + len(record[None])} values but "
                                  f"the header names {len(reader.fieldnames or [])} columns; quote values "
                                  "that contain commas")
                yield reader.line_num, record
        except UnicodeDecodeError:
            raise located(path, reader.line_num + 1, "not valid UTF-8; re-encode the file as UTF-8") from None
        except csv.Error as exc:
            raise located(path, reader.line_num, f"invalid CSV ({exc})") from None


def _parquet_records(path: Path, columns: Sequence[str] | None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Rows of a parquet file, of ``columns`` only when it has them all (else every column, so a
    missing one is reported with the columns there are)."""
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several unrelated types for unreadable files
        raise UserInputError(f"{path}: not a readable parquet file ({exc})") from None
    if columns and set(columns) <= set(parquet.schema_arrow.names):
        batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=list(columns))
    else:
        batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS)
    records = (record for batch in batches for record in batch.to_pylist())
    yield from enumerate(records, start=1)


def _dataset(source: str, kind: str, split: str, subset: str | None, streaming: bool):
    """A save_to_disk folder's split, or a hub dataset's (downloaded, or streamed)."""
    import datasets

    try:
        if kind == "dataset":
            loaded = datasets.load_from_disk(source)
        else:
            loaded = datasets.load_dataset(source, subset, split=split, streaming=streaming)
    except Exception as exc:  # datasets raises many unrelated types for "cannot load"
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        what = ("a folder saved with save_to_disk that cannot be loaded" if kind == "dataset" else
                "not a local file or directory, and not loadable as a Hugging Face dataset")
        raise UserInputError(f"{source}: {what} ({first_line}); check the path, or the dataset id, subset "
                             "and split and your network/HF_HUB_OFFLINE") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise UserInputError(f"{source}: no split {split!r}; splits: {', '.join(loaded)} (pass --split)")
        loaded = loaded[split]
    return loaded
