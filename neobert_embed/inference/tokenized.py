"""One tokenization call's output, held without padding until a batch is made (:class:`Tokenized`): what
every engine's tokenizer hands the model (a module of its own: the light runtime must not import torch).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Padding:
    """How a tokenizer pads a batch: its pad id, pad type id and side (0 in the attention mask).

    Example:
        >>> Padding(pad_id=1).value("input_ids"), Padding(pad_id=1).value("attention_mask")
        (1, 0)
    """

    pad_id: int = 0
    pad_type_id: int = 0
    left: bool = False

    @classmethod
    def of(cls, tokenizer: object) -> Padding:
        """A transformers tokenizer's padding (its ``pad_token_id``, ``pad_token_type_id``, ``padding_side``).

        Example:
            >>> Padding.of(AutoTokenizer.from_pretrained("bert-base-uncased"))
            Padding(pad_id=0, pad_type_id=0, left=False)
        """
        pad_id = getattr(tokenizer, "pad_token_id", None)
        return cls(int(pad_id) if pad_id is not None else 0, int(getattr(tokenizer, "pad_token_type_id", 0) or 0),
                   getattr(tokenizer, "padding_side", "right") == "left")

    def value(self, key: str) -> int:
        """What ``key``'s padded positions hold, as the tokenizer's own padding writes them."""
        return {"input_ids": self.pad_id, "token_type_ids": self.pad_type_id, "special_tokens_mask": 1}.get(key, 0)


@dataclass(frozen=True)
class Tokenized:
    """The output of one tokenization call, one row per text in input order, held without padding: a batch
    is padded to its own longest text when it is made (padding a whole call and making it one tensor took
    most of tokenization's time: docs/performance.md).

    Attributes:
        values: per key (``input_ids``, ``attention_mask``, ``token_type_ids``), every text's tokens one
            after another, int32 (vocabularies stay far below 2**31; a batch hands back int64).
        lengths: tokens of each text after truncation (its row in ``values``).
        padding: how a batch pads (:class:`Padding`).
        shared: what ``preprocess`` returned for the whole call (``modality``, ``prompt_length``).
        truncated: how many texts were longer than the model reads (cut at ``max_seq_length``).
        lost_tokens: how many of their tokens lay past the cut (None where the tokenizer does not say).
        cut: which texts those were (bool per row), where the tokenizer says.
    """

    values: dict[str, np.ndarray]
    lengths: np.ndarray
    padding: Padding = Padding()
    shared: dict[str, object] = field(default_factory=dict)
    truncated: int = 0
    lost_tokens: int | None = None
    cut: np.ndarray | None = None

    @functools.cached_property
    def starts(self) -> np.ndarray:
        """Where each text's tokens begin in ``values``."""
        return np.concatenate(([0], np.cumsum(self.lengths)[:-1])).astype(np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    def batch(self, rows: Sequence[int] | np.ndarray) -> dict[str, np.ndarray | object]:
        """The features of ``rows`` as one padded batch (int64), as wide as its longest text.

        Example:
            >>> tokenized = Tokenized.from_lists({"input_ids": [[101, 102], [101, 7, 102]],
            ...                                   "attention_mask": [[1, 1], [1, 1, 1]]})
            >>> tokenized.batch([0, 1])["input_ids"].tolist()
            [[101, 102, 0], [101, 7, 102]]
        """
        rows = np.asarray(rows, dtype=np.int64)
        lengths = self.lengths[rows]
        width = int(lengths.max()) if len(rows) else 0
        within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        source = np.repeat(self.starts[rows], lengths) + within
        target = (np.repeat(np.arange(len(rows)), lengths),
                  within + np.repeat(width - lengths, lengths) if self.padding.left else within)
        features: dict[str, np.ndarray | object] = {}
        for key, values in self.values.items():
            padded = np.full((len(rows), width), self.padding.value(key), dtype=np.int64)
            padded[target] = values[source]
            features[key] = padded
        return {**features, **self.shared}

    @classmethod
    def gather(cls, picks: Sequence[tuple[Tokenized, int]]) -> Tokenized:
        """One row from each of several calls (same tokenizer and prompt), in order: a server's batch.

        Example:
            >>> Tokenized.gather([(first, 0), (second, 2)]).lengths.tolist()
            [4, 9]
        """
        first = picks[0][0]
        lengths = np.array([tokenized.lengths[row] for tokenized, row in picks], dtype=np.int64)
        values = {key: np.concatenate([tokenized.values[key][tokenized.starts[row]:
                                                             tokenized.starts[row] + tokenized.lengths[row]]
                                       for tokenized, row in picks]) for key in first.values}
        return cls(values, lengths, first.padding, first.shared)

    @classmethod
    def from_lists(cls, rows: Mapping[str, Sequence[Sequence[int]]], **details: object) -> Tokenized:
        """From a tokenizer's per-text lists (one list of ids per text and key, any lengths).

        Example:
            >>> Tokenized.from_lists({"input_ids": [[101, 102], [101, 7, 102]]}).lengths.tolist()
            [2, 3]
        """
        first = next(iter(rows.values()))
        lengths = np.fromiter(map(len, first), dtype=np.int64, count=len(first))
        total = int(lengths.sum())
        values = {key: np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int32, count=total)
                  for key, lists in rows.items()}
        return cls(values, lengths, **details)  # type: ignore[arg-type]

    @classmethod
    def from_padded(cls, rows: Mapping[str, np.ndarray], mask: np.ndarray, **details: object) -> Tokenized:
        """From padded (texts, width) arrays and their attention mask (a module that returns tensors).

        Example:
            >>> Tokenized.from_padded({"input_ids": ids}, np.array([[1, 1, 0], [1, 1, 1]])).lengths.tolist()
            [2, 3]
        """
        real = mask.astype(bool)
        values = {key: np.asarray(array)[real] for key, array in rows.items()}
        values = {key: array.astype(np.int32) if array.dtype == np.int64 else array  # as from_lists
                  for key, array in values.items()}
        return cls(values, real.sum(axis=1).astype(np.int64), **details)  # type: ignore[arg-type]
