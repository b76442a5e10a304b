"""Checkpoints: every N steps, the last K kept, atomic, verified, resumed exactly.

Why: a run that lasts days is interrupted — preemption, Ctrl-C, a node failure — and must
continue as if nothing happened. A checkpoint directory ``step-NNNNNNNN`` holds the engine state
(parameters, optimizer, scheduler; sharded by DeepSpeed under ZeRO), each process's RNG states,
the trainer state (step, stream position, counters, the engine kind whose format reads its files),
the model config and tokenizer (so ``pretrain export`` needs nothing else), and a ``checkpoint.json``
with the size and SHA-256 of every file. It is put in place by :func:`files.replace_directory`, so
a crash mid-save leaves the previous checkpoints untouched (a replaced step's old copy left aside
stands in for it, and is put back on resume); on resume a newest checkpoint whose files do not
match its manifest (or fail to load) is skipped with a warning for the one before.

Example:
    >>> path = save_checkpoint(engine, run / "checkpoints", 1000, {"step": 1000}, (config, tokenizer), keep_last=3)
    >>> state, path = load_latest_checkpoint(engine, run / "checkpoints")
"""

from __future__ import annotations

import pickle
import random
import re
import shutil
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from neobert_embed.errors import UserInputError, listing
from neobert_embed.files import FilePin, follow_umask, remove_debris, replace_directory
from neobert_embed.pretraining.engine import (
    CHECKPOINT_FORMATS,
    TrainingEngine,
    check_tensor_files,
    load_tensors,
)
from neobert_embed.records import CHECKPOINT_MANIFEST, TRAINER_STATE
from neobert_embed.runs import CHECKPOINTS_DIR

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

T = TypeVar("T")

PREFIX = "step-"
RNG_PREFIX = "rng-"
MODEL_FILES = "model"


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
    paths = sorted(root.iterdir(), key=lambda p: p.name.startswith("."), reverse=True) if root.is_dir() else []
    found = {step: path for path in paths if (step := _step_of(path)) is not None}  # plain names come last: win
    return [found[step] for step in sorted(found, reverse=True)]


def _remove_debris(root: Path) -> list[Path]:
    """Put back the checkpoints that killed replacements moved aside; delete unfinished saves."""
    names = {match[1] for path in root.glob(f".{PREFIX}*") if (match := re.match(rf"\.({PREFIX}\d+)\.", path.name))}
    return [removed for name in sorted(names) for removed in remove_debris(root / name)]


def _checkpoint_files(directory: Path) -> list[Path]:
    """Every file of a checkpoint that its manifest pins (all but the manifest itself)."""
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name not in CHECKPOINT_MANIFEST.names)


def _write_manifest(directory: Path) -> None:
    files = _checkpoint_files(directory)
    CHECKPOINT_MANIFEST.write(directory, {str(p.relative_to(directory)): asdict(FilePin.of(p)) for p in files})


def _recorded_pin(entry: object) -> FilePin | None:
    """The pin a manifest entry records (None when it is not one). Checkpoints saved before
    :class:`~neobert_embed.files.FilePin` wrote the size under ``bytes``; they still resume."""
    fields = dict(entry) if isinstance(entry, dict) else {}
    if "bytes" in fields and "size" not in fields:
        fields["size"] = fields.pop("bytes")
    size, checksum = fields.get("size"), fields.get("sha256")
    if set(fields) != {"size", "sha256"} or not isinstance(size, int) or not isinstance(checksum, str):
        return None
    return FilePin(size, checksum)


def verify_checkpoint(directory: Path) -> None:
    """Raise :class:`CorruptCheckpoint` unless every file matches the manifest."""
    try:
        manifest = CHECKPOINT_MANIFEST.read(directory)
    except UserInputError as exc:
        raise CorruptCheckpoint(str(exc)) from None
    if manifest is None:
        raise CorruptCheckpoint(f"{CHECKPOINT_MANIFEST.path(directory)}: missing")
    unlisted = sorted(str(p.relative_to(directory)) for p in _checkpoint_files(directory)
                      if str(p.relative_to(directory)) not in manifest)
    if unlisted:  # an emptied or edited manifest must not switch the check off
        raise CorruptCheckpoint(f"{CHECKPOINT_MANIFEST.path(directory)}: damaged {CHECKPOINT_MANIFEST.holds} "
                                f"(it does not list {listing(unlisted)})")
    for name, entry in manifest.items():
        pin = _recorded_pin(entry)
        if pin is None:
            raise CorruptCheckpoint(f"{CHECKPOINT_MANIFEST.path(directory)}: damaged {CHECKPOINT_MANIFEST.holds} "
                                    f"(entry {name!r} is not {{'size': …, 'sha256': …}})")
        difference = pin.difference(directory / name)
        if difference == "missing":
            raise CorruptCheckpoint(f"{directory / name}: missing")
        if difference is not None:
            raise CorruptCheckpoint(f"{directory / name}: contents changed since it was saved ({difference})")
    try:  # before any engine unpickles them (DeepSpeed's own reader would run code)
        check_tensor_files(directory, skip=RNG_PREFIX)
    except pickle.UnpicklingError as exc:
        raise CorruptCheckpoint(f"{exc}, so it is not loaded (loading it could run code)") from None
    except Exception as exc:  # a file torch cannot read at all
        raise CorruptCheckpoint(f"{directory}: unreadable ({type(exc).__name__}: "
                                f"{(str(exc).splitlines() or [''])[0][:160]})") from None


def _rng_state() -> dict[str, Any]:
    """Every RNG's state as tensors and plain values, so that :func:`load_tensors` reads it back."""
    version, internal, gauss = random.getstate()
    name, keys, position, has_gauss, cached = np.random.get_state()
    state = {"python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
             "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                       "has_gauss": int(has_gauss), "cached": float(cached)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore_rng(state: dict[str, Any]) -> None:
    python, numpy = state["python"], state["numpy"]
    random.setstate((python["version"], tuple(python["internal"].tolist()), python["gauss"]))
    np.random.set_state((numpy["name"], numpy["keys"].numpy().astype(np.uint32), numpy["position"],
                         numpy["has_gauss"], numpy["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _load_rng(file: Path) -> None:
    """Restore the RNGs from ``file``; one that holds more than tensors and plain data (a checkpoint saved
    before RNG states were, or a tampered one) is not loaded: the run continues with fresh RNGs, and says so."""
    try:
        state = load_tensors(file)
    except pickle.UnpicklingError:
        warnings.warn(f"{file}: not restored (it holds more than tensors and plain data: an older checkpoint's "
                      "format, or a tampered file, and loading it could run code); the random streams start "
                      "afresh from here", stacklevel=3)
        return
    _restore_rng(state)


def save_checkpoint(engine: TrainingEngine, root: Path, step: int, trainer_state: dict[str, Any],
                    model_files: tuple[PretrainedConfig, PreTrainedTokenizerBase], keep_last: int) -> Path:
    """Save a complete checkpoint of ``step`` (collective: every process calls it); return its path.
    ``model_files``: what export needs besides the weights (the model config and the tokenizer).

    Example:
        >>> save_checkpoint(engine, Path("runs/x/checkpoints"), 1000, state, (config, tokenizer), keep_last=3)
        PosixPath('runs/x/checkpoints/step-00001000')
    """
    final = root / checkpoint_name(step)
    staging = root / f".{final.name}.saving.tmp"
    if engine.rank == 0:
        remove_debris(final)
        staging.mkdir(parents=True)
    engine.barrier()
    engine.save(staging)
    torch.save(_rng_state(), staging / f"{RNG_PREFIX}rank{engine.rank}.pt")
    engine.barrier()
    if engine.rank == 0:
        TRAINER_STATE.write(staging, trainer_state | {"engine": engine.kind})
        for part in model_files:
            part.save_pretrained(str(staging / MODEL_FILES))
        _write_manifest(staging)
        follow_umask(staging)  # save_pretrained writes its weights privately (0600)
        replace_directory(staging, final)  # a re-saved step: the old copy is moved aside, not deleted first
        for old in list_checkpoints(root)[keep_last:]:
            shutil.rmtree(old, ignore_errors=True)
    engine.barrier()
    return final


def _load_one(engine: TrainingEngine, directory: Path) -> dict[str, Any]:
    verify_checkpoint(directory)
    try:
        engine.load(directory)
        state = TRAINER_STATE.read(directory)
        if state is None:
            raise FileNotFoundError(f"no {TRAINER_STATE.name}")
        rng_file = next(f for f in (directory / f"{RNG_PREFIX}rank{engine.rank}.pt", directory / f"{RNG_PREFIX}rank0.pt")
                        if f.is_file())
        _load_rng(rng_file)
    except Exception as exc:  # any failure to load means this checkpoint is unusable; try the previous
        raise CorruptCheckpoint(f"{directory}: failed to load ({type(exc).__name__}: {exc})") from exc
    return state


def _first_usable(candidates: list[Path], use: Callable[[Path], T], failure: str) -> tuple[T, Path]:
    """``use`` the newest candidate that is not corrupt (warn about the others), else fail."""
    problem = "there is none"
    for directory in candidates:
        try:
            return use(directory), directory
        except CorruptCheckpoint as exc:
            problem = str(exc)
            warnings.warn(f"skipping corrupt checkpoint: {exc}", stacklevel=3)
    raise UserInputError(f"{failure} (last problem: {problem})")


def load_latest_checkpoint(engine: TrainingEngine, root: Path) -> tuple[dict[str, Any], Path]:
    """Restore the newest usable checkpoint into ``engine`` and the RNGs; return (trainer state, path).

    Debris of killed saves is cleared first (the run is this job's alone: the CLI holds its lock).

    Example:
        >>> state, path = load_latest_checkpoint(engine, Path("runs/x/checkpoints"))
        >>> state["step"]
        1000
    """
    if engine.rank == 0:
        _remove_debris(root)
    engine.barrier()
    if not (candidates := list_checkpoints(root)):
        raise UserInputError(f"--resume: no checkpoint in {root}; start without --resume")
    return _first_usable(candidates, lambda directory: _load_one(engine, directory),
                         f"--resume: every checkpoint in {root} is corrupt; start again without --resume, "
                         "with a new --output")


def find_checkpoint(source: Path) -> Path:
    """``source`` itself when it is a checkpoint, else the newest checkpoint of the run directory
    ``source``; only one whose files match its manifest.

    Example:
        >>> find_checkpoint(Path("runs/tiny")).name
        'step-00001000'
    """
    explicit = _step_of(source) is not None and TRAINER_STATE.exists(source)
    if not explicit and not (source / CHECKPOINTS_DIR).is_dir():
        raise UserInputError(f"{source}: neither a pretraining output directory nor a checkpoint (step-NNNNNNNN)")
    return _first_usable([source] if explicit else list_checkpoints(source / CHECKPOINTS_DIR), verify_checkpoint,
                         f"cannot export {source}: no usable checkpoint; export an earlier one")[1]


def consolidated_state_dict(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The objective module's whole fp32 weights in ``checkpoint``, read by the format of the
    engine that saved it (ZeRO shards merged).

    Example:
        >>> sorted(consolidated_state_dict(find_checkpoint(Path("runs/tiny"))))[0]
        'mlm.decoder.bias'
    """
    kind = (TRAINER_STATE.read(checkpoint) or {}).get("engine")
    if kind not in CHECKPOINT_FORMATS:
        raise UserInputError(f"{TRAINER_STATE.path(checkpoint)}: engine {kind!r} is not one of "
                             f"{sorted(CHECKPOINT_FORMATS)}; export an earlier checkpoint")
    return CHECKPOINT_FORMATS[kind].consolidated_state_dict(checkpoint)
