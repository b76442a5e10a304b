"""Fault injection, round 3: the operating system says no (issue: nothing lost when the machine fails).

Property, for each case (as in ``test_fault_injection.py``): exit status 2, ONE line on stderr that
starts with ``error:``, names the file or option and says what to do (the case's key words), no
traceback, and every file that existed before the command byte-identical afterwards (an earlier
output included: a failed ``--overwrite`` keeps the old matrix *and* its record), with nothing new
left but a lock file, a log or an index build's resume state.

The classes, each on every command that has it:

* a full disk: a small tmpfs filled to the last byte where the test may mount one (it runs as
  root in CI; the cases skip cleanly elsewhere), and ``OSError(ENOSPC)`` injected at the write
  primitive every writer goes through (``files.write_synced``) and at the libraries' own writes;
* the other refusals of the file system injected the same way: a quota (EDQUOT), a read-only file
  system (EROFS), a permission (EACCES), and ``MemoryError`` while encoding;
* names longer than the file system allows, once the temporary names beside them are counted;
* symbolic links as outputs (refused by every command, their targets untouched);
* memory limits known before the model loads (``ulimit -v``, a container's limit);
* a busy port and an empty ``--api-key`` for ``serve``;
* pipes (FIFOs) given to commands that read their input more than once.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from glue_helpers import tiny_task_dir
from safety_helpers import REPO, cli_env, fault_world, main_status, run_main, snapshot, write_jsonl
from safety_helpers import in_turn as _both

BAR = re.compile("━")
STARTED = re.compile(r"(used: |index: |training in |batches: )")  # a command's own lines once its work has begun
KEPT_ON_REFUSAL = re.compile(r"(/\.[^/]+\.lock|\.log|\.partial(/.*)?)$")
LONG = "n" * 240  # a legal name; the temporary names written beside it are not


@dataclass(frozen=True)
class Fault:
    """One command line under one refusal of the operating system.

    ``args`` take placeholders ({model}, {texts}, {out}: where outputs go, on the full disk for
    ``disk=True``). ``inject`` patches the process (a failing write, a memory limit); ``prepare``
    makes the case's files (before the disk is filled). ``expect``: words the one error line must hold.
    """

    name: str
    args: tuple[str, ...]
    expect: tuple[str, ...]
    prepare: Callable[[dict[str, Path]], None] | None = None
    inject: Callable[[pytest.MonkeyPatch], None] | None = None
    disk: bool = False
    run: bool = False  # {run}: a finished train-contrastive run, for the cases that replace one


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    paths = fault_world(tmp_path_factory.mktemp("os-faults"))
    root = paths["root"]
    encoded = root / "encoded"
    encoded.mkdir()
    assert main_status(["encode", "--model", paths["model"], "--input", paths["texts"], "--output",
                        encoded / "old.npy", "--precision", "fp32"]) == 0
    sts = root / "sts"
    sts.mkdir()
    (sts / "task.json").write_text('{"name": "S", "type": "STS"}', encoding="utf-8")
    write_jsonl(sts / "test.jsonl", [{"sentence1": f"a {i}", "sentence2": f"b {i}", "score": i % 5} for i in range(8)])
    glue = tiny_task_dir(root / "glue-tasks", "stsb", train=16, validation=8)
    return {**paths, "encoded": encoded, "old_matrix": encoded / "old.npy", "old_record": encoded / "old.npy.json",
            "sts": sts, "glue_task": glue}


@contextlib.contextmanager
def _tmpfs(where: Path, size: str = "1m") -> Iterator[bool]:
    """A small tmpfs at ``where`` for the block (True), or False where this process may not mount one."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        yield False
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(directory: Path) -> None:
    """Write a filler file until the file system has no byte left."""
    with open(directory / "filler", "wb", buffering=0) as handle:
        for block in (b"\0" * 4096, b"\0"):
            with contextlib.suppress(OSError):
                while handle.write(block):
                    pass
    assert shutil.disk_usage(directory).free < 4096


def _refusing(code: int, where: str = "write_synced", after: int = 0) -> Callable[[pytest.MonkeyPatch], None]:
    """Make the ``after``-th and later calls of ``neobert_embed.files.<where>`` fail with ``code``."""
    def patch(monkeypatch: pytest.MonkeyPatch) -> None:
        from neobert_embed import files, outputs

        original, calls = getattr(files, where), []

        def refuse(*args, **kwargs):
            calls.append(args)
            if len(calls) > after:
                raise OSError(code, os.strerror(code))
            return original(*args, **kwargs)
        for module in (files, outputs):  # outputs.published_file calls it by its own name
            if hasattr(module, where):
                monkeypatch.setattr(module, where, refuse)
    return patch


def _free_bytes(free: int) -> Callable[[pytest.MonkeyPatch], None]:
    """Make every file system report ``free`` bytes free (a disk too small for the output, found first)."""
    def patch(monkeypatch: pytest.MonkeyPatch) -> None:
        from neobert_embed import files

        real = shutil.disk_usage
        monkeypatch.setattr(files.shutil, "disk_usage", lambda path: real(path)._replace(free=free))
    return patch


def _raising(target: str, exc: BaseException) -> Callable[[pytest.MonkeyPatch], None]:
    """Make the function ``module:attribute`` raise ``exc`` (a library's own write, the encoder)."""
    def patch(monkeypatch: pytest.MonkeyPatch) -> None:
        import importlib

        module, attribute = target.split(":")
        owner = importlib.import_module(module)
        for part in attribute.split(".")[:-1]:
            owner = getattr(owner, part)

        def fail(*args, **kwargs):
            raise exc
        monkeypatch.setattr(owner, attribute.split(".")[-1], fail)
    return patch


def _memory_limit(available: int) -> Callable[[pytest.MonkeyPatch], None]:
    def patch(monkeypatch: pytest.MonkeyPatch) -> None:
        from neobert_embed import machine

        monkeypatch.setattr(machine, "memory_limits", lambda: [("the address-space limit (ulimit -v)", available)])
    return patch


def _copy(source: str, target: str) -> Callable[[dict[str, Path]], None]:
    def make(paths: dict[str, Path]) -> None:
        origin, destination = paths[source], Path(target.format(**{k: str(v) for k, v in paths.items()}))
        (shutil.copytree if origin.is_dir() else shutil.copy2)(origin, destination)
    return make


def _link(target: str, link: str) -> Callable[[dict[str, Path]], None]:
    """A symbolic link ``link`` to ``target`` (placeholders allowed; the target made by an earlier step)."""
    def make(paths: dict[str, Path]) -> None:
        fill = {k: str(v) for k, v in paths.items()}
        Path(link.format(**fill)).symlink_to(Path(target.format(**fill)))
    return make


def _fifo(name: str) -> Callable[[dict[str, Path]], None]:
    def make(paths: dict[str, Path]) -> None:
        os.mkfifo(paths["out"] / name)
    return make


LISTENING: list[socket.socket] = []  # sockets held open by the busy-port case, closed at the end of the module


def _listening_port() -> int:
    """A port another program listens on (this process, through a socket kept open)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    LISTENING.append(server)
    return server.getsockname()[1]


@pytest.fixture(scope="module", autouse=True)
def _close_listening() -> Iterator[None]:
    yield
    while LISTENING:
        LISTENING.pop().close()


M, T = "{model}", "{texts}"
ENCODE = ("encode", "--model", M, "--input", T, "--output")
MINE = ("mine-negatives", "--model", M, "--data", "{pairs}", "--output")
BUILD = ("index", "build", "--model", M, "--corpus", "{corpus}", "--index-type", "flat", "--output")
TRAIN = ("train-contrastive", "--model", M, "--data", "p={pairs}", "--recipe", "{recipe}", "--max-steps", "1",
         "--output")
EXPORT = ("export", M, "--format", "onnx", "--output")
PREPARE = ("pretrain", "prepare", "--corpus", T, "--tokenizer", M, "--output")
PRETRAIN = ("pretrain", "--recipe", "{repo}/recipes/pretrain-tiny.yaml", "--corpus", T, "--output")
MTEB = ("mteb", "--model", M, "--task-dir", "{sts}", "--output")
GLUE = ("glue", "--model", M, "--task-dir", "{glue_task}", "--output")
COMPARE = ("compare", "--models", M, "--data", "p={pairs}", "--recipe", "{recipe}", "--task-dir", "{sts}",
           "--output")
DEMO = ("demo", "--quick", "--output")
SERVE = ("serve", "--model", M)
FULL = ("no space left", "free space")  # the words of a full disk met while writing
DISK = ("free", "choose another --output")  # and of one found before (free-space preflight) or at the lock
OLD_PAIR = _both(lambda p: (p["out"] / "encoded").mkdir(), _copy("old_matrix", "{out}/encoded/old.npy"),
                 _copy("old_record", "{out}/encoded/old.npy.json"))  # an earlier matrix and its record, on that disk

DIRECTORY_COMMANDS = {"build": BUILD, "train": TRAIN, "export": EXPORT, "prepare": PREPARE, "pretrain": PRETRAIN,
                      "mteb": MTEB, "glue": GLUE, "compare": COMPARE, "demo": DEMO}
CHECKED_FIRST = {"pretrain export": ("pretrain", "export", "{root}", "--output"),  # their output is checked before
                 "convert": ("convert", "{root}", "--output")}                     # their input is read

CASES = [
    # --- a full disk (tmpfs): every writing command --------------------------------------------------
    Fault("full disk: encode", (*ENCODE, "{out}/new.npy"), ("new.npy", *DISK), disk=True),
    Fault("full disk: encode --overwrite keeps the old pair", (*ENCODE, "{out}/encoded/old.npy", "--overwrite"),
          ("old.npy", *DISK), OLD_PAIR, disk=True),
    Fault("full disk: mine-negatives", (*MINE, "{out}/mined.jsonl"), ("mined.jsonl", *DISK), disk=True),
    Fault("full disk: index add", ("index", "add", "{out}/index", "--corpus", "{new_docs}"), ("index", *FULL),
          _copy("index", "{out}/index"), disk=True),
    *[Fault(f"full disk: {name}", (*args, "{out}/o"), ("/o", *DISK), disk=True)
      for name, args in DIRECTORY_COMMANDS.items()],
    Fault("too little free space: index build, before the model loads", (*BUILD, "{out}/idx"),
          ("idx", "float32 vectors of", "documents", *DISK), inject=_free_bytes(1000)),
    # --- a full disk met while writing (injected at the write primitive and in libraries) -------------
    Fault("ENOSPC writing the matrix", (*ENCODE, "{out}/new.npy"), ("new.npy", *FULL), inject=_refusing(errno.ENOSPC)),
    Fault("ENOSPC writing the matrix over an old pair", (*ENCODE, "{out}/encoded/old.npy", "--overwrite"),
          ("old.npy", *FULL), OLD_PAIR, inject=_refusing(errno.ENOSPC)),
    Fault("ENOSPC writing the record after the matrix", (*ENCODE, "{out}/encoded/old.npy", "--overwrite"),
          ("old.npy", *FULL), OLD_PAIR, inject=_refusing(errno.ENOSPC, after=1)),
    Fault("ENOSPC writing mined rows", (*MINE, "{out}/mined.jsonl"), ("mined.jsonl", *FULL),
          inject=_refusing(errno.ENOSPC, after=0)),
    Fault("ENOSPC writing an index chunk", (*BUILD, "{out}/idx"), ("idx", *FULL), inject=_refusing(errno.ENOSPC)),
    Fault("ENOSPC in FAISS's write", (*BUILD, "{out}/idx"), ("idx", *FULL),
          inject=_raising("faiss:write_index", RuntimeError("Error in faiss::FileIOWriter: write error: "
                                                             "No space left on device"))),
    Fault("ENOSPC in index add", ("index", "add", "{out}/index", "--corpus", "{new_docs}"), ("index", *FULL),
          _copy("index", "{out}/index"), inject=_refusing(errno.ENOSPC)),
    Fault("ENOSPC writing the export", (*EXPORT, "{out}/e"), ("/e", *FULL), inject=_refusing(errno.ENOSPC, after=1)),
    Fault("ENOSPC in the ONNX export", (*EXPORT, "{out}/e"), ("/e", *FULL),
          inject=_raising("torch.onnx:export", OSError(errno.ENOSPC, "No space left on device"))),
    Fault("ENOSPC saving a checkpoint", (*TRAIN, "{out}/run"), ("run", *FULL),
          inject=_raising("sentence_transformers:SentenceTransformerTrainer.train",
                          RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed "
                                       "writing file data/0: file write failed; No space left on device"))),
    Fault("ENOSPC saving the final model over an old run", (*TRAIN, "{out}/run", "--overwrite"), ("run", *FULL),
          _copy("run", "{out}/run"), run=True, inject=_raising("sentence_transformers:SentenceTransformer.save",
                                                     OSError(errno.ENOSPC, "No space left on device"))),
    Fault("ENOSPC writing a prepared shard", (*PREPARE, "{out}/p"), ("/p", *FULL),
          inject=_refusing(errno.ENOSPC, after=1)),
    # --- the other refusals of the file system -----------------------------------------------------
    *[Fault(f"{name} writing the matrix", (*ENCODE, "{out}/new.npy"), ("new.npy", words), inject=_refusing(code))
      for name, code, words in (("EDQUOT", errno.EDQUOT, "quota"), ("EROFS", errno.EROFS, "read-only"),
                                ("EACCES", errno.EACCES, "permission"))],
    Fault("EDQUOT writing mined rows", (*MINE, "{out}/mined.jsonl"), ("mined.jsonl", "quota"),
          inject=_refusing(errno.EDQUOT)),
    Fault("EROFS writing the index", (*BUILD, "{out}/idx"), ("idx", "read-only"), inject=_refusing(errno.EROFS)),
    Fault("EACCES writing the export", (*EXPORT, "{out}/e"), ("/e", "permission"),
          inject=_refusing(errno.EACCES, after=1)),
    Fault("EDQUOT in training", (*TRAIN, "{out}/run"), ("run", "quota"),
          inject=_raising("sentence_transformers:SentenceTransformerTrainer.train",
                          OSError(errno.EDQUOT, "Disk quota exceeded"))),
    Fault("MemoryError while encoding", (*ENCODE, "{out}/new.npy"), ("out of memory", "--batch-size"),
          inject=_raising("neobert_embed.encoding:encode_text_chunks", MemoryError())),
    # --- names too long once the temporary names beside them are counted -------------------------------
    Fault("long name: encode", (*ENCODE, f"{{out}}/{LONG}.npy"), ("--output", "bytes", "at most")),
    Fault("long name: mine-negatives", (*MINE, f"{{out}}/{LONG}.jsonl"), ("--output", "bytes", "at most")),
    *[Fault(f"long name: {name}", (*args, f"{{out}}/{LONG}"), ("--output", "bytes", "at most"))
      for name, args in (DIRECTORY_COMMANDS | CHECKED_FIRST).items()],
    Fault("long folder name", (*ENCODE, f"{{out}}/{'f' * 300}/x.npy"), ("--output", "folder name", "300 bytes")),
    # --- symbolic links as outputs: one rule, refused, the target untouched -----------------------------
    Fault("link: encode over an earlier matrix", (*ENCODE, "{out}/link.npy", "--overwrite"),
          ("link.npy", "symbolic link", "encoded/old.npy"), _both(OLD_PAIR, _link("{out}/encoded/old.npy", "{out}/link.npy"))),
    Fault("link: encode's record", (*ENCODE, "{out}/new.npy"), ("new.npy.json", "symbolic link"),
          _both(OLD_PAIR, _link("{out}/encoded/old.npy.json", "{out}/new.npy.json"))),
    Fault("link: mine-negatives", (*MINE, "{out}/m.jsonl"), ("m.jsonl", "symbolic link"),
          _link("{texts}", "{out}/m.jsonl")),
    Fault("link: index build --overwrite", (*BUILD, "{out}/latest", "--overwrite"), ("latest", "symbolic link"),
          _both(_copy("index", "{out}/index"), _link("{out}/index", "{out}/latest"))),
    Fault("link: index add", ("index", "add", "{out}/latest", "--corpus", "{new_docs}"), ("latest", "symbolic link"),
          _both(_copy("index", "{out}/index"), _link("{out}/index", "{out}/latest"))),
    Fault("link: train-contrastive --overwrite of a run", (*TRAIN, "{out}/latest", "--overwrite"),
          ("latest", "symbolic link"), _both(_copy("run", "{out}/run"), _link("{out}/run", "{out}/latest")), run=True),
    *[Fault(f"link: {name}", (*args, "{out}/latest"), ("latest", "symbolic link"),
            _both(lambda p: (p["out"] / "target").mkdir(), _link("{out}/target", "{out}/latest")))
      for name, args in (DIRECTORY_COMMANDS | CHECKED_FIRST).items() if name != "train"],
    # --- memory limits known before the model loads ----------------------------------------------------
    *[Fault(f"memory limit: {name}", args, ("ulimit -v", "needs about"), inject=_memory_limit(100_000_000))
      for name, args in (("encode", (*ENCODE, "{out}/x.npy")), ("mine-negatives", (*MINE, "{out}/m.jsonl")),
                         ("index build", (*BUILD, "{out}/idx")), ("train-contrastive", (*TRAIN, "{out}/run")),
                         ("export", (*EXPORT, "{out}/e")), ("serve", SERVE), ("mteb", (*MTEB, "{out}/r")),
                         ("index search", ("index", "search", "{index}", "hello")))],
    # --- serve ---------------------------------------------------------------------------------------
    Fault("serve --api-key ''", (*SERVE, "--api-key", ""), ("--api-key", "empty")),
    Fault("serve --api-key '  '", (*SERVE, "--api-key", "  "), ("--api-key", "empty")),
    Fault("serve on a busy port", (*SERVE, "--port", "{port}"), ("--port {port}", "in use", "choose another --port"),
          lambda paths: paths.update(port=_listening_port())),
    # --- pipes where a command reads its input more than once ------------------------------------------
    Fault("FIFO corpus for index build", ("index", "build", "--model", M, "--corpus", "{out}/corpus.jsonl",
                                          "--output", "{out}/idx"), ("corpus.jsonl", "pipe", "save it to a file"),
          _fifo("corpus.jsonl")),
    Fault("FIFO data for mine-negatives", ("mine-negatives", "--model", M, "--data", "{out}/pairs.jsonl",
                                           "--output", "{out}/m.jsonl"), ("pairs.jsonl", "pipe"), _fifo("pairs.jsonl")),
    Fault("FIFO data for train-contrastive", ("train-contrastive", "--model", M, "--data", "p={out}/pairs.jsonl",
                                              "--recipe", "{recipe}", "--output", "{out}/run"), ("pairs.jsonl", "pipe"),
          _fifo("pairs.jsonl")),
    Fault("stdin for index add", ("index", "add", "{out}/index", "--corpus", "-"), ("standard input",),
          _copy("index", "{out}/index")),
    Fault("FIFO parquet for encode", ("encode", "--model", M, "--input", "{out}/t.parquet", "--output",
                                      "{out}/x.npy"), ("t.parquet", "pipe", "file"), _fifo("t.parquet")),
]


@pytest.fixture(scope="module")
def finished_run(world, tmp_path_factory) -> Path:
    """A finished train-contrastive run (for the cases that --overwrite one)."""
    run = tmp_path_factory.mktemp("run") / "run"
    code = main_status([*(a.format(**{k: str(v) for k, v in world.items()}) for a in TRAIN), run])
    assert code == 0 and (run / "run.json").is_file()
    return run


def _files(root: Path) -> dict[str, object]:
    found: dict[str, object] = {}
    for path in root.rglob("*"):
        if path.is_symlink():
            found[str(path)] = ("link", os.readlink(path))
        elif path.is_fifo():
            found[str(path)] = "fifo"
        else:
            found[str(path)] = snapshot(path) if path.is_file() else "dir"
    return found


def _holds_only_locks(path: Path) -> bool:
    """A results root made to hold its models' lock files (``mteb``: ``ROOT/.results--MODEL--REV.lock``)."""
    return path.is_dir() and not path.is_symlink() and all(KEPT_ON_REFUSAL.search(str(p)) for p in path.iterdir())


def test_the_table_has_at_least_40_cases_over_every_writing_command():
    assert len(CASES) >= 40 and len({c.name for c in CASES}) == len(CASES)
    commands = {c.args[0] if c.args[0] not in {"index", "pretrain"} else " ".join(c.args[:2]) for c in CASES}
    assert {"encode", "mine-negatives", "index build", "index add", "export", "train-contrastive",
            "pretrain prepare", "mteb", "glue", "compare", "demo", "serve"} <= commands | {"pretrain --recipe"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_os_failure_exits_2_in_one_line_and_loses_nothing(case, world, tmp_path, capsys, monkeypatch, request):
    run = request.getfixturevalue("finished_run") if case.run else None
    scratch = tmp_path / "disk"
    with _tmpfs(scratch) if case.disk else contextlib.nullcontext(True) as usable:
        if not usable:
            pytest.skip("cannot mount a tmpfs here (not root, or no mount): the injected cases cover writes")
        scratch.mkdir(exist_ok=True)
        paths = {**world, "out": scratch, "repo": REPO, **({"run": run} if run else {})}
        if case.prepare:
            case.prepare(paths)
        if case.disk:
            _fill(scratch)
        if case.inject:
            case.inject(monkeypatch)
        args = [arg.format(**{k: str(v) for k, v in paths.items()}) for arg in case.args]
        before = _files(world["root"]) | _files(scratch)
        code, out, err = run_main(args, capsys)
        after = _files(world["root"]) | _files(scratch)
        left = sorted(path for path in set(after) - set(before) if not KEPT_ON_REFUSAL.search(path)
                      and not _holds_only_locks(Path(path)))
    lines = [line for line in err.splitlines() if line.strip() and not BAR.search(line)]
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    # one error line, last; before it only what a command says once its work has started
    assert lines and lines[-1].startswith("error: ") and all(STARTED.match(line) for line in lines[:-1]), err
    missing = [word for word in case.expect if word.format(**{k: str(v) for k, v in paths.items()}).lower()
               not in lines[-1].lower()]
    assert not missing, f"{missing} not in: {lines[-1]}"
    assert {path: after.get(path) for path in before} == before
    assert not left, f"a refused command left files behind: {left}"


# --- what works now, beside what is refused --------------------------------------------------------


def test_a_matrix_and_its_record_are_one_unit_and_a_mismatch_is_told(world, tmp_path, capsys):
    """The record is published last and pins the matrix: a process killed between the two renames
    (simulated: another matrix under the old record) is refused by ``--calibration``, naming the record."""
    docs = tmp_path / "docs.npy"
    args = ["encode", "--model", world["model"], "--input", world["texts"], "--precision", "fp32",
            "--store-precision", "int8"]
    code, _, err = run_main([*args, "--output", docs], capsys)
    assert code == 0, err
    record = json.loads((tmp_path / "docs.npy.json").read_text(encoding="utf-8"))
    assert record["pin"]["size"] == docs.stat().st_size
    np.save(docs, np.zeros((3, 4), dtype=np.int8))  # the matrix of a run that died before its record
    code, _, err = run_main([*args, "--output", tmp_path / "q.npy", "--calibration", tmp_path / "docs.npy.json"],
                            capsys)
    assert code == 2 and "docs.npy.json describes another docs.npy" in err and "encode docs.npy again" in err, err
    assert not (tmp_path / "q.npy").exists()


def test_encode_reads_standard_input_and_a_fifo_as_streams(world, tmp_path, capsys, monkeypatch):
    """``-`` is standard input and a FIFO (what ``<(…)`` gives) is read once, line by line: the same
    matrix as from the file."""
    import io
    import threading

    base = ["encode", "--model", world["model"], "--precision", "fp32", "--output"]
    code, _, err = run_main([*base, tmp_path / "file.npy", "--input", world["texts"]], capsys)
    assert code == 0, err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(world["texts"].read_bytes())))
    code, _, err = run_main([*base, tmp_path / "stdin.npy", "--input", "-"], capsys)
    assert code == 0, err
    fifo = tmp_path / "texts"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(world["texts"].read_bytes()))
    writer.start()
    code, _, err = run_main([*base, tmp_path / "fifo.npy", "--input", fifo], capsys)
    writer.join(timeout=60)
    assert code == 0, err
    expected = np.load(tmp_path / "file.npy")
    assert expected.shape[0] == 30
    np.testing.assert_array_equal(np.load(tmp_path / "stdin.npy"), expected)
    np.testing.assert_array_equal(np.load(tmp_path / "fifo.npy"), expected)


def _modes(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): oct(path.stat().st_mode & 0o777) for path in root.rglob("*")
            if not path.is_symlink()}


def test_the_weights_of_a_trained_run_and_an_export_follow_the_umask(world, finished_run, tmp_path, capsys):
    """transformers saves ``model.safetensors`` as 0600; every file a command publishes gets the
    user's umask instead (0644 under 022; 0664 under 002, where the export runs)."""
    assert {name: mode for name, mode in _modes(finished_run).items()
            if mode not in ("0o644", "0o755")} == {}, "trained under umask 022"
    previous = os.umask(0o002)
    try:
        code, _, err = run_main(["export", world["model"], "--format", "onnx", "--output", tmp_path / "e"],
                                capsys)
    finally:
        os.umask(previous)
    assert code == 0, err
    modes = _modes(tmp_path / "e")
    assert "model.safetensors" in modes and "onnx/model.onnx" in modes
    assert {name: mode for name, mode in modes.items() if mode not in ("0o664", "0o775")} == {}


def test_mine_negatives_says_which_duplicate_rows_it_left_out(world, tmp_path, capsys):
    rows = [{"query": f"q {i}", "document": f"answer {i}"} for i in range(20)]
    rows[6] = dict(rows[1])
    rows[12] = dict(rows[1])
    pairs = write_jsonl(tmp_path / "pairs.jsonl", rows)
    code, _, err = run_main(["mine-negatives", "--model", world["model"], "--data", pairs, "--output",
                             tmp_path / "mined.jsonl", "--num-negatives", "1"], capsys)
    assert code == 0, err
    assert "2 duplicate (anchor, positive) rows left out (first: row 7, a repeat of row 2)" in err, err
    record = json.loads((tmp_path / "mined.jsonl.json").read_text(encoding="utf-8"))
    assert record["duplicates_left_out"] == {"count": 2, "first_row": 7}
    assert record["rows"] == 18 == len((tmp_path / "mined.jsonl").read_text(encoding="utf-8").splitlines())


def test_progress_is_a_plain_line_every_few_seconds_on_a_pipe(monkeypatch):
    """On a stderr that is not a terminal (nohup, CI) there is no bar to redraw: one line per
    interval says done/total, rate and time left, so slow is told from stuck."""
    import io
    import time

    from neobert_embed import console

    monkeypatch.setattr(console, "PLAIN_PROGRESS_SECONDS", 0.05)
    pipe = io.StringIO()
    handler = console.show_records(pipe)
    try:
        with console.document_progress(True) as bar:
            task = bar.add_task("encoding", total=200_000)
            bar.advance(task, 12_000)
            deadline = time.monotonic() + 10
            while "encoding:" not in pipe.getvalue() and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        handler.detach()
    lines = pipe.getvalue().splitlines()
    assert lines and all(re.fullmatch(r"encoding: 12,000/200,000 \(6\.0%\), [\d,]+/s, ETA (\d+h )?\d+m \d+s|"
                                      r"encoding: 12,000/200,000 \(6\.0%\), [\d,]+/s, ETA \d+s", line)
                         for line in lines), lines
    assert "━" not in pipe.getvalue()


def test_a_real_address_space_limit_fails_in_one_line_before_the_model_loads(world, tmp_path):
    """``ulimit -v`` too small for the libraries and the weights: one line naming the limit, exit 2
    (it was a traceback at model load, or an abort of the tokenizer's allocator)."""
    import resource

    limit = 1_500_000_000

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    result = subprocess.run([sys.executable, "-m", "neobert_embed.cli", "encode", "--model", str(world["model"]),
                             "--input", str(world["texts"]), "--output", str(tmp_path / "x.npy")],
                            env=cli_env(), capture_output=True, text=True, preexec_fn=limited, timeout=300)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "ulimit -v" in lines[0] and "needs about" in lines[0], result.stderr
    assert not (tmp_path / "x.npy").exists()
