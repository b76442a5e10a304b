"""int8 and binary vector codes that compare across files: the calibration travels with them.

Why: int8 scalar quantization maps each dimension's range ``[min, max]`` onto 256 buckets. When
the ranges are taken from each file's own embeddings, the same text gets different codes in
different files, so queries and documents encoded separately are silently mismatched. The ranges
are therefore part of the encoding, like the model: they are computed once (from the first file
encoded), saved with the output (``docs.npy`` + ``docs.npy.json``), and reused with
``encode --calibration docs.npy.json`` so identical texts get identical codes in any file. Inside
an index, FAISS's trained scalar quantizer is stored in ``index.faiss`` itself, so every ``index
add`` reuses the build's ranges. Binary codes (sign bits) need no ranges; their calibration only
records the threshold 0.

The arithmetic is sentence-transformers' ``quantize_embeddings`` (values outside the ranges are
clipped to the end buckets).

Example:
    >>> calibration = fit_calibration(document_vectors, "int8")
    >>> codes = quantize_with(query_vectors, calibration)
    >>> save_calibration("docs.npy.json", calibration)    # or via encode's sidecar
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from neobert_embed.errors import UserInputError

CALIBRATED_PRECISIONS = ("int8", "binary")
STORAGE_PRECISIONS = ("float32", "float16", *CALIBRATED_PRECISIONS)  # how vectors are kept (--store-precision)


def check_storage_precision(precision: str) -> None:
    """Refuse a ``--store-precision`` no writer knows, with one message for ``encode`` and ``index build``.

    Example:
        >>> check_storage_precision("int4")
        Traceback (most recent call last):
        UserInputError: --store-precision 'int4' is not one of float32, float16, int8, binary
    """
    if precision not in STORAGE_PRECISIONS:
        raise UserInputError(f"--store-precision {precision!r} is not one of {', '.join(STORAGE_PRECISIONS)}")


@dataclass(frozen=True)
class Calibration:
    """How float vectors become codes: per-dimension ``ranges`` (int8) or the sign (binary).

    Attributes:
        precision: ``int8`` or ``binary``.
        dimension: width of the float vectors it applies to.
        ranges: ``(2, dimension)`` minima and maxima for int8; None for binary.
        model: the model whose vectors were calibrated (informative; dimension is enforced).
        vectors: how many vectors the ranges were computed from.
    """

    precision: str
    dimension: int
    ranges: np.ndarray | None
    model: str | None = None
    vectors: int = 0

    def to_json(self) -> dict[str, Any]:
        """The JSON form stored in sidecars and manifests."""
        return {"precision": self.precision, "dimension": self.dimension, "model": self.model,
                "vectors": self.vectors, "threshold": 0.0 if self.precision == "binary" else None,
                "ranges": None if self.ranges is None else self.ranges.astype(float).tolist()}

    @classmethod
    def from_json(cls, data: object, where: str) -> Calibration:
        """Validate the JSON form; errors name ``where`` (the file) and the bad key."""
        if not isinstance(data, dict):
            raise UserInputError(f"{where}: expected a calibration object, got {type(data).__name__}")
        precision = data.get("precision")
        if precision not in CALIBRATED_PRECISIONS:
            raise UserInputError(f"{where}: key 'precision' is {precision!r}; a calibration is for "
                                 f"{' or '.join(CALIBRATED_PRECISIONS)} vectors")
        dimension = data.get("dimension")
        if not isinstance(dimension, int) or dimension < 1:
            raise UserInputError(f"{where}: key 'dimension' must be a positive integer, got {dimension!r}")
        ranges = None
        if precision == "int8":
            try:
                ranges = np.asarray(data.get("ranges"), dtype=np.float32)
            except (TypeError, ValueError):
                ranges = np.zeros(0)
            if ranges.shape != (2, dimension) or not np.isfinite(ranges).all():
                raise UserInputError(f"{where}: key 'ranges' must be two rows of {dimension} finite numbers "
                                     "(minima, maxima); re-create it with `neobert-embed encode --store-precision int8`")
        return cls(precision, dimension, ranges, data.get("model"), int(data.get("vectors") or 0))


def fit_calibration(embeddings: np.ndarray, precision: str, model: str | None = None) -> Calibration:
    """Calibrate ``precision`` codes on float ``embeddings`` (int8: per-dimension min and max).

    Example:
        >>> fit_calibration(np.random.rand(100, 8).astype("float32"), "int8").ranges.shape
        (2, 8)
    """
    if precision not in CALIBRATED_PRECISIONS:
        raise ValueError(f"precision {precision!r} needs no calibration")
    embeddings = np.asarray(embeddings, dtype=np.float32)
    if precision == "int8" and len(embeddings) < 2:
        raise UserInputError("int8 ranges cannot be calibrated on fewer than 2 texts; encode a "
                             "representative file first and pass its calibration with --calibration")
    ranges = (np.vstack((embeddings.min(axis=0), embeddings.max(axis=0))) if precision == "int8" else None)
    return Calibration(precision, int(embeddings.shape[1]), ranges, model, len(embeddings))


def quantize_with(embeddings: np.ndarray, calibration: Calibration) -> np.ndarray:
    """Codes of ``embeddings`` under ``calibration`` (int8: clipped to its ranges; binary: packed bits).

    Example:
        >>> quantize_with(vectors, calibration).dtype
        dtype('int8')
    """
    from sentence_transformers import quantize_embeddings

    embeddings = np.asarray(embeddings, dtype=np.float32)
    if embeddings.ndim != 2 or embeddings.shape[1] != calibration.dimension:
        raise UserInputError(f"the calibration is for {calibration.dimension}-d vectors (model "
                             f"{calibration.model!r}) but these are {embeddings.shape[-1]}-d; use a "
                             "calibration made with the same model")
    return quantize_embeddings(embeddings, precision=calibration.precision, ranges=calibration.ranges)


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration: an ``encode`` sidecar (``docs.npy.json``), its ``.npy`` (the sidecar
    beside it is used), or a plain calibration JSON file.

    Example:
        >>> load_calibration("docs.npy.json").precision
        'int8'
    """
    from neobert_embed.outputs import sidecar_path
    from neobert_embed.recipes import read_spec

    path = Path(path)
    if path.suffix == ".npy":
        path = sidecar_path(path)
    data: Any = read_spec(path, "calibration", "--calibration: pass the .npy.json written beside an int8/binary "
                          "`neobert-embed encode` output").data
    if "calibration" in data:
        data = data["calibration"]
    if data is None:
        raise UserInputError(f"--calibration {path}: this output was encoded at float precision and has "
                             "no calibration; use the sidecar of an int8 or binary encode")
    return Calibration.from_json(data, str(path))
