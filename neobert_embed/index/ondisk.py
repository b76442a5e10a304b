"""``--on-disk``: an IVF index whose inverted lists live in a memory-mapped file, not in RAM.

Why: a flat index of 21M x 768 floats needs 64 GB of RAM just to load. An IVF index only needs its
coarse quantizer in RAM if its inverted lists (the codes) are read from disk on demand. Following
FAISS's own recipe (``faiss/contrib/ondisk.py``), the trained, empty index is copied once per shard
of the build and filled with that shard alone; the per-shard inverted lists are then merged into
one ``OnDiskInvertedLists`` file (``index.ivfdata``) and searched through ``mmap``. RAM during the
build stays at the coarse quantizer, the training sample and one shard; during search at the
quantizer plus the pages the probed lists touch.

Example:
    >>> build_on_disk(spec, 384, blocks, sample, total, Path("runs/big.partial"))
    >>> index = read_on_disk(Path("runs/big"))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from neobert_embed.errors import UserInputError
from neobert_embed.index.factory import IndexSpec, as_codes, create_index, write_faiss_index
from neobert_embed.index.manifest import INDEX_NAME

if TYPE_CHECKING:
    import faiss

    from neobert_embed.index.factory import FaissIndex

IVFDATA_NAME = "index.ivfdata"
TRAINED_NAME = "trained.faiss"


def check_on_disk(spec: IndexSpec) -> None:
    """Only inverted-file indexes can keep their lists on disk; refuse the others with the fix.

    Example:
        >>> check_on_disk(choose_index_spec("hnsw", 10**6, 384))
        Traceback (most recent call last):
        UserInputError: --on-disk needs an IVF index ...
    """
    if spec.binary or "IVF" not in spec.factory:
        raise UserInputError(f"--on-disk needs an IVF index (--index-type ivf or ivfpq, or an IVF --factory); "
                             f"{spec.factory!r} keeps every vector in RAM")


def train_index(spec: IndexSpec, dimension: int, sample: Callable[[np.ndarray], np.ndarray],
                rows: np.ndarray) -> tuple[FaissIndex, float]:
    """Create and train an empty index on the sampled ``rows``; returns it and the seconds spent."""
    index = create_index(spec, dimension)
    start = time.perf_counter()
    if not index.is_trained:
        index.train(as_codes(spec, sample(rows)))
    return index, time.perf_counter() - start


def build_on_disk(index: faiss.Index, spec: IndexSpec, blocks: Iterable[tuple[int, np.ndarray]],
                  directory: Path) -> faiss.Index:
    """Fill one copy of the trained ``index`` per block, merge them into ``directory/index.ivfdata``.

    ``index`` must be trained and empty; it is returned holding the merged on-disk lists, already
    written to ``directory/index.faiss``. Ids are store rows, so search results need no offsets.

    Example:
        >>> merged = build_on_disk(trained, spec, shards.blocks(n_chunks), partial)
        >>> merged.ntotal == total
        True
    """
    import faiss
    from faiss.contrib.ondisk import merge_ondisk

    trained_path = directory / TRAINED_NAME
    write_faiss_index(index, trained_path)
    parts = []
    for number, (first, block) in enumerate(blocks):
        part = faiss.read_index(str(trained_path))
        part.add_with_ids(as_codes(spec, np.asarray(block, dtype=np.float32)),
                          np.arange(first, first + len(block), dtype=np.int64))
        parts.append(directory / f"part-{number:06d}.faiss")
        write_faiss_index(part, parts[-1])
        del part
    merged = faiss.read_index(str(trained_path))
    merge_ondisk(merged, [str(p) for p in parts], str(directory / IVFDATA_NAME))
    write_faiss_index(merged, directory / INDEX_NAME)
    for path in (trained_path, *parts):
        path.unlink()
    return read_on_disk(directory)


def read_on_disk(directory: Path) -> faiss.Index:
    """Open an on-disk index: the quantizer is loaded, ``index.ivfdata`` is memory-mapped read-only.

    The lists file is found next to ``index.faiss`` wherever the directory has moved.

    Example:
        >>> read_on_disk(Path("runs/big")).ntotal
        1000000
    """
    import faiss

    path = Path(directory) / INDEX_NAME
    if not (Path(directory) / IVFDATA_NAME).is_file():
        raise UserInputError(f"{directory / IVFDATA_NAME}: missing; the on-disk index is incomplete, rebuild it")
    return faiss.read_index(str(path), faiss.IO_FLAG_ONDISK_SAME_DIR | faiss.IO_FLAG_READ_ONLY)
