"""Run directories: what a run was asked to do, whether a resume continues it, and how it ends.

Why one module: training, index builds and corpus preparation are long jobs that resume, and each
had its own copy of the same four mechanisms, each behaving a little differently. Here they are
once:

* the **run record** (``run.json`` or the caller's name): the settings a run was started with,
  written atomically when it starts;
* the **resume check**: a resume whose settings differ is refused *before* any work, with one
  error listing every changed key as ``key (old → new)``; each area declares the operational keys
  that may change (log cadence, threads);
* **metrics.jsonl**: one JSON line per logged step, and on resume the lines past the restored step
  are dropped, so the file reads as one uninterrupted run;
* **promotion**: the finished output replaces the run directory in one rename, taking the run's
  own files (record, metrics, checkpoints) with it;
* :class:`Interrupted`: raised by library code after Ctrl-C *once its state is saved*. Library
  code never prints how to resume; the CLI turns the exception into the resume command (the same
  command line with ``--resume``) and exit status 130.

Example:
    >>> check_resume("runs/x", {"model": "bert", "recipe": {"lr": 1e-4}}, operational={"recipe.log_every"})
    >>> write_record("runs/x", {"model": "bert", "recipe": {"lr": 1e-4}})
    >>> metrics = MetricsFile("runs/x/metrics.jsonl", resume_step=0)
    >>> metrics.write({"step": 1, "loss": 2.3})
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from neobert_embed.errors import UserInputError
from neobert_embed.files import atomic_directory, atomic_write_json, atomic_write_text

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run after its state was saved; rerunning with ``resume_args`` continues it.

    A ``KeyboardInterrupt``, so code that does not know it still treats it as Ctrl-C. Only the CLI
    prints the resume command (the user's command line, ``--overwrite`` dropped, plus
    ``resume_args``); library callers read ``str(exc)`` for what was kept.

    Example:
        >>> raise Interrupted("checkpoint of step 7 saved in runs/x/checkpoints")
        >>> raise Interrupted("3 of 8 tasks are finished", resume_args=())  # rerun as is
    """

    def __init__(self, kept: str, resume_args: Sequence[str] = ("--resume",)) -> None:
        super().__init__(kept)
        self.kept = kept
        self.resume_args = tuple(resume_args)

    def resume_command(self, argv: Sequence[str], program: str = "neobert-embed") -> list[str]:
        """The command line that continues the run started by ``argv`` (the words after the program).

        Example:
            >>> Interrupted("kept").resume_command(["index", "build", "--overwrite", "--output", "x"])
            ['neobert-embed', 'index', 'build', '--output', 'x', '--resume']
        """
        words = [word for word in argv if word != "--overwrite"]
        return [program, *words, *(arg for arg in self.resume_args if arg not in words)]


def read_record(directory: str | Path, name: str = RUN_FILE) -> dict[str, Any] | None:
    """The run record in ``directory``, or None when there is none.

    Example:
        >>> read_record("runs/x")["model"]
        'bert'
    """
    path = Path(directory) / name
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserInputError(f"{path}: the run record is not valid JSON ({exc}); start a new run in "
                             "another directory") from None
    if not isinstance(record, dict):
        raise UserInputError(f"{path}: the run record is not a JSON object; start a new run in another directory")
    return record


def write_record(directory: str | Path, settings: Mapping[str, Any], name: str = RUN_FILE) -> Path:
    """Record what the run was asked to do (atomically; JSON values, nested mappings allowed).

    Example:
        >>> write_record("runs/x", {"model": "bert", "recipe": {"lr": 1e-4}})
        PosixPath('runs/x/run.json')
    """
    path = Path(directory) / name
    atomic_write_json(path, dict(settings))
    return path


def flatten(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys: ``{"a": {"b": 1}}`` → ``{"a.b": 1}``.

    Example:
        >>> flatten({"optimizer": {"lr": 1e-3}, "model": "bert"})
        {'optimizer.lr': 0.001, 'model': 'bert'}
    """
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, Mapping):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:28]}…{text[-28:]}"


def changed_keys(saved: Mapping[str, Any], current: Mapping[str, Any],
                 operational: Collection[str] = ()) -> list[str]:
    """Every dotted key whose value differs, as ``key (old → new)``; ``operational`` keys are ignored.

    Values are compared as JSON would store them (tuples equal lists).

    Example:
        >>> changed_keys({"recipe": {"lr": 1, "seed": 0}}, {"recipe": {"lr": 2, "seed": 1}})
        ['recipe.lr (1 → 2)', 'recipe.seed (0 → 1)']
    """
    old, new = (json.loads(json.dumps(flatten(d), default=str)) for d in (saved, current))
    return [f"{key} ({_show(old.get(key))} → {_show(new.get(key))})" for key in sorted(set(old) | set(new))
            if key not in operational and old.get(key) != new.get(key)]


def refuse_changes(where: str | Path, saved: Mapping[str, Any], current: Mapping[str, Any], *,
                   operational: Collection[str] = (), verb: str = "--resume",
                   hint: str = "resume with the run's settings, or start a new --output") -> None:
    """Raise one :class:`UserInputError` naming every changed key (see :func:`changed_keys`).

    Example:
        >>> refuse_changes("runs/x/run.json", {"lr": 1}, {"lr": 2})
        Traceback (most recent call last):
        UserInputError: runs/x/run.json: --resume must continue the same run, but lr (1 → 2) changed; ...
    """
    changed = changed_keys(saved, current, operational)
    if changed:
        raise UserInputError(f"{where}: {verb} must continue the same run, but {', '.join(changed)} changed; {hint}")


def check_resume(directory: str | Path, current: Mapping[str, Any], *, name: str = RUN_FILE,
                 operational: Collection[str] = (), verb: str = "--resume",
                 hint: str = "resume with the run's settings, or start a new --output") -> dict[str, Any] | None:
    """Compare ``current`` with the run record in ``directory`` (see :func:`refuse_changes`).

    Returns the record, or None when the directory holds none (nothing to continue).

    Example:
        >>> check_resume("runs/x", {"model": "bert", "recipe": {"lr": 1e-4}})
        {'model': 'bert', 'recipe': {'lr': 0.0001}}
    """
    saved = read_record(directory, name)
    if saved is not None:
        refuse_changes(Path(directory) / name, saved, current, operational=operational, verb=verb, hint=hint)
    return saved


class MetricsFile:
    """A run's ``metrics.jsonl``: one JSON object per line, each with its ``step``.

    Opening it with ``resume_step`` drops the lines logged after that step (by a run that died
    after its last checkpoint), so a resumed run logs those steps again without duplicates.

    Example:
        >>> metrics = MetricsFile("runs/x/metrics.jsonl", resume_step=500)
        >>> metrics.write({"step": 501, "loss": 1.9})
    """

    def __init__(self, path: str | Path, resume_step: int = 0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record (flushed at once: a crash loses at most the line being written)."""
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(dict(record)) + "\n")


@contextlib.contextmanager
def promoted(output: str | Path, record: str = RUN_FILE) -> Iterator[Path]:
    """Write the finished output in a temporary sibling that then replaces the run directory.

    When the block succeeds, every entry of ``output`` the block did not write (the run record,
    metrics, checkpoints, files the user keeps there) is moved into it, and it replaces ``output``
    in one rename (:func:`~neobert_embed.files.atomic_directory`); on failure ``output`` is left as
    it was. A non-empty ``output`` without ``record`` is never replaced.

    Example:
        >>> with promoted("runs/x") as tmp:
        ...     model.save(str(tmp))
    """
    output = Path(output)
    with atomic_directory(output, record=record) as tmp:
        yield tmp
        moved: list[str] = []
        try:
            for entry in sorted(output.iterdir()) if output.is_dir() else []:
                if not (tmp / entry.name).exists():
                    os.replace(entry, tmp / entry.name)
                    moved.append(entry.name)
        except BaseException:
            for name in moved:
                os.replace(tmp / name, output / name)
            raise
