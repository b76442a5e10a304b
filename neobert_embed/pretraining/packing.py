"""Documents -> fixed-length training rows, with document boundaries kept.

Why: padding a mixed-length corpus to the row length wastes most of the compute on pad tokens;
the official NeoBERT code packs but lets documents attend to each other (its own ablation lost
2.9 GLUE points to that). Here documents are concatenated into rows of ``seq_length`` tokens and
every row records where its documents start, so the encoder's varlen path attends only within a
document (``cu_seqlens``) and positions restart at 0 per document. A document longer than the
space left in a row is split — the rest starts the next row — never dropped, so rows are full
(100% real tokens except at the very end of a corpus smaller than one row).

The stream is a pure function of (lengths, seed, position): its position — epoch, document and
token offset — is three integers, which a checkpoint stores for an exact resume, and any process
can skip rows it does not own without reading their tokens.

Example:
    >>> stream = DocumentStream(corpus.lengths, seed=0)
    >>> rows = [stream.next_row(128, packed=True) for _ in range(4)]
    >>> batch = collate_rows(corpus, rows, seq_length=128, pad_id=0)
    >>> batch["cu_seqlens"][-1] == 4 * 128
    tensor(True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Piece:
    """Tokens ``start:stop`` of document ``doc``: one attention segment of a row."""

    doc: int
    start: int
    stop: int

    @property
    def length(self) -> int:
        return self.stop - self.start


@dataclass
class StreamPosition:
    """Where the stream resumes: document ``doc`` of epoch ``epoch``'s order, at token ``offset``."""

    epoch: int = 0
    doc: int = 0
    offset: int = 0


@dataclass(frozen=True)
class LengthMixture:
    """Draw documents by length bucket (stage 2 favours long documents).

    ``bounds[i]`` is the largest length of bucket i (``None``: unbounded); ``weights[i]`` the
    probability that the next document comes from bucket i. Buckets cycle through their own
    shuffled documents, so short documents can be rare and long ones repeated.
    """

    bounds: tuple[int | None, ...]
    weights: tuple[float, ...]

    def bucket_of(self, lengths: np.ndarray) -> np.ndarray:
        edges = np.array([b if b is not None else np.iinfo(np.int64).max for b in self.bounds])
        return np.minimum(np.searchsorted(edges, lengths, side="left"), len(edges) - 1)


class DocumentStream:
    """An endless, reproducible sequence of document pieces, reshuffled every epoch."""

    def __init__(self, lengths: np.ndarray, seed: int, mixture: LengthMixture | None = None,
                 position: StreamPosition | None = None) -> None:
        if lengths.size == 0 or int(lengths.max()) == 0:
            raise ValueError("the corpus has no tokens")
        self.lengths = lengths
        self.seed = seed
        self.mixture = mixture
        self.position = position or StreamPosition()
        self._order_epoch = -1
        self._order = np.empty(0, dtype=np.int64)

    def order(self, epoch: int) -> np.ndarray:
        """Document indices in the order epoch ``epoch`` visits them."""
        if epoch != self._order_epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._order = (rng.permutation(self.lengths.size) if self.mixture is None
                           else self._mixture_order(rng))
            self._order_epoch = epoch
        return self._order

    def _mixture_order(self, rng: np.random.Generator) -> np.ndarray:
        buckets = self.mixture.bucket_of(self.lengths)
        members = [np.flatnonzero(buckets == b) for b in range(len(self.mixture.weights))]
        weights = np.array([w if m.size else 0.0 for w, m in zip(self.mixture.weights, members, strict=True)])
        choice = rng.choice(len(members), size=self.lengths.size, p=weights / weights.sum())
        order = np.empty(self.lengths.size, dtype=np.int64)
        for b, docs in enumerate(members):
            slots = np.flatnonzero(choice == b)
            if slots.size:
                order[slots] = rng.permutation(docs)[np.arange(slots.size) % docs.size]
        return order

    def _take(self, budget: int) -> Piece:
        """The next piece of at most ``budget`` tokens; advances the position."""
        pos = self.position
        order = self.order(pos.epoch)
        doc = int(order[pos.doc])
        stop = min(int(self.lengths[doc]), pos.offset + budget)
        piece = Piece(doc, pos.offset, stop)
        if stop == self.lengths[doc]:
            pos.doc, pos.offset = pos.doc + 1, 0
            if pos.doc == order.size:
                pos.epoch, pos.doc = pos.epoch + 1, 0
        else:
            pos.offset = stop
        return piece

    def next_row(self, seq_length: int, packed: bool) -> list[Piece]:
        """The pieces of the next row: documents filling ``seq_length`` tokens (``packed``), or one
        document (chunk) per row, padded later (``packed=False``, the baseline)."""
        if not packed:
            return [self._take(seq_length)]
        pieces: list[Piece] = []
        room = seq_length
        while room:
            piece = self._take(room)
            if piece.length:
                pieces.append(piece)
            room -= piece.length
        return pieces


def collate_rows(corpus, rows: Sequence[list[Piece]], seq_length: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Stack rows into model inputs: ``input_ids``, ``attention_mask``, ``position_ids`` (restart at
    each document), ``cu_seqlens`` (int32 boundaries over the flattened batch x length tokens, a
    row's padding being its own segment) and ``max_seqlen``.

    Example:
        >>> batch = collate_rows(corpus, [[Piece(0, 0, 3), Piece(1, 0, 2)]], seq_length=6, pad_id=0)
        >>> batch["cu_seqlens"].tolist(), batch["position_ids"].tolist()
        ([0, 3, 5, 6], [[0, 1, 2, 0, 1, 0]])
    """
    ids = np.full((len(rows), seq_length), pad_id, dtype=np.int64)
    positions = np.zeros((len(rows), seq_length), dtype=np.int64)
    real = np.zeros((len(rows), seq_length), dtype=bool)
    boundaries = [0]
    for r, row in enumerate(rows):
        cursor = 0
        for piece in row:
            ids[r, cursor:cursor + piece.length] = corpus.tokens(piece.doc, piece.start, piece.stop)
            positions[r, cursor:cursor + piece.length] = np.arange(piece.length)
            cursor += piece.length
            boundaries.append(r * seq_length + cursor)
        real[r, :cursor] = True
        if cursor < seq_length:
            positions[r, cursor:] = np.arange(seq_length - cursor)
            boundaries.append((r + 1) * seq_length)
    cu_seqlens = torch.tensor(boundaries, dtype=torch.int32)
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(real).long(),
            "position_ids": torch.from_numpy(positions), "cu_seqlens": cu_seqlens,
            "max_seqlen": int((cu_seqlens[1:] - cu_seqlens[:-1]).max())}
