"""mteb's "superseded task" and deprecation warnings, gathered and shown once per run.

Why: mteb warns (through both ``logging`` and ``warnings``) every time a superseded task is
evaluated, so a benchmark run buries its results under dozens of repeated paragraphs. The
warnings matter — a superseded task may have known data errors — so they are kept, deduplicated,
and reported once at the end of the run (``EvaluationReport.notices``).

Example:
    >>> with collect_mteb_notices() as notices:
    ...     mteb.evaluate(model, mteb.get_task("Banking77Classification"), cache=None)
    >>> notices
    ["The task 'Banking77Classification' is superseded by 'Banking77Classification.v2'. ..."]
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

MTEB_LOGGERS = ("mteb.abstasks.abstask", "mteb.evaluate", "mteb.models.sentence_transformer_wrapper",
                "mteb.models.get_model_meta")
KEYWORDS = ("superseded", "deprecated", "renamed")


def _is_notice(message: str) -> bool:
    lowered = message.lower()
    return any(word in lowered for word in KEYWORDS)


class _Collector(logging.Filter):
    """Drops mteb's superseded/deprecation log records and keeps their text (first time only)."""

    def __init__(self, notices: list[str]) -> None:
        super().__init__()
        self.notices = notices

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno >= logging.WARNING and _is_notice(message):
            if message not in self.notices:
                self.notices.append(message)
            return False
        return True


@contextmanager
def collect_mteb_notices() -> Iterator[list[str]]:
    """Gather mteb's superseded/deprecation warnings (deduplicated) instead of printing them each time.

    Example:
        >>> with collect_mteb_notices() as notices:
        ...     run_tasks()
        >>> len(notices)   # one per superseded task, not one per evaluation
        1
    """
    notices: list[str] = []
    collector = _Collector(notices)
    loggers = [logging.getLogger(name) for name in MTEB_LOGGERS]
    for item in loggers:
        item.addFilter(collector)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield notices
        for warning in caught:
            message = str(warning.message)
            if _is_notice(message) or issubclass(warning.category, DeprecationWarning):
                if message not in notices:
                    notices.append(message)
            else:
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    finally:
        for item in loggers:
            item.removeFilter(collector)
