"""Pretraining documents: the text field of every record of a corpus, blank ones skipped.

Why: a corpus is read twice (once to learn a vocabulary, once to tokenize) and possibly resumed
mid-way, so reading must be deterministic and every bad record must be reported with its file and
line before hours are spent on it. Records come from :mod:`neobert_embed.sources` (every format,
directories, hub datasets with ``streaming`` for web-scale sets such as
``tiiuae/falcon-refinedweb``, whose documents are in the ``content`` field); this module checks
only the text field.

Example:
    >>> for text in iter_documents("corpus.jsonl", text_field="text"):
    ...     print(len(text))
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from neobert_embed.sources import iter_records


def iter_documents(corpus: str | Path, text_field: str = "text", split: str = "train",
                   streaming: bool = False) -> Iterator[str]:
    """Yield every non-blank document of ``corpus`` in a fixed order; errors name the file and line.

    Example:
        >>> next(iter_documents("corpus/", text_field="content"))
        'The first document.'
    """
    for where, record in iter_records(corpus, split=split, streaming=streaming, text_key=text_field,
                                      columns=[text_field]):
        if text_field not in record:
            raise where.error(f"field {text_field!r} is missing (keys: {sorted(map(str, record))[:8]}); "
                              "pass --text-field to name the field holding the document")
        text = record[text_field]
        if text is not None and not isinstance(text, str):
            raise where.error(f"field {text_field!r} must be a string, got {type(text).__name__}")
        if text and "\x00" in text:
            raise where.error("contains NUL bytes: this is not a text file; give a UTF-8 .txt (one "
                              "document per line), .jsonl or .parquet corpus")
        if text and text.strip():
            yield text
