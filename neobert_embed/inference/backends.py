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
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from neobert_embed.errors import UserInputError
from neobert_embed.inference.runners import OnnxRunner, OpenVINORunner, locate_graph, make_runner
from neobert_embed.model_files import MODULES_FILE, SavedModule
from neobert_embed.records import read_record

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from transformers import BatchEncoding, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

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
    located = locate_graph(directory, backend, quantized, inference_precision)
    entries, transformer_dir, file = located.modules, located.transformer_dir, located.file

    threads = threads or torch.get_num_threads()
    runner = make_runner(file, backend, threads, device, inference_precision)
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
