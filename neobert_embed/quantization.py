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

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from neobert_embed.errors import UserInputError

CalibratedPrecision = Literal["int8", "binary"]  # the stored precisions whose codes need a calibration
CALIBRATED_PRECISIONS: tuple[str, ...] = get_args(CalibratedPrecision)
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
        computed_at: the compute precision those vectors came from, when the ``encode`` sidecar it was
            read from records one (``encode --calibration`` computes at it unless ``--precision`` is given:
            the same text then gets the same float vector, hence the same codes).
    """

    precision: str
    dimension: int
    ranges: np.ndarray | None
    model: str | None = None
    vectors: int = 0
    computed_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form stored in sidecars and manifests."""
        return {"precision": self.precision, "dimension": self.dimension, "model": self.model,
                "vectors": self.vectors, "threshold": 0.0 if self.precision == "binary" else None,
                "ranges": None if self.ranges is None else self.ranges.astype(float).tolist()}

    @classmethod
    def from_record(cls, record: CalibrationRecord) -> Calibration:
        """The calibration a checked :class:`CalibrationRecord` holds."""
        ranges = None if record.ranges is None else np.asarray(record.ranges, dtype=np.float32)
        return cls(record.precision, record.dimension, ranges, record.model, record.vectors or 0)


Ranges = list[list[float]]  # int8 minima and maxima per dimension, as JSON holds them


class CalibrationRecord(BaseModel):
    """The JSON form of a :class:`Calibration` (a sidecar's ``calibration`` key, or a file of its own),
    checked field by field so a bad one is one error naming the file, line and key."""

    model_config = ConfigDict(allow_inf_nan=False)

    precision: CalibratedPrecision
    dimension: int = Field(gt=0)
    model: str | None = None
    vectors: int | None = Field(default=None, ge=0)
    threshold: float | None = None
    ranges: Ranges | None = Field(default=None, validate_default=True)  # int8 needs them: checked

    @field_validator("ranges")
    @classmethod
    def _two_rows_of_the_dimension(cls, ranges: Ranges | None, info: ValidationInfo) -> Ranges | None:
        dimension, precision = info.data.get("dimension"), info.data.get("precision")
        shape = f"two rows of {dimension} finite numbers (minima, maxima); re-create it with " \
                "`neobert-embed encode --store-precision int8`"
        if precision == "int8" and ranges is None:  # a missing key is no location of its own: name it
            raise ValueError(f"'ranges' is missing: an int8 calibration needs {shape}")
        if precision == "int8" and (len(ranges) != 2 or any(len(row) != dimension for row in ranges)):
            raise ValueError(f"must be {shape}")
        return ranges


class _ComputeRecord(BaseModel):
    """The compute precision an ``encode`` sidecar records (its ``compute`` key, as far as it matters here)."""

    precision: Literal["fp32", "bf16", "fp16", "int8"]


class _SidecarCalibration(BaseModel):
    """An ``encode`` sidecar, as far as its calibration goes (None: encoded at float precision)."""

    calibration: CalibrationRecord | None
    compute: _ComputeRecord | None = None  # absent in sidecars written before compute precisions existed


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
    from neobert_embed.outputs import check_record_matches, sidecar_path
    from neobert_embed.recipes import read_spec

    path = Path(path)
    if path.suffix == ".npy":
        path = sidecar_path(path)
    if path.suffix == ".json" and path.with_suffix("").suffix == ".npy":
        check_record_matches(path.with_suffix(""))  # the record of another matrix than the one beside it
    spec = read_spec(path, "calibration", "--calibration: pass the .npy.json written beside an int8/binary "
                     "`neobert-embed encode` output")
    if "calibration" not in spec.data:
        return Calibration.from_record(spec.validate(CalibrationRecord))
    sidecar = spec.validate(_SidecarCalibration)
    if sidecar.calibration is None:
        raise UserInputError(f"--calibration {path}: this output was encoded at float precision and has "
                             "no calibration; use the sidecar of an int8 or binary encode")
    computed_at = sidecar.compute.precision if sidecar.compute is not None else None
    return replace(Calibration.from_record(sidecar.calibration), computed_at=computed_at)
