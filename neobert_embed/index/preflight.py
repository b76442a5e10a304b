"""Checks that ``index build`` runs before the expensive work: a wrong flag fails in seconds.

Why: an impossible ``--factory`` (``IVF99999,Flat`` on 300 documents) used to fail with a FAISS
traceback after the whole corpus was encoded. Counting the corpus is cheap next to encoding it
(raw lines for ``.jsonl``/``.txt``, metadata for parquet), and with the model's embedding width
read from its files, FAISS itself can be asked whether the factory string parses and whether the
corpus has enough vectors to train it: IVF needs at least one training vector per list, a product
quantizer at least ``2**bits`` vectors.

Example:
    >>> check_factory_for_corpus("IVF99999,Flat", count_documents("corpus.jsonl"), 384)
    Traceback (most recent call last):
    UserInputError: --factory 'IVF99999,Flat' needs at least 99999 documents ...
"""

from __future__ import annotations

import re
from pathlib import Path

from neobert_embed.errors import UserInputError
from neobert_embed.index.factory import choose_index_spec, create_index, ivf_lists
from neobert_embed.sources import source_format

_PQ = re.compile(r"PQ(\d+)(?:x(\d+))?")


def count_documents(corpus: str | Path) -> int | None:
    """Documents in a local corpus without parsing it (non-blank lines of JSON-lines and text
    files; parquet row counts); None for other sources, which are counted when imported.

    Example:
        >>> count_documents("corpus.jsonl")
        300
    """
    kind = source_format(corpus)
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            return int(pq.ParquetFile(corpus).metadata.num_rows)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise UserInputError(f"{corpus}: not a readable parquet file ({exc})") from None
    if kind not in ("jsonl", "txt"):
        return None
    with open(corpus, "rb") as handle:
        return sum(1 for line in handle if line.strip())


def check_factory_for_corpus(factory: str, documents: int, dimension: int) -> None:
    """Refuse a factory string FAISS cannot parse, or cannot train on ``documents`` vectors.

    Example:
        >>> check_factory_for_corpus("IVF16,Flat", 10_000, 384)
    """
    import faiss

    index = create_index(choose_index_spec("auto", max(documents, 1), dimension, factory=factory), dimension)
    ivf = faiss.try_extract_index_ivf(index) if isinstance(index, faiss.Index) else index
    nlist = int(getattr(ivf, "nlist", 0) or 0)
    if nlist > documents:
        raise UserInputError(f"--factory {factory!r} needs at least {nlist} documents to train its {nlist} "
                             f"lists, but the corpus has {documents}; use IVF{ivf_lists(documents)} or fewer "
                             "lists, or leave --factory out (the automatic choice fits the corpus)")
    for match in _PQ.finditer(factory):
        centroids = 2 ** int(match.group(2) or 8)
        if centroids > documents:
            raise UserInputError(f"--factory {factory!r}: its product quantizer needs at least {centroids} "
                                 f"documents to train, but the corpus has {documents}; use fewer bits "
                                 f"(PQ{match.group(1)}x4) or a flat/IVF index")
