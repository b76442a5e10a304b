"""Safe file primitives shared by every long-running command.

Why: an interrupted job must never leave a half-written model, index or checkpoint that a later
run mistakes for a finished one. Everything that lands on disk goes through a temporary sibling
and an atomic ``os.replace``. Reading is strict and located: a bad line names its file and line.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Protocol

from neobert_embed.errors import (
    SystemRefusal,
    UserInputError,
    existing_ancestor,
    human_bytes,
    located,
    mount_point,
    system_failure,
)

WRITTEN_KEY = "written"  # a directory record's list of the entries its writer made (see atomic_directory)


def current_umask() -> int:
    """The process's file-creation mask (read without changing it for longer than one call).

    Example:
        >>> oct(current_umask())
        '0o22'
    """
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see either the old file or the whole new one.

    The file gets the mode a plain ``open()`` would give it (0666 less the user's umask), not
    ``mkstemp``'s private 0600: outputs on a shared machine stay readable as the user intends.

    Example:
        >>> atomic_write_bytes("out/manifest.json", b"{}")
    """
    with atomic_path(path) as tmp:
        write_synced(tmp, data)


def write_synced(path: str | Path, data: bytes | None = None) -> None:
    """Write ``data`` into ``path`` (None: keep what a library wrote there) and flush it to the disk,
    so a file renamed into place afterwards is complete even after a power cut.

    Example:
        >>> write_synced(".docs.npy.x1.tmp")   # np.save wrote it; now it is on the disk
    """
    with open(path, "wb" if data is not None else "rb+") as handle:
        if data is not None:
            handle.write(data)
            handle.flush()
        os.fsync(handle.fileno())


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary sibling of ``path`` to write; it replaces ``path`` in one rename when the block
    succeeds, and is removed when it fails. Every atomic file write goes through it, bytes
    (:func:`atomic_write_bytes`) or a library that writes by name (FAISS, Arrow).

    Why: a crash mid-write leaves ``.NAME.XXXX.tmp`` (which :func:`remove_debris` clears), never a
    torn ``path``; the name is unique, so two writers in one process do not share it. A refusal of
    the operating system (a full disk, a quota, a read-only file system…) becomes one
    :class:`UserInputError` naming ``path`` (:func:`~neobert_embed.errors.system_failure`).

    Example:
        >>> with atomic_path("runs/idx/index.faiss") as tmp:
        ...     faiss.write_index(index, str(tmp))
    """
    path = Path(path)
    tmp: Path | None = None
    with writing(path):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            tmp = Path(name)
            os.fchmod(fd, 0o666 & ~current_umask())
            os.close(fd)
            yield tmp
            os.replace(tmp, path)
        except BaseException:
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            raise


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Inside the block, a refusal of the operating system (a full disk, a quota, a read-only file
    system, a name too long, a permission, memory) becomes one :class:`UserInputError` naming
    ``path``, the output being written, and what to do; anything else passes unchanged.

    Why one place: the write sites are many (our atomic writers, FAISS, sqlite, Arrow, the
    Trainer's checkpoints) and each library words the failure its own way (``disk I/O error``,
    ``file write failed``), often without the file. The atomic writers and every claimed output
    directory (:func:`~neobert_embed.runs.claimed_directory`) run inside it; where blocks nest, the
    outermost names the output (``runs/index``, not its hidden ``.index.partial/index.faiss``). A failure a library
    hid the reason of counts as a full disk when next to nothing is free where it wrote.

    Example:
        >>> with writing("runs/index"):
        ...     faiss.write_index(index, "runs/.index.partial/index.faiss")
        Traceback (most recent call last):
        UserInputError: runs/index: no space left on the device (0 B free on /runs); ...
    """
    try:
        yield
    except SystemRefusal as refusal:  # met inside, by a writer of a part: the outermost names the output
        raise system_failure(refusal, path) from refusal.cause
    except (UserInputError, KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except Exception as exc:
        failure = system_failure(exc, path)
        if failure is None and isinstance(exc, OSError | RuntimeError) and _device_full(Path(path)):
            failure = system_failure(OSError(errno.ENOSPC, "No space left on device"), path)
        if failure is None:
            raise
        raise failure from exc


def _device_full(path: Path) -> bool:
    try:
        return shutil.disk_usage(existing_ancestor(path)).free < FULL_BYTES
    except OSError:
        return False


FULL_BYTES = 64 * 1024  # less free than this where a write just failed: the disk is full


def follow_umask(root: str | Path) -> None:
    """Give every file and folder under ``root`` the mode a plain ``open()``/``mkdir()`` would
    (0666/0777 less the user's umask; executables keep their execute bits).

    Why: libraries write some files privately (transformers saves ``model.safetensors`` as 0600
    through a temporary file), and a model meant for a shared machine must be readable as the
    user's umask says (docs/data-safety.md). Called on what a writer made, before it is published.

    Example:
        >>> follow_umask("runs/.model.k2j1.tmp")
    """
    root = Path(root)
    mask = current_umask()
    for path in [root, *root.rglob("*")] if root.is_dir() else [root] if root.exists() else []:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        wanted = 0o777 & ~mask if path.is_dir() or mode & 0o111 else 0o666 & ~mask
        if mode & 0o777 != wanted:
            os.chmod(path, wanted)


def check_free_space(path: str | Path, needed: int, flag: str = "--output", what: str = "the output") -> None:
    """Refuse to start a write of about ``needed`` bytes at ``path`` when its file system has less
    free, before any work (the old output stays until the new one is complete, so both must fit).

    Example:
        >>> check_free_space("/data/docs.npy", 1_200_000_000, what="the matrix")
        Traceback (most recent call last):
        UserInputError: --output /data/docs.npy: writing the matrix takes about 1.2 GB, but /data has 0.3 GB free; ...
    """
    try:
        free = shutil.disk_usage(existing_ancestor(path)).free
    except OSError:
        return
    if needed > free:
        mount = mount_point(path)
        raise UserInputError(f"{flag} {path}: writing {what} takes about {human_bytes(needed)}, but {mount} has "
                             f"{human_bytes(free)} free; free {human_bytes(needed - free)} on {mount} or choose "
                             f"another {flag}")


def atomic_write_text(path: str | Path, text: str) -> None:
    """UTF-8 text version of :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON atomically.

    Example:
        >>> atomic_write_json("run/summary.json", {"ndcg_at_10": 0.41})
    """
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def atomic_directory(path: str | Path, overwrite: bool = True, record: str | None = None,
                     stamp: bool = True, keep_others: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling directory that replaces ``path`` only if the block succeeds.

    Used for saved models and exported checkpoints: an exception or Ctrl-C inside the block
    leaves ``path`` exactly as it was (absent, or the previous complete version). With
    ``record`` (the name of the file by which the command recognises its own output, such as
    ``run.json``), a non-empty ``path`` without that file is never replaced, and (with ``stamp``)
    the record written in the block gets the list of entries the block wrote (``written``), by
    which a later ``--overwrite`` tells the command's files from a user's. What the block wrote
    follows the umask (:func:`follow_umask`); with ``keep_others``, the entries of the old ``path``
    the block did not write (a run's record, metrics, checkpoints, a user's notes) move into the new
    version unchanged, and back if publishing fails. A refusal of the operating system (a full disk)
    is one user error naming ``path``; the temporary directory is removed and ``path`` stays whole.

    Example:
        >>> with atomic_directory("runs/model", record="export.json") as tmp:
        ...     model.save(str(tmp))
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise UserInputError(f"{path} already exists; choose another output or remove it")
    if record is not None and path.is_dir() and any(path.iterdir()) and not (path / record).exists():
        raise UserInputError(f"{path} holds files that neobert-embed did not write (no {record}); "
                             "nothing was deleted: choose another output or empty it yourself")
    tmp: Path | None = None
    adopted: list[str] = []
    with writing(path):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
            yield tmp
            follow_umask(tmp)
            if keep_others:
                adopted = _move_entries(path, tmp)
            if stamp and record is not None and (tmp / record).is_file():
                data = read_json(tmp / record, "record just written")
                if isinstance(data, dict):
                    atomic_write_json(tmp / record, {**data, WRITTEN_KEY: sorted(os.listdir(tmp))})
            replace_directory(tmp, path)
        except BaseException:
            if tmp is not None:
                _move_entries(tmp, path, adopted)  # the entries moved in go back, as they were
                shutil.rmtree(tmp, ignore_errors=True)
            raise


def _move_entries(source: Path, target: Path, names: list[str] | None = None) -> list[str]:
    """Move the entries of ``source`` (only ``names``, when given) that ``target`` lacks into it; returns
    the names moved. A failure moves back what was moved, so nothing is left half-way."""
    if names is None:
        names = sorted(entry.name for entry in source.iterdir()) if source.is_dir() else []
    moved: list[str] = []
    try:
        for name in names:
            present = (source / name).exists() or (source / name).is_symlink()
            if present and not (target / name).exists():
                os.replace(source / name, target / name)
                moved.append(name)
    except BaseException:
        for name in moved:
            os.replace(target / name, source / name)
        raise
    return moved


def replace_directory(source: str | Path, target: str | Path) -> None:
    """Move the finished directory ``source`` to ``target``, replacing any older ``target``.

    The old directory is renamed aside first and deleted only after the new one is in place,
    so at every instant ``target`` is either the complete old or the complete new version.

    Example:
        >>> replace_directory("runs/.index.partial", "runs/index")
    """
    source, target = Path(source), Path(target)
    old = None
    if target.exists() or target.is_symlink():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    try:
        os.replace(source, target)
    except BaseException:
        if old is not None:
            os.replace(old, target)
        raise
    if old is not None and (old.is_symlink() or old.is_file()):
        old.unlink()
    elif old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove_debris(target: str | Path) -> list[Path]:
    """Delete the temporary siblings that :func:`atomic_directory` and :func:`replace_directory`
    leave beside ``target`` when their process is killed; returns what was removed.

    A writer killed inside :func:`replace_directory` may have moved the old ``target`` aside
    without putting the new one in place: that old version is moved back, never deleted.
    Call it only while holding the writer lock of ``target`` (see :mod:`neobert_embed.locks`).

    Example:
        >>> remove_debris("runs/news-index")
        [PosixPath('runs/.news-index.k2j1.tmp')]
    """
    target = Path(target)
    if not target.parent.is_dir():
        return []
    old = sorted(target.parent.glob(f".{target.name}.old-*"))
    if old and not target.exists():
        os.replace(old.pop(), target)
    temporary = re.compile(rf"\.{re.escape(target.name)}\.[A-Za-z0-9_-]+\.tmp")  # not ".NAME.other.XXXX.tmp":
    found = [*(p for p in target.parent.iterdir() if temporary.fullmatch(p.name)), *old]  # another output's
    for path in found:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return found


NAME_LIMIT = 200  # bytes of a name read from a file, leaving room for what writers add beside it
NAME_HINT = "names read from files become file names: use letters, digits, '_', '-', '.' (not first)"


def name_problem(name: object) -> str | None:
    """Why ``name`` (read from a file) cannot be one entry of a folder, or None when it can.

    Why one rule: task names (``task.json``), split names, shard and checkpoint file names in
    manifests all become file names; one that holds ``/`` or ``..`` walks out of the output,
    and one starting with ``.`` collides with the hidden files writers keep (locks, temporaries).

    Example:
        >>> name_problem("STS12"), name_problem("../../X")
        (None, "holds '/' (a name must be one path component)")
    """
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not a text name"
    if not name.strip():
        return "is empty"
    for bad in ("/", "\\", "\0"):
        if bad in name:
            return f"holds {bad!r} (a name must be one path component)"
    if name.startswith("."):
        return "starts with '.' (hidden names and '..' are reserved for the toolkit's own files)"
    if any(ord(char) < 32 for char in name):
        return "holds a control character"
    if len(name.encode("utf-8")) > NAME_LIMIT:
        return f"is {len(name.encode('utf-8'))} bytes (at most {NAME_LIMIT})"
    return None


def safe_name(name: object, what: str, source: str | Path) -> str:
    """``name``, read from ``source``, checked to be one safe folder entry (:func:`name_problem`);
    otherwise one :class:`UserInputError` naming the file, the name and what to do.

    Example:
        >>> safe_name("../../X", "task name", "tasks/t/task.json")
        Traceback (most recent call last):
        UserInputError: tasks/t/task.json: task name '../../X' holds '/' ...
    """
    problem = name_problem(name)
    if problem is not None:
        raise UserInputError(f"{source}: {what} {name!r} {problem}; {NAME_HINT}")
    return str(name)


def named_path(root: str | Path, *names: object, what: str, source: str | Path) -> Path:
    """``root / name / ...`` for names read from ``source``, each checked by :func:`safe_name`: the
    one way a name from a file becomes a path, so the result always lies inside ``root``.

    Example:
        >>> named_path("prepared/shards", "000001.arrow", what="shard", source="prepared/corpus.json")
        PosixPath('prepared/shards/000001.arrow')
    """
    return Path(root).joinpath(*(safe_name(name, what, source) for name in names))


def value_digest(value: str | dict | list, length: int = 16) -> str:
    """The first ``length`` hex digits of the SHA-256 of ``value``: a string's UTF-8 bytes, anything
    else as JSON with sorted keys (so equal settings hash alike whatever their order).

    Why one function: results caches (evaluation recipes), tokenised-data caches (GLUE) and resume
    guards (a data source's files) all key on "a short hash of these settings"; one rule keeps their
    keys comparable and their length a choice, not an accident.

    Example:
        >>> value_digest({"b": 1, "a": 2}, 12) == value_digest({"a": 2, "b": 1}, 12)
        True
    """
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks (checkpoints and indexes record it).

    Example:
        >>> len(sha256_file("runs/index/index.faiss"))
        64
    """
    digest = hashlib.sha256()
    _feed(digest, path)
    return digest.hexdigest()


@dataclass(frozen=True)
class FilePin:
    """A file's size and SHA-256 as it was written, recorded beside it so that a later reader can
    tell a truncated, corrupt or swapped file from the one it wrote.

    Why one: a pretraining checkpoint's manifest and an index's manifest both pin their files, and
    each used to write the pair under its own keys (``bytes`` in one, ``size`` in the other) and
    compare it its own way. Pydantic records take it as a field type (``dict[str, FilePin]``; extra
    keys refused).

    Example:
        >>> pin = FilePin.of("runs/index/index.faiss")
        >>> pin.difference("runs/index/index.faiss") is None
        True
        >>> pin.difference("runs/index/truncated.faiss", checksum=False)
        '64 bytes, but 11534381 were recorded'
    """

    __pydantic_config__: ClassVar[dict[str, str]] = {"extra": "forbid"}

    size: int
    sha256: str

    @classmethod
    def of(cls, path: str | Path) -> FilePin:
        """The pin of ``path`` as it is now."""
        return cls(size=Path(path).stat().st_size, sha256=sha256_file(path))

    def difference(self, path: str | Path, *, checksum: bool = True) -> str | None:
        """How ``path`` differs from this pin (None when it matches): missing, another size, or
        (unless ``checksum`` is False, for a check in milliseconds) other contents of the same size."""
        path = Path(path)
        if not path.is_file():
            return "missing"
        found = path.stat()
        if found.st_size != self.size:
            return f"{found.st_size} bytes, but {self.size} were recorded"
        identity = (self.sha256, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)
        if not checksum or _VERIFIED.get(path.resolve()) == identity:
            return None
        if sha256_file(path) != self.sha256:
            return "contents differ from the recorded checksum (same size)"
        _VERIFIED[path.resolve()] = identity
        return None


#: Files this process has hashed and found as pinned, by what ``os.stat`` says of them (inode, size, and
#: the modification and change times, which no write leaves as they were): a file opened by several
#: readers of one command (an index's openers, a resumed build's passes over its shards) is hashed once.
_VERIFIED: dict[Path, tuple[object, ...]] = {}


def directory_digest(directory: str | Path, skip: tuple[str, ...] = ()) -> str:
    """Short SHA-256 of a directory's files (relative names and contents): a local model's or
    task's "revision" in results. Hidden files and top-level folders named in ``skip`` are left out.

    Example:
        >>> directory_digest("runs/my-embedder", skip=("checkpoints",))
        '3f9a0c2b71de'
    """
    directory, digest = Path(directory), hashlib.sha256()
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        relative = file.relative_to(directory)
        if relative.parts[0] in skip or any(part.startswith(".") for part in relative.parts):
            continue
        digest.update(str(relative).encode("utf-8"))
        _feed(digest, file)
    return digest.hexdigest()[:12]


class Digest(Protocol):
    """What :func:`sha256_file` and :func:`directory_digest` feed file blocks to (any ``hashlib`` hash)."""

    def update(self, data: bytes, /) -> None: ...


def _feed(digest: Digest, path: str | Path) -> None:
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)


def read_json(path: str | Path, what: str = "record",
              fix: str = "restore it from a copy, or remove it to start that part over") -> Any:
    """The JSON value in ``path``; a damaged file is one located error, not a traceback.

    Why: records (run, journal, manifest, state files) and model files are read back by reruns; a
    file cut short by a full disk or edited by hand must say which file, where, and what to do
    (``fix``: for a model file, re-download or re-export it).

    Example:
        >>> read_json("runs/demo/stages.json", "demo journal")
        Traceback (most recent call last):
        UserInputError: runs/demo/stages.json:1: damaged demo journal (invalid JSON: ... column 2); ...
    """
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{path}: damaged {what} (not UTF-8 at byte {exc.start}); {fix}") from None
    except json.JSONDecodeError as exc:
        raise located(path, exc.lineno, f"damaged {what} (invalid JSON: {exc.msg}, column {exc.colno}); {fix}") \
            from None


def read_json_object_or_none(path: str | Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when it is missing, unreadable, damaged or not an object.

    Why: some files are hints, not inputs: a sidecar beside an output, a lock holder's note, the
    list of what an earlier writer wrote, a tiny model's size for a label. A damaged one must not
    stop a command (the hint is then simply absent), and each of these used to catch its own set
    of exceptions. Records a command depends on are read with :func:`read_json` instead.

    Example:
        >>> read_json_object_or_none("runs/x/.out.lock.json") is None   # cut short by a crash
        True
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, record)`` for each non-blank line of a JSON-lines file.

    Errors name the file and the 1-based line: a line that is not UTF-8, not JSON, or not a JSON
    object raises :class:`~neobert_embed.errors.UserInputError`.

    Example:
        >>> for line, row in iter_jsonl("queries.jsonl"):
        ...     print(line, row["text"])
    """
    for number, text in _utf8_lines(path):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise located(path, number, f"invalid JSON ({exc.msg}, column {exc.colno})") from None
        if not isinstance(record, dict):
            raise located(path, number, f"expected a JSON object, got {type(record).__name__}")
        yield number, record


def iter_text_lines(path: str | Path, keep_blank: bool = False) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` for each line of a UTF-8 text file.

    Blank lines are skipped unless ``keep_blank`` (then row ``i`` of the output is line ``i + 1``).

    Example:
        >>> docs = [text for _, text in iter_text_lines("corpus.txt")]
    """
    for number, text in _utf8_lines(path):
        text = text.rstrip("\r\n")
        if keep_blank or text.strip():
            yield number, text


STDIN = "-"  # an input path that means standard input (the Unix convention)


def is_stream(path: str | Path) -> bool:
    """Whether ``path`` is an input that can be read only once, from start to end: ``-`` (standard
    input), a FIFO, a process substitution ``<(…)`` (``/dev/fd/63``) or a character device.

    Example:
        >>> is_stream("-"), is_stream("/dev/stdin"), is_stream("docs.txt")
        (True, True, False)
    """
    if str(path) == STDIN:
        return True
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[BinaryIO]:
    """``path`` opened for binary reading; ``-`` is standard input (left open: it is not ours)."""
    if str(path) == STDIN:
        yield sys.stdin.buffer
        return
    with open(path, "rb") as handle:
        yield handle


def _utf8_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(line_number, decoded line)`` pairs; a line that is not UTF-8 is an error naming it."""
    path = Path(path)
    if not path.is_file() and not is_stream(path):
        raise UserInputError(f"{path}: file not found")
    with _opened(path) as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                yield number, raw.decode("utf-8-sig" if number == 1 else "utf-8")  # no byte-order mark
            except UnicodeDecodeError as exc:
                raise located(path, number, f"not valid UTF-8 ({exc.reason} at byte {exc.start}); "
                              "re-encode the file as UTF-8") from None
