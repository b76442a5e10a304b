"""User-facing errors.

Every mistake a user can fix (a bad file, an unknown key, a missing column) is raised as a
:class:`UserInputError` whose message says *where* (file, line, key) and *what to do*. The CLI
prints these without a traceback and exits with status 2; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

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
