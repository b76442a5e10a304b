"""Top-level CLI commands that belong to no single area: ``encode``, ``export`` (and the demo).

Heavy libraries (torch, the runtimes of ``export``: onnx, onnxruntime, openvino, nncf) are imported
inside the commands, so ``--help`` is instant and a bad option fails before any of them is loaded.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from neobert_embed import options as opt

if TYPE_CHECKING:
    from rich.console import Console

    from neobert_embed.demo.run import Stage


def encode(
    model: str = typer.Option(..., "--model", "-m", help="Registry key, hub id, HF or SentenceTransformer directory."),
    input_path: Path = typer.Option(..., "--input", "-i", help="Texts: .txt (one per line), .jsonl, .json, .csv, "
                                    ".parquet, a directory of them, or a dataset."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the embedding matrix (.npy)."),
    field: str = typer.Option("text", "--field", help="Field holding the text (not for .txt)."),
    store_precision: opt.StorePrecision = None,
    batch_size: opt.BatchSize = 32,
    max_length: opt.MaxLength = None,
    prompt_name: str = typer.Option("document", "--prompt-name", help="Saved prompt to prepend (default "
                                    "'document' when the model saved one; '' for none)."),
    as_json: opt.AsJson = False,
    calibration: Path = typer.Option(None, "--calibration", help="int8/binary calibration to reuse: the "
                                     "OUTPUT.npy.json of an earlier encode (identical texts, identical codes; "
                                     "the model then computes at that encode's precision unless --precision "
                                     "is given)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing output written by encode."),
    verbose: opt.Verbose = False,
    precision: opt.ComputePrecision = None,  # None: auto, or the precision --calibration's vectors came from
    backend: opt.Backend = "torch",
    blank: str = typer.Option("error", "--blank", help="A blank text is an error (default, naming its row), "
                              "skip (left out; OUTPUT.json lists the rows) or keep (encoded as an empty text, "
                              "so row i is line i + 1)."),
) -> None:
    """Encode a file of texts into an .npy matrix (length-batched, with progress).

    Beside OUTPUT, OUTPUT.json records the model, the compute precision (and why), the stored
    precision and (int8/binary) calibration.
    """
    from neobert_embed.console import json_only_stdout, third_party_log
    from neobert_embed.encoding import encode_file, report_json
    from neobert_embed.quantization import check_storage_precision

    store_precision = store_precision or "float32"
    check_storage_precision(store_precision)
    with third_party_log(output, verbose), json_only_stdout(as_json):
        report = encode_file(model, input_path, output, field=field, precision=store_precision,
                             batch_size=batch_size, max_seq_length=max_length, prompt_name=prompt_name,
                             show_progress=not as_json, calibration=calibration, overwrite=overwrite,
                             compute_precision=precision, backend=backend, blank=blank)
    typer.echo(report.used, err=True)
    if as_json:
        typer.echo(report_json(report))
    else:
        typer.echo(f"encoded {report.texts} texts → {report.output} ({report.dimension}-d, {report.precision}) "
                   f"in {report.seconds:.1f} s: {report.texts_per_second:.1f} docs/s")


def demo(
    output: Path = typer.Option(Path("runs/demo"), "--output", "-o", help="Where every demo output goes."),
    fresh: bool = typer.Option(False, "--fresh", help="Start over instead of skipping finished stages."),
    quick: bool = typer.Option(False, "--quick", help="Seconds-long sizes for smoke tests (scores mean nothing)."),
    no_wait: opt.NoWait = False,
    verbose: opt.Verbose = False,
) -> None:
    """Run the whole pipeline offline on the Python standard library's docstrings.

    Pretrains a small NeoBERT, fine-tunes it and the real all-MiniLM-L6-v2 contrastively on
    (summary, body) pairs, evaluates them beside their starting points on a held-out retrieval
    task, then indexes the corpus with FAISS and searches it with held-out queries, the fine-tuned
    MiniLM's hits beside the base model's. Third-party output goes to OUTPUT/demo.log. Finished
    stages are skipped when the command is rerun (after Ctrl-C, say); --fresh starts over.
    """
    from neobert_embed.console import user_console
    from neobert_embed.demo.run import LOG_NAME, DemoSettings, run_demo
    from neobert_embed.demo.summary import print_summary

    console = user_console()
    console.print(f"[bold]neobert-embed demo[/] → {output} (rerun to continue after an interruption)")
    settings = DemoSettings.quick() if quick else DemoSettings()
    with StageDisplay(console) as display:
        report = run_demo(output, settings, fresh=fresh, wait=not no_wait, on_start=display.start,
                          on_stage=display.finish, verbose=verbose)
    print_summary(report, console)
    console.print(f"third-party warnings and progress bars: {output / LOG_NAME}")


class StageDisplay:
    """One spinner line per running stage (:func:`~neobert_embed.console.spinner`), replaced by a
    ✓ line with its time and key figure."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.running = contextlib.ExitStack()

    def start(self, name: str) -> None:
        from neobert_embed.console import spinner

        self.stop()
        self.running.enter_context(spinner(f"{name}…", self.console))

    def finish(self, stage: Stage) -> None:
        self.stop()
        self.console.print(f"[green]✓[/] {stage.name} ({stage.seconds:.0f} s): {stage.figure}")

    def stop(self) -> None:
        self.running.close()

    def __enter__(self) -> StageDisplay:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


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
    no_wait: opt.NoWait = False,
    as_json: opt.AsJson = False,
    verbose: opt.Verbose = False,
) -> None:
    """Export a model as ONNX or OpenVINO files that sentence-transformers' backends load.

    The output is a complete SentenceTransformer directory (tokenizer, pooling, normalization,
    prompts) with the graph beside it. Every file written is checked against the torch fp32
    model (cosine of the sentence embeddings, also in OUTPUT/export.json); run it with
    --backend onnx|openvino (encode, index, serve).
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
        report = export_model(model, output, export_format, quantize, overwrite, calibration=texts,
                              wait=not no_wait)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        typer.echo(report.summary())


def register(app: typer.Typer) -> None:
    """Attach ``encode``, ``export`` and ``demo`` to the main app."""
    app.command("encode")(encode)
    app.command("export")(export)
    app.command("demo")(demo)
