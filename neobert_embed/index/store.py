"""The id/text store kept next to a FAISS index: one SQLite file, no pickles.

Why: FAISS only knows integer positions. The store maps position ``row`` (the FAISS id) to the
user's document id, title and text, enforces unique ids (a duplicate is reported with the file
and line of both occurrences), and remembers which rows were replaced (FAISS cannot delete from
every index type, so replaced rows are tombstoned and filtered at search time). Which encoding
chunks of an interrupted build are finished is told by their shard files, not by the store.

Example:
    >>> store = DocumentStore("index/documents.sqlite")
    >>> store.import_documents(read_corpus("corpus.jsonl"), source="corpus.jsonl")
    >>> store.get([0])[0].doc_id
    'd1'
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from neobert_embed.errors import UserInputError
from neobert_embed.index.documents import CorpusDocument

COMMIT_EVERY = 10_000
DUPLICATE_POLICIES = ("error", "replace")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS imports (import_id INTEGER PRIMARY KEY, source TEXT NOT NULL,
                                    complete INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS documents (
    row INTEGER PRIMARY KEY,
    doc_id TEXT NOT NULL,
    title TEXT NOT NULL,
    text TEXT NOT NULL,
    import_id INTEGER NOT NULL REFERENCES imports(import_id),
    line INTEGER NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS live_doc_ids ON documents(doc_id) WHERE deleted = 0;
"""
#: Only in an index of passages (``index build --passages``): FAISS id -> document row and its characters.
_PASSAGES_SCHEMA = """
CREATE TABLE IF NOT EXISTS passages (row INTEGER PRIMARY KEY, document INTEGER NOT NULL REFERENCES documents(row),
                                     start_char INTEGER NOT NULL, end_char INTEGER NOT NULL)
"""
_INSERT = "INSERT INTO documents (row, doc_id, title, text, import_id, line) VALUES (?, ?, ?, ?, ?, ?)"


@dataclass(frozen=True)
class StoredDocument:
    """A document as kept in the store; ``row`` is its FAISS id."""

    row: int
    doc_id: str
    title: str
    text: str

    @property
    def encoded_text(self) -> str:
        """What the model encodes (title and text joined as mteb does)."""
        return CorpusDocument(self.doc_id, self.title, self.text, 0).encoded_text


@dataclass(frozen=True)
class ImportResult:
    """Outcome of one import: rows ``[first_row, first_row + added)`` are new, ``replaced`` were tombstoned."""

    first_row: int
    added: int
    replaced: int


class DocumentStore:
    """SQLite-backed id/text store whose rows are FAISS positions (0-based, append-only)."""

    def __init__(self, path: str | Path, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        if read_only:
            if not self.path.is_file():
                raise UserInputError(f"{self.path}: missing; the index directory is incomplete, rebuild it")
            self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                       isolation_level=None, check_same_thread=False)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Fold the write-ahead log back into the single store file (so it can be copied) and close."""
        if not self.read_only:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._db.execute("PRAGMA journal_mode=DELETE")
        self._db.close()

    def __enter__(self) -> DocumentStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def total_rows(self) -> int:
        """Rows ever added, tombstoned ones included: equals the FAISS index's ``ntotal``."""
        return int(self._db.execute("SELECT COUNT(*) FROM documents").fetchone()[0])

    def live_count(self) -> int:
        """Documents currently searchable."""
        return int(self._db.execute("SELECT COUNT(*) FROM documents WHERE deleted = 0").fetchone()[0])

    def deleted_rows(self) -> np.ndarray:
        """FAISS ids of replaced documents (of their passages, in an index of passages), to exclude at search time."""
        query = ("SELECT p.row FROM passages p JOIN documents d ON d.row = p.document WHERE d.deleted = 1 "
                 "ORDER BY p.row" if self.has_passages() else "SELECT row FROM documents WHERE deleted = 1 ORDER BY row")
        return np.asarray([r[0] for r in self._db.execute(query).fetchall()], dtype=np.int64)

    def has_passages(self) -> bool:
        """True for an index of passages (``index build --passages``): FAISS ids are passage rows."""
        return self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'passages'"
                                ).fetchone() is not None

    def vector_count(self) -> int:
        """Vectors the FAISS index holds for this store: its passages, or one per document row."""
        if self.has_passages():
            return int(self._db.execute("SELECT COUNT(*) FROM passages").fetchone()[0])
        return self.total_rows()

    def add_passages(self, spans: np.ndarray) -> int:
        """Append passages ``(document row, start, end)`` as the next FAISS ids; returns the first id.

        Example:
            >>> store.add_passages(np.array([[0, 0, 1180], [0, 905, 2043]]))
            0
        """
        self._db.execute(_PASSAGES_SCHEMA)
        first = self.vector_count()
        self._db.execute("BEGIN")
        self._db.executemany("INSERT INTO passages (row, document, start_char, end_char) VALUES (?, ?, ?, ?)",
                             ((first + i, *map(int, span)) for i, span in enumerate(spans)))
        self._db.execute("COMMIT")
        return first

    def passage_documents(self) -> np.ndarray:
        """The document row of every passage, indexed by its FAISS id."""
        rows = self._db.execute("SELECT document FROM passages ORDER BY row").fetchall()
        return np.asarray([r[0] for r in rows], dtype=np.int64)

    def passages(self, rows: Sequence[int]) -> list[tuple[int, int, int]]:
        """``(document row, start, end)`` of the passages at FAISS ids ``rows``, in the order asked."""
        wanted = [int(r) for r in rows]
        if not wanted:
            return []
        marks = ",".join("?" * len(wanted))
        found = {r[0]: (r[1], r[2], r[3]) for r in self._db.execute(
            f"SELECT row, document, start_char, end_char FROM passages WHERE row IN ({marks})", wanted)}
        return [found[r] for r in wanted]

    def import_finished(self, source: str) -> bool:
        """True when an import of ``source`` ran to completion (a resumed build skips re-reading it)."""
        return self._db.execute("SELECT 1 FROM imports WHERE source = ? AND complete = 1",
                                (source,)).fetchone() is not None

    def _start_import(self, source: str) -> tuple[int, int]:
        """Return (import id, documents already imported) for ``source``, resuming an unfinished import."""
        found = self._db.execute("SELECT import_id, complete FROM imports WHERE source = ? "
                                 "ORDER BY import_id DESC LIMIT 1", (source,)).fetchone()
        if found is not None and not found[1]:
            done = self._db.execute("SELECT COUNT(*) FROM documents WHERE import_id = ?",
                                    (found[0],)).fetchone()[0]
            return int(found[0]), int(done)
        cursor = self._db.execute("INSERT INTO imports (source) VALUES (?)", (source,))
        return int(cursor.lastrowid), 0

    def largest_numeric_id(self) -> int:
        """The largest document id that is a whole number (0 when there is none): where row-number
        ids of a later ``index add`` continue from.

        Example:
            >>> store.largest_numeric_id()
            300
        """
        found = self._db.execute("SELECT MAX(CAST(doc_id AS INTEGER)) FROM documents "
                                 "WHERE doc_id GLOB '[0-9]*' AND doc_id NOT GLOB '*[^0-9]*'").fetchone()[0]
        return int(found or 0)

    def _duplicate(self, doc: CorpusDocument, source: str, import_id: int, policy: str,
                   ids_are_rows: bool = False) -> int:
        """Handle a clash on a live id: tombstone the old row (``replace``) or raise a located error."""
        row, old_import, old_line, old_source = self._db.execute(
            "SELECT d.row, d.import_id, d.line, i.source FROM documents d JOIN imports i "
            "USING (import_id) WHERE d.doc_id = ? AND d.deleted = 0", (doc.doc_id,)).fetchone()
        if policy == "replace" and old_import != import_id and not ids_are_rows:
            self._db.execute("UPDATE documents SET deleted = 1 WHERE row = ?", (row,))
            return 1
        first = f"line {old_line}" if old_source == source else f"{old_source}:{old_line}"
        if old_import == import_id:
            hint = "ids must be unique within a corpus; remove or rename one of them"
        elif ids_are_rows or doc.doc_id == str(old_line):
            hint = ("the indexed id is a row number, so the two are different documents: give the new "
                    "documents their own ids, or add them with --row-ids (numbering continues after the "
                    "index's largest id)")
        else:
            hint = "it is already in the index; pass --on-duplicate replace to overwrite it"
        raise UserInputError(f"{doc.where or source}: duplicate id {doc.doc_id!r} (first at {first}); {hint}")

    def import_documents(self, documents: Iterable[CorpusDocument], source: str,
                         on_duplicate: str = "error",
                         progress: Callable[[int], None] | None = None,
                         ids_are_rows: bool = False) -> ImportResult:
        """Append documents, committing every ``COMMIT_EVERY`` rows; an interrupted import resumes.

        Args:
            documents: documents in corpus order (the same order on every call for a resume).
            source: name of the corpus, used in messages and to find an unfinished import.
            on_duplicate: ``error`` (refuse, naming both lines) or ``replace`` (tombstone the
                indexed document with the same id). A repeat inside ``documents`` is always refused.
            progress: called with the number of documents read so far.
            ids_are_rows: the ids are line/row numbers: a clash is never "replaceable".

        Example:
            >>> store.import_documents(read_corpus("more.jsonl"), "more.jsonl", on_duplicate="replace")
            ImportResult(first_row=1000, added=20, replaced=3)
        """
        if on_duplicate not in DUPLICATE_POLICIES:
            raise ValueError(f"on_duplicate must be one of {DUPLICATE_POLICIES}, got {on_duplicate!r}")
        import_id, skip = self._start_import(source)
        earliest = self._db.execute("SELECT MIN(row) FROM documents WHERE import_id = ?",
                                    (import_id,)).fetchone()[0]
        first_row = self.total_rows() if earliest is None else int(earliest)
        row, replaced = self.total_rows(), 0
        self._db.execute("BEGIN")
        try:
            for number, doc in enumerate(documents, start=1):
                if number <= skip:
                    continue
                values = (row, doc.doc_id, doc.title, doc.text, import_id, doc.line)
                try:
                    self._db.execute(_INSERT, values)
                except sqlite3.IntegrityError:
                    replaced += self._duplicate(doc, source, import_id, on_duplicate, ids_are_rows)
                    self._db.execute(_INSERT, values)
                row += 1
                if (number - skip) % COMMIT_EVERY == 0:  # one row inserted per document after ``skip``
                    self._db.execute("COMMIT")
                    self._db.execute("BEGIN")
                    if progress:
                        progress(number)
            self._db.execute("UPDATE imports SET complete = 1 WHERE import_id = ?", (import_id,))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return ImportResult(first_row=first_row, added=row - first_row, replaced=replaced)

    def unknown_ids(self, doc_ids: Sequence[str]) -> list[str]:
        """The ids of ``doc_ids`` that no live document carries (what a judgement may not name).

        Example:
            >>> store.unknown_ids(["d1", "nope"])
            ['nope']
        """
        known: set[str] = set()
        for start in range(0, len(doc_ids), 500):  # SQLite's limit on bound parameters
            chunk = list(doc_ids[start:start + 500])
            marks = ",".join("?" * len(chunk))
            known.update(row[0] for row in self._db.execute(
                f"SELECT doc_id FROM documents WHERE deleted = 0 AND doc_id IN ({marks})", chunk))
        return [doc_id for doc_id in doc_ids if doc_id not in known]

    def get(self, rows: Sequence[int]) -> list[StoredDocument]:
        """Documents at FAISS ids ``rows``, in the order asked.

        Example:
            >>> [d.doc_id for d in store.get([3, 0])]
            ['d4', 'd1']
        """
        wanted = [int(r) for r in rows]
        if not wanted:
            return []
        marks = ",".join("?" * len(wanted))
        found = {r[0]: StoredDocument(*r) for r in self._db.execute(
            f"SELECT row, doc_id, title, text FROM documents WHERE row IN ({marks})", wanted)}
        return [found[r] for r in wanted]

    def documents_between(self, first_row: int, end_row: int) -> list[StoredDocument]:
        """Documents with ``first_row <= row < end_row`` in row order (one encoding chunk)."""
        return [StoredDocument(*r) for r in self._db.execute(
            "SELECT row, doc_id, title, text FROM documents WHERE row >= ? AND row < ? ORDER BY row",
            (first_row, end_row))]
