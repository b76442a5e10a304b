"""Checkpoints: every N steps, the last K kept, atomic, verified, resumed exactly.

Why: a run that lasts days is interrupted — preemption, Ctrl-C, a node failure — and must
continue as if nothing happened. A checkpoint directory ``step-NNNNNNNN`` holds the engine state
(parameters, optimizer, scheduler; sharded by DeepSpeed under ZeRO), each process's RNG states,
the trainer state (step, data-stream position, counters, the engine kind), the model config and
tokenizer (so ``pretrain export`` needs nothing else), and a ``manifest.json`` with the size and
SHA-256 of every file. The engine's files are its own business (:class:`~.engine.TrainingEngine`):
export asks the format of the engine that wrote them for the consolidated weights.

It is written under a temporary name and put in place by :func:`files.replace_directory`, so a
crash mid-save leaves the previous checkpoints untouched; a re-saved step killed between that
function's two renames leaves its old copy moved aside, which is listed in its place (export) and
put back on resume (:func:`remove_checkpoint_debris`). On resume a newest checkpoint whose files
do not match its manifest (or fail to load) is skipped with a warning for the one before.

Example:
    >>> path = save_checkpoint(engine, run / "checkpoints", 1000, {"step": 1000}, write_model_files, keep_last=3)
    >>> state, path = load_latest_checkpoint(engine, run / "checkpoints")
"""

from __future__ import annotations

import json
import random
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from neobert_embed.errors import UserInputError
from neobert_embed.files import atomic_write_json, remove_debris, replace_directory, sha256_file
from neobert_embed.pretraining.engine import CHECKPOINT_FORMATS, TrainingEngine

PREFIX = "step-"
MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.json"
MODEL_FILES = "model"
ENGINE_KEY = "engine"


class CorruptCheckpoint(Exception):
    """A checkpoint whose files are missing, changed or unloadable."""


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def _step_of(path: Path) -> int | None:
    """The step of a checkpoint directory, or of one moved aside by a killed replacement."""
    match = re.fullmatch(rf"{PREFIX}(\d+)|\.{PREFIX}(\d+)\.old-\d+", path.name)
    return int(match[1] or match[2]) if match and path.is_dir() else None


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories under ``root``, newest first; a step whose directory is missing
    because a killed replacement moved it aside is listed by that copy."""
    found: dict[int, Path] = {}
    for path in sorted(root.iterdir(), key=lambda p: p.name.startswith(".")) if root.is_dir() else ():
        if (step := _step_of(path)) is not None:
            found.setdefault(step, path)
    return [found[step] for step in sorted(found, reverse=True)]


def remove_checkpoint_debris(root: Path) -> list[Path]:
    """Put back the checkpoints that killed replacements moved aside and delete unfinished saves
    (only with the run to oneself: no other process saving into ``root``); returns what was removed.

    Example:
        >>> remove_checkpoint_debris(Path("runs/x/checkpoints"))
        [PosixPath('runs/x/checkpoints/.step-00001000.saving.tmp')]
    """
    names = {match[1] for path in root.glob(f".{PREFIX}*") if (match := re.match(rf"\.({PREFIX}\d+)\.", path.name))}
    return [removed for name in sorted(names) for removed in remove_debris(root / name)]


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


def save_checkpoint(engine: TrainingEngine, root: Path, step: int, trainer_state: dict[str, Any],
                    write_model_files: Callable[[Path], None], keep_last: int) -> Path:
    """Save a complete checkpoint of ``step`` (collective: every process calls it); return its path.

    Example:
        >>> save_checkpoint(engine, Path("runs/x/checkpoints"), 1000, state, write_files, keep_last=3)
        PosixPath('runs/x/checkpoints/step-00001000')
    """
    final = root / checkpoint_name(step)
    staging = root / f".{final.name}.saving.tmp"
    if engine.rank == 0:
        remove_debris(final)
        staging.mkdir(parents=True)
    engine.barrier()
    engine.save(staging)
    torch.save(_rng_state(), staging / f"rng-rank{engine.rank}.pt")
    engine.barrier()
    if engine.rank == 0:
        atomic_write_json(staging / TRAINER_STATE, trainer_state | {ENGINE_KEY: engine.kind})
        write_model_files(staging / MODEL_FILES)
        _write_manifest(staging)
        replace_directory(staging, final)  # a re-saved step: the old copy is moved aside, not deleted first
        for old in list_checkpoints(root)[keep_last:]:
            shutil.rmtree(old, ignore_errors=True)
    engine.barrier()
    return final


def _load_one(engine: TrainingEngine, directory: Path) -> dict[str, Any]:
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


def load_latest_checkpoint(engine: TrainingEngine, root: Path) -> tuple[dict[str, Any], Path]:
    """Restore the newest usable checkpoint into ``engine`` and the RNGs; return (trainer state, path).

    Debris of killed saves is cleared first; a corrupt checkpoint is reported with a warning and
    the previous one is tried.

    Example:
        >>> state, path = load_latest_checkpoint(engine, Path("runs/x/checkpoints"))
        >>> state["step"]
        1000
    """
    if engine.rank == 0:
        remove_checkpoint_debris(root)
    engine.barrier()
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


def find_checkpoint(source: Path) -> Path:
    """``source`` itself when it is a checkpoint (verified), else the newest verified checkpoint of
    the run directory ``source`` (corrupt ones are skipped with a warning).

    Example:
        >>> find_checkpoint(Path("runs/tiny")).name
        'step-00001000'
    """
    if _step_of(source) is not None and (source / TRAINER_STATE).is_file():
        try:
            verify_checkpoint(source)
        except CorruptCheckpoint as exc:
            raise UserInputError(f"cannot export: {exc}; export an earlier checkpoint instead") from None
        return source
    if not (source / "checkpoints").is_dir():
        raise UserInputError(f"{source}: neither a pretraining output directory nor a checkpoint (step-NNNNNNNN)")
    for directory in list_checkpoints(source / "checkpoints"):
        try:
            verify_checkpoint(directory)
            return directory
        except CorruptCheckpoint as exc:
            warnings.warn(f"skipping corrupt checkpoint: {exc}", stacklevel=2)
    raise UserInputError(f"{source / 'checkpoints'}: no usable checkpoint")


def consolidated_state_dict(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The objective module's whole fp32 weights in ``checkpoint``, read by the format of the
    engine that saved it (ZeRO shards merged).

    Example:
        >>> sorted(consolidated_state_dict(find_checkpoint(Path("runs/tiny"))))[0]
        'mlm.decoder.bias'
    """
    kind = json.loads((checkpoint / TRAINER_STATE).read_text(encoding="utf-8"))[ENGINE_KEY]
    return CHECKPOINT_FORMATS[kind].consolidated_state_dict(checkpoint)
