"""``--json`` means stdout holds JSON and nothing else.

Why: libraries print to stdout while they work (DeepSpeed's op-builder warnings, progress lines
from third-party code, sometimes from C extensions writing to file descriptor 1 directly), which
made ``train-contrastive --json | jq`` fail. While a command with ``--json`` works, both Python's
``sys.stdout`` and descriptor 1 point at stderr; the command prints its JSON after the block,
when stdout is restored.

Example:
    >>> with json_only_stdout(as_json):
    ...     summary = train(...)          # any stray print lands on stderr
    >>> print(json.dumps(summary))        # the only thing on stdout
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator


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
