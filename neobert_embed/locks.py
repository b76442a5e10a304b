"""One writer at a time: exclusive locks for shared artifacts (indexes, run directories).

Why: two ``index add`` runs on one index each copied the index, appended their documents and
swapped their copy in; the second swap silently dropped the first run's documents while both
reported success. Every writer of a shared artifact now holds an exclusive lock (``filelock``,
an OS-level ``flock`` released by the kernel when its process dies) for its whole
read-modify-write. Readers take no lock: writers publish by an atomic rename, so a reader sees the
old or the new version, never a mix.

The lock file sits *beside* the artifact (``runs/.news-index.lock``), so it survives the rename
that publishes a new version. A small JSON note next to it says who holds the lock; a waiter
prints it, and a writer that finds a note left by a process that is gone knows its predecessor
crashed (the caller then clears that writer's debris, or resumes its work).

Example:
    >>> with writer_lock("runs/news-index", command="index add", wait=False):
    ...     add_documents(...)
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from neobert_embed.errors import UserInputError, system_failure
from neobert_embed.files import atomic_write_json, read_json_object_or_none

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.2
_HELD: set[tuple[int, str]] = set()
"""(thread, lock file) pairs held: a thread taking a lock again inside its block passes through (an
flock taken twice through two handles would wait for itself); another thread waits as another process would."""


@dataclass(frozen=True)
class LockHolder:
    """Who holds (or held) a writer lock, from the note beside the lock file."""

    pid: int
    host: str
    command: str
    since: str

    def describe(self) -> str:
        """One human-readable phrase, e.g. ``pid 123 on box (index add, since 2026-01-01T10:00)``."""
        return f"pid {self.pid} on {self.host} ({self.command}, since {self.since[:19]})"


def lock_path(target: str | Path) -> Path:
    """The lock file of ``target``: a hidden sibling, ``runs/x`` → ``runs/.x.lock``.

    Example:
        >>> lock_path("runs/news-index")
        PosixPath('runs/.news-index.lock')
    """
    target = Path(target)
    return target.parent / f".{target.name}.lock"


def is_lock_file(name: str) -> bool:
    """Whether ``name`` is a writer lock or its note (what a directory holding only these holds
    nothing of anyone's: ``mteb`` locks one model's results with a lock file inside the root).

    Example:
        >>> is_lock_file(".results--bert--abc.lock"), is_lock_file(".bert.lock.json"), is_lock_file("bert.lock")
        (True, True, False)
    """
    return name.startswith(".") and name.endswith((".lock", ".lock.json"))


def _note_path(target: Path) -> Path:
    return target.parent / f".{target.name}.lock.json"


def read_holder(target: str | Path) -> LockHolder | None:
    """The note of the current (or crashed) holder of ``target``'s lock, if any.

    Example:
        >>> read_holder("runs/news-index") is None
        True
    """
    data = read_json_object_or_none(_note_path(Path(target))) or {}
    try:
        return LockHolder(int(data["pid"]), str(data["host"]), str(data["command"]), str(data["since"]))
    except (ValueError, KeyError, TypeError):
        return None


def _write_note(target: Path, command: str) -> None:
    atomic_write_json(_note_path(target), {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                                           "since": datetime.now(timezone.utc).isoformat()})


@contextlib.contextmanager
def writer_lock(target: str | Path, *, command: str, wait: bool = True,
                on_stale: Callable[[LockHolder], None] | None = None, reentrant: bool = False) -> Iterator[None]:
    """Hold the exclusive writer lock of ``target`` for the duration of the block.

    Args:
        command: what this writer is doing (shown to anyone who has to wait).
        wait: when another writer holds the lock, wait for it (saying so in a log warning);
            with ``wait=False`` fail at once with a :class:`UserInputError` naming the holder.
        on_stale: called with the note of a previous holder that died without releasing
            cleanly (a crash or SIGKILL): the caller clears or resumes that writer's work
            (default: log a warning).

    Example:
        >>> with writer_lock("runs/x", command="train-contrastive", wait=False):
        ...     train(...)

    With ``reentrant``, a thread that already holds the lock of ``target`` (a command that claimed
    its output file, then publishes it) passes straight through; otherwise it is one more writer.
    """
    from filelock import FileLock, Timeout

    target = Path(target)
    held = (threading.get_ident(), str(lock_path(target).absolute()))
    if reentrant and held in _HELD:  # this thread holds it already (a command's claim, then its publishing step)
        yield
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path(target)), thread_local=False, poll_interval=POLL_SECONDS)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = read_holder(target)
        who = holder.describe() if holder else "another process"
        if not wait:
            raise UserInputError(f"{target} is being written by {who}; wait until it finishes, or rerun "
                                 "without --no-wait to wait for it") from None
        logger.warning("waiting for %s to finish writing %s (Ctrl-C to give up; --no-wait fails at once instead)",
                       who, target)
        lock.acquire()
    except OSError as exc:
        raise UserInputError(f"{target}: cannot create its writer lock {lock_path(target)} ({exc.strerror or exc}); "
                             "the directory holding it must be writable") from None
    try:
        previous = read_holder(target)
        if previous is not None and previous.pid != os.getpid():
            if on_stale is not None:
                on_stale(previous)
            else:
                logger.warning("note: an earlier writer of %s, %s, stopped without finishing", target,
                               previous.describe())
        try:
            _write_note(target, command)
        except UserInputError as exc:  # a full disk: say it of the output, not of the hidden note
            raise (system_failure(exc.__cause__, target) if exc.__cause__ else exc) from None
        _HELD.add(held)
        yield
    finally:
        _HELD.discard(held)
        _note_path(target).unlink(missing_ok=True)
        lock.release()
