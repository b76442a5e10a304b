"""Index integrity: checksums in the manifest, ``index verify``, and one-line errors on open.

Why: a truncated copy, a disk error or an ``index.faiss`` copied from another index used to fail
deep inside FAISS or SQLite with a long traceback (once a bare ``AssertionError``), or worse, to
load and return wrong documents. The manifest records each file's size and SHA-256 when the index
is written; opening an index (search, add, serve) checks both, and what FAISS and SQLite hold, against
the manifest; ``neobert-embed index verify DIR`` recomputes the checksums and reports every difference.

Example:
    >>> report = verify_index("runs/news-index")
    >>> report.ok, report.problems
    (True, [])
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from neobert_embed.errors import UserInputError
from neobert_embed.files import FilePin
from neobert_embed.index.factory import read_faiss_index
from neobert_embed.index.manifest import INDEX_NAME, STORE_NAME, IndexManifest, read_manifest
from neobert_embed.index.ondisk import IVFDATA_NAME, read_on_disk
from neobert_embed.index.rerank import RERANK_NAME
from neobert_embed.index.store import DocumentStore
from neobert_embed.records import INDEX_MANIFEST

if TYPE_CHECKING:
    import faiss

CHECKSUMMED = (INDEX_NAME, STORE_NAME, IVFDATA_NAME, RERANK_NAME)  # the last two only exist for some indexes


def _advice(directory: Path) -> str:
    return (f"restore {directory} from a copy, or rebuild it with `neobert-embed index build --overwrite` "
            "(an interrupted build continues with `--resume`); `neobert-embed index verify` checks every file")


def with_checksums(directory: str | Path, manifest: IndexManifest) -> IndexManifest:
    """``manifest`` with the checksums of the index files in ``directory`` (call before writing it).

    Example:
        >>> write_manifest(work, with_checksums(work, manifest))
    """
    directory = Path(directory)
    return manifest.model_copy(update={"files": {name: FilePin.of(directory / name) for name in CHECKSUMMED
                                                 if (directory / name).is_file()}})


def check_index_files(directory: str | Path) -> IndexManifest:
    """The manifest of ``directory``, after checking every file it lists against its recorded size and
    SHA-256 (:func:`check_checksums`): what ``index search``, ``add`` and ``serve`` run before they load a model.

    Example:
        >>> check_index_files("runs/news-index").documents
        120000
    """
    manifest = read_manifest(directory)
    check_checksums(Path(directory), manifest)
    return manifest


def check_checksums(directory: Path, manifest: IndexManifest) -> None:
    """Refuse, in one line naming the file, an index file that is missing or differs from the size or the
    SHA-256 in the manifest: the one check before every search, add and serve, so a damaged index is never
    searched, and ``index add`` never records new checksums over a damaged file.

    Hashing reads each file once (~1.6 GB/s on a 2-core EPYC; the index is read next anyway, from the page
    cache); a file this process verified and nothing wrote since is not hashed again (:class:`FilePin`).

    Example:
        >>> check_checksums(Path("runs/news-index"), read_manifest("runs/news-index"))
    """
    for name, recorded in manifest.files.items():
        path = directory / name
        difference = recorded.difference(path)
        if difference == "missing":
            raise UserInputError(f"{path}: missing; {_advice(directory)}")
        if difference is not None:
            raise UserInputError(f"{path}: {difference} in the manifest (truncated, corrupt or from another "
                                 f"index); {_advice(directory)}")


def open_faiss(directory: str | Path, manifest: IndexManifest) -> faiss.Index:
    """Load ``index.faiss`` of ``directory`` and check it is this index's (vectors, dimension).

    An ``--on-disk`` index is opened with its inverted lists memory-mapped from ``index.ivfdata``.

    Example:
        >>> open_faiss("runs/news-index", read_manifest("runs/news-index")).ntotal
        7600
    """
    directory = Path(directory)
    check_checksums(directory, manifest)
    path = directory / INDEX_NAME
    try:
        index = read_on_disk(directory) if manifest.on_disk else read_faiss_index(path, manifest.binary)
    except (RuntimeError, AssertionError, MemoryError, EOFError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:160]
        raise UserInputError(f"{path}: not a readable FAISS index ({reason}); {_advice(directory)}") from None
    if int(index.ntotal) != manifest.vectors or int(index.d) != manifest.dimension:
        raise UserInputError(f"{path}: holds {index.ntotal} vectors of dimension {index.d} but the manifest "
                             f"says {manifest.vectors} of dimension {manifest.dimension}: the file belongs "
                             f"to another index; {_advice(directory)}")
    return index


def open_store(directory: str | Path, manifest: IndexManifest, read_only: bool = True) -> DocumentStore:
    """Open ``documents.sqlite`` of ``directory`` and check it holds the manifest's rows.

    Example:
        >>> open_store("runs/news-index", read_manifest("runs/news-index")).live_count()
        7600
    """
    directory = Path(directory)
    check_checksums(directory, manifest)
    path = directory / STORE_NAME
    store = None
    try:
        store = DocumentStore(path, read_only=read_only)
        rows, live = store.vector_count(), store.live_count()
    except sqlite3.DatabaseError as exc:
        if store is not None:
            with contextlib.suppress(sqlite3.DatabaseError):
                store.close()
        raise UserInputError(f"{path}: not a readable document store ({exc}); {_advice(directory)}") from None
    if rows != manifest.vectors or live != manifest.documents:
        store.close()
        raise UserInputError(f"{path}: holds {rows} rows ({live} live) but the manifest says {manifest.vectors} "
                             f"({manifest.documents} live): the file belongs to another index or version; "
                             f"{_advice(directory)}")
    return store


@dataclass
class VerifyReport:
    """What ``index verify`` found: ``problems`` is empty when every check passed."""

    directory: str
    checked: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems


def verify_index(directory: str | Path) -> VerifyReport:
    """Recompute every checksum of an index and open its FAISS file and store against the manifest.

    Example:
        >>> verify_index("runs/news-index").ok
        True
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    report = VerifyReport(str(directory))
    if not manifest.files:
        report.problems.append(f"{INDEX_MANIFEST.path(directory)}: records no checksums (index made by an older "
                               "version); rebuild it to get them")
    for name, recorded in manifest.files.items():
        path = directory / name
        difference = recorded.difference(path)
        if difference != "missing":
            report.checked.append(name)
        if difference is not None:
            report.problems.append(f"{path}: {difference}" if difference == "missing" else
                                   f"{path}: checksum differs from the manifest ({difference}): the file is "
                                   "corrupt or from another index")
    for opener in (open_faiss, open_store):
        try:
            opened = opener(directory, manifest)
        except UserInputError as exc:
            message = str(exc).split("; restore")[0]
            named = message.split(": ")[0]  # the file: a checksum found different above is not reported twice
            if not any(problem.split(": ")[0] == named for problem in report.problems):
                report.problems.append(message)
        else:
            if isinstance(opened, DocumentStore):
                opened.close()
    return report
