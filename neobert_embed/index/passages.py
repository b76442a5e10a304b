"""Long documents as overlapping passages: every token of a document is indexed, and a document is
ranked by its best passage (MaxP).

Why: a model reads ``max_seq_length`` tokens; an index that encodes each document once loses
everything past its window (a report, a paper, a manual: most of it). Retrieval research splits
long documents into overlapping windows and scores a document by its best passage (MaxP, the
document ranking of BEIR-era systems); text-embeddings-inference and sentence-transformers leave
the splitting to their callers. This module is that caller for ``index build --passages``:

1. each document is tokenized ONCE, whole, by the model's own Rust tokenizer with the document
   prompt in front (:meth:`~neobert_embed.inference.fast_tokenizer.FastTokenizer.offsets`: ids and
   each token's characters);
2. its tokens past the prompt are cut into windows of ``window`` tokens (the model's
   ``max_seq_length`` less its special tokens and its prompt's tokens), a new window every
   ``stride`` tokens (default: ``window - window // 4``, an overlap of a quarter window); a document
   that fits is one passage, the very tokens ``encode`` would give it;
3. each passage's ids (special tokens + prompt + window) go to the model without tokenizing again
   (:func:`~neobert_embed.inference.pipeline.encode_tokenized`: the one encoding loop, over the torch
   pipeline or the light runtime), and keep their document's row and the characters ``[start, end)`` of the document's
   ``text`` they cover.

Before the first passage is encoded, the first documents' first passages are checked against the
pipeline's own tokenization of the same documents (truncated: the same tokens); a tokenizer whose
pieces do not agree (a tokenizer without a Rust one, a custom ``preprocess``) encodes the passages'
texts instead, and says so.

Example:
    >>> splitter = PassageEncoder(load_encoder("all-MiniLM-L6-v2"))
    >>> passages = splitter.encode(store.documents_between(0, 100))
    >>> passages.vectors.shape[0] == len(passages.spans)
    True
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from neobert_embed.errors import UserInputError
from neobert_embed.sentence import DOCUMENT_PROMPT, resolve_prompt

if TYPE_CHECKING:
    from neobert_embed.index.encoder import IndexEncoder
    from neobert_embed.index.store import StoredDocument
    from neobert_embed.inference.fast_tokenizer import FastTokenizer, TokenOffsets
    from neobert_embed.inference.tokenized import Tokenized

logger = logging.getLogger(__name__)

#: The default overlap of two passages is ``window // OVERLAP_DIVISOR`` tokens (a quarter window).
OVERLAP_DIVISOR = 4
#: Documents tokenized per call of the Rust tokenizer (its threads share them).
DOCUMENTS_PER_CALL = 256
#: Passages encoded per call of the model's pipeline (its chunk: length-sorted batches within it).
PASSAGES_PER_CALL = 2048
#: Documents whose first passage is checked against the pipeline's tokenization before the first encode.
PROBE_DOCUMENTS = 4
#: What a span row holds (``spans`` arrays and the store's ``passages`` table).
SPAN_COLUMNS = ("document", "start", "end")
_WORDS = re.compile(r"\S+")


def default_stride(window: int) -> int:
    """Tokens between passage starts by default: an overlap of ``window // 4`` tokens.

    Example:
        >>> default_stride(250)
        188
    """
    return max(1, window - window // OVERLAP_DIVISOR)


def token_windows(n_tokens: int, window: int, stride: int,
                  word_starts: np.ndarray | None = None) -> list[tuple[int, int]]:
    """``[start, end)`` token windows covering ``n_tokens`` tokens: one every ``stride`` tokens, the last
    ending at the last token; a text that fits (or has no tokens) is one window.

    With ``word_starts`` (per token, whether it begins a word), no window starts inside a word: a start on
    a continuation piece (WordPiece ``##wi``) moves back to its word's first token, the window keeps its
    ``window`` tokens from there, and the next one starts ``stride`` tokens after the moved start; the last
    window starts at the first word start at or after ``n_tokens - window``. So a passage's tokens are those
    its text gives when tokenized alone. Only a word longer than the stride is cut inside. Windows still
    cover every token, overlap by at least ``window - stride``, hold at most ``window`` tokens, and are never
    empty or repeated; without ``word_starts`` (or when every token begins a word) they are the plain grid.

    Example:
        >>> token_windows(10, 4, 3)
        [(0, 4), (3, 7), (6, 10)]
        >>> token_windows(10, 4, 3, np.array([1, 1, 1, 0, 1, 1, 0, 0, 1, 1], dtype=bool))
        [(0, 4), (2, 6), (5, 9), (8, 10)]
    """
    if n_tokens <= window:
        return [(0, n_tokens)]
    starts = np.ones(n_tokens, dtype=bool) if word_starts is None else np.asarray(word_starts, dtype=bool).copy()
    starts[0] = True
    boundaries = np.flatnonzero(starts)

    windows = []
    start = 0
    while start + window < n_tokens:
        windows.append((start, start + window))
        nominal = start + stride
        word = int(boundaries[np.searchsorted(boundaries, nominal, side="right") - 1])
        start = word if word > start else nominal  # a word longer than the stride: cut inside it
    following = np.searchsorted(boundaries, n_tokens - window)
    last = int(boundaries[following]) if following < len(boundaries) else start
    windows.append((min(last, start), n_tokens))
    return windows


def word_starts(offsets: np.ndarray, text: str) -> np.ndarray:
    """Per token of ``text`` (its ``(start, end)`` characters), whether it begins a word: the first token, a
    token after a gap (whitespace the tokenizer dropped), and one that opens on whitespace (byte-level BPE's
    ``Ġword``, SentencePiece's ``▁word``). A continuation piece (WordPiece ``##wi``) touches the piece before
    it, so it never counts; punctuation glued to a word does not either, which only keeps more together.

    Example:
        >>> word_starts(np.array([[0, 3], [3, 5], [6, 8], [8, 9]]), "unbe lie,").tolist()
        [True, False, True, False]
    """
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    starts = np.ones(len(offsets), dtype=bool)
    if len(offsets) > 1:
        after_gap = offsets[1:, 0] > offsets[:-1, 1]
        on_space = np.fromiter((text[i:i + 1].isspace() for i in offsets[1:, 0].tolist()), dtype=bool,
                               count=len(offsets) - 1)
        starts[1:] = after_gap | on_space
    return starts


def text_span(document: StoredDocument, start: int, end: int) -> tuple[int, int]:
    """Characters ``[start, end)`` of a document's encoded text (``title + " " + text``) as characters of its
    ``text`` (a passage reaching into the title starts at 0).

    Example:
        >>> text_span(StoredDocument(0, "d1", "Title", "body text"), 6, 10)
        (0, 4)
    """
    body = document.text.strip()
    encoded = document.encoded_text
    shift = (len(encoded) - len(body) if body else len(encoded)) - (len(document.text) - len(document.text.lstrip()))
    return (min(max(start - shift, 0), len(document.text)), min(max(end - shift, 0), len(document.text)))


@dataclass(frozen=True)
class Passages:
    """Passage vectors and, per row, ``(document, start, end)``: the index of its document in the list
    encoded (or its store row, see :meth:`offset`) and the characters of the document's text it covers.

    Example:
        >>> passages.spans[:2].tolist()
        [[0, 0, 1180], [0, 905, 2043]]
    """

    vectors: np.ndarray
    spans: np.ndarray

    def offset(self, first_row: int) -> Passages:
        """The same passages with document indexes turned into store rows (``first_row`` + index)."""
        spans = self.spans.copy()
        spans[:, 0] += first_row
        return Passages(self.vectors, spans)


def concatenated(parts: Sequence[Passages], dimension: int) -> Passages:
    """One :class:`Passages` of ``parts`` in order (an empty one when there are none)."""
    if not parts:
        return Passages(np.empty((0, dimension), dtype=np.float32), np.empty((0, 3), dtype=np.int64))
    return Passages(np.concatenate([p.vectors for p in parts]), np.concatenate([p.spans for p in parts]))


def fast_tokenizer_of(model: object) -> FastTokenizer | None:
    """The Rust tokenizer a model encodes with: a light model's own, a SentenceTransformer's copy."""
    from neobert_embed.inference.fast_tokenizer import FastTokenizer

    tokenizer = getattr(model, "tokenizer", None)
    if isinstance(tokenizer, FastTokenizer):
        return tokenizer
    limit = getattr(model, "max_seq_length", None)
    return FastTokenizer.of(tokenizer, int(limit)) if tokenizer is not None and limit else None


class PassageEncoder:
    """Splits documents into passages and encodes them with an index's model and document prompt.

    Args:
        encoder: the index's model (:func:`~neobert_embed.index.encoder.load_encoder`).
        stride: tokens between passage starts (default :func:`default_stride` of the window).

    Raises:
        UserInputError: a stride outside ``1..window``, or a window with no room past the prompt.
    """

    def __init__(self, encoder: IndexEncoder, stride: int | None = None) -> None:
        self.encoder = encoder
        model = encoder.model
        prompt = encoder.prompts.get(DOCUMENT_PROMPT)
        self.prompt = (resolve_prompt(model, None) if prompt is None else prompt) or ""
        self.max_seq_length = int(model.max_seq_length)
        self.fast = fast_tokenizer_of(model)
        self._agrees: bool | None = None if self.fast is not None else False
        self._reference: Tokenized | None = None
        if self.fast is not None:
            framing = self.fast.offsets([self.prompt])[0]
            self._prompt_tokens = len(framing.ids) if self.prompt else 0
            overhead = len(framing.head) + len(framing.tail) + self._prompt_tokens
        else:  # passages of whitespace words, their texts encoded (see _cut_text)
            self._prompt_tokens = len(self.prompt.split())
            overhead = 2 + self._prompt_tokens
        self.window = self.max_seq_length - overhead
        if self.window < 1:
            raise UserInputError(f"the model's max_seq_length ({self.max_seq_length}) leaves no token for a passage "
                                 f"after its special tokens and document prompt {self.prompt!r}")
        self.stride = default_stride(self.window) if stride is None else int(stride)
        if not 1 <= self.stride <= self.window:
            raise UserInputError(f"--stride must be between 1 and the passage window ({self.window} tokens: "
                                 f"max_seq_length {self.max_seq_length} less special tokens and the prompt), "
                                 f"got {self.stride}")

    def encode(self, documents: Sequence[StoredDocument], advance: Callable[[int], None] | None = None) -> Passages:
        """The passages of ``documents`` (spans name each document by its index in ``documents``).

        Example:
            >>> PassageEncoder(encoder).encode(store.documents_between(0, 8)).spans[:, 0].max()
            7
        """
        parts: list[Passages] = []
        pending: list[tuple[list[int], list[int], tuple[int, int, int]]] = []
        for first in range(0, len(documents), DOCUMENTS_PER_CALL):
            group = documents[first:first + DOCUMENTS_PER_CALL]
            texts = [self.prompt + document.encoded_text for document in group]
            tokenized = self.fast.offsets(texts) if self.fast is not None else None
            if self._agrees is None:
                self._agrees = self._probe(group, tokenized)
            for index, document in enumerate(group):
                if self._agrees:
                    pending.extend(self._cut(first + index, document, tokenized[index]))
                else:
                    pending.extend(([], [], span) for span in self._cut_text(first + index, document))
            while len(pending) >= PASSAGES_PER_CALL:
                parts.append(self._encode(pending[:PASSAGES_PER_CALL], documents))
                pending = pending[PASSAGES_PER_CALL:]
            if advance is not None:
                advance(len(group))
        if pending:
            parts.append(self._encode(pending, documents))
        return concatenated(parts, self.encoder.dimension)

    def _windows(self, starts: np.ndarray, prompt_tokens: int) -> list[tuple[int, int]]:
        """Windows of a document's tokens (``starts``: whether each begins a word) when the prompt in front of it
        took ``prompt_tokens`` (a prompt whose last piece merged with the text's first can take one more or less
        than alone)."""
        window = max(1, self.window + self._prompt_tokens - prompt_tokens)
        return token_windows(len(starts), window, min(self.stride, window), starts)

    def _cut(self, index: int, document: StoredDocument,
             tokens: TokenOffsets) -> list[tuple[list[int], list[int], tuple[int, int, int]]]:
        """One document's passages: (ids, type ids, (index, start, end) in its text)."""
        length = len(self.prompt)
        prompt_tokens = int((tokens.offsets[:, 0] < length).sum()) if length else 0
        body, types, offsets = tokens.ids[prompt_tokens:], tokens.type_ids[prompt_tokens:], tokens.offsets[prompt_tokens:]
        head, tail = list(tokens.head) + tokens.ids[:prompt_tokens].tolist(), list(tokens.tail)
        head_types = list(tokens.head_types) + tokens.type_ids[:prompt_tokens].tolist()
        out = []
        starts = word_starts(offsets, self.prompt + document.encoded_text)
        for start, end in self._windows(starts, prompt_tokens):
            characters = (int(offsets[start, 0]) - length, int(offsets[end - 1, 1]) - length) if end > start else (0, 0)
            out.append((head + body[start:end].tolist() + tail,
                        head_types + types[start:end].tolist() + list(tokens.tail_types),
                        (index, *text_span(document, *characters))))
        return out

    def _cut_text(self, index: int, document: StoredDocument) -> list[tuple[int, int, int]]:
        """Passages of a model whose tokenizer cannot be called directly: windows of whitespace words."""
        words = [(m.start(), m.end()) for m in _WORDS.finditer(document.encoded_text)]
        return [(index, *text_span(document, words[start][0] if words else 0, words[end - 1][1] if words else 0))
                for start, end in token_windows(len(words), self.window, self.stride)]

    def _probe(self, documents: Sequence[StoredDocument], tokenized: list[TokenOffsets] | None) -> bool:
        """Whether the first documents' first passages are exactly what the pipeline tokenizes for them."""
        if tokenized is None:
            return False
        sample = list(documents[:PROBE_DOCUMENTS])
        reference = self._tokenize_reference([document.encoded_text for document in sample])
        mine = self._tokenized([self._cut(i, d, tokenized[i])[0] for i, d in enumerate(sample)], reference)
        rows = np.arange(len(sample))
        ours, theirs = mine.batch(rows), reference.batch(rows)
        agrees = (np.array_equal(mine.lengths, reference.lengths)
                  and all(np.array_equal(ours[key], theirs[key]) for key in reference.values))
        if agrees:
            self._reference = reference
        else:
            logger.warning("passages: the model's Rust tokenizer, called directly, does not give the pipeline's "
                           "tokens; encoding the passages' texts instead (each passage tokenized again)")
        return agrees

    def _tokenize_reference(self, texts: list[str]) -> Tokenized:
        """``texts`` as the model's own encoding path tokenizes them (truncated at its window)."""
        from neobert_embed.inference.pipeline import engine_of

        return engine_of(self.encoder.model).tokenize(texts, self.prompt or None)

    def _tokenized(self, passages: Sequence[tuple[list[int], list[int], tuple[int, int, int]]],
                   reference: Tokenized) -> Tokenized:
        """The passages' ids as the pipeline holds tokenized texts (the reference's keys, padding, shared values)."""
        from neobert_embed.inference.tokenized import Tokenized

        rows = {"input_ids": [ids for ids, _, _ in passages],
                "attention_mask": [[1] * len(ids) for ids, _, _ in passages],
                "token_type_ids": [types for _, types, _ in passages]}
        return Tokenized.from_lists({key: rows[key] for key in reference.values if key in rows},
                                    padding=reference.padding, shared=reference.shared)

    def _encode(self, passages: Sequence[tuple[list[int], list[int], tuple[int, int, int]]],
                documents: Sequence[StoredDocument]) -> Passages:
        """Vectors of passages (ids, or for a model tokenized through its texts, spans)."""
        spans = np.asarray([span for _, _, span in passages], dtype=np.int64).reshape(-1, 3)
        encoder, model = self.encoder, self.encoder.model
        if not self._agrees:
            texts = [documents[i].text[start:end] or documents[i].encoded_text for i, start, end in spans.tolist()]
            return Passages(encoder.encode_in_length_order(texts, DOCUMENT_PROMPT), spans)
        from neobert_embed.inference.pipeline import encode_tokenized, engine_of

        tokenized = self._tokenized(passages, self._reference)
        vectors = encode_tokenized(engine_of(model), tokenized, batch_size=encoder.batch_size,
                                   normalize=encoder.normalized,
                                   name_row=lambda row: f"passage {row + 1} of document {int(spans[row, 0]) + 1}")
        return Passages(np.ascontiguousarray(vectors, dtype=np.float32), spans)




def _spans_path(directory: Path, chunk: int) -> Path:
    return Path(directory) / f"spans-{chunk:06d}.npy"


def write_spans(directory: Path, chunk: int, spans: np.ndarray) -> None:
    """Persist one encoded chunk's passage spans (atomically, before its vectors mark it finished)."""
    import io

    from neobert_embed.files import atomic_write_bytes

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(spans, dtype=np.int64).reshape(-1, 3))
    atomic_write_bytes(_spans_path(directory, chunk), buffer.getvalue())


def read_spans(directory: Path) -> np.ndarray:
    """Every span :func:`write_spans` left in ``directory``, in the order of their chunk numbers (their rows).

    Example:
        >>> read_spans(Path("runs/index.partial/shards")).shape
        (61, 3)
    """
    files = sorted(Path(directory).glob("spans-*.npy"), key=lambda path: int(path.stem.split("-")[1]))
    parts = [np.load(path, allow_pickle=False).reshape(-1, 3) for path in files]
    return np.concatenate(parts) if parts else np.empty((0, 3), dtype=np.int64)
