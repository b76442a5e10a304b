"""Tokenizers for pretraining: an existing one, or a WordPiece vocabulary learned on the corpus.

Why: the tiny recipe must run offline, where bert-base-uncased cannot be downloaded, and a small
vocabulary (a few thousand pieces) makes the output softmax cheap enough for a 2-core CPU. The
trained vocabulary is saved as a standard ``BertTokenizerFast`` (uncased, [PAD]=0 … [MASK]=4), so
``AutoTokenizer``, sentence-transformers and ``train-contrastive`` load it like any BERT tokenizer.

Example:
    >>> tokenizer = train_wordpiece(["first document", "second one"], vocab_size=256, output="tok")
    >>> tokenizer("first one")["input_ids"][0] == tokenizer.cls_token_id
    True
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from neobert_embed.errors import UserInputError
from neobert_embed.files import atomic_directory

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
UNLIMITED_LENGTH = 1_000_000_000  # documents are split by packing, never truncated by the tokenizer


def train_wordpiece(texts: Iterable[str], vocab_size: int, output: str | Path):
    """Learn an uncased WordPiece vocabulary of at most ``vocab_size`` pieces; save it to ``output``."""
    from tokenizers.implementations import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    learner = BertWordPieceTokenizer(lowercase=True, clean_text=True, strip_accents=None)
    learner.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2,
                                special_tokens=SPECIAL_TOKENS, show_progress=False)
    with atomic_directory(output) as tmp:
        tokenizer = BertTokenizerFast(vocab=learner.get_vocab(), do_lower_case=True,
                                      model_max_length=UNLIMITED_LENGTH)
        tokenizer.save_pretrained(str(tmp))
    return load_tokenizer(str(output))


def load_tokenizer(source: str | Path):
    """Load a tokenizer from a directory or hub id with a clear error when that is impossible.

    Example:
        >>> load_tokenizer("google-bert/bert-base-uncased").mask_token
        '[MASK]'
    """
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError) as exc:
        raise UserInputError(
            f"cannot load tokenizer {source!r} ({str(exc).splitlines()[0]}); give a local tokenizer "
            "directory, a hub id reachable from here, or 'train' to learn a vocabulary on the corpus"
        ) from None
    if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
        raise UserInputError(f"tokenizer {source!r} has no [MASK] or [PAD] token; MLM pretraining needs both")
    tokenizer.model_max_length = UNLIMITED_LENGTH
    return tokenizer
