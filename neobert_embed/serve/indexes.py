"""The indexes a server searches, reopened when ``index add`` changes them.

Why: ``index add`` replaces an index directory atomically, and a server must serve the new documents
without a restart: each request compares the manifest's (inode, size, mtime) with the one opened. A
directory gone for good is refused (503) and reported by ``/health`` until it is back. Queries go through
the server's batcher when the served model built the index, else through the index's own model.

Example:
    >>> registry = IndexRegistry(["runs/news-index"], served=served)
    >>> registry.get("news-index").index.manifest.documents
    7600
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from neobert_embed.errors import UserInputError
from neobert_embed.index import Hit, SearchIndex, open_index, read_manifest
from neobert_embed.index.encoder import IndexEncoder
from neobert_embed.inference.runtime import InferenceModel
from neobert_embed.locks import read_holder
from neobert_embed.records import INDEX_MANIFEST
from neobert_embed.serve.errors import APIError

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)
VANISH_RECHECK_SECONDS = 0.05  # a missing manifest is looked for again once before the index counts as gone


class UnknownIndex(APIError):
    """A request named an index this server does not serve."""

    status, kind = 404, "not_found"


class IndexGone(APIError):
    """A served index whose directory disappeared under the server (answered 503, and /health says so)."""

    status, kind = 503, "index_unavailable"


def _stamp(directory: Path) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(INDEX_MANIFEST.path(directory))
    except FileNotFoundError:  # mid-replacement by `index add`: keep the open one
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


@dataclass
class OpenIndex:
    """One opened version of an index."""

    name: str
    index: SearchIndex
    stamp: tuple[int, int, int] | None
    shared: bool  # True: queries are encoded by the served model through the batcher
    lock: threading.Lock = field(default_factory=threading.Lock)  # FAISS params and SQLite: one at a time

    def hits(self, vectors: np.ndarray, k: int) -> list[list[Hit]]:
        """Top-``k`` documents for query vectors encoded the index's way."""
        with self.lock:
            return self.index.hits(vectors, k)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Encode ``queries`` with the index's own model and search (for a non-shared index)."""
        with self.lock:
            return self.index.search(queries, k)


class IndexRegistry:
    """Named indexes (directory name → open index), reopened when their manifest changes."""

    def __init__(self, directories: Sequence[str | Path], served: InferenceModel | None = None,
                 model_name: str = "", device: str | None = None) -> None:
        self.served, self.model_name, self.device = served, model_name, device
        self.directories: dict[str, Path] = {}
        for directory in map(Path, directories):
            name = directory.resolve().name
            if name in self.directories:
                raise UserInputError(f"two indexes are named {name!r} ({self.directories[name]} and "
                                     f"{directory}); serve directories with different names")
            read_manifest(directory)  # a clear error now rather than at the first request
            self.directories[name] = directory
        self._open: dict[str, OpenIndex] = {}
        self.gone: dict[str, str] = {}  # indexes whose directory disappeared: why each is refused
        self._lock = threading.Lock()
        for name in self.names:  # opened now, so the first request does not pay for it
            self.get(name)

    @property
    def names(self) -> list[str]:
        """Served index names, in command-line order (the first is the default)."""
        return list(self.directories)

    def get(self, name: str | None) -> OpenIndex:
        """The current version of index ``name`` (default: the first), reopened if it changed."""
        if not self.directories:
            raise UnknownIndex("this server has no index; start it with --index DIR to enable /search")
        name = name if name is not None else self.names[0]
        if name not in self.directories:
            raise UnknownIndex(f"unknown index {name!r}; this server has: {', '.join(self.names)}")
        directory = self.directories[name]
        stamp = _stamp(directory)
        if stamp is None and self._vanished(name, directory):
            raise IndexGone(f"index {name!r} is unavailable: {self.gone[name]}")
        self._back(name)
        with self._lock:  # a changed index is reopened once; searches in flight finish on the old version
            current = self._open.get(name)
            if current is None or (stamp is not None and stamp != current.stamp):
                current = self._open[name] = self._load(name, directory, stamp)
        return current

    def _vanished(self, name: str, directory: Path) -> bool:
        """Whether ``directory`` is gone for good, not being replaced by ``index add`` (which holds its writer
        lock); logged once."""
        if read_holder(directory) is not None:
            return False  # mid-replacement: keep serving the open version
        time.sleep(VANISH_RECHECK_SECONDS)
        if _stamp(directory) is not None:
            return False
        if name not in self.gone:
            self.gone[name] = (f"its directory {directory} (or its {INDEX_MANIFEST.name}) disappeared; "
                               "searches are refused until it is back (rebuild it, or restore it) or the server "
                               "restarts without it")
            logger.error("index %r: %s", name, self.gone[name])
            self._open.pop(name, None)  # release its files
        return True

    def unavailable(self) -> dict[str, str]:
        """Served indexes whose directory has disappeared, with why (looked at now, nothing opened)."""
        for name, directory in self.directories.items():
            if _stamp(directory) is None:
                self._vanished(name, directory)
            else:
                self._back(name)
        return dict(self.gone)

    def _back(self, name: str) -> None:
        if self.gone.pop(name, None) is not None:
            logger.warning("index %r is back; searching it again", name)

    def _load(self, name: str, directory: Path, stamp: tuple[int, int, int] | None) -> OpenIndex:
        manifest, served = read_manifest(directory), self.served
        if served is not None and served.fingerprint is not None:
            encoder = IndexEncoder(model=served.model, name=self.model_name, path=None, revision=None,
                                   fingerprint=served.fingerprint, choice=served.choice,
                                   similarity=getattr(served.model, "similarity_fn_name", None) or "cosine")
            # an export computes as saved whatever precision the index was built at (as `index search` with it)
            if (encoder.matches(manifest) and int(served.model.max_seq_length) == manifest.max_seq_length
                    and (served.backend != "torch" or encoder.compute_precision == manifest.compute_precision)):
                return OpenIndex(name, open_index(directory, encoder=encoder), stamp, shared=True)
        return OpenIndex(name, open_index(directory, device=self.device), stamp, shared=False)
