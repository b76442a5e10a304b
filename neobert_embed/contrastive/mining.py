"""Hard-negative mining: add the most confusable wrong documents to (query, positive) pairs.

Why: random in-batch negatives become easy quickly; negatives that a model ranks high but that are
not the positive carry the signal. This wraps sentence-transformers' ``mine_hard_negatives``
(FAISS search over the positives of the file) and writes JSON lines with ``anchor, positive,
negative_1..n`` — exactly what ``train-contrastive`` reads.

The model computes at ``--precision`` (default ``auto``: the fastest precision whose vectors stay
within cosine 0.9999 of fp32, measured on a few of the pairs being mined; see
:mod:`neobert_embed.inference.runtime`). Mining only ranks candidates, so that tolerance changes
no ranking that matters, and a large file is encoded up to ~2× faster on a CPU with bf16 units.
The choice is on the ``used:`` line and in the output's sidecar record (``precision``).

Example:
    >>> mine_negatives("bert", "pairs.jsonl", "mined.jsonl", num_negatives=3, range_min=10, range_max=50)
    PosixPath('mined.jsonl')
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

from neobert_embed.contrastive.data import load_examples
from neobert_embed.contrastive.recipe import DataSource
from neobert_embed.errors import UserInputError
from neobert_embed.files import check_free_space
from neobert_embed.machine import check_compute_precision, check_precision_fits, describe_machine
from neobert_embed.sentence import DOCUMENT_PROMPT, QUERY_PROMPT, resolve_prompt

if TYPE_CHECKING:
    from datasets import Dataset

MINE_WRITER = "neobert-embed mine-negatives"
logger = logging.getLogger(__name__)


def mine_negatives(model: str, data: str | Path, output: str | Path, *, num_negatives: int = 3,
                   range_min: int = 0, range_max: int | None = None, margin: float | None = None,
                   batch_size: int = 32, max_seq_length: int | None = None, overwrite: bool = False,
                   precision: str = "auto", device: str | None = None) -> Path:
    """Mine ``num_negatives`` hard negatives per row of ``data`` and write them to ``output``.

    Args:
        model: anything ``load_sentence_model`` accepts; its own ``max_seq_length`` and its
            "query"/"document" prompts (when saved) are used, as for training and search (one
            log line says what it encodes with).
        data: a file/dataset readable by ``train-contrastive`` (existing negatives are ignored).
        output: JSON-lines file to write (atomically).
        num_negatives: negatives per row; rows without enough candidates are dropped.
        range_min, range_max: only candidates ranked in [range_min, range_max) are considered;
            skipping the very top avoids false negatives (unlabelled positives).
        margin: keep a candidate only if its similarity is at least this far below the positive's.
        max_seq_length: override the model's own length.
        overwrite: replace an existing ``output`` (only one that mine-negatives wrote; the output
            is checked, like every input, before the model is loaded).
        precision: compute precision of the model's forward (``auto`` | ``fp32`` | ``bf16`` | ``fp16``
            | ``int8``); ``auto`` measures on a few of the pairs. Recorded in the sidecar.
        device: ``cpu``, ``cuda`` … (default: automatic).

    Example:
        >>> mine_negatives("runs/x", "pairs.parquet", "mined.jsonl", num_negatives=5, margin=0.05)
    """
    from neobert_embed.model_files import check_model_files
    from neobert_embed.outputs import claimed_file, published_file

    if num_negatives < 1:
        raise UserInputError(f"--num-negatives must be at least 1, got {num_negatives}")
    if batch_size < 1:
        raise UserInputError(f"--batch-size must be at least 1, got {batch_size}")
    if range_min < 0:
        raise UserInputError(f"--range {range_min}:{range_max}: ranks start at 0")
    if margin is not None and not (math.isfinite(margin) and margin >= 0):
        raise UserInputError(f"--margin {margin}: must be a finite number ≥ 0 (a score difference below the positive)")
    check_precision_fits(check_compute_precision(precision), describe_machine(device))
    with claimed_file(output, writer=MINE_WRITER, inputs=[data, model], overwrite=overwrite, suffix=".jsonl"):
        checked = check_model_files(model)  # handed to the loader: the files are inspected once
        if range_max is not None and range_max - range_min < num_negatives:
            raise UserInputError(f"--range {range_min}:{range_max} leaves fewer than {num_negatives} candidates")
        from sentence_transformers.util import mine_hard_negatives

        from neobert_embed.encoding import used_line
        from neobert_embed.inference.runtime import load_inference_model

        pairs = load_examples("mine", DataSource(path=str(data))).select_columns(["anchor", "positive"])
        if pairs.num_rows < 2:
            raise UserInputError(f"{data}: mining needs at least 2 rows (the positives are the candidates)")
        check_free_space(output, _mined_bytes(pairs["anchor"], pairs["positive"], num_negatives), what="the mined rows")
        loaded = load_inference_model(checked, precision, device=device, max_seq_length=max_seq_length,
                                      sample_texts=_sample_texts(pairs), batch_size=batch_size)
        sentence_model = loaded.model
        prompts = {"query_prompt": resolve_prompt(sentence_model, QUERY_PROMPT),
                   "corpus_prompt": resolve_prompt(sentence_model, DOCUMENT_PROMPT)}
        anchors, positives = pairs["anchor"], pairs["positive"]
        repeats = repeated_rows(list(zip(anchors, positives, strict=True)))
        logger.info(used_line(sentence_model, [QUERY_PROMPT, DOCUMENT_PROMPT], field="anchor/positive",
                              compute=loaded.choice.description) + _said(repeats, "duplicate (anchor, positive) rows left out"))
        mined = mine_hard_negatives(pairs, sentence_model, anchor_column_name="anchor",
                                    positive_column_name="positive", range_min=range_min, range_max=range_max,
                                    absolute_margin=margin, num_negatives=num_negatives, sampling_strategy="top",
                                    output_format="n-tuple", batch_size=batch_size, use_faiss=True, verbose=False,
                                    **prompts)
        if mined.num_rows == 0:
            raise UserInputError(f"{data}: no row got {num_negatives} negatives; widen --range, lower --margin "
                                 "or --num-negatives")
        kept = set(zip(mined["anchor"], mined["positive"], strict=True))
        repeated = {row for row, _ in repeats}
        short = [(row, None) for row, pair in enumerate(zip(anchors, positives, strict=True), start=1)
                 if row not in repeated and pair not in kept]
        if short:
            logger.warning("%s: %s", data, _said(short, f"rows with fewer than {num_negatives} negatives left out "
                                                         "(widen --range or lower --margin to keep them)").lstrip("; "))
        with published_file(output, MINE_WRITER, model=model, data=str(data), rows=mined.num_rows,
                            num_negatives=num_negatives, range=[range_min, range_max], margin=margin,
                            precision=loaded.choice.to_json(), duplicates_left_out=_dropped(repeats),
                            short_rows_left_out=_dropped(short)) as staged, \
                open(staged.path, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in mined)
        return Path(output)


def repeated_rows(pairs: list[tuple[str, str]]) -> list[tuple[int, int]]:
    """``(row, earlier row)`` of every pair that repeats an earlier one (1-based): what mining
    leaves out (sentence-transformers keeps one copy of each (anchor, positive) pair).

    Example:
        >>> repeated_rows([("q", "a"), ("q", "b"), ("q", "a")])
        [(3, 1)]
    """
    first: dict[tuple[str, str], int] = {}
    repeats = []
    for row, pair in enumerate(pairs, start=1):
        if pair in first:
            repeats.append((row, first[pair]))
        else:
            first[pair] = row
    return repeats


def _said(rows: list[tuple[int, int | None]], what: str) -> str:
    """``; 5 duplicate … rows left out (first: row 17, a repeat of row 3)`` for the used: line ('' for none)."""
    if not rows:
        return ""
    row, earlier = rows[0]
    return f"; {len(rows)} {what} (first: row {row}" + (f", a repeat of row {earlier})" if earlier else ")")


def _dropped(rows: list[tuple[int, int | None]]) -> dict[str, int | None]:
    """How many rows were left out and the first, for the sidecar record."""
    return {"count": len(rows), "first_row": rows[0][0] if rows else None}


def _mined_bytes(anchors: list[str], positives: list[str], num_negatives: int) -> int:
    """About how large the mined file is: each row holds its anchor, its positive and
    ``num_negatives`` positives of other rows, as JSON."""
    texts = sum(len(text.encode("utf-8")) for text in (*anchors, *positives))
    return int(texts * (2 + num_negatives) / 2 + 64 * len(anchors) * (2 + num_negatives))


def _sample_texts(pairs: Dataset, limit: int = 32) -> list[str]:
    """Anchors and positives spread through ``pairs``: what ``auto`` measures precisions on (both
    sides, since queries and documents differ in length)."""
    rows = pairs.num_rows
    picked = pairs.select(sorted({int(i * rows / limit) for i in range(min(limit, rows))}))
    return [text for row in picked for text in (row["anchor"], row["positive"]) if isinstance(text, str)]
