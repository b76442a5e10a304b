"""A model's tokenizer called straight through its Rust ``tokenizers.Tokenizer``, unpadded (:class:`FastTokenizer`).

Why: ``SentenceTransformer.preprocess`` spends most of a call in Python after the Rust tokenizer, on one core,
while the Rust part spreads over all of them (docs/performance.md). Like text-embeddings-inference, this keeps
the ids as flat arrays, set up as sentence-transformers' ``Transformer`` calls the tokenizer (special tokens,
``longest_first`` truncation at ``max_seq_length``, no padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from neobert_embed.inference.tokenized import Padding, Tokenized

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass(frozen=True)
class TokenOffsets:
    """One text tokenized whole, for splitting it: ids and type ids (no special tokens, untruncated), each
    token's ``(start, end)`` characters, and the special tokens around a text (``head``, ``tail``, their types).

    Example:
        >>> fast.offsets(["a cat"])[0].offsets.tolist()
        [[0, 1], [2, 5]]
    """

    ids: np.ndarray
    type_ids: np.ndarray
    offsets: np.ndarray
    head: tuple[int, ...]
    tail: tuple[int, ...]
    head_types: tuple[int, ...]
    tail_types: tuple[int, ...]


class FastTokenizer:
    """A ``tokenizers.Tokenizer`` that truncates at ``max_seq_length`` and never pads; not changed while
    in use, so safe to call from several threads. The torch engine uses it where it agrees with
    ``preprocess`` (:class:`~neobert_embed.inference.pipeline.DirectTokenizer`); the light runtime builds it
    from the exported files.

    Example:
        >>> fast = FastTokenizer.of(model.tokenizer, model.max_seq_length)
        >>> fast.tokenize(["a cat", "a black cat"]).lengths.tolist()
        [4, 5]
    """

    def __init__(self, batching: Tokenizer, max_seq_length: int, truncation_side: str = "right",
                 padding: Padding | None = None) -> None:
        self._batching = batching
        self._batching.no_padding()
        self.padding = padding or Padding()
        self.truncation_side = truncation_side
        self.special_ids = frozenset(token_id for token_id, token in batching.get_added_tokens_decoder().items()
                                     if token.special)
        self.set_max_seq_length(max_seq_length)

    @classmethod
    def of(cls, tokenizer: object, max_seq_length: int) -> FastTokenizer | None:
        """A copy of a transformers tokenizer's Rust tokenizer (normalizer, special tokens, pad id, sides);
        None for a slow, Python tokenizer.

        Example:
            >>> FastTokenizer.of(AutoTokenizer.from_pretrained("bert-base-uncased"), 512).max_seq_length
            512
        """
        from tokenizers import Tokenizer

        backend = getattr(tokenizer, "backend_tokenizer", None)
        if not isinstance(backend, Tokenizer):
            return None
        return cls(Tokenizer.from_str(backend.to_str()), max_seq_length,
                   str(getattr(tokenizer, "truncation_side", "right")), Padding.of(tokenizer))

    def set_max_seq_length(self, length: int) -> None:
        """Truncate at ``length`` tokens from now on (at start-up only: not while batches run)."""
        self.max_seq_length = int(length)
        self._batching.enable_truncation(self.max_seq_length, strategy="longest_first",
                                         direction=self.truncation_side)

    def offsets(self, texts: Sequence[str]) -> list[TokenOffsets]:
        """``texts`` tokenized once each, whole and without special tokens, with every token's character span:
        what splits long documents into passages (:mod:`neobert_embed.index.passages`).

        Example:
            >>> [len(t.ids) for t in tokenizer.offsets(["word " * 600])]
            [600]
        """
        from tokenizers import Tokenizer

        whole = Tokenizer.from_str(self._batching.to_str())  # a copy: this one is shared by threads
        whole.no_truncation()
        framed = whole.encode("a")
        mask = framed.special_tokens_mask
        head = next((i for i, special in enumerate(mask) if not special), len(mask))
        tail = next((i for i, special in enumerate(reversed(mask)) if not special), 0)
        ids, types = framed.ids, framed.type_ids
        framing = dict(head=tuple(ids[:head]), tail=tuple(ids[len(ids) - tail:]),
                       head_types=tuple(types[:head]), tail_types=tuple(types[len(types) - tail:]))
        return [TokenOffsets(np.asarray(e.ids, dtype=np.int64), np.asarray(e.type_ids, dtype=np.int64),
                             np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2), **framing)
                for e in whole.encode_batch(list(texts), add_special_tokens=False)]

    def batch(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """``input_ids``, ``attention_mask`` and ``token_type_ids`` (int64, padded to the longest, truncated).

        Example:
            >>> tokenizer.batch(["a cat"])["attention_mask"].tolist()
            [[1, 1, 1, 1]]
        """
        return self.tokenize(texts).batch(np.arange(len(texts)))  # type: ignore[return-value]

    def tokenize(self, texts: Sequence[str]) -> Tokenized:
        """``texts`` tokenized in one call (the Rust tokenizer's threads), unpadded, counting what was cut.

        Example:
            >>> tokenizer.tokenize(["a cat", "word " * 600]).truncated
            1
        """
        encodings = self._batching.encode_batch(list(texts))
        cut = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(encodings))
        return Tokenized.from_lists({"input_ids": [e.ids for e in encodings],
                                     "attention_mask": [e.attention_mask for e in encodings],
                                     "token_type_ids": [e.type_ids for e in encodings]},
                                    padding=self.padding, truncated=int(cut.sum()), cut=cut,
                                    lost_tokens=sum(len(o.ids) - sum(o.special_tokens_mask)
                                                    for e in encodings for o in e.overflowing))
