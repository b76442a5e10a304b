"""Encoded vectors of an unfinished build, one ``.npy`` file per chunk.

Why: encoding is the expensive part of a build. Each finished chunk is written atomically as its
own file, so a killed build loses at most the chunk in flight, and the final index can be trained
and filled from memory-mapped shards without holding every float vector in RAM twice. Each shard's
size and SHA-256 are written beside it (``chunk-NNNNNN.npy.pin``): a resumed build counts a chunk as
finished only when its shard matches, and encodes a truncated or damaged one again (saying so) instead
of failing on it at the end of every rerun.

Example:
    >>> shards = ShardDirectory("runs/index.partial/shards")
    >>> shards.write(0, vectors)
    >>> sum(len(block) for _, block in shards.blocks(2))
    16384
"""

from __future__ import annotations

import io
import json
import logging
import shutil
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np

from neobert_embed.files import FilePin, atomic_write_bytes, atomic_write_text

logger = logging.getLogger(__name__)
PIN_SUFFIX = ".pin"


class ShardDirectory:
    """Chunk ``i`` covers store rows ``[i * chunk_size, (i + 1) * chunk_size)``."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, chunk: int) -> Path:
        """File holding chunk ``chunk``."""
        return self.directory / f"chunk-{chunk:06d}.npy"

    def write(self, chunk: int, vectors: np.ndarray) -> None:
        """Persist one chunk atomically (temporary file, fsync, rename), then its pin."""
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(vectors, dtype=np.float32))
        atomic_write_bytes(self.path(chunk), buffer.getvalue())
        atomic_write_text(self._pin(chunk), json.dumps(asdict(FilePin.of(self.path(chunk)))))

    def _pin(self, chunk: int) -> Path:
        return self.path(chunk).with_name(self.path(chunk).name + PIN_SUFFIX)

    def finished(self) -> set[int]:
        """Chunks whose shard is on disk and matches its pin; one that does not (truncated, damaged, or its
        pin lost) is left out with a warning, so that it is encoded again (and replaced).

        Example:
            >>> ShardDirectory("runs/index.partial/shards").finished()
            {0, 1, 3}
        """
        found = set()
        for path in sorted(self.directory.glob("chunk-*.npy")):
            chunk = int(path.stem.split("-")[1])
            problem = self._problem(chunk)
            if problem is None:
                found.add(chunk)
                continue
            logger.warning("%s: %s; encoding chunk %d again", path, problem, chunk)
        return found

    def _problem(self, chunk: int) -> str | None:
        """Why chunk ``chunk``'s shard cannot be used, or None."""
        try:
            pin = FilePin(**json.loads(self._pin(chunk).read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return "no readable pin beside it (written by a build killed in between, or damaged)"
        difference = pin.difference(self.path(chunk))
        return None if difference is None else f"{difference} (truncated or damaged since it was written)"

    def load(self, chunk: int) -> np.ndarray:
        """Memory-map one chunk."""
        return np.load(self.path(chunk), mmap_mode="r")

    def blocks(self, n_chunks: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(first_row, vectors)`` for chunks ``0 .. n_chunks - 1``, memory-mapped."""
        first = 0
        for chunk in range(n_chunks):
            vectors = self.load(chunk)
            yield first, vectors
            first += len(vectors)

    def gather(self, rows: np.ndarray, chunk_size: int | None = None, starts: np.ndarray | None = None) -> np.ndarray:
        """Vectors at sorted ``rows`` (a training or calibration sample): chunks of ``chunk_size`` rows each,
        or chunk ``i`` starting at row ``starts[i]`` (chunks of different sizes: an index of passages)."""
        parts = []
        chunks = rows // chunk_size if starts is None else np.searchsorted(starts, rows, side="right") - 1
        for chunk in np.unique(chunks):
            first = int(chunk) * chunk_size if starts is None else int(starts[chunk])
            parts.append(np.asarray(self.load(int(chunk))[rows[chunks == chunk] - first]))
        return np.concatenate(parts).astype(np.float32, copy=False)

    def starts(self, n_chunks: int) -> np.ndarray:
        """The first row of each of chunks ``0 .. n_chunks - 1`` (read from the shards' headers)."""
        return np.concatenate(([0], np.cumsum([len(self.load(chunk)) for chunk in range(n_chunks)])[:-1])).astype(np.int64)

    def remove(self) -> None:
        """Delete all shards once the final index holds the vectors."""
        shutil.rmtree(self.directory, ignore_errors=True)
