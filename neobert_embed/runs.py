"""Run directories: what a run was asked to do, whether a resume continues it, and how it ends.

Why one module: training, index builds and corpus preparation are long jobs that resume, and each
had its own copy of these mechanisms, each behaving a little differently. Here they are once:
claiming the output directory (:func:`claimed_directory`: checked before any work, then held by
one writer for the whole job); where an unfinished output is built (:func:`partial_directory`);
updating a finished one in place (:func:`updated_directory`: the same lock, and a staged copy
that replaces it whole or not at all); the run record (settings
written atomically when a run starts); the resume check (a resume with other settings is refused
before any work, in one error listing every changed key as ``key (old → new)``, except the
operational keys each area declares); ``metrics.jsonl`` (trimmed on resume to
the restored step, so it reads as one uninterrupted run); promotion of the finished output; and
:class:`Interrupted`, raised by library code after Ctrl-C once its state is saved, which only the
CLI turns into the resume command and exit status 130.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from neobert_embed.distributed import is_main_process
from neobert_embed.errors import UserInputError, located
from neobert_embed.files import atomic_directory, atomic_write_text, writing
from neobert_embed.locks import LockHolder, writer_lock
from neobert_embed.outputs import DirectoryState, RecordNames, check_not_link, check_output_directory
from neobert_embed.records import RUN, RecordFile

METRICS_FILE = "metrics.jsonl"  # one JSON line per logged training step
CHECKPOINTS_DIR = "checkpoints"  # resumable training states, one folder each


@contextlib.contextmanager
def claimed_directory(output: str | Path, *, record: RecordNames, command: str,
                      inputs: Collection[str | Path | None] = (), what: str = "output", wait: bool = True,
                      replace: str | None = None, owned: Collection[str] = (), writer: str | None = None,
                      part: str | Path | None = None,
                      on_stale: Callable[[LockHolder], None] | None = None) -> Iterator[DirectoryState]:
    """Own the directory ``output`` for the block: the one way a command starts writing one.

    Before any work the path is checked (:func:`~neobert_embed.outputs.check_output_directory`: not
    a file, not an input, writable, absent, empty or carrying ``record``; with ``replace``, holding
    nothing but what its record claims; with ``writer``, a record naming no other writer), then this process takes the directory's writer lock
    (:func:`~neobert_embed.locks.writer_lock`; ``wait=False`` fails at once when another writer
    holds it) and checks again, since the other writer may have changed it meanwhile. Under
    torchrun only rank 0 checks and locks, for the whole job. Yields the directory's state
    (``absent``, ``empty`` or ``owned``), from which the command decides what resume and
    overwrite mean for it. A refusal of the operating system inside the block (a full disk while
    the command writes, whichever library writes) is one error naming ``output``
    (:func:`~neobert_embed.files.writing`).

    With ``part`` (a path relative to ``output``) only that part of a shared output is locked:
    ``mteb`` locks one model's results in a results root, so evaluations of other models into
    the same root run side by side while a second evaluation of the same model waits. Its lock
    file lies at the top of ``output`` (``.results--<model>--<revision>.lock``), never inside a tree
    another library reads.

    Example:
        >>> with claimed_directory("runs/x", record=RUN, command="neobert-embed train-contrastive") as state:
        ...     train_into("runs/x", fresh=state is not DirectoryState.OWNED)
    """
    if not is_main_process():
        yield DirectoryState.OWNED
        return
    check = dict(record=record, inputs=list(inputs), what=what, replace=replace, owned=owned, writer=writer)
    check_output_directory(output, **check)
    locked = Path(output) if part is None else Path(output) / "--".join(Path(part).parts)
    with writing(output), writer_lock(locked, command=command, wait=wait, on_stale=on_stale):
        yield check_output_directory(output, **check)


@contextlib.contextmanager
def updated_directory(directory: str | Path, *, record: RecordFile, command: str, wait: bool = True,
                      on_stale: Callable[[LockHolder], None] | None = None) -> Iterator[Path]:
    """Update the finished directory ``directory`` (one this toolkit wrote: it carries ``record``)
    through a staged copy: the one way a command changes an existing output in place.

    Holds the directory's writer lock for the block (concurrent updates are serialised, none is
    lost; ``wait=False`` fails at once when another writer holds it) and yields an empty sibling
    to write the new version into; it replaces ``directory`` in one rename when the block
    succeeds, and an error or Ctrl-C leaves ``directory`` exactly as it was. Under torchrun call it
    on rank 0 only (``index add`` does, through :func:`~neobert_embed.distributed.on_main`).

    Example:
        >>> with updated_directory("runs/index", record=INDEX_MANIFEST, command="neobert-embed index add") as work:
        ...     write_new_version(from_dir="runs/index", into=work)
    """
    check_not_link(directory, "the directory")  # the one rule for links (outputs.check_not_link)
    with writing(directory), writer_lock(directory, command=command, wait=wait, on_stale=on_stale), \
            atomic_directory(directory, record=record.name, stamp=False) as work:
        yield work


def partial_directory(output: str | Path) -> Path:
    """Where a long job builds ``output`` until it is complete: the hidden sibling ``.NAME.partial``,
    renamed into place in one step at the end, so ``output`` is never a half-written thing. It
    lies beside ``output`` (not inside it) and is hidden, so no overwrite check counts it as the
    user's, and the writer lock of ``output`` covers it.

    Example:
        >>> partial_directory("runs/news-index")
        PosixPath('runs/.news-index.partial')
    """
    output = Path(output)
    return output.with_name(f".{output.name}.partial")


def adopt_unfinished(earlier: Path, output: Path, record: RecordFile[Any]) -> None:
    """Move an unfinished job that an earlier version left at ``earlier`` (it carries the job's
    state ``record``) to where jobs resume from now, :func:`partial_directory` of ``output``, so its
    finished work is kept; nothing when there is none, or when a newer unfinished job is there.

    Example:
        >>> adopt_unfinished(Path("runs/news-index.partial"), Path("runs/news-index"), INDEX_BUILD_STATE)
    """
    partial = partial_directory(output)
    if record.exists(earlier) and not partial.exists():
        os.replace(earlier, partial)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run after its state was saved; rerunning with ``resume_args`` continues it.

    A ``KeyboardInterrupt``, so code that does not know it still treats it as Ctrl-C. Only the CLI
    prints the resume command (its own command line, ``--overwrite`` dropped, plus ``resume_args``);
    library callers read ``str(exc)`` for what was kept.

    Example:
        >>> raise Interrupted("checkpoint of step 7 saved in runs/x/checkpoints")
        >>> raise Interrupted("3 of 8 tasks are finished", resume_args=())  # rerun as is
    """

    def __init__(self, kept: str, resume_args: Sequence[str] = ("--resume",)) -> None:
        super().__init__(kept)
        self.resume_args = tuple(resume_args)


def _flatten(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys: ``{"a": {"b": 1}}`` → ``{"a.b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        flat |= _flatten(value, f"{prefix}{key}.") if isinstance(value, Mapping) else {f"{prefix}{key}": value}
    return flat


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:28]}…{text[-28:]}"


def check_resume(directory: str | Path, current: Mapping[str, Any], *, record: RecordFile = RUN,
                 operational: Collection[str] = (), verb: str = "--resume",
                 hint: str = "resume with the run's settings, or start a new --output") -> dict[str, Any] | None:
    """Compare ``current`` with the ``record`` in ``directory``; return the record (None: there is none).

    One :class:`UserInputError` names every dotted key whose value differs, as ``key (old → new)``;
    ``operational`` keys may change. Values compare as JSON stores them (tuples equal lists).

    Example:
        >>> check_resume("runs/x", {"model": "bert", "recipe": {"lr": 1e-3}})
        Traceback (most recent call last):
        UserInputError: runs/x/run.json: --resume must continue the same run, but recipe.lr (0.0001 → 0.001) changed; ...
    """
    saved = record.read(directory)
    if saved is None:
        return None
    old, new = (json.loads(json.dumps(_flatten(d), default=str)) for d in (saved, current))
    changed = [f"{key} ({_show(old.get(key))} → {_show(new.get(key))})" for key in sorted(set(old) | set(new))
               if key not in operational and old.get(key) != new.get(key)]
    if changed:
        raise UserInputError(f"{record.path(directory)}: {verb} must continue the same run, but "
                             f"{', '.join(changed)} changed; {hint}")
    return saved


class MetricsFile:
    """A run's ``metrics.jsonl``: one JSON object per line, each with its ``step``. Opening it for a
    run at ``resume_step`` drops the lines logged after that step (by a run that died after its
    last checkpoint) and a line cut short by a crash, so the resumed run logs those steps again.

    Example:
        >>> metrics = MetricsFile("runs/x/metrics.jsonl", resume_step=500)
        >>> metrics.write({"step": 501, "loss": 1.9})
    """

    def __init__(self, path: str | Path, resume_step: int) -> None:
        self.path = Path(path)
        if self.path.is_file():
            kept = [row for row in read_metrics(self.path) if row.get("step", 0) <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(row) + "\n" for row in kept))

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record (flushed at once: a crash loses at most the line being written)."""
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(dict(record)) + "\n")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (none when it is absent). The last line is left out when a
    crash cut it short; a damaged line before it is an error naming the file and line.

    Example:
        >>> [row["loss"] for row in read_metrics("runs/x/metrics.jsonl")][:2]
        [7.81, 7.42]
    """
    path = Path(path)
    lines = path.read_bytes().splitlines() if path.is_file() else []  # bytes: a cut can split a character
    rows: list[dict[str, Any]] = []
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8")
            row = json.loads(line) if line.strip() else None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if number == len(lines):
                break
            why = f"invalid JSON: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else f"not UTF-8 at byte {exc.start}"
            raise located(path, number, f"damaged training log line ({why}); delete that line, or resume from the "
                          "checkpoint before it") from None
        if isinstance(row, dict):
            rows.append(row)
    return rows


@contextlib.contextmanager
def promoted(output: str | Path, record: RecordFile = RUN) -> Iterator[Path]:
    """Write the finished output in a temporary sibling that then replaces the run directory.

    When the block succeeds, the entries of ``output`` it did not write (record, metrics,
    checkpoints, the user's files) move into it, and it replaces ``output`` in one rename
    (:func:`~neobert_embed.files.atomic_directory`); on failure ``output`` is left as it was.

    Example:
        >>> with promoted("runs/x") as tmp:
        ...     model.save(str(tmp))
    """
    with atomic_directory(output, record=record.name, stamp=False, keep_others=True) as tmp:
        yield tmp
