"""Checkpoints: every N steps, the last K kept, atomic, verified, resumed exactly.

Why: a run that lasts days is interrupted — preemption, Ctrl-C, a node failure — and must
continue as if nothing happened. A checkpoint directory ``step-NNNNNNNN`` holds the engine state
(parameters, optimizer, scheduler; sharded by DeepSpeed under ZeRO), each process's RNG states,
the trainer state (step, data-stream position, counters), the model config and tokenizer (so
``pretrain export`` needs nothing else), and a ``manifest.json`` with the size and SHA-256 of
every file. It is written under a temporary name and renamed into place only when complete, so a
crash mid-save leaves the previous checkpoints untouched; on resume a newest checkpoint whose
files do not match its manifest (or fail to load) is skipped with a warning for the one before.

Example:
    >>> path = save_checkpoint(engine, run / "checkpoints", 1000, {"step": 1000}, write_model_files, keep_last=3)
    >>> state, path = load_latest_checkpoint(engine, run / "checkpoints")
"""

from __future__ import annotations

import json
import random
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from neobert_embed.errors import UserInputError
from neobert_embed.files import atomic_write_json, replace_directory, sha256_file

PREFIX = "step-"
MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.json"
MODEL_FILES = "model"


class CorruptCheckpoint(Exception):
    """A checkpoint whose files are missing, changed or unloadable."""


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint directories under ``root``, newest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]), reverse=True)


def _write_manifest(directory: Path) -> None:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    atomic_write_json(directory / MANIFEST, {
        str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in files})


def verify_checkpoint(directory: Path) -> None:
    """Raise :class:`CorruptCheckpoint` unless every file matches the manifest."""
    manifest_path = directory / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CorruptCheckpoint(f"{manifest_path}: unreadable ({exc})") from None
    for name, expected in manifest.items():
        path = directory / name
        if not path.is_file():
            raise CorruptCheckpoint(f"{path}: missing")
        if path.stat().st_size != expected["bytes"] or sha256_file(path) != expected["sha256"]:
            raise CorruptCheckpoint(f"{path}: contents changed since it was saved (size or checksum)")


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(engine, root: Path, step: int, trainer_state: dict[str, Any],
                    write_model_files: Callable[[Path], None], keep_last: int) -> Path:
    """Save a complete checkpoint of ``step`` (collective: every process calls it); return its path.

    Example:
        >>> save_checkpoint(engine, Path("runs/x/checkpoints"), 1000, state, write_files, keep_last=3)
        PosixPath('runs/x/checkpoints/step-00001000')
    """
    final = root / checkpoint_name(step)
    staging = root / f".{final.name}.tmp"
    if engine.rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    engine.barrier()
    engine.save(staging)
    torch.save(_rng_state(), staging / f"rng-rank{engine.rank}.pt")
    engine.barrier()
    if engine.rank == 0:
        atomic_write_json(staging / TRAINER_STATE, trainer_state)
        write_model_files(staging / MODEL_FILES)
        _write_manifest(staging)
        replace_directory(staging, final)  # a re-saved step: the old copy is moved aside, not deleted first
        for old in list_checkpoints(root)[keep_last:]:
            shutil.rmtree(old, ignore_errors=True)
    engine.barrier()
    return final


def _load_one(engine, directory: Path) -> dict[str, Any]:
    verify_checkpoint(directory)
    try:
        engine.load(directory)
        state = json.loads((directory / TRAINER_STATE).read_text(encoding="utf-8"))
        rng_file = directory / f"rng-rank{engine.rank}.pt"
        if not rng_file.is_file():
            rng_file = directory / "rng-rank0.pt"
        _restore_rng(torch.load(rng_file, map_location="cpu", weights_only=False))
    except Exception as exc:  # any failure to load means this checkpoint is unusable; try the previous
        raise CorruptCheckpoint(f"{directory}: failed to load ({type(exc).__name__}: {exc})") from exc
    return state


def load_latest_checkpoint(engine, root: Path) -> tuple[dict[str, Any], Path]:
    """Restore the newest usable checkpoint into ``engine`` and the RNGs; return (trainer state, path).

    A corrupt checkpoint is reported with a warning and the previous one is tried.

    Example:
        >>> state, path = load_latest_checkpoint(engine, Path("runs/x/checkpoints"))
        >>> state["step"]
        1000
    """
    candidates = list_checkpoints(root)
    if not candidates:
        raise UserInputError(f"--resume: no checkpoint in {root}; start without --resume")
    for directory in candidates:
        try:
            return _load_one(engine, directory), directory
        except CorruptCheckpoint as exc:
            warnings.warn(f"skipping corrupt checkpoint: {exc}; falling back to the previous one",
                          stacklevel=2)
    raise UserInputError(f"--resume: every checkpoint in {root} is corrupt (see the warnings above); "
                         "start again without --resume, with a new --output")


def latest_valid_checkpoint(root: Path) -> Path:
    """The newest checkpoint under ``root`` whose files match their manifest (for export)."""
    for directory in list_checkpoints(root):
        try:
            verify_checkpoint(directory)
            return directory
        except CorruptCheckpoint as exc:
            warnings.warn(f"skipping corrupt checkpoint: {exc}", stacklevel=2)
    raise UserInputError(f"{root}: no usable checkpoint")
