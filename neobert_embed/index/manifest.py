"""The manifest written next to every index: what made it, how to search it, what it holds.

Why: vectors from one model are meaningless to another. The manifest pins the model (name,
revision and a fingerprint of its weights), the prompts and normalization used for documents,
and the FAISS factory string plus the search parameters calibrated for it, so ``index search``
can reproduce the query side exactly and refuse a model that would return garbage.

Example:
    >>> manifest = read_manifest("runs/news-index")
    >>> manifest.factory, manifest.search_params
    ('IVF1024,Flat', {'nprobe': 16})
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from neobert_embed.errors import UserInputError
from neobert_embed.files import FilePin
from neobert_embed.recipes import FileName
from neobert_embed.records import INDEX_MANIFEST
from neobert_embed.runs import partial_directory

INDEX_NAME = "index.faiss"
STORE_NAME = "documents.sqlite"
FORMAT_VERSION = 1


class Calibration(BaseModel):
    """How the search parameter was chosen: recall@10 against exact search on sampled vectors."""

    model_config = ConfigDict(extra="forbid")

    parameter: str | None = Field(description="nprobe or efSearch; None for exact indexes")
    value: int | None = None
    recall_at_10: float
    target: float
    queries: int


class PassageSettings(BaseModel):
    """How an index of passages (``index build --passages``) cut its documents: ``window`` tokens of text per
    passage (``max_seq_length`` less special tokens and the document prompt), a new one every ``stride``."""

    model_config = ConfigDict(extra="forbid")

    window: int = Field(gt=0)
    stride: int = Field(gt=0)


class IndexManifest(BaseModel):
    """Everything needed to search an index correctly, saved as ``manifest.json``."""

    model_config = ConfigDict(extra="forbid")

    format_version: int = FORMAT_VERSION
    model: str = Field(description="model name or path as given at build time")
    model_path: str | None = Field(default=None, description="absolute path when the model is local")
    model_revision: str | None = None
    model_fingerprint: str = Field(description="hash of the model's weights; search refuses others")
    dimension: int
    similarity: Literal["cosine", "dot"]
    normalized: bool
    max_seq_length: int
    prompts: dict[str, str] = Field(default_factory=dict, description="'query' and 'document' prompts")
    index_type: Literal["flat", "ivf", "hnsw", "ivfpq", "custom"]
    factory: str
    index_choice: str | None = Field(default=None, description="the index built and why, e.g. 'flat (exact): auto, "
                                     "4,000 vectors < 100,000, exact search is fast' (None before it was kept)")
    precision: Literal["float32", "float16", "int8", "binary"] = Field(description="how vectors are stored")
    compute_precision: Literal["fp32", "bf16", "fp16", "int8"] = Field(
        default="fp32", description="what the model's forward ran in for the documents; queries default to it")
    compute: dict[str, Any] | None = Field(default=None, description="how compute_precision was chosen (auto's "
                                           "measured trials, the machine)")
    binary: bool = False
    search_params: dict[str, int] = Field(default_factory=dict)
    calibration: Calibration | None = None
    documents: int = Field(description="searchable documents")
    vectors: int = Field(description="vectors in the FAISS index, replaced ones included")
    replaced: int = 0
    sources: list[str] = Field(default_factory=list)
    files: dict[FileName, FilePin] = Field(default_factory=dict, description="checksums of index.faiss, "
                                        "documents.sqlite, and index.ivfdata / vectors.f16.npy where they exist "
                                        "(empty for indexes made before checksums)")
    on_disk: bool = Field(default=False, description="inverted lists memory-mapped from index.ivfdata")
    rerank_k_factor: int | None = Field(
        default=None, description="k x this many candidates re-scored exactly against vectors.f16.npy")
    passages: PassageSettings | None = Field(default=None, description="an index of passages: vectors are "
                                             "passages, documents rank by their best one (absent otherwise)")
    train_vectors: int | None = Field(default=None, description="size of the sample the index was trained on")
    train_seconds: float | None = Field(default=None, description="time spent training on that sample")
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    updated_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))


def write_manifest(directory: str | Path, manifest: IndexManifest) -> None:
    """Write ``manifest.json`` atomically.

    Example:
        >>> write_manifest("runs/news-index", manifest)
    """
    record = manifest.model_dump(mode="json")
    if manifest.passages is None:  # an index of whole documents is written as before passages existed
        del record["passages"]
    INDEX_MANIFEST.write(directory, record)


def read_manifest(directory: str | Path) -> IndexManifest:
    """Read and validate an index directory's manifest, explaining what is wrong when it is not one.

    Example:
        >>> read_manifest("runs/news-index").documents
        7600
    """
    directory = Path(directory)
    if not INDEX_MANIFEST.exists(directory):
        partial = partial_directory(directory)
        hint = (f"; an interrupted build is in {partial}: rerun `neobert-embed index build` with "
                "--resume" if partial.is_dir() else "; build one with `neobert-embed index build`")
        raise UserInputError(f"{directory}: not an index (no {INDEX_MANIFEST.name}){hint}")
    return INDEX_MANIFEST.validate(directory, IndexManifest)
