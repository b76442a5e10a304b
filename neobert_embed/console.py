"""One voice on the console: the toolkit's own lines on screen, third-party chatter in the run's log.

Why: a long job drives transformers, sentence-transformers, mteb, datasets and DeepSpeed, each of
which prints its own warnings (``FutureWarning``, ``UserWarning``), "Loading weights" bars and
dataset-formatting bars. Left alone they bury the one line a user needs (what finished, where it
went). The toolkit itself never prints: library code logs through a module logger, and the command
line renders those records on one user console (:func:`show_records`; process 0 only under
torchrun/DeepSpeed). :func:`third_party_log` sends everything else written during a command
(``sys.stdout``/``sys.stderr``, warnings, third-party log records) to ``OUTPUT.log`` and ends with
one summary line; ``verbose=True`` leaves it on screen. :func:`progress_bar` draws on the user
console without touching the streams. :func:`json_only_stdout` keeps stdout pure JSON for
``--json`` (even C code writing to descriptor 1 lands on stderr).

Example:
    >>> show_records()                                  # what neobert_embed.cli does once
    >>> with third_party_log("runs/index"):
    ...     logging.getLogger("neobert_embed.index").info("encoding…")   # on screen
    ...     warnings.warn("noise", FutureWarning)                         # in runs/index.log
    third-party output: 2 lines in runs/index.log
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rich.console import Console

from neobert_embed.distributed import is_main_process

if TYPE_CHECKING:
    from rich.progress import Progress, ProgressColumn, Task

PACKAGE = "neobert_embed"
PROGRESS_SWITCHES = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1",
                     "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
logger = logging.getLogger(__name__)


class ConsoleHandler(logging.Handler):
    """Renders the toolkit's log records on the user console (below ERROR: process 0 only)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(logging.INFO)
        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        self.stdout = sys.stdout  # the command's own stdout, before any capturing block

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.ERROR and not is_main_process():
            return
        style = "bold red" if record.levelno >= logging.ERROR else "yellow" if record.levelno >= logging.WARNING \
            else None
        try:
            self.console.print(self.format(record), style=style, markup=False)
        except Exception:  # noqa: BLE001 - logging's contract: a broken stream must not break the job
            self.handleError(record)

    def detach(self) -> None:
        logging.getLogger(PACKAGE).removeHandler(self)


def _console_handler() -> ConsoleHandler | None:
    return next((h for h in logging.getLogger(PACKAGE).handlers if isinstance(h, ConsoleHandler)), None)


def show_records(stream: TextIO | None = None) -> ConsoleHandler:
    """Render ``neobert_embed`` log records on ``stream`` (default: the current stderr), replacing
    an earlier handler; while rendered, they stay out of the run's log (third-party output only).
    The current stdout is remembered as the command's, for :func:`user_console`.

    Example:
        >>> show_records().detach()
    """
    package = logging.getLogger(PACKAGE)
    if (previous := _console_handler()) is not None:
        previous.detach()
    handler = ConsoleHandler(stream or sys.stderr)
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    return handler


def user_console(stderr: bool = False, stream: TextIO | None = None) -> Console:
    """The one console for the toolkit's own lines (messages, tables, spinners), unaffected by
    capturing blocks: the streams the command started with (:func:`show_records` remembers them),
    else the process's real ones. ``stream`` names another (``main()``'s error line, written after
    the command's handler is gone, goes to the stderr current then).

    Example:
        >>> user_console().print("[green]✓[/] done")
    """
    if stream is None and (handler := _console_handler()) is not None:
        if stderr:
            return handler.console
        stream = handler.stdout
    if stream is None:
        stream = sys.__stderr__ if stderr else sys.__stdout__  # type: ignore[assignment]
    return Console(file=stream, highlight=False)


PLAIN_PROGRESS_SECONDS = 10.0  # how often a progress display on a non-terminal stderr prints a line


def progress_bar(*columns: str | ProgressColumn, show: bool = True, transient: bool = False) -> Progress:
    """A rich progress display on the user console (process 0 only) that leaves the streams alone
    (rich's default proxies would put captured third-party output back on screen).

    On a stderr that is not a terminal (``nohup``, CI, a pipe) a bar cannot redraw, so the display
    prints a plain line every :data:`PLAIN_PROGRESS_SECONDS` instead, for each task under way
    (``encoding: 12,000/200,000 (6.0%), 850/s, ETA 3m 41s``): slow is then told from stuck. A job
    shorter than that prints none.

    Example:
        >>> with progress_bar(show=True) as bar:
        ...     task = bar.add_task("tokenizing", total=None)
    """
    from rich.progress import Progress

    console = user_console(stderr=True)
    shown = show and is_main_process()
    if shown and not console.is_terminal:
        return _plain_progress()(*columns, console=console, redirect_stdout=False, redirect_stderr=False)
    return Progress(*columns, console=console, disable=not shown, transient=transient, redirect_stdout=False,
                    redirect_stderr=False)


@functools.cache
def _plain_progress() -> type[Progress]:
    """The class of :func:`progress_bar`'s display for a non-terminal (rich is imported only here)."""
    from rich.progress import Progress

    class PlainProgress(Progress):
        """Tracks tasks like a bar and prints one plain line per task every :data:`PLAIN_PROGRESS_SECONDS`
        (its live display, which would draw frames, is never started)."""

        _stopping: threading.Event | None = None
        _printer: threading.Thread | None = None

        def start(self) -> None:
            self._stopping = threading.Event()
            self._printer = threading.Thread(target=self._print_every, name="progress-lines", daemon=True)
            self._printer.start()

        def stop(self) -> None:  # not rich's: it ends a non-terminal's display with an empty line
            if self._stopping is not None and self._printer is not None:
                self._stopping.set()
                self._printer.join()

        def _print_every(self) -> None:
            while self._stopping is not None and not self._stopping.wait(PLAIN_PROGRESS_SECONDS):
                for task in self.tasks:
                    if not task.finished:
                        self.console.print(progress_line(task.description, task.completed, task.total,
                                                         task.elapsed or 0.0), markup=False, highlight=False)

    return PlainProgress


def progress_line(what: str, done: float, total: float | None, seconds: float) -> str:
    """One plain progress line: done/total, rate and time left.

    Example:
        >>> progress_line("encoding", 12_000, 200_000, 14.1)
        'encoding: 12,000/200,000 (6.0%), 851/s, ETA 3m 41s'
    """
    rate = done / seconds if seconds > 0 else 0.0
    if total is None:
        return f"{what}: {done:,.0f} done, {rate:,.0f}/s, {_duration(seconds)} so far"
    left = f"ETA {_duration((total - done) / rate)}" if rate > 0 else "ETA unknown"
    return f"{what}: {done:,.0f}/{total:,.0f} ({100 * done / max(total, 1):.1f}%), {rate:,.0f}/s, {left}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h {minutes}m" if hours else f"{minutes}m {seconds}s" if minutes else f"{seconds}s"


@contextlib.contextmanager
def spinner(text: str, console: Console | None = None) -> Iterator[None]:
    """A spinner line on the user console while the block runs, erased when it ends.

    Why not rich's ``console.status``: on a terminal it redirects ``sys.stdout``/``sys.stderr``,
    so third-party output written during the step would land on screen instead of the run's log.

    Example:
        >>> with spinner("converting chandar-lab/NeoBERT …"):
        ...     convert_checkpoint("chandar-lab/NeoBERT", "models/neobert")
    """
    from rich.live import Live
    from rich.spinner import Spinner

    with Live(Spinner("dots", text=text), console=console or user_console(stderr=True), transient=True,
              redirect_stdout=False, redirect_stderr=False):
        yield


def document_progress(show: bool = True) -> Progress:
    """Progress of a document job: description, bar, done/total, docs/s, elapsed, remaining.

    Example:
        >>> with document_progress() as progress:
        ...     progress.advance(progress.add_task("encoding", total=1000), 100)
    """
    from rich import progress as bars
    from rich.text import Text

    class DocsPerSecond(bars.ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:,.0f} docs/s" if speed else "… docs/s")

    return progress_bar(bars.TextColumn("{task.description}"), bars.BarColumn(), bars.MofNCompleteColumn(),
                        DocsPerSecond(), bars.TimeElapsedColumn(), bars.TimeRemainingColumn(), show=show)


@contextlib.contextmanager
def third_party_log(output: str | Path, verbose: bool = False) -> Iterator[Path]:
    """:func:`capture_third_party` into ``OUTPUT.log`` (beside the output file or run directory, so
    it never makes a run look foreign and survives its atomic replacement), then one line on the
    user console: ``third-party output: N lines in LOG``. Nothing with ``verbose`` (it stayed on
    screen), nor when the command refuses its input (that error stays one line).

    Example:
        >>> with third_party_log("runs/index"):
        ...     build_index(...)
    """
    from neobert_embed.errors import UserInputError, system_failure

    log_path = Path(output).with_name(Path(output).name + ".log")
    before, refused = _line_count(log_path), False
    failures: list[OSError] = []
    try:
        with capture_third_party(log_path, verbose=verbose, failures=failures):
            yield log_path
    except Exception as exc:  # a refusal (the input, or the operating system's: a full disk) stays one line
        refused = isinstance(exc, UserInputError) or system_failure(exc) is not None
        raise
    finally:
        lines = _line_count(log_path) - before
        if not verbose and not refused:
            said = f"{lines} lines in {log_path}" if lines else "none"
            if failures:
                said = f"not all kept ({log_path}: {failures[0].strerror or failures[0]})"
            logger.info("third-party output: %s", said)


def _line_count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n") if path.is_file() else 0
    except OSError:
        return 0


class _LazyLog(io.TextIOBase):
    """A log file created at its first write, so a command refused at once leaves no file behind.

    A log that cannot be written (a full disk, a read-only or vanished directory) drops what it is
    given from then on and keeps the reason in ``failure``: third-party chatter must never turn the
    command's own one-line error into chained tracebacks, nor stop a command that can still finish.
    """

    encoding = "utf-8"

    def __init__(self, path: Path) -> None:
        self.path, self.file = path, None
        self.failure: OSError | None = None
        self.created = False  # whether this log made the file (an empty one it made is removed on failure)

    def _open(self) -> TextIO | None:
        if self.file is None and self.failure is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.created = not self.path.exists()
                self.file = open(self.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed by close()
            except OSError as exc:
                self.failure = exc
        return self.file

    def _failed(self, exc: OSError) -> None:
        self.failure = exc
        file, self.file = self.file, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()

    def write(self, text: str) -> int:
        file = self._open() if text else None
        if file is not None:
            try:
                file.write(text)
            except OSError as exc:
                self._failed(exc)
        return len(text)

    def fileno(self) -> int:  # a child process given this stream writes to the log file itself
        file = self._open()
        if file is None:
            raise io.UnsupportedOperation(f"{self.path} cannot be written")
        return file.fileno()

    def flush(self) -> None:
        if self.file is not None:
            try:
                self.file.flush()
            except OSError as exc:
                self._failed(exc)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            super().close()  # flushes first
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
        if self.failure is not None and self.created:
            with contextlib.suppress(OSError):
                if self.path.stat().st_size == 0:
                    self.path.unlink()


@contextlib.contextmanager
def capture_third_party(log_path: str | Path, verbose: bool = False,
                        failures: list[OSError] | None = None) -> Iterator[Path]:
    """Send stdout, stderr, warnings and log records written inside the block to ``log_path``.

    Child processes started inside the block inherit the log as their stdout and stderr when they
    are given ``stdout=sys.stdout, stderr=sys.stderr``. A log that cannot be written drops the
    output quietly; its error is appended to ``failures`` (for the caller's summary line). With ``verbose`` nothing is touched: it all
    stays on screen, as without this block. Progress bars of the Hugging Face libraries and tqdm are
    switched off inside the block, since a bar in a file is noise; the environment is restored.

    Example:
        >>> with capture_third_party("run.log"):
        ...     print("goes to run.log")
    """
    log_path = Path(log_path)
    if verbose:
        yield log_path
        return
    log = _LazyLog(log_path)
    try:
        with contextlib.closing(log), _log_records_to(log), environment(PROGRESS_SWITCHES), \
                warnings.catch_warnings(), _terminal_handlers_to(log), contextlib.redirect_stdout(log), \
                contextlib.redirect_stderr(log):
            warnings.simplefilter("default")  # each distinct warning once per location
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: log.write(
                warnings.formatwarning(message, category, filename, lineno, line))  # even under a warnings recorder
            yield log_path
    finally:
        if log.failure is not None and failures is not None:
            failures.append(log.failure)


@contextlib.contextmanager
def child_output_captured() -> Iterator[None]:
    """Send what child processes started in the block write on file descriptors 1 and 2 to
    ``sys.stderr`` as it is now: the run's log inside :func:`capture_third_party`.

    Why: :func:`capture_third_party` redirects Python's streams, which a compiler that a library
    starts (DeepSpeed probes its ops by compiling test programs: ``/usr/bin/ld: cannot find -laio``)
    does not use; it writes to the process's descriptors, so its lines landed on the user's screen
    around the one-line messages. Only for short blocks that print nothing themselves: the user
    console writes to the same descriptor.

    Example:
        >>> with capture_third_party("run.log"), child_output_captured():
        ...     subprocess.run(["gcc", "test.c"])   # its messages go to run.log
    """
    import tempfile

    sys.stdout.flush()
    sys.stderr.flush()
    try:
        descriptors = (sys.__stdout__.fileno(), sys.__stderr__.fileno())
    except (AttributeError, OSError, io.UnsupportedOperation):  # no real descriptors (embedded interpreters)
        yield
        return
    with tempfile.TemporaryFile() as sink:
        saved = [os.dup(fd) for fd in descriptors]
        for fd in descriptors:
            os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            for fd, copy in zip(descriptors, saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            written = sink.read().decode("utf-8", errors="replace")
            if written:
                sys.stderr.write(written)


@contextlib.contextmanager
def without_progress_bars() -> Iterator[None]:
    """Switch off the progress bars of transformers, huggingface_hub and tqdm for the block.

    Why: a command whose console stays on screen (``serve``) has no log to send them to, and a
    bar drawn while a model loads breaks its one-line messages (an error included). The switches
    are read by tqdm and transformers when they are imported, so an already imported transformers'
    own switch is flipped as well; one not imported yet is left so (an exported model runs without
    it: :mod:`neobert_embed.inference.light`).

    Example:
        >>> with without_progress_bars():
        ...     model = load_sentence_model("bert")
    """
    transformers_logging = sys.modules.get("transformers.utils.logging")
    enabled = transformers_logging is not None and transformers_logging.is_progress_bar_enabled()
    if enabled:
        transformers_logging.disable_progress_bar()
    try:
        with environment(PROGRESS_SWITCHES):
            yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


@contextlib.contextmanager
def environment(values: dict[str, str] | None = None, keep: tuple[str, ...] = ()) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block; afterwards those keys and ``keep`` are as before.

    Example:
        >>> with environment({"TQDM_DISABLE": "1"}, keep=("MASTER_PORT",)):
        ...     os.environ["MASTER_PORT"] = "29500"    # gone again after the block
    """
    saved = {key: os.environ.get(key) for key in (*(values or {}), *keep)}
    os.environ.update(values or {})
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
    handler.addFilter(lambda record: record.name.split(".")[0] != PACKAGE or _console_handler() is None)
    root = logging.getLogger()
    previous_level = root.level
    root.addHandler(handler)
    root.setLevel(min(previous_level or logging.WARNING, logging.INFO))
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(previous_level)


def _stream_handlers() -> list[logging.StreamHandler]:
    """Every plain stream handler alive, attached to a logger or not.

    Why not only the attached ones: a library may keep its handler detached for a while and attach
    it again later (``transformers.Trainer`` re-enables transformers' default handler), and one
    made inside a capture would then write to the closed log. ``logging`` keeps a weak reference
    to every handler it made (for shutdown), which finds them all.
    """
    loggers = [logging.getLogger(), *(item for item in logging.Logger.manager.loggerDict.values()
                                      if isinstance(item, logging.Logger))]
    alive = [ref() for ref in getattr(logging, "_handlerList", ())]  # stdlib's registry of handlers
    handlers = {id(h): h for h in [*alive, *(h for log in loggers for h in log.handlers)] if h is not None}
    return [handler for handler in handlers.values() if type(handler) is logging.StreamHandler]


@contextlib.contextmanager
def _terminal_handlers_to(stream: TextIO) -> Iterator[None]:
    """Point libraries' existing terminal log handlers (transformers' own, say) at ``stream``.

    Afterwards they point back, and a handler a library made inside the block (``datasets``
    makes its own at first use, on the ``sys.stderr`` of that moment: the log) is pointed at
    the real stderr, or every record it writes later would fail on the closed log.
    """
    terminals = (sys.__stderr__, sys.__stdout__)
    for handler in _stream_handlers():
        _unbind_flush(handler)  # left by an earlier capture
    moved = [(handler, handler.stream) for handler in _stream_handlers() if handler.stream in terminals]
    for handler, _ in moved:
        handler.setStream(stream)
    try:
        yield
    finally:
        for handler, original in moved:
            handler.setStream(original)
        for handler in _stream_handlers():
            _unbind_flush(handler)
            if handler.stream is stream:
                handler.setStream(sys.__stderr__)


def _unbind_flush(handler: logging.StreamHandler) -> None:
    """Drop a handler's own ``flush`` when it is bound to a capture's log (its class's flush remains).

    Why: transformers makes its default handler with ``handler.flush = sys.stderr.flush``; made
    inside a capture, that is the log's flush, which fails on the closed log at the next command's
    first record (a second command in one process: a notebook, a torchrun worker, a test).
    """
    bound = getattr(handler.__dict__.get("flush"), "__self__", None)
    if isinstance(bound, _LazyLog):
        del handler.flush


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
    try:  # the process's own descriptors: inside third_party_log, sys.stdout and sys.stderr are both the log
        fd, err_fd = sys.__stdout__.fileno(), sys.__stderr__.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # no real stdout (embedded interpreters)
        fd = err_fd = None
    saved_fd = None if fd is None else os.dup(fd)
    if saved_fd is not None:
        os.dup2(err_fd, fd)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved_fd is not None:
            os.dup2(saved_fd, fd)
            os.close(saved_fd)
