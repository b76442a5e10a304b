"""The runtimes an exported graph runs on: ONNX Runtime and OpenVINO, token ids in, hidden states out.

Why a module of its own: the light runtime and ``export``'s check run the same files the same way,
without torch. Both runtimes get ``threads`` (ONNX Runtime would otherwise start one per core), ONNX
Runtime one inter-op thread and OpenVINO the latency hint (all threads on one request). Example:
:func:`make_runner`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from neobert_embed.errors import UserInputError
from neobert_embed.model_files import MODULES_FILE, SavedModule, saved_modules

BACKENDS = ("onnx", "openvino")
#: The graph files, relative to the Transformer module's folder: ``(fp32, int8)`` per backend, the names
#: sentence-transformers' own ``backend=`` loaders look for.
GRAPH_FILES = {
    "onnx": ("onnx/model.onnx", "onnx/model_qint8_avx512_vnni.onnx"),
    "openvino": ("openvino/openvino_model.xml", "openvino/openvino_model_qint8_quantized.xml"),
}
OUTPUT_NAME = "last_hidden_state"
#: ``inference_precision`` values and OpenVINO's names for them (ONNX Runtime runs the file's fp32).
PRECISIONS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


def graph_file(directory: str | Path, backend: str, quantized: bool = False) -> Path:
    """The graph file of ``backend`` in an exported directory (it need not exist).

    Example:
        >>> graph_file("runs/x-onnx", "onnx", quantized=True)
        PosixPath('runs/x-onnx/onnx/model_qint8_avx512_vnni.onnx')
    """
    if backend not in GRAPH_FILES:
        raise UserInputError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    return Path(directory) / GRAPH_FILES[backend][int(quantized)]


def unreadable_graph(file: Path, runtime: str, exc: Exception) -> UserInputError:
    """One line for a graph its runtime cannot read (truncated, another runtime's), with the runtime's
    own reason's last line."""
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:200]
    return UserInputError(f"{file}: not a readable {runtime} model ({reason}); export it again with "
                          f"`neobert-embed export MODEL --format {runtime.lower()} --output DIR --overwrite`")


class Runner(Protocol):
    """A runtime, for the light runtime: named int64 arrays in, ``(batch, length, hidden)`` fp32 out."""

    name: str  # the runtime, as users know it: "ONNX Runtime", "OpenVINO"
    input_names: tuple[str, ...]
    description: str  # its version, device, precision and threads

    def __call__(self, arrays: dict[str, np.ndarray]) -> np.ndarray: ...


def make_runner(file: Path, backend: str, threads: int, device: str | None = None,
                precision: str | None = None) -> OnnxRunner | OpenVINORunner:
    """The runner of ``backend`` (``onnx`` or ``openvino``) for ``file``; ``precision`` is OpenVINO's only
    (``fp32`` | ``bf16`` | ``fp16``; None: the device's default, bf16 on CPUs with bf16 units).

    Example:
        >>> make_runner(graph_file("runs/x-openvino", "openvino"), "openvino", 2, precision="fp32").description
        'openvino 2025.1.0 (CPU, f32, 2 threads)'
    """
    if backend == "onnx":
        return OnnxRunner(file, threads, device)
    return OpenVINORunner(file, threads, device, precision)


class OnnxRunner:
    """An ONNX Runtime session: named int64 arrays in, ``last_hidden_state`` out (thread-safe)."""

    name = "ONNX Runtime"

    def __init__(self, file: Path, threads: int, device: str | None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        kind, _, index = (device or "cpu").partition(":")
        if kind == "cpu":
            providers: list[str | tuple[str, dict[str, int]]] = ["CPUExecutionProvider"]
        elif kind == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers = [("CUDAExecutionProvider", {"device_id": int(index or 0)}), "CPUExecutionProvider"]
        else:
            raise UserInputError(f"device {device!r}: this onnxruntime runs on {', '.join(ort.get_available_providers())}"
                                 "; use device='cpu' (or install onnxruntime-gpu for 'cuda')")
        from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidGraph, InvalidProtobuf

        try:
            self.session = ort.InferenceSession(str(file), options, providers=providers)
        except (InvalidProtobuf, InvalidGraph, Fail) as exc:  # a graph cut short, or not this runtime's
            raise unreadable_graph(file, "ONNX", exc) from None
        self.input_names = tuple(node.name for node in self.session.get_inputs())
        self.output_names = [OUTPUT_NAME if OUTPUT_NAME in {o.name for o in self.session.get_outputs()}
                             else self.session.get_outputs()[0].name]
        self.description = f"onnxruntime {ort.__version__} ({self.session.get_providers()[0]}, {threads} threads)"

    def __call__(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        return self.session.run(self.output_names, arrays)[0]


class OpenVINORunner:
    """A compiled OpenVINO model; one infer request per calling thread (a request is not thread-safe)."""

    name = "OpenVINO"

    def __init__(self, file: Path, threads: int, device: str | None, precision: str | None) -> None:
        import openvino as ov

        target = (device or "CPU").upper()
        config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
        if target == "CPU":
            config["INFERENCE_NUM_THREADS"] = threads
        if precision is not None:
            config["INFERENCE_PRECISION_HINT"] = PRECISIONS[precision]
        core = ov.Core()
        try:
            self.compiled = core.compile_model(str(file), target, config)
        except RuntimeError as exc:
            if target in core.available_devices:  # the device is there: the files are what failed
                raise unreadable_graph(file, "OpenVINO", exc) from None
            raise UserInputError(f"device {device!r}: OpenVINO sees {', '.join(core.available_devices)} here; "
                                 "use one of them (default CPU)") from exc
        self.input_names = tuple(port.get_any_name() for port in self.compiled.inputs)
        self.output = next((port for port in self.compiled.outputs if OUTPUT_NAME in port.get_names()),
                           self.compiled.outputs[0])
        self._local = threading.local()
        used = str(self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()) if target == "CPU" \
            else "device default"
        self.description = f"openvino {ov.get_version().split('-')[0]} ({target}, {used}, {threads} threads)"

    def __call__(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        return request.infer(arrays)[self.output]  # a copy (share_outputs=False): the request is reused


@dataclass(frozen=True)
class ExportedGraph:
    """An exported directory's modules (``modules.json``), Transformer folder and graph file."""

    modules: list[SavedModule]
    transformer_dir: Path
    file: Path


def locate_graph(directory: str | Path, backend: str, quantized: bool = False,
                 inference_precision: str | None = None) -> ExportedGraph:
    """Check an exported directory and find its graph, or one line saying what is missing and how to write it.

    Example:
        >>> locate_graph("runs/x-onnx", "onnx").file
        PosixPath('runs/x-onnx/onnx/model.onnx')
    """
    directory = Path(directory)
    if backend not in BACKENDS:
        raise UserInputError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if inference_precision is not None and inference_precision not in PRECISIONS:
        raise UserInputError(f"inference_precision {inference_precision!r} is not one of {', '.join(PRECISIONS)}")
    if backend == "onnx" and inference_precision not in (None, "fp32"):
        raise UserInputError(f"inference_precision {inference_precision!r}: ONNX Runtime runs the file's own "
                             "precision; use the openvino backend for bf16/fp16 compute")
    modules_json = directory / MODULES_FILE
    if not modules_json.is_file():
        raise UserInputError(f"{directory} is not a SentenceTransformer directory (no modules.json); export one "
                             f"with `neobert-embed export MODEL --format {backend} --output {directory}`")
    entries = saved_modules(directory)
    if not entries[0].is_transformer:
        raise UserInputError(f"{modules_json}: the first module is not a Transformer, so there is no encoder "
                             "graph to run")
    transformer_dir = directory / entries[0].path
    file = graph_file(transformer_dir, backend, quantized)
    if not file.is_file():
        other = graph_file(transformer_dir, backend, not quantized)
        hint = (f"; {other.relative_to(directory)} is there: pass quantized={not quantized}" if other.is_file()
                else f"; write it with `neobert-embed export MODEL --format {backend}"
                     f"{' --quantize int8' if quantized else ''} --output DIR`")
        raise UserInputError(f"{file} not found{hint}")
    return ExportedGraph(entries, transformer_dir, file)
