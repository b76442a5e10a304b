"""Streaming corpus readers: JSON lines, parquet, plain text, Hugging Face datasets.

Why: a corpus can be far larger than memory, so documents are yielded one at a time, and every
problem (missing field, bad encoding, empty id) is reported with the file and the line or row it
sits on, before any model time is spent on it. Duplicate ids and empty corpora are detected by the
document store while the corpus is imported (see :mod:`neobert_embed.index.store`).

Example:
    >>> for doc in read_corpus("corpus.jsonl", text_field="text", id_field="_id"):
    ...     print(doc.line, doc.doc_id, doc.text[:40])
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neobert_embed.errors import UserInputError, located
from neobert_embed.files import iter_jsonl, iter_text_lines

JSONL_SUFFIXES = {".jsonl", ".ndjson", ".json"}
PARQUET_SUFFIXES = {".parquet", ".pq"}
TEXT_SUFFIXES = {".txt", ".text", ".tsv"}
PARQUET_BATCH_ROWS = 8192


@dataclass(frozen=True)
class CorpusDocument:
    """One document as read from its source.

    Attributes:
        doc_id: the user's id (``--id-field``), or the line/row number with ``row_ids``.
        title: optional title, empty when the source has none.
        text: the body; what is encoded is ``title + " " + text`` when a title exists (as mteb does).
        line: 1-based line (jsonl, txt) or row (parquet, datasets) the document came from.
    """

    doc_id: str
    title: str
    text: str
    line: int

    @property
    def encoded_text(self) -> str:  # mteb: mteb/_create_dataloaders.py _corpus_to_dict
        """The string the model sees: title and body joined exactly like mteb's retrieval tasks."""
        return f"{self.title} {self.text}".strip() if self.title else self.text.strip()


@dataclass(frozen=True)
class CorpusFields:
    """Which fields of a record hold the id, text and title.

    Attributes:
        text_field: field with the document body.
        id_field: field with the unique document id.
        title_field: field with an optional title, joined before the text as mteb does
            (``title + " " + text``) when a record has one; default ``title``; empty or None: no titles.
        row_ids: ignore ``id_field`` and number documents by their line/row (1-based).
        split: split to read when the corpus is a Hugging Face dataset.
    """

    text_field: str = "text"
    id_field: str = "_id"
    title_field: str | None = "title"
    row_ids: bool = False
    split: str = "train"


def corpus_kind(source: str | Path) -> str:
    """Classify a corpus source as ``jsonl``, ``parquet``, ``txt`` or ``hf`` (a dataset).

    Example:
        >>> corpus_kind("docs.parquet")
        'parquet'
    """
    path = Path(source)
    if path.is_dir():
        return "hf"
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix in PARQUET_SUFFIXES:
        return "parquet"
    if suffix in TEXT_SUFFIXES:
        return "txt"
    if path.exists():
        raise UserInputError(f"{path}: unknown corpus format {suffix!r}; use .jsonl, .parquet or .txt "
                             "(one document per line), or a Hugging Face dataset")
    if str(source).count("/") <= 1 and not suffix:
        return "hf"
    raise UserInputError(f"{path}: file not found")


def corpus_fingerprint(source: str | Path) -> str:
    """Identify a corpus version (path, size, modification time) so a resume can refuse a changed file.

    Example:
        >>> corpus_fingerprint("corpus.jsonl")  # doctest: +SKIP
        'a3f9...'
    """
    path = Path(source)
    if path.is_file():
        stat = path.stat()
        key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    else:
        key = str(path.resolve() if path.exists() else source)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def _field(source: str, line: int, record: dict[str, Any], field: str, what: str, flag: str) -> Any:
    if field not in record or record[field] is None:
        present = ", ".join(sorted(map(str, record))) or "none"
        raise located(source, line, f"{what} field {field!r} is missing (fields present: {present}); "
                      f"fix the row or pass {flag}")
    return record[field]


def _document(source: str, line: int, record: dict[str, Any], fields: CorpusFields) -> CorpusDocument:
    text = _field(source, line, record, fields.text_field, "text", "--text-field")
    if not isinstance(text, str):
        raise located(source, line, f"text field {fields.text_field!r} must be a string, "
                      f"got {type(text).__name__}")
    if fields.row_ids:
        doc_id = str(line)
    else:
        raw_id = _field(source, line, record, fields.id_field, "id", "--id-field (or --row-ids)")
        doc_id = str(raw_id)
        if not doc_id.strip():
            raise located(source, line, f"id field {fields.id_field!r} is empty; every document needs an id")
    title = ""
    if fields.title_field:
        title = record.get(fields.title_field) or ""
        if not isinstance(title, str):
            raise located(source, line, f"title field {fields.title_field!r} must be a string")
    return CorpusDocument(doc_id=doc_id, title=title, text=text, line=line)


def _iter_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several unrelated types for unreadable files
        raise UserInputError(f"{path}: not a readable parquet file ({exc})") from None
    row = 0
    for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
        for record in batch.to_pylist():
            row += 1
            yield row, record


def _iter_dataset(source: str, split: str) -> Iterator[tuple[int, dict[str, Any]]]:
    import datasets

    try:
        if Path(source).is_dir():
            loaded = datasets.load_from_disk(source)
        else:
            loaded = datasets.load_dataset(source, split=split)
    except (FileNotFoundError, ValueError, ConnectionError, OSError) as exc:
        raise UserInputError(f"cannot load Hugging Face dataset {source!r}: {exc}. Pass a .jsonl, "
                             ".parquet or .txt file, a dataset saved with save_to_disk, or a hub "
                             "dataset id reachable from this machine") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise UserInputError(f"dataset {source!r} has no split {split!r}; splits: "
                                 f"{', '.join(loaded)} (pass --split)")
        loaded = loaded[split]
    yield from enumerate(loaded, start=1)


def read_corpus(source: str | Path, fields: CorpusFields | None = None) -> Iterator[CorpusDocument]:
    """Yield the documents of a corpus one by one, with located errors.

    Args:
        source: ``.jsonl``/``.parquet``/``.txt`` file, a ``save_to_disk`` dataset folder, or a hub
            dataset id. A ``.txt`` file holds one document per line; its ids are line numbers.
        fields: which fields hold id, text and title (defaults: ``_id``, ``text``, ``title``).

    Example:
        >>> docs = read_corpus("news.parquet", CorpusFields(text_field="body", row_ids=True))
        >>> next(docs).doc_id
        '1'
    """
    fields = fields or CorpusFields()
    kind = corpus_kind(source)
    name = str(source)
    if kind == "txt":
        for line, text in iter_text_lines(source):
            yield CorpusDocument(doc_id=str(line), title="", text=text, line=line)
        return
    if kind == "jsonl":
        records = iter_jsonl(source)
    elif kind == "parquet":
        records = _iter_parquet(Path(source))
    else:
        records = _iter_dataset(name, fields.split)
        name = f"{name}[{fields.split}]"
    for line, record in records:
        yield _document(name, line, record, fields)
