"""User-facing errors.

Every mistake a user can fix (a bad file, an unknown key, a missing column) is raised as a
:class:`UserInputError` whose message says *where* (file, line, key) and *what to do*. The CLI
prints these without a traceback and exits with status 2; anything else is a bug and keeps its
traceback. The operating system's refusals (a full disk, a quota, a read-only file system, a name
too long, a permission, memory, a busy port) are the user's to fix too: :func:`system_failure`
words them, once, for every writer (:func:`neobert_embed.files.writing`) and for the CLI.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Sequence
from pathlib import Path


class UserInputError(ValueError):
    """An error the user can fix by changing their input, recipe or command line.

    Example:
        >>> raise UserInputError("data.jsonl:3: field 'text' is missing; add it or pass --text-field")
    """


def located(path: str | Path, line: int | None, message: str) -> UserInputError:
    """Build a :class:`UserInputError` prefixed with ``file:line`` so editors can jump there.

    Example:
        >>> str(located("corpus.jsonl", 12, "invalid JSON"))
        'corpus.jsonl:12: invalid JSON'
    """
    where = f"{path}:{line}" if line is not None else str(path)
    return UserInputError(f"{where}: {message}")


def listing(items: Sequence[object], shown: int = 3) -> str:
    """The first ``shown`` items of an error message's list, and how many more there are.

    Example:
        >>> listing(["a.txt", "b/", "c", "d", "e"])
        'a.txt, b/, c and 2 more'
    """
    head = ", ".join(map(str, items[:shown]))
    return head + (f" and {len(items) - shown} more" if len(items) > shown else "")


# What an operating system's refusal means for the user, and what to do: one place, so every writer
# (and the CLI, for failures outside a writer) says it the same way.
_SYSTEM_FIXES = {
    errno.ENOSPC: "no space left on the device{space}; free space there or choose another --output",
    errno.EDQUOT: "disk quota exceeded{space}; free space in your quota or choose another --output",
    errno.EROFS: "read-only file system; choose a location on a writable file system",
    errno.ENAMETOOLONG: "file name too long for its file system{name}; choose a shorter name",
    errno.EACCES: "permission denied; choose a path you may read and write, or change its permissions",
    errno.EPERM: "operation not permitted; choose a path you may read and write, or change its permissions",
    errno.EADDRINUSE: "address already in use; choose another --port or stop the program listening on it",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n) or close other programs",
    errno.ENFILE: "too many open files on this system; close other programs and rerun",
}
# Libraries that wrap the OS error in their own exception (safetensors, torch, FAISS, sqlite) keep its words.
_SYSTEM_WORDS = {"no space left on device": errno.ENOSPC, "os error 28": errno.ENOSPC,
                 "database or disk is full": errno.ENOSPC, "disk quota exceeded": errno.EDQUOT,
                 "read-only file system": errno.EROFS, "file name too long": errno.ENAMETOOLONG,
                 "permission denied": errno.EACCES}
MEMORY_FIX = ("out of memory; lower --batch-size, close other programs, or raise the memory limit "
              "(ulimit -v, the container's limit)")


def system_errno(exc: BaseException) -> int | None:
    """The operating-system error behind ``exc`` (an ``OSError``, or a library's exception caused
    by one or quoting its words), or None when there is none.

    Example:
        >>> system_errno(RuntimeError("write failed: No space left on device (os error 28)"))
        28
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _SYSTEM_FIXES:
            return exc.errno
        text = str(exc).lower()
        found = next((code for words, code in _SYSTEM_WORDS.items() if words in text), None)
        if found is not None:
            return found
        exc = exc.__cause__ or exc.__context__
    return None


class SystemRefusal(UserInputError):
    """A :class:`UserInputError` for a refusal of the operating system (see :func:`system_failure`);
    ``cause`` is the original error, so a writer of the whole output can name that output instead of
    the hidden temporary file the refusal met (``runs/index``, not ``runs/.index.partial/index.faiss``).
    """

    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(message)
        self.cause = cause


def system_failure(exc: BaseException, path: str | Path | None = None) -> SystemRefusal | None:
    """The one-line user error for an operating system's refusal (a full disk, a quota, a
    read-only file system, a name too long, a permission, memory, a busy port), naming ``path`` (the
    output being written; for a refusal about one file, the file the error names, when it does) and
    what to do; None when ``exc`` is not one (a bug keeps its traceback).

    Example:
        >>> str(system_failure(OSError(errno.ENOSPC, "No space left on device"), "/data/docs.npy"))
        '/data/docs.npy: no space left on the device (0 B free on /data); free space there or choose another --output'
    """
    if isinstance(exc, SystemRefusal):
        exc = exc.cause
    if isinstance(exc, MemoryError):
        return SystemRefusal(f"{path}: {MEMORY_FIX}" if path is not None else MEMORY_FIX, exc)
    code = system_errno(exc)
    if code is None:
        return None
    own = getattr(exc, "filename", None)  # a permission or a name concerns one file: name it, if the error does
    where = path if code in (errno.ENOSPC, errno.EDQUOT) or own is None else own
    message = _SYSTEM_FIXES[code].format(space=_free_space(where), name=_longest_name(where))
    return SystemRefusal(f"{where}: {message}" if where else message, exc)


def human_bytes(size: float) -> str:
    """``1.2 GB``: a size for a message.

    Example:
        >>> human_bytes(1_234_567_890)
        '1.2 GB'
    """
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


def existing_ancestor(path: str | Path) -> Path:
    """``path`` or its nearest ancestor that exists (where a new file's space and rights are decided)."""
    path = Path(os.path.abspath(path))
    while not _exists(path) and path != path.parent:
        path = path.parent
    return path


def _exists(path: Path) -> bool:
    """``path.exists()``, False for a name the file system cannot even look up (too long)."""
    try:
        return path.exists()
    except OSError:
        return False


def mount_point(path: str | Path) -> Path:
    """The mount point of the file system holding ``path`` (what a user frees space on)."""
    path = existing_ancestor(path)
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def _free_space(path: str | Path | None) -> str:
    if path is None:
        return ""
    try:
        free = shutil.disk_usage(existing_ancestor(path)).free
    except OSError:
        return ""
    return f" ({human_bytes(free)} free on {mount_point(path)})"


def _longest_name(path: str | Path | None) -> str:
    if path is None:
        return ""
    longest = max((len(os.fsencode(part)) for part in Path(path).parts), default=0)
    return f" (a part of its name is {longest} bytes)"
