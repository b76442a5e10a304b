"""Exact re-ranking of product-quantized candidates against float16 vectors kept on disk.

Why: product quantization shrinks a vector to a few dozen bytes, which is what lets 100M vectors
fit in RAM, but its approximate scores mis-order the nearest neighbours. FAISS's own refine
(``IndexRefineFlat``) fixes that by keeping every float vector in RAM, which defeats the point.
Here the index returns ``k * k_factor`` candidates and they are re-scored exactly against a float16
copy of the vectors in ``vectors.f16.npy``, read row by row with ``pread``: RAM holds the codes and
one search's candidates, and the OS page cache keeps what queries touch. (A memory map looked
cheaper, but the kernel's fault-around maps 64 KB of cached file around every row it faults in:
calibrating a 1M x 384 on-disk index that way left 0.7 GB of the file in the process, peak RSS 1029 MB.)

Example:
    >>> index = RerankedIndex(faiss_index, RerankVectors(Path("runs/big-index/vectors.f16.npy")), k_factor=8)
    >>> scores, rows = index.search(queries, 10)
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from neobert_embed.files import atomic_path

if TYPE_CHECKING:
    import faiss

    from neobert_embed.index.factory import FaissIndex

RERANK_NAME = "vectors.f16.npy"
RERANK_K_FACTOR = 8
WRITE_ROWS = 65_536


def needs_rerank(factory: str) -> bool:
    """Product-quantized indexes are re-ranked; flat, scalar-quantized and HNSW ones are not.

    Example:
        >>> needs_rerank("IVF1024,PQ48x8"), needs_rerank("IVF1024,Flat")
        (True, False)
    """
    return "PQ" in factory.replace("OPQ", "") and "Refine" not in factory and "RFlat" not in factory


def write_rerank_vectors(path: Path, blocks: Iterable[tuple[int, np.ndarray]], total: int, dimension: int) -> None:
    """Stream float vectors block by block into a float16 ``.npy`` file (RAM: one block).

    Example:
        >>> write_rerank_vectors(Path("vectors.f16.npy"), [(0, x)], len(x), x.shape[1])
    """
    with atomic_path(path) as tmp:  # a crash or a short stream leaves the old file (or none), never a torn one
        written = 0
        with open(tmp, "wb") as handle:   # plain writes: a writable memmap would keep every page in RSS
            np.lib.format.write_array_header_1_0(handle, {"descr": np.dtype(np.float16).str, "fortran_order": False,
                                                          "shape": (total, dimension)})
            for first, block in blocks:
                if first != written:
                    raise ValueError(f"blocks must be contiguous: expected row {written}, got {first}")
                for start in range(0, len(block), WRITE_ROWS):   # slices: a whole memmapped block would be copied at once
                    handle.write(np.ascontiguousarray(block[start:start + WRITE_ROWS], dtype=np.float16).tobytes())
                written += len(block)
            handle.flush()
            os.fsync(handle.fileno())
        if written != total:
            raise ValueError(f"wrote {written} vectors, expected {total}")


def append_rerank_vectors(source: Path, new: list[np.ndarray], target: Path) -> None:
    """Write ``target``: the vectors of ``source`` with ``new`` blocks appended (``index add`` on a
    re-ranked index; ``source`` is only read, so the original index stays intact until the swap).

    Example:
        >>> append_rerank_vectors(Path("index/vectors.f16.npy"), [more_vectors], Path("work/vectors.f16.npy"))
    """
    old = RerankVectors(source)
    total = len(old) + sum(len(block) for block in new)

    def blocks():
        for start in range(0, len(old), WRITE_ROWS):
            yield start, old.contiguous(start, min(start + WRITE_ROWS, len(old)))
        first = len(old)
        for block in new:
            yield first, block
            first += len(block)

    write_rerank_vectors(target, blocks(), total, old.shape[1])


class RerankVectors:
    """The rows of a float16 ``.npy`` file, read on demand (``vectors[rows]`` as for an array).

    Example:
        >>> RerankVectors(Path("runs/big/vectors.f16.npy"))[np.array([3, 17])].shape
        (2, 384)
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # opened once and held, as a memory map would be: a search keeps reading the file it was opened
        # with even while `index build --overwrite` swaps the directory
        handle = open(self.path, "rb")  # noqa: SIM115 - closed by the finalizer below
        weakref.finalize(self, handle.close)
        major, _ = np.lib.format.read_magic(handle)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        self.shape, _, self.dtype = read_header(handle)
        self.offset = handle.tell()
        self._fd = handle.fileno()
        self.row_bytes = self.shape[1] * self.dtype.itemsize

    def __len__(self) -> int:
        return int(self.shape[0])

    def contiguous(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start`` to ``stop`` in one read."""
        data = os.pread(self._fd, (stop - start) * self.row_bytes, self.offset + start * self.row_bytes)
        return np.frombuffer(data, dtype=self.dtype).reshape(stop - start, self.shape[1])

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        """The vectors at ``rows`` (sorted rows read the file in order)."""
        data = b"".join(os.pread(self._fd, self.row_bytes, self.offset + int(row) * self.row_bytes) for row in rows)
        return np.frombuffer(data, dtype=self.dtype).reshape(len(rows), self.shape[1])


class RerankedIndex:
    """A FAISS index whose top ``k * k_factor`` candidates are re-scored exactly (inner product).

    Behaves like a FAISS index for :func:`neobert_embed.index.factory.search_vectors`: ``search``,
    ``ntotal``, ``d``; ``reranked_base`` is the wrapped index (whose search parameters apply).
    """

    def __init__(self, base: FaissIndex, vectors: np.ndarray | RerankVectors, k_factor: int = RERANK_K_FACTOR) -> None:
        self.reranked_base = base
        self.vectors = vectors
        self.k_factor = int(k_factor)

    @property
    def ntotal(self) -> int:
        """Vectors in the wrapped index."""
        return int(self.reranked_base.ntotal)

    @property
    def d(self) -> int:
        """Dimension of the wrapped index."""
        return int(self.reranked_base.d)

    def search(self, queries: np.ndarray, k: int, *, params: faiss.SearchParameters | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` (scores, ids) after exact re-scoring; -1 pads missing results like FAISS."""
        _, candidates = self.reranked_base.search(queries, k * self.k_factor, params=params)
        valid = candidates >= 0
        rows = np.where(valid, candidates, 0)
        order = np.argsort(rows, axis=None, kind="stable")
        flat = np.empty((rows.size, self.d), dtype=np.float32)
        flat[order] = self.vectors[rows.reshape(-1)[order]]  # sorted reads touch the file in order
        scores = np.einsum("qd,qkd->qk", queries.astype(np.float32), flat.reshape(*rows.shape, self.d))
        scores[~valid] = -np.inf
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        best_scores = np.take_along_axis(scores, top, axis=1)
        best_ids = np.where(np.isfinite(best_scores), np.take_along_axis(candidates, top, axis=1), -1)
        return np.where(np.isfinite(best_scores), best_scores, -np.inf).astype(np.float32), best_ids


def with_rerank(index: FaissIndex, directory: Path, k_factor: int | None) -> FaissIndex | RerankedIndex:
    """Wrap ``index`` for re-ranking against ``directory``'s float16 vectors when the manifest asks
    for it (``k_factor`` set).

    Example:
        >>> index = with_rerank(faiss.read_index("index.faiss"), Path("runs/big"), 8)
    """
    return index if not k_factor else RerankedIndex(index, RerankVectors(Path(directory) / RERANK_NAME), k_factor)
