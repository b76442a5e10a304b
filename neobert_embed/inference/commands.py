"""CLI command of `neobert_embed.inference`: ``neobert-embed export`` (registered by `neobert_embed.cli`).

Why: the export, its checks and the runtimes (torch, onnx, onnxruntime, openvino, nncf) are
imported inside the command, so ``--help`` is instant and a bad ``--format``, ``--quantize`` or
``--output`` fails before any of them is loaded.

Example:
    $ neobert-embed export runs/my-embedder --format onnx --quantize int8 --output runs/my-embedder-onnx
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from neobert_embed import options as opt


def export(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="Registry key, hub id, HF or SentenceTransformer "
                                         "directory.")],
    output: Annotated[Path, typer.Option(
        "--output", "-o", help="Directory to write: the SentenceTransformer files plus the graph "
        "(onnx/model.onnx or openvino/openvino_model.xml).")],
    export_format: Annotated[str, typer.Option("--format", help="onnx or openvino.")],
    quantize: Annotated[str | None, typer.Option(
        "--quantize", help="int8: also write the int8 file (onnx/model_qint8_avx512_vnni.onnx or "
        "openvino/openvino_model_qint8_quantized.xml).")] = None,
    calibration: Annotated[Path | None, typer.Option(
        "--calibration", help="OpenVINO int8: texts (.txt, .jsonl, .csv, .parquet…) for static int8 "
        "quantization of activations too; without it only the weights become int8.")] = None,
    field: Annotated[str, typer.Option("--field", help="Field holding the text in --calibration "
                                       "(not for .txt).")] = "text",
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="Replace an existing output written by export (nothing else is ever replaced).")] = False,
    as_json: opt.AsJson = False,
    verbose: opt.Verbose = False,
) -> None:
    """Export a model as ONNX or OpenVINO files that sentence-transformers' backends load.

    The output is a complete SentenceTransformer directory (tokenizer, pooling, normalization,
    prompts) with the graph beside it. Every file written is checked against the torch fp32
    model (cosine of the sentence embeddings, also in OUTPUT/export.json); run it with
    neobert_embed.inference.backends.load_backend_model.
    """
    from neobert_embed.errors import UserInputError
    from neobert_embed.inference.export import FORMATS, QUANTIZATIONS

    if export_format not in FORMATS:
        raise UserInputError(f"--format {export_format!r} is not one of {', '.join(FORMATS)}")
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise UserInputError(f"--quantize {quantize!r} is not one of {', '.join(QUANTIZATIONS)}")
    if calibration is not None and not (export_format == "openvino" and quantize == "int8"):
        raise UserInputError("--calibration is used only with --format openvino --quantize int8")
    import json

    from neobert_embed.console import json_only_stdout, third_party_log
    from neobert_embed.inference.export import check_export_output, export_model

    check_export_output(output, model, overwrite)  # before the calibration file and the model are read
    texts = None
    if calibration is not None:
        from neobert_embed.encoding import read_texts

        texts = [text for text in read_texts(calibration, field=field, keep_blank=False) if text.strip()]
    with third_party_log(output, verbose), json_only_stdout(as_json):
        report = export_model(model, output, export_format, quantize, overwrite, calibration=texts)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        typer.echo(report.summary())


def register(app: typer.Typer) -> None:
    """Attach ``export`` to the main app."""
    app.command("export")(export)
