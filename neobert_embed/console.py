"""One voice on the console: the toolkit's own lines on screen, third-party chatter in the run's log.

Why: a long job drives transformers, sentence-transformers, mteb, datasets and DeepSpeed, each of
which prints its own warnings (``FutureWarning``, ``UserWarning``), "Loading weights" bars and
dataset-formatting bars. Left alone they bury the one line a user needs (what finished, where it
went). :func:`capture_third_party` routes everything written through ``sys.stdout``/``sys.stderr``,
Python warnings and terminal ``logging`` handlers into a log file for the duration of a job, while the console
returned by :func:`user_console` keeps writing to the real terminal. ``verbose=True`` leaves
everything on screen. :func:`json_only_stdout` keeps stdout pure JSON for ``--json`` (stray prints,
DeepSpeed's op-builder warnings, even C code writing to descriptor 1, land on stderr).

Example:
    >>> console = user_console()
    >>> with capture_third_party("runs/demo/demo.log") as log:
    ...     console.print("training…")          # on screen
    ...     import warnings; warnings.warn("noise", FutureWarning)   # in runs/demo/demo.log
    >>> console.print(f"log: {log}")
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from rich.console import Console

PROGRESS_SWITCHES = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1",
                     "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}


def user_console(stderr: bool = False) -> Console:
    """A rich console bound to the real terminal stream, so capturing leaves it on screen.

    Example:
        >>> user_console().print("[green]✓[/] done")
    """
    stream: TextIO = sys.__stderr__ if stderr else sys.__stdout__  # type: ignore[assignment]
    return Console(file=stream, highlight=False)


@contextlib.contextmanager
def capture_third_party(log_path: str | Path, verbose: bool = False) -> Iterator[Path]:
    """Send stdout, stderr, warnings and log records written inside the block to ``log_path``.

    Child processes started inside the block inherit the log as their stdout and stderr when they
    are given ``stdout=sys.stdout, stderr=sys.stderr``. With ``verbose`` nothing is redirected (the
    log still receives log records). Progress bars of the Hugging Face libraries and tqdm are
    switched off inside the block, since a bar in a file is noise; the environment is restored.

    Example:
        >>> with capture_third_party("run.log"):
        ...     print("goes to run.log")
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8", buffering=1) as log, _log_records_to(log):
        if verbose:
            yield log_path
            return
        with _environment(PROGRESS_SWITCHES), warnings.catch_warnings(), _terminal_handlers_to(log), \
                contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            warnings.simplefilter("default")  # each distinct warning once per location
            yield log_path


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _log_records_to(stream: TextIO) -> Iterator[None]:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    previous_level = root.level
    root.addHandler(handler)
    root.setLevel(min(previous_level or logging.WARNING, logging.INFO))
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(previous_level)


@contextlib.contextmanager
def _terminal_handlers_to(stream: TextIO) -> Iterator[None]:
    """Point libraries' existing terminal log handlers (transformers' own, say) at ``stream``."""
    loggers = [logging.getLogger(), *(item for item in logging.Logger.manager.loggerDict.values()
                                      if isinstance(item, logging.Logger))]
    terminals = (sys.__stderr__, sys.__stdout__)
    moved = [(handler, handler.stream) for log in loggers for handler in log.handlers
             if type(handler) is logging.StreamHandler and handler.stream in terminals]
    for handler, _ in moved:
        handler.setStream(stream)
    try:
        yield
    finally:
        for handler, original in moved:
            handler.setStream(original)


@contextlib.contextmanager
def json_only_stdout(enabled: bool = True) -> Iterator[None]:
    """Send everything written to stdout during the block to stderr (when ``enabled``).

    Example:
        >>> with json_only_stdout():
        ...     print("warning from a library")   # goes to stderr
    """
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved_fd = None
    try:
        fd = sys.stdout.fileno()
        err_fd = sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # an in-memory stdout (tests)
        fd = err_fd = None
    if fd is not None and err_fd is not None:
        saved_fd = os.dup(fd)
        os.dup2(err_fd, fd)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved_fd is not None:
            os.dup2(saved_fd, fd)
            os.close(saved_fd)
