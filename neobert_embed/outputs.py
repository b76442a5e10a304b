"""Ownership of outputs: a command deletes or replaces only what it can prove it made.

Why: output paths are typed by people, and a wrong ``--output`` must never cost them data. Every
command that writes checks its output *before* any model is loaded (so a mistake fails in a
second, not after an hour of encoding):

* the location is usable: the right kind (a file path for a file, a directory for a directory),
  and the nearest existing parent is a writable directory;
* it is not one of the command's inputs (``encode --input t.txt --output t.txt``);
* an existing output is replaced only when it carries the command's own record: a directory
  holding its run record or manifest (``run.json``, ``manifest.json``, ``export.json``,
  ``stages.json``), or a file with the JSON sidecar its writer leaves beside it. Anything else is
  *foreign*: the command stops with exit status 2 and deletes nothing, ``--overwrite`` included.

Example:
    >>> check_output_file("out/docs.npy", inputs=["docs.txt"], overwrite=False)
    >>> check_output_directory("runs/x", record="run.json", replace="--overwrite")
    <DirectoryState.OWNED: 'owned'>
"""

from __future__ import annotations

import contextlib
import enum
import fnmatch
import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from neobert_embed.errors import UserInputError, existing_ancestor, listing
from neobert_embed.files import (
    WRITTEN_KEY,
    FilePin,
    atomic_path,
    read_json_object_or_none,
    remove_debris,
    write_synced,
    writing,
)
from neobert_embed.locks import is_lock_file, writer_lock

if TYPE_CHECKING:
    from neobert_embed.records import RecordFile

logger = logging.getLogger(__name__)
RecordNames: TypeAlias = "str | RecordFile | tuple[str | RecordFile, ...]"
"""What marks a directory as a command's own: a record (any of its names), a file name, or several."""


class DirectoryState(str, enum.Enum):
    """What an output directory holds before a command writes to it."""

    ABSENT = "absent"
    EMPTY = "empty"
    OWNED = "owned"
    FOREIGN = "foreign"


def same_path(a: str | Path, b: str | Path) -> bool:
    """True when ``a`` and ``b`` name the same file or directory (symlinks and ``..`` resolved).

    Example:
        >>> same_path("docs/../docs.txt", "docs.txt")
        True
    """
    a, b = Path(a), Path(b)
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _inside(child: Path, parent: Path) -> bool:
    return child.resolve().is_relative_to(parent.resolve())


def check_writable_location(path: str | Path, flag: str = "--output") -> None:
    """Refuse ``path`` when it cannot be created: its nearest existing ancestor must be a
    writable directory (not a file, not read-only).

    Example:
        >>> check_writable_location("/proc/out.npy")
        Traceback (most recent call last):
        UserInputError: --output /proc/out.npy: cannot write in /proc (permission denied) ...
    """
    path = Path(path)
    check_not_link(path, flag)
    check_name_length(path, flag)
    if path.is_dir():
        directory = path  # files are created inside it
    else:
        directory = path.parent  # the file (new or replaced) is created here, or below its nearest ancestor
        while not directory.exists() and directory != directory.parent:
            directory = directory.parent
        if not directory.is_dir():
            raise UserInputError(f"{flag} {path}: {directory} is a file, so nothing can be created under it; "
                                 "choose another location")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UserInputError(f"{flag} {path}: cannot write in {directory} (permission denied); choose a "
                             "location you can write to")


def check_not_link(path: str | Path, flag: str = "--output") -> None:
    """Refuse an output that is a symbolic link: the one rule for links, in every command.

    Why: replacing an output is a rename of the path itself, so through a link a command would put
    a new directory where the link was and leave (or delete) files in the link's target that it
    does not own. Naming the target itself makes what is replaced, locked and owned unambiguous.

    Example:
        >>> check_not_link("runs/latest")
        Traceback (most recent call last):
        UserInputError: --output runs/latest is a symbolic link (to runs/x); ...
    """
    path = Path(path)
    if path.is_symlink():
        target = Path(os.path.realpath(path))
        raise UserInputError(f"{flag} {path} is a symbolic link (to {os.readlink(path)}); outputs are never written "
                             f"through a link: pass its target ({flag} {target}) or another path (nothing was changed)")


NAME_DECORATION = len("..NAME.lock.json.XXXXXXXX.tmp") - len("NAME")
"""Bytes the longest name a writer makes beside an output adds to the output's own name (the
temporary file of its lock note; a sidecar's temporary file, ``.NAME.json.XXXXXXXX.tmp``, is shorter)."""


def check_name_length(path: str | Path, flag: str = "--output") -> None:
    """Refuse an output whose name, or a name a writer makes beside it (temporary files, lock,
    sidecar), is longer than its file system allows, before any work.

    Why: a 240-byte name is legal, but ``.NAME.json.XXXXXXXX.tmp`` beside it is not, and the
    write failed only after everything was encoded.

    Example:
        >>> check_name_length("out/" + "x" * 240 + ".npy")
        Traceback (most recent call last):
        UserInputError: --output out/xxxx…: its name is 244 bytes, ...
    """
    path = Path(os.path.abspath(path))
    anchor = existing_ancestor(path)
    try:
        limit = os.pathconf(anchor, "PC_NAME_MAX")
        path_limit = os.pathconf(anchor, "PC_PATH_MAX")
    except (OSError, ValueError):
        limit, path_limit = 255, 4096
    size = len(os.fsencode(path.name))
    for part in path.relative_to(anchor).parts[:-1]:
        if len(os.fsencode(part)) > limit:
            raise UserInputError(f"{flag} {path}: the folder name {part[:24]}… is {len(os.fsencode(part))} bytes, "
                                 f"over the file system's limit of {limit}; choose a shorter name")
    if size + NAME_DECORATION > limit:
        raise UserInputError(f"{flag} {path.parent / (path.name[:24] + '…')}: its name is {size} bytes, and the "
                             f"files written beside it add {NAME_DECORATION}, over the file system's limit of "
                             f"{limit} bytes per name; choose a name of at most {limit - NAME_DECORATION} bytes")
    if len(os.fsencode(str(path))) + NAME_DECORATION >= path_limit:
        raise UserInputError(f"{flag} {path.parent / (path.name[:24] + '…')}: the path is "
                             f"{len(os.fsencode(str(path)))} bytes, too long for the file system (limit "
                             f"{path_limit}); choose a shorter path")


def check_not_input(output: str | Path, inputs: Iterable[str | Path | None], flag: str = "--output") -> None:
    """Refuse an output that is, or contains, one of ``inputs``.

    Example:
        >>> check_not_input("t.txt", ["t.txt"])
        Traceback (most recent call last):
        UserInputError: --output t.txt is also an input of this command ...
    """
    output = Path(output)
    for item in inputs:
        if item is None or not str(item):
            continue
        source = Path(item)
        if same_path(output, source) or (source.exists() and _inside(source, output)):
            raise UserInputError(f"{flag} {output} is also an input of this command ({source}); writing it "
                                 "would destroy the input: choose another output path")


def sidecar_path(path: str | Path) -> Path:
    """The JSON record written beside a file output: ``docs.npy`` → ``docs.npy.json``.

    Example:
        >>> sidecar_path("out/docs.npy")
        PosixPath('out/docs.npy.json')
    """
    path = Path(path)
    return path.with_name(path.name + ".json")


def read_sidecar(path: str | Path) -> dict[str, Any] | None:
    """The record beside ``path`` (see :func:`published_file`), or None when there is none.

    Example:
        >>> read_sidecar("out/docs.npy")["writer"]
        'neobert-embed encode'
    """
    return read_json_object_or_none(sidecar_path(path))


PIN_KEY = "pin"  # a file output's record: the size and SHA-256 of the file it describes (files.FilePin)


@dataclass
class StagedFile:
    """A file output being written (:func:`published_file`): ``path`` is the temporary file to fill,
    ``record`` the fields its sidecar will hold (the block may add to them)."""

    path: Path
    record: dict[str, Any]


@contextlib.contextmanager
def published_file(path: str | Path, writer: str, **fields: Any) -> Iterator[StagedFile]:
    """Write the file output ``path`` and its record (sidecar ``PATH.json``) as one unit: both
    are written to temporary files first, then the file is put in place, then the record, last.

    Why: the record is how a later command trusts the file (``--overwrite``, ``--calibration``,
    provenance). Written first, a failed run left a record of itself over the previous matrix,
    or a record with no matrix. Now a failure while writing (a full disk) leaves the previous
    pair whole (or nothing), and the record pins the file it describes (size and SHA-256), so
    even a process killed between the two renames leaves a pair a reader can tell apart
    (:func:`check_record_matches`). It holds the output's writer lock (:func:`claimed_file`, which
    a command takes before its work, already holds it), so two writers never publish at once.

    Example:
        >>> with published_file("out/docs.npy", "neobert-embed encode", model="bert") as staged:
        ...     np.save(staged.path, vectors, allow_pickle=False)
        ...     staged.record["texts"] = len(vectors)
    """
    path = Path(path)
    with writing(path), _file_lock(path, writer), atomic_path(sidecar_path(path)) as record_tmp, \
            atomic_path(path) as data_tmp:
        staged = StagedFile(data_tmp, dict(fields))
        yield staged
        write_synced(data_tmp)
        pin = FilePin.of(data_tmp)
        record = {"writer": writer, "written_at": datetime.now(timezone.utc).isoformat(), **staged.record,
                  PIN_KEY: {"size": pin.size, "sha256": pin.sha256}}
        write_synced(record_tmp, (json.dumps(record, indent=2, sort_keys=True, default=str) + "\n").encode("utf-8"))
    # atomic_path publishes the inner file (the data) first, the record last


@contextlib.contextmanager
def claimed_file(path: str | Path, *, writer: str, inputs: Iterable[str | Path | None] = (), overwrite: bool = False,
                 flag: str = "--output", suffix: str | None = None, wait: bool = True) -> Iterator[Path]:
    """Own the file output ``path`` for the block: the one way a command starts writing a file.

    The path is checked before any work (:func:`check_output_file`), then this process takes the
    output's writer lock (:func:`~neobert_embed.locks.writer_lock`: a second command on the same
    output waits, saying for whom, or with ``wait=False`` refuses at once), removes what a killed
    writer of this output left (its hidden ``.NAME.XXXXXXXX.tmp`` files: no live writer has any
    while we hold the lock), and checks again: an output another writer finished meanwhile is
    replaced only with ``overwrite``, like one that was there before.

    Why: two ``encode`` runs to one ``-o`` both exited 0, the later silently replacing the other's
    finished matrix, and ``kill -9`` left temporary files that each rerun added to.

    Example:
        >>> with claimed_file("docs.npy", writer="neobert-embed encode", inputs=["docs.txt"], suffix=".npy"):
        ...     encode_into("docs.npy")
    """
    check = dict(writer=writer, inputs=list(inputs), overwrite=overwrite, flag=flag, suffix=suffix)
    check_output_file(path, **check)
    with writing(path), _file_lock(path, writer, wait=wait):
        check_output_file(path, **check)
        yield Path(path)


@contextlib.contextmanager
def _file_lock(path: Path | str, writer: str, wait: bool = True) -> Iterator[None]:
    """The writer lock of a file output, and a killed writer's temporary files cleared under it."""
    with writer_lock(path, command=writer, wait=wait, reentrant=True):
        for target in (Path(path), sidecar_path(path)):
            for removed in remove_debris(target):
                logger.warning("removed %s, left by a writer of %s that was stopped", removed, path)
        yield


def check_record_matches(path: str | Path, flag: str = "--calibration") -> None:
    """Refuse a file output whose record pins another file than the one beside it (a run killed
    between publishing the file and its record; a file replaced by hand). Records written before
    pins existed pass.

    Example:
        >>> check_record_matches("docs.npy")
        Traceback (most recent call last):
        UserInputError: --calibration docs.npy.json describes another docs.npy (… bytes, but … were recorded); ...
    """
    path = Path(path)
    pin = (read_sidecar(path) or {}).get(PIN_KEY)
    if not isinstance(pin, dict) or not path.is_file():
        return
    try:
        difference = FilePin(size=int(pin["size"]), sha256=str(pin["sha256"])).difference(path)
    except (KeyError, TypeError, ValueError):
        difference = "its pin is damaged"
    if difference is not None:
        raise UserInputError(f"{flag} {sidecar_path(path)} describes another {path.name} ({difference}): the run that "
                             f"wrote them did not finish; encode {path.name} again")


def check_output_file(path: str | Path, *, writer: str, inputs: Iterable[str | Path | None] = (),
                      overwrite: bool = False, flag: str = "--output", suffix: str | None = None) -> None:
    """Check a file output and its sidecar before any work: right kind and suffix, writable, not
    an input, and an existing file (or sidecar) replaced only with ``overwrite`` *and* proof that
    ``writer`` made it.

    Args:
        writer: the command that writes it (``neobert-embed encode``), as in its sidecar.
        suffix: the one suffix the written format has (``.npy``): another one is refused, so a
            matrix never lands in ``notes.txt``.

    Example:
        >>> check_output_file("docs.npy", writer="neobert-embed encode", inputs=["docs.txt"], suffix=".npy")
    """
    path = Path(path)
    check_name_length(path, flag)  # first: a name too long cannot even be looked at
    if path.is_dir():
        raise UserInputError(f"{flag} {path} is a directory; give a file path such as {path / 'output'}"
                             f"{suffix or path.suffix or ''}")
    side = sidecar_path(path)
    check_not_link(side, f"{flag}'s record")
    check_not_input(path, inputs, flag)
    check_not_input(side, inputs, f"{flag}'s record")
    if suffix is not None and path.suffix.lower() != suffix:
        raise UserInputError(f"{flag} {path}: {writer} writes a {suffix} file; give a path ending in {suffix} "
                             f"(e.g. {path.with_suffix(suffix)})")
    check_writable_location(path, flag)
    if side.is_dir() or (side.exists() and (read_sidecar(path) or {}).get("writer") != writer):
        raise UserInputError(f"{flag} {path}: its record {side} would be written over, but {side.name} exists "
                             f"and was not written by {writer}; nothing was replaced: choose another path or "
                             "move that file")
    if not path.exists():
        return
    if not overwrite:
        raise UserInputError(f"{flag} {path} already exists; pass --overwrite to replace it (only a file "
                             f"written by {writer} is ever replaced) or choose another path")
    record = read_sidecar(path)
    if record is None or record.get("writer") != writer:
        raise UserInputError(f"{flag} {path} was not written by {writer} (no {sidecar_path(path).name} "
                             "record); nothing was replaced: choose another path or remove it yourself")


def directory_state(path: str | Path, record: RecordNames) -> DirectoryState:
    """Classify an output directory by whether it carries the command's ``record`` file (or any
    of several: a results root is recognised by ``results/`` or ``summary.md``).

    Example:
        >>> directory_state("runs/x", "run.json")
        <DirectoryState.ABSENT: 'absent'>
    """
    path = Path(path)
    if not path.exists():
        return DirectoryState.ABSENT
    if _record_present(path, record) is not None:
        return DirectoryState.OWNED
    held = [entry for entry in path.iterdir() if not is_lock_file(entry.name)]  # a lock file is no one's content
    return DirectoryState.FOREIGN if held else DirectoryState.EMPTY


def check_directory_path(path: str | Path, flag: str = "--output", what: str = "output") -> None:
    """Refuse a directory output that is an existing file or lies where nothing can be written.

    Example:
        >>> check_directory_path("notes.txt")
        Traceback (most recent call last):
        UserInputError: --output notes.txt is a file, but the output is a directory ...
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserInputError(f"{flag} {path} is a file, but the {what} is a directory; choose a directory "
                             "path (nothing was changed)")
    check_writable_location(path, flag)


def check_output_directory(path: str | Path, *, record: RecordNames, inputs: Iterable[str | Path | None] = (),
                           flag: str = "--output", what: str = "output", replace: str | None = None,
                           owned: Iterable[str] = (), writer: str | None = None) -> DirectoryState:
    """Check a directory output before any work; refuse a file, an input, an unwritable place and
    a non-empty directory that lacks ``record`` (foreign content is never deleted).

    With ``replace`` (the flag that replaces it: ``--overwrite``, ``--fresh``), an owned directory must hold nothing but
    what its record claims (:func:`check_replaceable`; ``owned``: name patterns the command always
    writes there).

    With ``writer``, an owned directory whose record names another ``writer`` is foreign too: two
    commands write ``export.json`` (``export`` and ``pretrain export``), and neither replaces the
    other's output.

    Returns the directory's state so the caller can decide what ``--overwrite``/``--resume`` mean
    for its own output.

    Example:
        >>> check_output_directory("runs/demo", record="stages.json")
        <DirectoryState.ABSENT: 'absent'>
    """
    path = Path(path)
    check_name_length(path, flag)  # first: a name too long cannot even be looked at
    check_not_input(path, inputs, flag)
    check_directory_path(path, flag, what)
    state = directory_state(path, record)
    names = tuple(part if isinstance(part, str) else part.name for part in _parts(record))  # for messages
    if state is DirectoryState.FOREIGN:
        raise UserInputError(f"{flag} {path} holds {_some_entries(path)} but no {' or '.join(names)}, so it is not a {what} "
                             "written by neobert-embed; nothing was deleted: choose another path or an "
                             "empty directory")
    if writer is not None and state is DirectoryState.OWNED:
        _check_writer(path, record, writer, flag)
    if replace and state is DirectoryState.OWNED:
        check_replaceable(path, _record_present(path, record) or names[0], owned=owned, flag=flag, verb=replace)
    return state


def _parts(record: RecordNames) -> tuple[str | RecordFile, ...]:
    """The file names and records that ``record`` names, as a tuple."""
    return record if isinstance(record, tuple) else (record,)


def _check_writer(path: Path, record: RecordNames, writer: str, flag: str) -> None:
    """Refuse an output whose record says another command wrote it (a record without ``writer`` is
    from before the field: it passes)."""
    for part in _parts(record):
        data = None if isinstance(part, str) else part.read(path)
        if isinstance(data, dict) and data.get("writer", writer) != writer:
            raise UserInputError(f"{flag} {path} holds a {part.holds} written by {data['writer']!r}, not by {writer}; "
                                 "nothing was deleted: choose another path")


def _record_present(path: Path, record: RecordNames) -> str | None:
    """The name of the file in ``path`` that marks it as the command's own, or None: a plain name that
    exists, or a record under its name or a legacy name that holds it (:meth:`RecordFile.path`)."""
    for part in _parts(record):
        if isinstance(part, str):
            if (path / part).exists():
                return part
        elif part.exists(path):
            return part.path(path).name
    return None


def claimed_entries(directory: str | Path, record: str, owned: Iterable[str] = ()) -> set[str]:
    """Name patterns of the entries of ``directory`` that its writer claims: the record itself,
    what the record lists (``written``, written by :func:`~neobert_embed.files.atomic_directory`;
    the top folders of its ``files``) and the writer's own ``owned`` patterns.

    Example:
        >>> claimed_entries("runs/index", "manifest.json", owned=("index.ivfdata",))
        {'manifest.json', 'index.faiss', 'documents.sqlite', 'index.ivfdata'}
    """
    data = read_json_object_or_none(Path(directory) / record) or {}
    files = data.get("files") if isinstance(data.get("files"), dict | list) else []
    written = data.get(WRITTEN_KEY) if isinstance(data.get(WRITTEN_KEY), list) else []
    return {record, *owned, *(str(name) for name in written), *(Path(str(name)).parts[0] for name in files)}


def check_replaceable(directory: str | Path, record: str, *, owned: Iterable[str] = (), flag: str = "--output",
                      verb: str = "--overwrite") -> None:
    """Refuse to replace (or clear) an owned output directory that holds entries its writer did
    not claim (:func:`claimed_entries`): files a user put inside an earlier output are never
    deleted. Hidden entries (locks, temporary siblings' debris) and logs are the tool's own.

    Example:
        >>> check_replaceable("runs/index", "manifest.json")
        Traceback (most recent call last):
        UserInputError: --output runs/index holds notes.txt, which manifest.json does not list ...
    """
    directory = Path(directory)
    if not directory.is_dir():
        return
    claimed = claimed_entries(directory, record, owned)
    foreign = sorted(entry.name for entry in directory.iterdir() if not entry.name.startswith(".")
                     and not entry.name.endswith(".log") and not any(fnmatch.fnmatch(entry.name, p) for p in claimed))
    if foreign:
        raise UserInputError(f"{flag} {directory} holds {listing(foreign)}, which {record} does not list as written by "
                             f"neobert-embed; {verb} would delete it, so nothing was deleted: move it out of "
                             f"{directory} or choose another path")


def _some_entries(directory: Path) -> str:
    """``a.txt, b/ and 4 more``: what a directory holds, for an error message."""
    return listing(sorted(entry.name + ("/" if entry.is_dir() else "") for entry in directory.iterdir()))


def model_label(model: str) -> str:
    """Folder and table name of a model: a path's last part, or the id with ``/`` → ``__``.

    Example:
        >>> model_label("answerdotai/ModernBERT-base"), model_label("neobert")
        ('answerdotai__ModernBERT-base', 'neobert')
    """
    path = Path(model)
    return path.name if path.exists() else model.replace("/", "__")
