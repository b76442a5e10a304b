"""``neobert-embed export``: a model as ONNX or OpenVINO files in sentence-transformers' own layout.

Why: serving stacks without PyTorch need the encoder as a graph, and a graph that silently computes
something else is worse than none. The export writes ``model.save``'s directory plus the graph where
sentence-transformers' ``backend=`` loaders look for it, then encodes texts with every file written
through the light runtime (what users run) and compares them with the torch fp32 model: an fp32 file
below a mean cosine of 0.9999 is refused. Figures and file hashes go into ``export.json``; how each
file is made and what it measured: docs/performance.md ("Export"). Example: :func:`export_model`.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neobert_embed.errors import UserInputError
from neobert_embed.records import EXPORT

if TYPE_CHECKING:
    import numpy as np
    import openvino
    import torch
    from sentence_transformers import SentenceTransformer
    from torch import nn


logger = logging.getLogger(__name__)

WRITER = "neobert-embed export"
FORMATS = ("onnx", "openvino")
QUANTIZATIONS = ("int8",)
OPSET = 17
FP32_MIN_MEAN_COSINE = 0.9999
EXPORT_COPIES = 2.0  # an export holds the model's weights twice: the SentenceTransformer files and the graph
INT8_COPY = 0.3  # and a quarter more (plus headers) for an int8 graph
#: Below this mean cosine to fp32 on the check texts, an int8 file is reported with a warning. Lower than
#: the target the settings were chosen for (mean 0.995, minimum 0.98 over 256 real texts): activations are
#: quantized with one scale per batch, so the few very short check texts ("ok") are the worst case.
INT8_WARN_MEAN = 0.99
#: Texts every exported file is checked on: short and long, punctuation, digits, several scripts.
CHECK_TEXTS = (
    "A man is playing a guitar on the street.",
    "how do I reset my password?",
    "The quarterly report shows revenue grew 12.5% to $4.2 billion, driven by cloud services and "
    "strong demand in Asia, while operating costs fell for the third straight quarter.",
    "Cats sleep.",
    "def add(a, b):\n    return a + b  # adds two numbers",
    "Le chat dort sur le canapé pendant que la pluie tombe.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "東京は日本の首都です。",
    "Scientists discovered a new species of frog in the Amazon rainforest, whose bright colours warn "
    "predators that its skin is poisonous; the team published their findings after three years of "
    "field work across remote river valleys and mountain slopes.",
    "What is the boiling point of water at sea level?",
    "NASA's rover sent back images of an ancient river delta on Mars.",
    "ok",
    "Stocks rallied on Friday after the central bank signalled that interest rates would stay on hold.",
    "Instructions: mix 200 g flour, 2 eggs and 300 ml milk; rest 30 min; fry thin pancakes.",
    "Is this the right way to the train station?",
    "The patient reported mild headaches and dizziness after starting the new medication.",
)
TRACE_TEXTS = ("a short text", "a somewhat longer text than the first one, so the batch is padded", "mid length")


@dataclass(frozen=True)
class Agreement:
    """Cosine of a file's pooled sentence embeddings to the torch fp32 model's, over ``texts`` texts."""

    mean: float
    minimum: float
    texts: int


@dataclass
class ExportReport:
    """What :func:`export_model` wrote and how closely it agrees with the torch model: ``file`` is the one a
    runtime loads (the int8 one with ``quantize``; its size with OpenVINO's ``.bin``), ``files`` every graph
    written, ``source_fingerprint`` the weights' (an index built with them accepts this export)."""

    source: str
    output: Path
    format: str
    quantize: str | None
    file: Path
    size_bytes: int
    fp32: Agreement
    int8: Agreement | None
    files: dict[str, int]
    inputs: tuple[str, ...]
    method: str | None = None
    seconds: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)
    source_fingerprint: str | None = None

    def summary(self) -> str:
        """One line: the file, its size and its cosine to the torch fp32 model: ``exported runs/my-embedder →
        runs/my-embedder-onnx/onnx/model_qint8_avx512_vnni.onnx (33.6 MB); cosine to torch fp32: ...``."""
        checked = self.int8 or self.fp32
        line = (f"exported {self.source} → {self.file} ({self.size_bytes / 1e6:.1f} MB); cosine to torch fp32: "
                f"mean {checked.mean:.6f}, min {checked.minimum:.6f} on {checked.texts} texts")
        if self.int8 is not None:
            line += f" ({self.method}; the fp32 graph beside it: mean {self.fp32.mean:.6f})"
        return f"{line}, in {self.seconds:.1f} s"

    def to_json(self) -> dict[str, Any]:
        """The report as JSON values (paths as strings)."""
        return {**asdict(self), "output": str(self.output), "file": str(self.file)}


def check_export_output(output: str | Path, source: str | Path, overwrite: bool) -> None:
    """Refuse, before any model is loaded, an output that is a file, is unwritable, is the source, or
    holds something: an earlier export is replaced only with ``overwrite``, anything else never.

    Example:
        >>> check_export_output("runs/x-onnx", "runs/x", overwrite=False)
    """
    from neobert_embed.outputs import DirectoryState, check_output_directory

    output = Path(output)
    state = check_output_directory(output, **_claim(output, source, overwrite))
    if state is DirectoryState.OWNED and not overwrite:
        raise UserInputError(f"--output {output} already holds an export; pass --overwrite to replace it or choose "
                             "another path")


def _claim(output: Path, source: str | Path, overwrite: bool) -> dict[str, Any]:
    """What makes ``output`` this command's to write (see :func:`~neobert_embed.runs.claimed_directory`)."""
    return dict(record=EXPORT, inputs=[source] if Path(source).exists() else [], what="model export",
                replace="--overwrite" if overwrite else None, writer=WRITER)


def export_model(
    source: str | Path,
    output_dir: str | Path,
    format: str = "onnx",  # noqa: A002  (the CLI's --format)
    quantize: str | None = None,
    overwrite: bool = False,
    *,
    calibration: Sequence[str] | None = None,
    texts: Sequence[str] = CHECK_TEXTS,
    wait: bool = True,
) -> ExportReport:
    """Export ``source`` to ``output_dir`` as a SentenceTransformer directory with an ONNX or OpenVINO graph.

    Args:
        source: registry key, hub id, Hugging Face or SentenceTransformer directory (loaded fp32 on CPU).
        output_dir: absent, empty, or an earlier export (replaced with ``overwrite``).
        quantize: ``int8`` to also write the int8 file.
        calibration: OpenVINO int8 only: real texts for static quantization (a few hundred are plenty);
            without them the weights alone are compressed to int8.
        texts: the texts each written file is checked on against the torch fp32 model.
        wait: when another command writes ``output_dir``, wait for it (default); False fails at once.

    Nothing is written when it raises (a bad format or output, or an fp32 graph below a mean cosine of 0.9999).

    Example:
        >>> export_model("sentence-transformers/all-MiniLM-L6-v2", "models/minilm-openvino", "openvino").fp32
        Agreement(mean=1.0, minimum=0.9999998, texts=16)
    """
    started = time.perf_counter()
    if format not in FORMATS:
        raise UserInputError(f"--format {format!r} is not one of {', '.join(FORMATS)}")
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise UserInputError(f"--quantize {quantize!r} is not one of {', '.join(QUANTIZATIONS)}")
    if calibration is not None and not (format == "openvino" and quantize == "int8"):
        raise UserInputError("--calibration is used only by --format openvino --quantize int8 (ONNX int8 "
                             "quantizes activations per batch and needs none)")
    if not texts:
        raise UserInputError("texts: give at least one text to check the exported files on")
    output = Path(output_dir)
    check_export_output(output, source, overwrite)

    from neobert_embed.artifact_hashes import PINS_KEY, pin_export
    from neobert_embed.files import atomic_directory, check_free_space, remove_debris
    from neobert_embed.inference.runners import GRAPH_FILES
    from neobert_embed.inference.runtime import model_fingerprint
    from neobert_embed.model_files import model_bytes
    from neobert_embed.runs import claimed_directory
    from neobert_embed.sentence import load_sentence_model

    fp32_name, int8_name = GRAPH_FILES[format]
    # One writer at a time; a writer killed earlier left a temporary sibling, removed here.
    with claimed_directory(output, command=WRITER, wait=wait, on_stale=lambda _: remove_debris(output),
                           **_claim(output, source, overwrite)):
        check_export_output(output, source, overwrite)  # again, now that no one else writes it
        check_free_space(output, model_bytes(source, EXPORT_COPIES + (INT8_COPY if quantize else 0.0)),
                         what=f"the {format} export of {source}")
        model = load_sentence_model(source, device="cpu", precision="fp32")
        fingerprint = model_fingerprint(model)  # before anything else touches the weights
        graph, inputs = _traceable_encoder(model)
        reference = model.encode(list(texts), batch_size=8, convert_to_numpy=True)
        with atomic_directory(output, record=EXPORT.name) as tmp:
            model.save(str(tmp))
            onnx_file = tmp / GRAPH_FILES["onnx"][0]
            _export_onnx(graph, model, inputs, onnx_file)
            if format == "openvino":
                import openvino as ov

                ov_model = ov.convert_model(str(onnx_file))
                (tmp / fp32_name).parent.mkdir(exist_ok=True)
                ov.save_model(ov_model, str(tmp / fp32_name), compress_to_fp16=False)
                onnx_file.unlink()
                onnx_file.parent.rmdir()
            fp32 = _agreement(reference, _encode_file(model, tmp, format, False, texts))
            if fp32.mean < FP32_MIN_MEAN_COSINE:
                raise UserInputError(f"{source}: the exported {format} graph does not compute what the torch model does "
                                     f"(mean cosine {fp32.mean:.6f} < {FP32_MIN_MEAN_COSINE} on {fp32.texts} texts); "
                                     "nothing was written. Please report this model's architecture")
            method, int8 = None, None
            if quantize == "int8":
                method = (_quantize_openvino(ov_model, tmp / int8_name, model, inputs, calibration)
                          if format == "openvino" else _quantize_onnx(onnx_file, tmp / int8_name))
                int8 = _agreement(reference, _encode_file(model, tmp, format, True, texts))
            if int8 is not None and int8.mean < INT8_WARN_MEAN:
                logger.warning("%s int8: cosine to fp32 mean %.4f (min %.4f) is below %.2f; check the model's "
                               "quality on your task before using it", format, int8.mean, int8.minimum, INT8_WARN_MEAN)
            files = {name: _size(tmp / name) for name in (fp32_name, int8_name) if (tmp / name).is_file()}
            report = ExportReport(source=str(source), output=output, format=format, quantize=quantize,
                                  file=output / (int8_name if quantize else fp32_name),
                                  size_bytes=files[int8_name if quantize else fp32_name], fp32=fp32, int8=int8,
                                  files=files, inputs=inputs, method=method, versions=_versions(format),
                                  source_fingerprint=fingerprint, seconds=time.perf_counter() - started)
            record = {**report.to_json(), "writer": WRITER, "opset": OPSET,
                      "file": str(report.file.relative_to(output))}  # relative: the directory may move
            del record["output"]
            record[PINS_KEY] = pin_export(tmp)  # every file written above; checked at each load
            EXPORT.write(tmp, record)
    return report


def _size(file: Path) -> int:
    """Bytes of a graph file (an OpenVINO ``.xml`` with its ``.bin``)."""
    weights = file.with_suffix(".bin")
    return file.stat().st_size + (weights.stat().st_size if file.suffix == ".xml" and weights.is_file() else 0)


def _versions(format: str) -> dict[str, str]:  # noqa: A002
    import importlib.metadata as metadata

    names = ("torch", "onnx", "onnxruntime", *(("openvino", "nncf") if format == "openvino" else ()))
    found = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):  # a runtime not installed
            found[name] = metadata.version(name)
    return found


def _agreement(reference: np.ndarray, candidate: np.ndarray) -> Agreement:
    import numpy as np

    reference, candidate = np.asarray(reference, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    cosines = (reference * candidate).sum(1) / np.maximum(
        np.linalg.norm(reference, axis=1) * np.linalg.norm(candidate, axis=1), 1e-12)
    return Agreement(mean=round(float(cosines.mean()), 7), minimum=round(float(cosines.min()), 7),
                     texts=len(cosines))


def _encode_file(model: SentenceTransformer, directory: Path, backend: str, quantized: bool,
                 texts: Sequence[str]) -> np.ndarray:
    """Sentence embeddings of ``texts`` from a written file in fp32, by the light runtime (what ``--backend
    onnx|openvino`` runs); a pipeline it refuses (a Dense module) as sentence-transformers' loaders run it."""
    from neobert_embed.inference.light import TORCH_HINT, load_light_model
    from neobert_embed.inference.runners import locate_graph

    fp32 = "fp32" if backend == "openvino" else None
    try:
        light = load_light_model(directory, backend, quantized=quantized, inference_precision=fp32)
    except UserInputError as exc:
        if TORCH_HINT not in str(exc):
            raise
        return _encode_around_graph(model, locate_graph(directory, backend, quantized).file, backend, texts)
    return light.encode(list(texts), batch_size=8)


def _encode_around_graph(model: SentenceTransformer, file: Path, backend: str, texts: Sequence[str]) -> np.ndarray:
    """``model.encode(texts)`` with the graph's hidden states in place of its encoder's (a forward hook on
    the Transformer module, removed after)."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from neobert_embed.inference.runners import make_runner

    runner = make_runner(file, backend, torch.get_num_threads(), None, "fp32" if backend == "openvino" else None)

    def graph_output(_module: nn.Module, _inputs: object, features: dict[str, Any]) -> dict[str, Any]:
        zeros = torch.zeros_like(features["input_ids"])  # for token_type_ids the tokenizer did not make
        hidden = runner({name: features.get(name, zeros).numpy().astype(np.int64) for name in runner.input_names})
        features["token_embeddings"] = torch.from_numpy(np.asarray(hidden, dtype=np.float32))
        return features

    hook = model[0].register_forward_hook(graph_output)
    try:  # sentence-transformers' own encode, which runs the modules (a loader's subclass may not)
        return SentenceTransformer.encode(model, list(texts), batch_size=8, convert_to_numpy=True)
    finally:
        hook.remove()


def _traceable_encoder(model: SentenceTransformer) -> tuple[nn.Module, tuple[str, ...]]:
    """A module mapping the graph's inputs to ``last_hidden_state``, and their names: ``token_type_ids`` is
    one when the tokenizer makes them and the model's forward takes them (BERT; not RoBERTa nor NeoBERT)."""
    import copy
    import inspect

    from sentence_transformers.base.modules.transformer import Transformer
    from torch import nn

    from neobert_embed.modeling import NeoBERTModel
    from neobert_embed.modeling.padded_export import PaddedNeoBERT

    first = model[0]
    if not isinstance(first, Transformer) or first.auto_model is None:
        raise UserInputError(f"the model's first module is {type(first).__name__}, not a Hugging Face Transformer "
                             "encoder; only Transformer-based SentenceTransformers can be exported")
    encoder = copy.deepcopy(first.auto_model).float().eval()
    if isinstance(encoder, NeoBERTModel):
        encoder.config.attention_backend = "padded"  # the copy only: the saved model keeps its setting
        return PaddedNeoBERT(encoder).eval(), ("input_ids", "attention_mask")
    produced = model.preprocess(list(TRACE_TEXTS))
    accepted = inspect.signature(encoder.forward).parameters
    names = tuple(name for name in ("input_ids", "attention_mask", "token_type_ids")
                  if name in produced and (name in accepted or name == "input_ids"))

    class LastHiddenState(nn.Module):  # positional inputs → last_hidden_state: what the exporter traces
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return self.encoder(**dict(zip(names, inputs, strict=True)), return_dict=True).last_hidden_state

    return LastHiddenState().eval(), names


def _export_onnx(graph: nn.Module, model: SentenceTransformer, inputs: tuple[str, ...], file: Path) -> None:
    """Trace ``graph`` on a padded batch and write it with dynamic batch and sequence axes."""
    import torch

    from neobert_embed.inference.runners import OUTPUT_NAME

    sample = model.preprocess(list(TRACE_TEXTS))
    args = tuple(sample[name] for name in inputs)
    axes = {name: {0: "batch_size", 1: "sequence_length"} for name in (*inputs, OUTPUT_NAME)}
    file.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter: onnxscript is not needed
        warnings.filterwarnings("ignore", message="Exporting aten::index operator")  # arange indices (masks)
        torch.onnx.export(graph, args, str(file), dynamo=False, opset_version=OPSET, input_names=list(inputs),
                          output_names=[OUTPUT_NAME], dynamic_axes=axes, do_constant_folding=True)


def _quantize_onnx(fp32: Path, int8: Path) -> str:
    """Dynamic int8: per-channel int8 weights of the weight MatMuls and embedding tables, uint8 activations
    per batch. The FFN's down-projections (MatMuls that narrow: ``in > out``), whose input is the
    heavy-tailed GELU/SwiGLU output, stay fp32 (docs/performance.md has the agreement with and without)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(fp32), load_external_data=False).graph
    shapes = {tensor.name: tuple(tensor.dims) for tensor in graph.initializer}
    kept = [node.name for node in graph.node if node.op_type == "MatMul"
            and len(shape := shapes.get(node.input[1], ())) == 2 and shape[0] > shape[1]]
    quantize_dynamic(str(fp32), str(int8), per_channel=True, weight_type=QuantType.QInt8,
                     op_types_to_quantize=["MatMul", "Gather"], nodes_to_exclude=kept,
                     extra_options={"MatMulConstBOnly": True})
    return (f"onnxruntime dynamic int8: per-channel int8 weights, uint8 activations; {len(kept)} FFN "
            "down-projections kept fp32")


def _quantize_openvino(ov_model: openvino.Model, xml: Path, model: SentenceTransformer, inputs: tuple[str, ...],
                       calibration: Sequence[str] | None) -> str:
    """nncf static int8 (weights and activations) with ``calibration`` texts, else int8 weight compression
    (compute stays fp32/bf16: it saves memory more than time); returns the method."""
    import nncf
    import openvino as ov

    if calibration:  # one text per item: padding would enter the activation statistics
        items = nncf.Dataset(calibration, lambda text: {name: value.numpy() for name, value
                                                        in model.preprocess([text]).items() if name in inputs})
        quantized = nncf.quantize(ov_model, items, model_type=nncf.ModelType.TRANSFORMER,
                                  subset_size=len(calibration))
        method = f"nncf static int8 (weights and activations), calibrated on {len(calibration)} texts"
    else:
        quantized = nncf.compress_weights(ov_model, mode=nncf.CompressWeightsMode.INT8_ASYM)
        method = "nncf int8 weight compression (pass calibration texts for int8 activations too)"
    ov.save_model(quantized, str(xml), compress_to_fp16=False)
    return method
