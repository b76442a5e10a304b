"""Turning texts into embedding matrices: validation, truncation notice, storage precision.

Why: sentence-transformers rejects a bad input deep inside its preprocessing without saying
which one, and truncates long inputs silently. Users encoding a file need to know which line is
wrong and how many texts were cut.

Documented behaviour:
    * an empty or whitespace-only text is encoded as ``[CLS] [SEP]`` (a valid, content-free input);
    * a text longer than ``model.max_seq_length`` tokens is truncated, with ONE warning that counts them;
    * a non-string item raises ``TypeError`` naming its index.

Example:
    >>> from neobert_embed import load_sentence_model
    >>> from neobert_embed.encoding import encode_texts
    >>> vectors = encode_texts(load_sentence_model("neobert"), ["a cat", "a dog"])
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from neobert_embed.errors import UserInputError, listing
from neobert_embed.files import check_free_space
from neobert_embed.quantization import (
    Calibration,
    check_storage_precision,
    fit_calibration,
    load_calibration,
    quantize_with,
)
from neobert_embed.sentence import DOCUMENT_PROMPT
from neobert_embed.sources import iter_records, source_format

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

logger = logging.getLogger(__name__)

def check_texts(texts: Sequence[object]) -> list[str]:
    """Return ``texts`` as a list of strings, or raise ``TypeError`` naming the first bad index.

    Example:
        >>> check_texts(["ok", 3])
        Traceback (most recent call last):
        TypeError: texts[1] is int, not str: every input must be a string
    """
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, not one string: wrap it as [text]")
    checked = list(texts)
    for index, text in enumerate(checked):
        if not isinstance(text, str):
            raise TypeError(f"texts[{index}] is {type(text).__name__}, not str: every input must be a string")
    return checked


def quantize(embeddings: np.ndarray, precision: str, calibration: Calibration | None = None) -> np.ndarray:
    """Store float32 embeddings at ``precision`` (float16, int8 scalar-quantized, or packed binary).

    int8 and binary use :mod:`neobert_embed.quantization` (sentence-transformers' arithmetic) with
    ``calibration`` (a :class:`~neobert_embed.quantization.Calibration`); without one, int8 ranges
    are taken from these embeddings, so pass the calibration of earlier files to compare codes.

    Example:
        >>> quantize(np.ones((2, 16), dtype=np.float32), "binary").shape
        (2, 2)
    """
    check_storage_precision(precision)
    if precision == "float32":
        return embeddings.astype(np.float32, copy=False)
    if precision == "float16":
        return embeddings.astype(np.float16)
    return quantize_with(embeddings, calibration or fit_calibration(embeddings, precision))  # int8, binary


def encode_texts(
    model: SentenceTransformer,
    texts: Sequence[object],
    *,
    batch_size: int = 32,
    prompt_name: str | None = None,
    show_progress: bool = False,
) -> np.ndarray:
    """Encode ``texts`` with a SentenceTransformer after validating them; returns float32 (n, dim).

    Every text is tokenized once, ahead of the model, and batches are formed from length-sorted
    texts (:mod:`neobert_embed.inference.pipeline`); NeoBERT and the BERT family also skip pad
    tokens inside the model. The truncation warning comes from the same tokenization.

    Example:
        >>> encode_texts(model, ["", "a long text ..."], prompt_name="document").shape
        (2, 768)
    """
    checked = check_texts(texts)
    out = np.empty((len(checked), int(model.get_embedding_dimension())), dtype=np.float32)
    start = 0
    for vectors in _checked_chunks(model, checked, batch_size, prompt_name, show_progress):
        out[start:start + len(vectors)] = vectors
        start += len(vectors)
    return out


def encode_text_chunks(
    model: SentenceTransformer,
    texts: Sequence[object],
    *,
    batch_size: int = 32,
    prompt_name: str | None = None,
    show_progress: bool = False,
) -> Iterator[np.ndarray]:
    """:func:`encode_texts` one chunk of rows at a time, in input order: for a caller that writes the
    matrix as it goes, so a big input never holds its whole matrix in memory (``encode`` of a file).

    Example:
        >>> sum(len(rows) for rows in encode_text_chunks(model, texts))
        200000
    """
    return _checked_chunks(model, check_texts(texts), batch_size, prompt_name, show_progress)


def _checked_chunks(model: SentenceTransformer, checked: list[str], batch_size: int, prompt_name: str | None,
                    show_progress: bool) -> Iterator[np.ndarray]:
    """:func:`encode_text_chunks` of texts :func:`check_texts` passed (checked once, when the call is made)."""
    if not checked:
        return
    from neobert_embed.console import document_progress
    from neobert_embed.inference.pipeline import encode_chunks, engine_of
    from neobert_embed.sentence import resolve_prompt

    prompt = resolve_prompt(model, prompt_name)
    with document_progress(show_progress) as bar:
        task = bar.add_task("encoding", total=len(checked))
        for vectors in encode_chunks(engine_of(model), checked, prompt=prompt or None, batch_size=batch_size,
                                   on_truncated=functools.partial(_warn_truncated, model, len(checked))):
            bar.advance(task, len(vectors))
            yield vectors


def _warn_truncated(model: SentenceTransformer, total: int, truncated: int) -> None:
    if truncated:
        logger.warning("%d of %d texts are longer than max_seq_length=%d tokens and were truncated",
                       truncated, total, model.max_seq_length)


def used_line(model: SentenceTransformer, prompt_names: Sequence[str | None], field: str | None = None,
              compute: str | None = None) -> str:
    """One line saying what a model encodes with: compute precision, max_seq_length, prompts (name
    and text), field.

    Example:
        >>> used_line(model, ["document"], field="text", compute="bf16 (asked for)")
        "used: precision bf16 (asked for); max_seq_length 256; prompt 'document' = 'passage: '; field 'text'"
    """
    parts = [f"precision {compute}"] if compute else []
    parts.append(f"max_seq_length {model.max_seq_length}")
    from neobert_embed.sentence import resolve_prompt

    for name in prompt_names:
        text = resolve_prompt(model, name)
        shown = name if name and name in (model.prompts or {}) else f"{model.default_prompt_name} (default)"
        parts.append(f"prompt {shown!r} = {text!r}" if text else f"no {name} prompt" if name else "no prompt")
    if field is not None:
        parts.append(f"field {field!r}")
    return "used: " + "; ".join(parts)


def read_texts(path: str | Path, field: str = "text", keep_blank: bool = True) -> list[str]:
    """Read the ``field`` of every record of ``path`` (any format :mod:`neobert_embed.sources`
    reads; a ``.txt`` file holds one text per line).

    With ``keep_blank`` every line of a ``.txt`` file is a text, blank ones included, so row ``i``
    of the output matrix always belongs to line ``i + 1``.

    Errors name the file and line (or row): unreadable bytes, invalid JSON, a missing or
    non-string field. ``-`` reads standard input, and a FIFO or ``<(…)`` is read as a stream (text
    lines, or JSON lines when named ``*.jsonl``): the texts are read once.

    Example:
        >>> read_texts("docs.jsonl", field="body")[:1]
        ['first document']
    """
    texts = []
    for where, record in iter_records(path, keep_blank=keep_blank, text_key=field, stream=True):
        if field not in record:
            raise where.error(f"field {field!r} is missing; pass --field with the right name")
        if not isinstance(record[field], str):
            raise where.error(f"field {field!r} is {type(record[field]).__name__}, not a string")
        texts.append(record[field])
    if not texts:
        raise UserInputError(f"{path}: no texts found; the file is empty")
    return texts


@dataclass
class EncodeReport:
    """What ``encode_file`` did: how many texts, how fast, where the matrix went."""

    texts: int
    dimension: int
    precision: str
    seconds: float
    texts_per_second: float
    output: str
    max_seq_length: int = 0
    prompt_name: str | None = None
    prompt: str | None = None
    used: str = ""
    calibration: str | None = None
    compute_precision: str = "fp32"


ENCODE_WRITER = "neobert-embed encode"
BLANK_POLICIES = ("error", "skip", "keep")


def apply_blank_policy(texts: list[str], blank: str, source: str | Path) -> tuple[list[str], list[int]]:
    """The texts to encode and the 1-based rows left out, by the ``blank`` policy (see
    :func:`encode_file`); every blank text refused (``error``), or all of them blank, is one error.

    Example:
        >>> apply_blank_policy(["a", " ", "b"], "skip", "t.txt")
        (['a', 'b'], [2])
    """
    if blank not in BLANK_POLICIES:
        raise UserInputError(f"--blank {blank!r} is not one of {', '.join(BLANK_POLICIES)}")
    rows = [row for row, text in enumerate(texts, start=1) if not text.strip()]
    if len(rows) == len(texts):
        raise UserInputError(f"{source}: no text to encode (all {len(texts)} rows are blank)")
    if not rows or blank == "keep":
        return texts, []
    if blank == "error":
        raise UserInputError(f"{source}: {len(rows)} blank text(s) (rows {listing(rows, 5)}); pass --blank skip to leave "
                             "them out (OUTPUT.json lists their rows) or --blank keep to encode them as empty "
                             "texts (row i stays line i + 1)")
    return [text for text in texts if text.strip()], rows


def encode_file(
    model_name: str,
    input_path: str | Path,
    output_path: str | Path,
    *,
    field: str = "text",
    precision: str = "float32",
    batch_size: int = 32,
    max_seq_length: int | None = None,
    prompt_name: str | None = DOCUMENT_PROMPT,
    show_progress: bool = True,
    calibration: str | Path | None = None,
    overwrite: bool = False,
    compute_precision: str | None = None,
    backend: str = "torch",
    blank: str = "error",
) -> EncodeReport:
    """Encode every text of a file into an ``.npy`` matrix written atomically.

    Defaults are the model's own: its ``max_seq_length`` (a saved SentenceTransformer's, else what
    the encoder's positions allow) and its ``document`` prompt when it saved one (none otherwise);
    ``max_seq_length`` and ``prompt_name`` (None or '' for no prompt) override them. The report's
    ``used`` line says what was applied.

    Beside the matrix, ``OUTPUT.json`` records what made it (model, precision, texts) and, for int8
    and binary, the calibration; pass that file as ``calibration`` when encoding more texts so
    identical texts get identical codes. ``compute_precision`` is the precision the model's forward
    runs in (:mod:`neobert_embed.inference.runtime`; ``auto`` measures on the first texts of the
    file). Its default is ``auto``, except with a ``calibration`` whose sidecar records the precision
    its vectors were computed at: that one (on the torch backend), since two runs of ``auto`` may
    choose differently and a text's codes then differ by a step. ``backend`` runs an ``export`` output through ONNX Runtime or OpenVINO. ``blank``
    says what a blank text is (:data:`BLANK_POLICIES`): ``error`` (default: refused, naming its
    row), ``skip`` (left out; the sidecar's ``skipped_rows`` lists them) or ``keep`` (the empty text
    is encoded, so row ``i`` is always line ``i + 1``). Everything a user can get wrong (output path, calibration,
    length, model files, input lines) is checked before the model is loaded; an existing output is
    replaced only with ``overwrite`` and only if this command wrote it.

    Example:
        >>> report = encode_file("neobert", "docs.txt", "docs.npy", precision="int8")
        >>> encode_file("neobert", "queries.txt", "queries.npy", precision="int8",
        ...             calibration="docs.npy.json").texts_per_second
        412.7
    """
    from neobert_embed.inference.runtime import load_inference_model
    from neobert_embed.machine import check_compute_precision
    from neobert_embed.model_files import check_model_files
    from neobert_embed.outputs import claimed_file, sidecar_path
    from neobert_embed.sentence import resolve_prompt

    if compute_precision is not None:
        check_compute_precision(compute_precision)
    check_storage_precision(precision)
    if batch_size < 1:
        raise UserInputError(f"--batch-size must be positive, got {batch_size}")
    from neobert_embed.distributed import encode_across_ranks, init_world, on_main

    output_path = Path(output_path)
    with contextlib.ExitStack() as claim:  # the output's writer lock, from its check to its publication
        world = init_world()  # under torchrun, rank r encodes chunks i = r mod world; rank 0 writes the file

        def preflight():  # rank 0 checks; its refusal reaches every rank (no rank waits on a barrier)
            claim.enter_context(claimed_file(output_path, writer=ENCODE_WRITER, inputs=[input_path, calibration],
                                             overwrite=overwrite, suffix=".npy"))
            loaded = load_calibration(calibration) if calibration is not None else None
            if loaded is not None and loaded.precision != precision:
                raise UserInputError(f"--calibration {calibration} is for {loaded.precision} vectors but --store-precision "
                                     f"is {precision}; pass --store-precision {loaded.precision}")
            return loaded, check_model_files(model_name, max_seq_length, "--max-length")

        saved, checked = on_main(world, preflight)  # the model's files, inspected once: the loader reads no more
        texts, skipped = apply_blank_policy(read_texts(input_path, field), blank, input_path)
        # an exported graph (--backend onnx/openvino) computes as it was saved: no recorded precision applies
        follows = saved is not None and compute_precision is None and backend == "torch"
        recorded = saved.computed_at if follows else None
        loaded = load_inference_model(checked, compute_precision or recorded or "auto", device=world.device(None),
                                      backend=backend, max_seq_length=max_seq_length, sample_texts=texts,
                                      batch_size=batch_size, agree=functools.partial(on_main, world))
        model, compute = loaded.model, loaded.choice
        if recorded is not None:  # nobody asked: the used: line says where the precision came from
            compute = replace(compute, requested="calibration",
                              reason=f"the calibration's own: {calibration} was encoded at it")
        prompt_name = prompt_name or ""  # None, like '', is no prompt here
        prompt = resolve_prompt(model, prompt_name, required=None if prompt_name == DOCUMENT_PROMPT else "--prompt-name")
        if world.is_main:  # the matrix must fit beside the old one (replaced only once complete)
            check_free_space(output_path, stored_bytes(len(texts), model.get_embedding_dimension(), precision) + 4096,
                             what=f"the matrix of {len(texts)} texts")
        start = time.perf_counter()
        record = dict(model=model_name, input=str(input_path), texts=len(texts), compute=compute.to_json(), blank=blank,
                      skipped_rows=skipped, calibration_from=str(calibration) if calibration is not None else None)
        chunks = functools.partial(encode_text_chunks, model, batch_size=batch_size, prompt_name=prompt_name)
        dimension = int(model.get_embedding_dimension())
        if not world.distributed and streams(precision, saved):  # written as it goes: the matrix is never held
            fitted = _stream_matrix(output_path, chunks(texts, show_progress=show_progress), len(texts), dimension,
                                    precision, saved, **record)
        else:
            embeddings = encode_across_ranks(
                world, len(texts), lambda first, stop: encode_texts(model, texts[first:stop], batch_size=batch_size,
                                                                   prompt_name=prompt_name,
                                                                   show_progress=show_progress and world.is_main),
                Path(str(output_path) + ".parts"))
            if embeddings is None:  # not rank 0: rank 0 writes the matrix and reports
                return EncodeReport(texts=len(texts), dimension=dimension, precision=precision,
                                    seconds=round(time.perf_counter() - start, 3), texts_per_second=0.0,
                                    output=str(output_path), max_seq_length=int(model.max_seq_length),
                                    compute_precision=compute.description)
            fitted = _store_matrix(output_path, embeddings, precision, saved, **record)
        seconds = time.perf_counter() - start
        return EncodeReport(texts=len(texts), dimension=dimension, precision=precision,
                            seconds=round(seconds, 3), texts_per_second=round(len(texts) / max(seconds, 1e-9), 1),
                            output=str(output_path), max_seq_length=int(model.max_seq_length),
                            prompt_name=prompt_name if prompt else None, prompt=prompt or None,
                            used=used_line(model, [prompt_name],
                                           None if source_format(input_path, stream=True) == "txt" else field, compute.description)
                            + (f"; {len(skipped)} blank texts skipped (rows {listing(skipped, 5)})" if skipped else ""),
                            calibration=str(sidecar_path(output_path)) if fitted is not None else None,
                            compute_precision=compute.description)


def streams(precision: str, calibration: Calibration | None) -> bool:
    """Whether vectors stored at ``precision`` can be written as they are encoded: always for float32 and
    float16; for int8 and binary only with a ``calibration`` (else it is fitted on the whole matrix).

    Example:
        >>> streams("float16", None), streams("int8", None)
        (True, False)
    """
    return precision in ("float32", "float16") or calibration is not None


def _store_matrix(output_path: Path, embeddings: np.ndarray, precision: str, calibration: Calibration | None,
                  **record: Any) -> Calibration | None:
    """Write ``embeddings`` stored at ``precision`` and the sidecar saying how (:func:`_matrix_file`);
    return the int8/binary calibration used (``calibration``, or one fitted on these vectors).

    Example:
        >>> _store_matrix(Path("docs.npy"), vectors, "int8", None, model="bert", texts=2).precision
        'int8'
    """
    from neobert_embed.outputs import sidecar_path

    fitted = calibration
    if fitted is None and precision in ("int8", "binary"):
        fitted = fit_calibration(embeddings, precision, model=record.get("model"))
        logger.warning("%s codes use a calibration fitted on these %d texts: they compare only with codes "
                       "encoded with --calibration %s", precision, len(embeddings), sidecar_path(output_path))
    with _matrix_file(output_path, int(embeddings.shape[1]), precision, fitted, **record) as handle:
        np.save(handle, quantize(embeddings, precision, fitted), allow_pickle=False)
    return fitted


def _stream_matrix(output_path: Path, chunks: Iterator[np.ndarray], rows: int, dimension: int, precision: str,
                   calibration: Calibration | None, **record: Any) -> Calibration | None:
    """Write the ``rows`` vectors of ``chunks`` (float32, in row order) stored at ``precision`` as each
    chunk comes: the same bytes ``np.save`` writes for the whole matrix, with only one chunk in memory.
    Needs :func:`streams`; returns ``calibration``.

    Example:
        >>> _stream_matrix(Path("docs.npy"), iter([vectors]), len(vectors), 384, "float16", None, model="bert")
    """
    empty = quantize(np.zeros((0, dimension), dtype=np.float32), precision, calibration)  # the stored layout
    header = {"descr": np.lib.format.dtype_to_descr(empty.dtype), "fortran_order": False,
              "shape": (rows, int(empty.shape[1]))}
    written = 0
    with _matrix_file(output_path, dimension, precision, calibration, **record) as handle:
        np.lib.format.write_array_header_1_0(handle, header)
        for vectors in chunks:
            handle.write(np.ascontiguousarray(quantize(vectors, precision, calibration)))
            written += len(vectors)
        if written != rows:
            raise ValueError(f"encoded {written} rows, not {rows}")
    return calibration


@contextlib.contextmanager
def _matrix_file(output_path: Path, dimension: int, precision: str, calibration: Calibration | None,
                 **record: Any) -> Iterator[BinaryIO]:
    """The open temporary file of a matrix, published with its sidecar as one unit (the sidecar last,
    pinning the matrix: :func:`~neobert_embed.outputs.published_file`) when the block ends."""
    from neobert_embed.outputs import published_file

    with published_file(output_path, ENCODE_WRITER, **record, dimension=dimension, precision=precision,
                        calibration=calibration.to_json() if calibration is not None else None,
                        calibration_shared=record.get("calibration_from") is not None if calibration is not None
                        else None) as staged, open(staged.path, "wb") as handle:
        yield handle


def stored_bytes(rows: int, dimension: int, precision: str) -> int:
    """Bytes of a ``rows`` × ``dimension`` matrix stored at ``precision`` (its ``.npy`` header aside):
    what ``encode`` checks the free space against before it starts.

    Example:
        >>> stored_bytes(1000, 384, "int8"), stored_bytes(1000, 384, "binary")
        (384000, 48000)
    """
    per_row = {"float32": 4 * dimension, "float16": 2 * dimension, "int8": dimension,
               "binary": (dimension + 7) // 8}[precision]
    return rows * per_row


def report_json(report: EncodeReport) -> str:
    """One-line JSON of an :class:`EncodeReport` (what ``encode --json`` prints)."""
    return json.dumps(asdict(report))
