"""Running an exported model (ONNX Runtime or OpenVINO) behind sentence-transformers' own ``encode``.

Why: sentence-transformers loads ``backend="onnx"``/``"openvino"`` only through optimum, and no
optimum release installs beside transformers 5 — so an exported directory could not be run here at
all. This module loads the files ``neobert-embed export`` writes (sentence-transformers' layout,
:mod:`neobert_embed.inference.export`) itself: it returns a real ``SentenceTransformer`` whose first
module, :class:`BackendTransformer`, tokenizes exactly as sentence-transformers' ``Transformer``
module does (saved ``max_seq_length``, ``do_lower_case``, prompts and their ``prompt_length``) and
runs the encoder through the runtime; the modules after it (``Pooling``, ``Normalize``, ``Dense``…),
the prompts, the default prompt and the similarity function are the saved ones. So
``model.encode(texts, prompt_name="query", normalize_embeddings=True)`` behaves as for the torch
model, at the runtime's speed.

Threads: ONNX Runtime would otherwise start one thread per core whatever torch was told; both
runtimes get ``threads`` (default: ``torch.get_num_threads()``), ONNX Runtime one inter-op thread and
OpenVINO the latency hint (one request at a time, all threads on it). OpenVINO computes in its
default precision for the device (bf16 on CPUs with bf16 units); ``inference_precision="fp32"``
keeps fp32, which is how ``export`` verifies a file.

Example:
    >>> model = load_backend_model("runs/my-embedder-onnx", "onnx", threads=4)
    >>> model.encode(["how do I reset my password?"], prompt_name="query").shape
    (1, 384)
    >>> int8 = load_backend_model("runs/my-embedder-onnx", "onnx", quantized=True)
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from neobert_embed.errors import UserInputError
from neobert_embed.model_files import MODULES_FILE, SavedModule, saved_modules
from neobert_embed.records import read_record

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from transformers import BatchEncoding, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

BACKENDS = ("onnx", "openvino")
#: The graph files, relative to the directory of the Transformer module: ``(fp32, int8)`` per backend.
#: These are the names sentence-transformers' own ``backend=`` loaders look for.
GRAPH_FILES = {
    "onnx": ("onnx/model.onnx", "onnx/model_qint8_avx512_vnni.onnx"),
    "openvino": ("openvino/openvino_model.xml", "openvino/openvino_model_qint8_quantized.xml"),
}
#: Encoder inputs a graph may take, in the order they are exported; its output is ``last_hidden_state``.
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
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
    """One line for an exported graph its runtime cannot read (truncated, overwritten, another
    runtime's), with the runtime's own reason cut to its last line.

    Example:
        >>> raise unreadable_graph(Path("runs/x-onnx/onnx/model.onnx"), "ONNX", exc)
        Traceback (most recent call last):
        UserInputError: runs/x-onnx/onnx/model.onnx: not a readable ONNX model (... Protobuf parsing failed.); ...
    """
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:200]
    return UserInputError(f"{file}: not a readable {runtime} model ({reason}); export it again with "
                          f"`neobert-embed export MODEL --format {runtime.lower()} --output DIR --overwrite`")


class OnnxRunner:
    """An ONNX Runtime session: named int64 arrays in, ``last_hidden_state`` out (thread-safe)."""

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


class BackendTransformer(nn.Module):
    """The first module of an exported model: tokenizes like sentence-transformers' ``Transformer``
    and puts the runtime's ``token_embeddings`` into the features.

    Attributes:
        tokenizer: the saved tokenizer (``model.tokenizer`` of the SentenceTransformer).
        runner: :class:`OnnxRunner` or :class:`OpenVINORunner`.
        file: the graph file it runs.
        do_lower_case: lower-case inputs (the saved module's setting).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, runner: OnnxRunner | OpenVINORunner, file: Path, *, hidden_size: int,
                 max_seq_length: int | None, do_lower_case: bool = False) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.runner = runner
        self.file = file
        self.hidden_size = hidden_size
        self.do_lower_case = do_lower_case
        if max_seq_length is not None:
            self.tokenizer.model_max_length = max_seq_length
        self._prompt_lengths: dict[str, int] = {}

    @property
    def modalities(self) -> list[str]:
        """Text only: an exported encoder takes token ids."""
        return ["text"]

    @property
    def max_seq_length(self) -> int:
        """Inputs are truncated to this many tokens (the saved module's, as in sentence-transformers)."""
        return self.tokenizer.model_max_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        self.tokenizer.model_max_length = value

    def get_max_seq_length(self) -> int:
        """``max_seq_length`` (the older sentence-transformers accessor)."""
        return self.max_seq_length

    def get_embedding_dimension(self) -> int:
        """Width of ``token_embeddings`` (the encoder's hidden size)."""
        return self.hidden_size

    def get_word_embedding_dimension(self) -> int:
        """Same as :meth:`get_embedding_dimension` (the name older Pooling code calls)."""
        return self.hidden_size

    def preprocess(self, inputs: Sequence[Any], prompt: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Token ids of texts (or ``(text, text)`` pairs) with ``prompt`` prepended, padded to the longest
        and truncated to ``max_seq_length``; ``prompt_length`` as sentence-transformers computes it."""
        if not inputs:
            return {}
        firsts, seconds = [], []
        for index, item in enumerate(inputs):
            parts = item if isinstance(item, (tuple, list)) else (item,)
            if not 1 <= len(parts) <= 2 or not all(isinstance(part, str) for part in parts):
                raise ValueError(f"inputs[{index}] is {type(item).__name__}: an exported model takes texts or "
                                 "(text, text) pairs only")
            firsts.append((prompt or "") + parts[0])
            seconds.append(parts[1] if len(parts) == 2 else None)
        pairs = [text for text in seconds if text is not None]
        if pairs and len(pairs) != len(seconds):
            raise ValueError("inputs mix single texts and (text, text) pairs; encode them separately")
        features = dict(self._tokenize(firsts, pairs or None))
        features["modality"] = "text"
        if prompt:
            features["prompt_length"] = self._prompt_length(prompt)
        return features

    def tokenize(self, texts: Sequence[Any], **kwargs: Any) -> dict[str, Any]:
        """:meth:`preprocess` without a prompt (the older sentence-transformers entry point)."""
        return self.preprocess(texts)

    def _tokenize(self, texts: list[str], pairs: list[str] | None) -> BatchEncoding:
        if self.do_lower_case:
            texts = [text.lower() for text in texts]
            pairs = None if pairs is None else [text.lower() for text in pairs]
        return self.tokenizer(texts, pairs, padding=True, truncation="longest_first",
                              max_length=self.max_seq_length, return_tensors="pt")

    def _prompt_length(self, prompt: str) -> int:
        """Tokens of the prompt alone, less a trailing special token (sentence-transformers' rule)."""
        if prompt not in self._prompt_lengths:
            ids = self._tokenize([prompt], None)["input_ids"][0]
            self._prompt_lengths[prompt] = len(ids) - int(int(ids[-1]) in set(self.tokenizer.all_special_ids))
        return self._prompt_lengths[prompt]

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Run the graph on the features' token ids; ``token_embeddings`` is (batch, length, hidden) fp32."""
        ids = features["input_ids"]
        arrays = {}
        for name in self.runner.input_names:
            value = features.get(name)
            if value is None and name == "token_type_ids":
                value = torch.zeros_like(ids)
            if value is None:
                raise KeyError(f"{self.file} takes input {name!r}, which the tokenizer did not produce")
            arrays[name] = value.detach().cpu().numpy().astype(np.int64, copy=False)
        hidden = self.runner(arrays)
        features["token_embeddings"] = torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32)).to(ids.device)
        return features

    def extra_repr(self) -> str:
        return f"file={self.file}, runtime={self.runner.description}, max_seq_length={self.max_seq_length}"


def _read_json(path: Path) -> dict[str, Any]:
    return read_record(path, "exported model file", "re-export the model") if path.is_file() else {}


def _load_saved_module(directory: Path, entry: SavedModule) -> nn.Module:
    """A module after the first, loaded as sentence-transformers loads it (no third-party code)."""
    import inspect

    from sentence_transformers.util import import_module_class

    try:
        module_class = import_module_class(entry.type, str(directory), trust_remote_code=False)
    except (ImportError, ValueError) as exc:
        raise UserInputError(f"{directory / MODULES_FILE}: module {entry.name!r} of type {entry.type!r} "
                             f"cannot be loaded here ({exc})") from None
    if len(inspect.signature(module_class.load).parameters) == 1:  # an old-style module: load(path)
        return module_class.load(str(directory / entry.path))
    return module_class.load(str(directory), subfolder=entry.path, local_files_only=True)


def load_backend_model(
    path: str | Path,
    backend: str,
    *,
    threads: int | None = None,
    device: str | None = None,
    quantized: bool = False,
    inference_precision: str | None = None,
) -> SentenceTransformer:
    """Load an exported directory as a ``SentenceTransformer`` that runs on ONNX Runtime or OpenVINO.

    Args:
        path: a directory written by ``neobert-embed export`` (or any SentenceTransformer directory
            holding ``onnx/model.onnx`` / ``openvino/openvino_model.xml`` beside its Transformer module).
        backend: ``onnx`` or ``openvino``.
        threads: compute threads (default: ``torch.get_num_threads()``).
        device: ``cpu`` (default), ``cuda[:N]`` for onnxruntime-gpu, or an OpenVINO device (``GPU``…).
        quantized: run the int8 file (``export --quantize int8``) instead of the fp32 one.
        inference_precision: OpenVINO only: ``fp32`` | ``bf16`` | ``fp16`` (default: the device's own
            choice, bf16 on CPUs with bf16 units). ONNX Runtime runs the file as written.

    Returns:
        A ``sentence_transformers.SentenceTransformer`` (``get_backend()`` says which runtime).

    Example:
        >>> model = load_backend_model("runs/x-openvino", "openvino", inference_precision="fp32")
        >>> model.encode(["a sentence"], normalize_embeddings=True).shape
        (1, 384)
    """
    from sentence_transformers import SentenceTransformer
    from transformers import AutoConfig, AutoTokenizer

    import neobert_embed.modeling.auto  # noqa: F401  (NeoBERT's config class for AutoConfig)

    directory = Path(path)
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

    threads = threads or torch.get_num_threads()
    precision = inference_precision if backend == "openvino" else None
    runner = OnnxRunner(file, threads, device) if backend == "onnx" else OpenVINORunner(file, threads, device,
                                                                                         precision)
    settings = _read_json(transformer_dir / "sentence_bert_config.json")
    config = AutoConfig.from_pretrained(str(transformer_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(transformer_dir))
    max_length = settings.get("max_seq_length")
    if max_length is None and getattr(config, "max_position_embeddings", -1) != -1:
        max_length = min(tokenizer.model_max_length, config.max_position_embeddings)  # as sentence-transformers
    first = BackendTransformer(tokenizer, runner, file, hidden_size=config.hidden_size, max_seq_length=max_length,
                               do_lower_case=bool(settings.get("do_lower_case", False)))
    modules: OrderedDict[str, nn.Module] = OrderedDict([(entries[0].name, first)])
    for entry in entries[1:]:
        modules[entry.name] = _load_saved_module(directory, entry)

    saved = _read_json(directory / "config_sentence_transformers.json")
    similarity = saved.get("similarity_fn_name")
    model = SentenceTransformer(
        modules=modules, device="cpu", backend=backend, prompts=saved.get("prompts") or None,
        default_prompt_name=saved.get("default_prompt_name"), truncate_dim=saved.get("truncate_dim"),
        similarity_fn_name=similarity if similarity in SentenceTransformer.SUPPORTED_SIMILARITY_FN_NAMES else None)
    model.module_kwargs = OrderedDict((entry.name, list(entry.kwargs)) for entry in entries)
    logger.debug("loaded %s on %s", file, runner.description)
    return model
