"""Training examples for contrastive fine-tuning: read, normalize columns, validate.

Why: public retrieval datasets name their columns a dozen ways (anchor/positive/negative,
query/document/negative_1…, question/answer, BGE's neg lists). The trainer feeds *every* column
of a dataset to the loss as a text, so an id or score column slipping through would silently
become a bogus "negative". Here each source is mapped onto ``anchor, positive, negative_1..n``;
other columns are dropped with one notice, and every row is checked (non-empty strings, the same
number of negatives) with errors that name the file, the line or row, and the column.

Example:
    >>> ds = load_examples("snli", DataSource(path="triplets.jsonl"))
    >>> ds.column_names
    ['anchor', 'positive', 'negative_1']
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from neobert_embed.contrastive.recipe import DataSource
from neobert_embed.errors import UserInputError
from neobert_embed.sources import Location, iter_records

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)

QUERY_COLUMNS = ("anchor", "query", "question")
POSITIVE_COLUMNS = ("positive", "document", "pos", "answer", "passage")
NEGATIVE_LIST_COLUMNS = ("negatives", "neg")
NUMBERED_NEGATIVE = re.compile(r"^negative_?(\d+)$")


def _pick(columns: Iterable[str], candidates: tuple[str, ...], role: str, where: str) -> str:
    found = [c for c in candidates if c in columns]
    if not found:
        raise UserInputError(f"{where}: no {role} column; name it one of {list(candidates)} "
                             f"(found columns: {sorted(columns)})")
    if len(found) > 1:
        raise UserInputError(f"{where}: several {role} columns {found}; keep one or rename the others")
    return found[0]


def resolve_columns(columns: Iterable[str], where: str) -> tuple[str, str, list[str] | str, list[str]]:
    """Map a source's columns to (query, positive, negatives, ignored).

    ``negatives`` is a list of single-text columns in order (``negative`` or ``negative_1..n``)
    or the name of one list-valued column (``negatives``/``neg``).

    Example:
        >>> resolve_columns(["query", "document", "negative_2", "negative_1", "id"], "f.jsonl")
        ('query', 'document', ['negative_1', 'negative_2'], ['id'])
    """
    columns = list(columns)
    query = _pick(columns, QUERY_COLUMNS, "query", where)
    positive = _pick(columns, POSITIVE_COLUMNS, "positive", where)
    numbered = sorted((int(m.group(1)), c) for c in columns if (m := NUMBERED_NEGATIVE.match(c)))
    single = ["negative"] if "negative" in columns else []
    lists = [c for c in NEGATIVE_LIST_COLUMNS if c in columns]
    kinds = [k for k in (single, [c for _, c in numbered], lists) if k]
    if len(kinds) > 1:
        raise UserInputError(f"{where}: negatives given in several forms {sum(kinds, [])}; use either "
                             "'negative', 'negative_1..n' or one list column 'negatives'")
    negatives: list[str] | str = lists[0] if lists else (single or [c for _, c in numbered])
    used = {query, positive, *(negatives if isinstance(negatives, list) else [negatives])}
    return query, positive, negatives, [c for c in columns if c not in used]


def _text(value: object, column: str, location: Location) -> str:
    if not isinstance(value, str):
        got = "missing/null" if value is None else type(value).__name__
        raise location.error(f"column {column!r} must be text, got {got}")
    if not value.strip():
        raise location.error(f"column {column!r} is empty; every query, positive and negative must be "
                             "non-empty text (fix or remove the row)")
    return value


def load_examples(name: str, source: DataSource) -> Dataset:
    """Load one named source as a ``datasets.Dataset`` with columns anchor, positive, negative_1..n.

    Raises :class:`UserInputError` naming the file and line/row for a missing column, an empty or
    non-text value, or a row whose number of negatives differs from the first row's.

    Example:
        >>> load_examples("nq", DataSource(path="nq.parquet")).num_rows
        1000
    """
    import datasets

    where = f"{source.path} (dataset {name!r})"
    columns: dict[str, list[str]] | None = None
    first_location: Location | None = None
    keys: tuple[str, ...] = ()
    for location, record in iter_records(source.path, split=source.split, subset=source.subset):
        previous_keys, keys = keys, tuple(record)
        if columns is None:
            query, positive, negatives, ignored = resolve_columns(keys, where)
            if ignored:
                logger.warning("%s: ignoring column(s) %s (not query/positive/negative texts)", where, ignored)
        elif keys != previous_keys and query in record and positive in record:  # same keys: same roles
            negatives = resolve_columns(keys, str(location))[2]  # JSON lines: rows name their own
        for column in (query, positive, *(negatives if isinstance(negatives, list) else [negatives])):
            if column not in record:
                raise location.error(f"column {column!r} is missing (the first row has it)")
        texts_neg = record[negatives] if isinstance(negatives, str) else [record[c] for c in negatives]
        if isinstance(negatives, str) and not isinstance(texts_neg, list):
            raise location.error(f"column {negatives!r} must be a list of texts")
        if columns is None:
            first_location = location
            columns = {"anchor": [], "positive": [], **{f"negative_{i}": [] for i in range(1, len(texts_neg) + 1)}}
        if len(texts_neg) != len(columns) - 2:
            raise location.error(f"{len(texts_neg)} negatives, but {first_location} has "
                                 f"{len(columns) - 2}; all rows of a dataset need the same number of "
                                 "negatives (trim/pad them, or split the file into two --data entries)")
        columns["anchor"].append(_text(record[query], query, location))
        columns["positive"].append(_text(record[positive], positive, location))
        for i, text in enumerate(texts_neg, start=1):
            label = negatives if isinstance(negatives, str) else negatives[i - 1]
            columns[f"negative_{i}"].append(_text(text, label, location))
    if columns is None:
        raise UserInputError(f"{where}: no examples; the dataset is empty")
    return datasets.Dataset.from_dict(columns)


def load_training_data(data: dict[str, DataSource]) -> dict[str, Any]:
    """Load every named source (see :func:`load_examples`); fails before training on any bad row.

    Example:
        >>> sets = load_training_data({"snli": DataSource(path="snli.jsonl")})
        >>> {name: ds.num_rows for name, ds in sets.items()}
        {'snli': 6503}
    """
    if not data:
        raise UserInputError("no training data: pass --data NAME=PATH (repeatable) or add 'data:' to the recipe")
    return {name: load_examples(name, source) for name, source in data.items()}
