"""Index documents: which record fields hold the id, title and text, and the checks on them.

Why: records come from :mod:`neobert_embed.sources` (every format, errors located); this module
adds only what an index needs of a record: a non-empty id (or the row number), a text, an optional
title, each problem reported with the file and line or row it sits on before any model time is
spent. Duplicate ids and empty corpora are detected by the document store while the corpus is
imported (see :mod:`neobert_embed.index.store`).

Example:
    >>> for doc in read_corpus("corpus.jsonl", CorpusFields(text_field="text", id_field="_id")):
    ...     print(doc.line, doc.doc_id, doc.text[:40])
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neobert_embed.sources import Location, iter_records, source_format

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CorpusDocument:
    """One document as read from its source.

    Attributes:
        doc_id: the user's id (``--id-field``), or the record's row number (1-based, over the whole
            source) with ``row_ids`` and for a ``.txt`` file.
        title: optional title, empty when the source has none.
        text: the body; what is encoded is ``title + " " + text`` when a title exists (as mteb does).
        line: 1-based line (jsonl, csv, txt) or row (json list, parquet, datasets) in its file.
        where: ``file:line`` (or row), for messages.
    """

    doc_id: str
    title: str
    text: str
    line: int
    where: str = ""

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
        row_ids: ignore ``id_field`` and number documents by their row (1-based, over the whole source).
        split: split to read when the corpus is a Hugging Face dataset.
    """

    text_field: str = "text"
    id_field: str = "_id"
    title_field: str | None = "title"
    row_ids: bool = False
    split: str = "train"


def _field(where: Location, record: dict[str, Any], field: str, what: str, flag: str) -> Any:
    if field not in record or record[field] is None:
        present = ", ".join(sorted(map(str, record))) or "none"
        raise where.error(f"{what} field {field!r} is missing (fields present: {present}); "
                          f"fix the row or pass {flag}")
    return record[field]


def _document(where: Location, record: dict[str, Any], fields: CorpusFields, row_ids: bool) -> CorpusDocument:
    text = _field(where, record, fields.text_field, "text", "--text-field")
    if not isinstance(text, str):
        raise where.error(f"text field {fields.text_field!r} must be a string, got {type(text).__name__}")
    if row_ids:
        doc_id = str(where.row)
    else:
        doc_id = str(_field(where, record, fields.id_field, "id", "--id-field (or --row-ids)"))
        if not doc_id.strip():
            raise where.error(f"id field {fields.id_field!r} is empty; every document needs an id")
    title = (record.get(fields.title_field) or "") if fields.title_field else ""
    if not isinstance(title, str):
        raise where.error(f"title field {fields.title_field!r} must be a string")
    return CorpusDocument(doc_id=doc_id, title=title, text=text, line=where.number, where=str(where))


def read_corpus(source: str | Path, fields: CorpusFields | None = None) -> Iterator[CorpusDocument]:
    """Yield the documents of a corpus one by one, with located errors.

    Args:
        source: any source :func:`neobert_embed.sources.iter_records` reads (jsonl, ndjson, json,
            csv, parquet, txt, a directory, a save_to_disk folder, a hub id). A ``.txt`` file holds
            one document per line, numbered by row.
        fields: which fields hold id, text and title (defaults: ``_id``, ``text``, ``title``).

    Example:
        >>> docs = read_corpus("news.parquet", CorpusFields(text_field="body", row_ids=True))
        >>> next(docs).doc_id
        '1'
    """
    fields = fields or CorpusFields()
    row_ids = fields.row_ids or source_format(source) == "txt"
    skipped: list[str] = []
    for where, record in iter_records(source, split=fields.split, text_key=fields.text_field):
        document = _document(where, record, fields, row_ids)
        if document.encoded_text:
            yield document
        else:  # an empty text and title would be indexed as the vector of "", found by every query
            skipped.append(str(where))
    if skipped:
        logger.warning("%s: skipped %d document(s) with no text and no title (first: %s)", source, len(skipped),
                       skipped[0])
