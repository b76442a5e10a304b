"""A prepared (tokenized) corpus on disk, opened without loading it into memory.

Why: packing needs random access to any slice of any document and the length of every document;
the Arrow shards are memory-mapped, so opening a corpus of billions of tokens costs only its
offsets, and the operating system pages tokens in as rows are built.

Example:
    >>> corpus = load_prepared("runs/prepared")
    >>> corpus.tokens(0, 0, 5)          # first five token ids of document 0
    array([  2, 512, 873,  91, 404], dtype=int32)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from neobert_embed.errors import UserInputError
from neobert_embed.files import named_path
from neobert_embed.records import CORPUS_MANIFEST, CORPUS_SHARDS_KEY

SHARDS_DIR = "shards"  # a prepared corpus's Arrow shards of token ids
TOKENIZER_DIR = "tokenizer"  # the tokenizer those ids come from, saved beside them


def is_prepared(path: str | Path) -> bool:
    """True when ``path`` is a completely prepared corpus directory (its ``corpus.json``, or a
    ``manifest.json`` from before that name that lists shards: an index's manifest does not)."""
    return CORPUS_MANIFEST.exists(path)


@dataclass
class PreparedCorpus:
    """Token ids of every document, plus the tokenizer that produced them."""

    path: Path
    lengths: np.ndarray
    _flat: list[np.ndarray] = field(repr=False)
    _shard_of_doc: np.ndarray = field(repr=False)
    _start_of_doc: np.ndarray = field(repr=False)

    @property
    def num_documents(self) -> int:
        return int(self.lengths.size)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def tokens(self, doc: int, start: int, stop: int) -> np.ndarray:
        """Token ids ``start:stop`` of document ``doc`` (a zero-copy view)."""
        base = self._start_of_doc[doc]
        return self._flat[self._shard_of_doc[doc]][base + start: base + stop]

    @cached_property
    def tokenizer(self):
        """The tokenizer saved with the corpus."""
        from neobert_embed.pretraining.vocab import load_tokenizer

        return load_tokenizer(self.path / TOKENIZER_DIR)


def load_prepared(path: str | Path) -> PreparedCorpus:
    """Open a directory written by :func:`prepare_corpus`.

    Example:
        >>> load_prepared("runs/prepared").num_documents
        9120
    """
    import pyarrow as pa

    path = Path(path)
    if not is_prepared(path):
        raise UserInputError(f"{path}: not a prepared corpus (no {CORPUS_MANIFEST.name}); run "
                             "`neobert-embed pretrain prepare` on it, or finish the interrupted run")
    names = CORPUS_MANIFEST.read(path).get(CORPUS_SHARDS_KEY)
    if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
        raise UserInputError(f"{CORPUS_MANIFEST.path(path)}: damaged {CORPUS_MANIFEST.holds} "
                             f"({CORPUS_SHARDS_KEY!r} must list the shard files); {CORPUS_MANIFEST.fix}")
    flats, shard_ids, starts, lengths = [], [], [], []
    for shard_index, name in enumerate(names):
        shard = named_path(path / SHARDS_DIR, name, what="shard", source=CORPUS_MANIFEST.path(path))
        try:
            with pa.memory_map(str(shard)) as source:
                table = pa.ipc.open_stream(source).read_all()
        except (OSError, pa.ArrowInvalid) as exc:
            raise UserInputError(f"{shard}: unreadable shard ({exc}); delete {path} and prepare again") from None
        ids = table.column("input_ids").combine_chunks()
        flats.append(ids.values.to_numpy(zero_copy_only=True))
        offsets = ids.offsets.to_numpy()
        starts.append(offsets[:-1].astype(np.int64))
        lengths.append(np.diff(offsets).astype(np.int64))
        shard_ids.append(np.full(len(ids), shard_index, dtype=np.int32))
    return PreparedCorpus(path, np.concatenate(lengths), flats, np.concatenate(shard_ids),
                          np.concatenate(starts))
