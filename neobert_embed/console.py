"""One voice on the console: the toolkit's own lines on screen, third-party chatter in the run's log.

Why: a long job drives transformers, sentence-transformers, mteb, datasets and DeepSpeed, each of
which prints its own warnings (``FutureWarning``, ``UserWarning``), "Loading weights" bars and
dataset-formatting bars. Left alone they bury the one line a user needs (what finished, where it
went). The toolkit itself never prints: library code logs through ``logging`` (a module logger),
and the command line renders those records on one user console (:func:`show_records`, installed
once by ``neobert_embed.cli``; rank 0 only under torchrun/DeepSpeed). :func:`third_party_log`
routes everything written through ``sys.stdout``/``sys.stderr``, Python warnings and third-party
log records into the run's log for the duration of a job and ends with one summary line;
``verbose=True`` leaves everything on screen. :func:`progress_bar` draws on the user console
without redirecting the streams, so bars and capture coexist. :func:`json_only_stdout` keeps
stdout pure JSON for ``--json`` (stray prints, DeepSpeed's op-builder warnings, even C code
writing to descriptor 1, land on stderr).

Example:
    >>> show_records()                                  # what neobert_embed.cli does once
    >>> with third_party_log("runs/x.log"):
    ...     logging.getLogger("neobert_embed.demo").info("training…")   # on screen
    ...     warnings.warn("noise", FutureWarning)                        # in runs/x.log
    third-party output: 2 lines in runs/x.log
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
from typing import TYPE_CHECKING, TextIO

from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress, ProgressColumn, Task
    from rich.text import Text

PACKAGE = "neobert_embed"
PROGRESS_SWITCHES = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1",
                     "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
logger = logging.getLogger(__name__)


def is_rank_zero() -> bool:
    """True in a single process and in process 0 of a torchrun/DeepSpeed job (``RANK`` unset or 0)."""
    return int(os.environ.get("RANK", "0")) == 0


class ConsoleHandler(logging.Handler):
    """Renders the toolkit's log records on the user console: warnings in yellow, errors in red.

    Records below ERROR are shown by process 0 only, so an N-process job says each thing once.
    """

    STYLES = {logging.WARNING: "yellow", logging.ERROR: "bold red"}

    def __init__(self, stream: TextIO) -> None:
        super().__init__(logging.INFO)
        self.console = Console(file=stream, highlight=False, soft_wrap=True)

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.ERROR and not is_rank_zero():
            return
        style = next((s for level, s in sorted(self.STYLES.items(), reverse=True) if record.levelno >= level), None)
        try:
            self.console.print(self.format(record), style=style, markup=False)
        except Exception:  # noqa: BLE001 - logging's contract: a broken stream must not break the job
            self.handleError(record)

    def detach(self) -> None:
        """Stop rendering: the package's records go back to the root logger's handlers only."""
        logging.getLogger(PACKAGE).removeHandler(self)


def _shown_on_console(record: logging.LogRecord) -> bool:
    """True for the toolkit's records while a :class:`ConsoleHandler` renders them (kept out of the log)."""
    return record.name.split(".")[0] == PACKAGE and _console_handler() is not None


def _console_handler() -> ConsoleHandler | None:
    return next((h for h in logging.getLogger(PACKAGE).handlers if isinstance(h, ConsoleHandler)), None)


def show_records(stream: TextIO | None = None) -> ConsoleHandler:
    """Render ``neobert_embed`` log records on ``stream`` (default: the current stderr), once.

    Called by the command line before a command runs; a second call replaces the first handler.
    While it renders them, the records stay out of the run's log, which holds third-party output only.

    Example:
        >>> show_records()
        >>> logging.getLogger("neobert_embed.index").info("index written")   # on stderr
    """
    package = logging.getLogger(PACKAGE)
    for handler in [h for h in package.handlers if isinstance(h, ConsoleHandler)]:
        package.removeHandler(handler)
    handler = ConsoleHandler(stream or sys.stderr)
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    return handler


def user_console(stderr: bool = False) -> Console:
    """The console the toolkit's own lines go to, unaffected by capturing.

    On stderr it is the one :func:`show_records` renders log records on (the real stderr when no
    command line set one up); on stdout it is the real stdout.

    Example:
        >>> user_console().print("[green]✓[/] done")
    """
    handler = _console_handler() if stderr else None
    if handler is not None:
        return handler.console
    stream: TextIO = sys.__stderr__ if stderr else sys.__stdout__  # type: ignore[assignment]
    return Console(file=stream, highlight=False)


def progress_bar(*columns: str | ProgressColumn, show: bool = True, transient: bool = False) -> Progress:
    """A rich progress display on the user console (process 0 only) that leaves the streams alone.

    rich's default swaps ``sys.stdout``/``sys.stderr`` for proxies to the screen while a bar is
    live, which would put third-party output captured by :func:`third_party_log` back on screen.

    Example:
        >>> with progress_bar(show=True) as bar:
        ...     task = bar.add_task("tokenizing", total=None)
    """
    from rich.progress import Progress

    return Progress(*columns, console=user_console(stderr=True), disable=not show or not is_rank_zero(),
                    transient=transient, redirect_stdout=False, redirect_stderr=False)


def document_progress(show: bool = True) -> Progress:
    """A progress display for long document jobs: description, bar, done/total, docs/s, elapsed, remaining.

    Example:
        >>> with document_progress(show=True) as progress:
        ...     task = progress.add_task("encoding", total=1000)
        ...     progress.advance(task, 100)
    """
    from rich import progress as bars
    from rich.text import Text

    class DocsPerSecond(bars.ProgressColumn):
        """Throughput in documents per second (the figure users compare between models)."""

        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:,.0f} docs/s" if speed else "… docs/s")

    return progress_bar(bars.TextColumn("{task.description}"), bars.BarColumn(), bars.MofNCompleteColumn(),
                        DocsPerSecond(), bars.TimeElapsedColumn(), bars.TimeRemainingColumn(), show=show)


def log_path_for(output: str | Path) -> Path:
    """Where a command writing ``output`` (a file or a run directory) keeps its log: ``OUTPUT.log``.

    Beside the output rather than inside it, so the log never makes a run directory look foreign
    or non-empty to the output checks, and survives the atomic replacement of the output.

    Example:
        >>> log_path_for("runs/index")
        PosixPath('runs/index.log')
    """
    output = Path(output)
    return output.with_name(output.name + ".log")


@contextlib.contextmanager
def third_party_log(log_path: str | Path, verbose: bool = False) -> Iterator[Path]:
    """:func:`capture_third_party` for a command, ending with one line on the user console:
    ``third-party output: N lines in LOG`` (nothing with ``verbose``, where it stayed on screen;
    nothing when the command failed before anything was written, so its error stays one line).

    Example:
        >>> with third_party_log(log_path_for("runs/index")):
        ...     build_index(...)
    """
    log_path = Path(log_path)
    before, failed = _line_count(log_path), True
    try:
        with capture_third_party(log_path, verbose=verbose):
            yield log_path
        failed = False
    finally:
        lines = _line_count(log_path) - before
        if not verbose and (lines or not failed):
            logger.info("third-party output: %s", f"{lines} lines in {log_path}" if lines else "none")


def _line_count(path: Path) -> int:
    if not path.is_file():
        return 0
    with open(path, "rb") as handle:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))


class _LazyLog(io.TextIOBase):
    """A log file created at its first write, so a command refused at once leaves no file behind."""

    encoding = "utf-8"

    def __init__(self, path: Path) -> None:
        self.path, self.file = path, None

    def _open(self) -> TextIO:
        if self.file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed by close()
        return self.file

    def write(self, text: str) -> int:
        return self._open().write(text) if text else 0

    def fileno(self) -> int:  # a child process given this stream writes to the log file itself
        return self._open().fileno()

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        super().close()  # flushes first
        if self.file is not None:
            self.file.close()


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
    with contextlib.closing(_LazyLog(log_path)) as log, _log_records_to(log):
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
    handler.addFilter(lambda record: not _shown_on_console(record))
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
