"""The light runtime: an exported model encodes with tokenizers + ONNX Runtime or OpenVINO + numpy, no torch.

Why: importing torch, transformers and sentence-transformers takes seconds, longer than encoding a few
texts; the graph holds the encoder, and what sentence-transformers does around it (Transformer → Pooling
→ optionally Normalize, read from the files its loaders read) is small. :class:`LightModel` is an
:class:`~neobert_embed.inference.pipeline.Engine`: it runs the one encoding loop (example:
:func:`load_light_model`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from neobert_embed.artifact_hashes import verify_export
from neobert_embed.errors import UserInputError
from neobert_embed.files import read_json
from neobert_embed.inference import pipeline
from neobert_embed.inference.fast_tokenizer import FastTokenizer
from neobert_embed.inference.pipeline import plan_cpu_batches
from neobert_embed.inference.runners import BACKENDS, GRAPH_FILES, Runner, locate_graph, make_runner
from neobert_embed.inference.tokenized import Padding, Tokenized
from neobert_embed.model_files import MODULES_FILE, SavedModule
from neobert_embed.records import EXPORT

#: sentence-transformers' pooling modes, in the order it concatenates them.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
#: The keys of sentence-transformers' older Pooling configs, and the mode each switches on.
LEGACY_POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                       "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                       "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
#: What the light runtime runs: the class names of sentence-transformers' modules (any module path).
RUNS = ("Transformer", "Pooling", "Normalize")
TORCH_HINT = "use --backend torch (with torch, transformers and sentence-transformers installed)"
NO_LIMIT = 1 << 30  # transformers' "no model_max_length" is a very large int: treated as none


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = read_json(path, "exported model file", "export the model again with --overwrite")
    if not isinstance(value, dict):
        raise UserInputError(f"{path}: expected a JSON object; export the model again with --overwrite")
    return value


def _token_text(value: object) -> str | None:
    """A special token as ``tokenizer_config.json`` stores it: a string, or an object with ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_tokenizer(folder: Path, max_seq_length: int | None, do_lower_case: bool) -> FastTokenizer:
    """``folder``'s ``tokenizer.json`` set up as sentence-transformers' ``Transformer`` calls it;
    ``max_seq_length`` None: the tokenizer's limit, capped by the encoder's positions.

    Example:
        >>> read_tokenizer(Path("runs/minilm-onnx"), None, do_lower_case=False).max_seq_length
        256
    """
    from tokenizers import Tokenizer, normalizers

    file = folder / "tokenizer.json"
    if not file.is_file():
        raise UserInputError(f"{file} not found: the light runtime reads a fast tokenizer's tokenizer.json; "
                             f"{TORCH_HINT}")
    settings = _json(folder / "tokenizer_config.json")
    if max_seq_length is None:
        limits = [settings.get("model_max_length"), _json(folder / "config.json").get("max_position_embeddings")]
        usable = [int(limit) for limit in limits if isinstance(limit, (int, float)) and 0 < limit < NO_LIMIT]
        max_seq_length = min(usable) if usable else 512
    rust = Tokenizer.from_file(str(file))
    if do_lower_case:  # a Lowercase first, unless it lowercases already (a BERT normalizer with lowercase)
        current = rust.normalizer
        parts = list(current) if isinstance(current, normalizers.Sequence) else [current] if current else []
        if not any(isinstance(part, normalizers.Lowercase) or getattr(part, "lowercase", False) for part in parts):
            rust.normalizer = normalizers.Sequence([normalizers.Lowercase(), *parts])
    pad = (_token_text(settings.get("pad_token"))
           or _token_text(_json(folder / "special_tokens_map.json").get("pad_token")))
    pad_id = rust.token_to_id(pad) if pad is not None else None
    padding = Padding(pad_id if pad_id is not None else 0, int(settings.get("pad_token_type_id", 0)),
                      str(settings.get("padding_side", "right")) == "left")
    return FastTokenizer(rust, max_seq_length, str(settings.get("truncation_side", "right")), padding)


@dataclass(frozen=True)
class Pooling:
    """sentence-transformers' Pooling module in numpy (its padded path, which the graph's output is).

    Example:
        >>> Pooling(("mean",), 384, True)(hidden, mask, None).shape
        (2, 384)
    """

    modes: tuple[str, ...]
    dimension: int
    include_prompt: bool = True

    @classmethod
    def read(cls, folder: Path) -> Pooling:
        """The Pooling of ``folder/config.json`` (the current and the older key names)."""
        config = _json(folder / "config.json")
        mode = config.get("pooling_mode")
        if mode is None:
            mode = [name for key, name in LEGACY_POOLING_KEYS.items() if config.get(key)] or ["mean"]
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
        unknown = [name for name in modes if name not in POOLING_MODES]
        dimension = config.get("embedding_dimension", config.get("word_embedding_dimension"))
        if unknown or not isinstance(dimension, int):
            raise UserInputError(f"{folder / 'config.json'}: pooling {unknown or 'without embedding_dimension'} is "
                                 f"not one the light runtime runs ({', '.join(POOLING_MODES)}); {TORCH_HINT}")
        return cls(modes, dimension, bool(config.get("include_prompt", True)))

    @property
    def output_dimension(self) -> int:
        """Width of the pooled vector: one hidden size per mode."""
        return len(self.modes) * self.dimension

    def __call__(self, hidden: np.ndarray, mask: np.ndarray, prompt_length: int | None) -> np.ndarray:
        """Pool ``hidden`` (batch, length, width) over ``mask``; ``prompt_length`` tokens are left out unless
        the prompt is included."""
        original = mask
        if prompt_length and not self.include_prompt:  # the prompt's tokens, after any left padding, left out
            positions = np.arange(mask.shape[1])[None, :]
            mask = np.where(positions < (mask.argmax(axis=1) + prompt_length)[:, None], 0, mask)
        weights = mask[..., None].astype(np.float32)
        pooled = []
        for mode in self.modes:
            if mode == "cls":
                pooled.append(hidden[np.arange(len(hidden)), mask.argmax(axis=1)])
            elif mode == "max":
                pooled.append(np.where(weights > 0, hidden, -np.inf).max(axis=1))
            elif mode in ("mean", "mean_sqrt_len_tokens"):
                total = np.maximum(weights.sum(axis=1), 1e-9)
                pooled.append((hidden * weights).sum(axis=1) / (total if mode == "mean" else np.sqrt(total)))
            elif mode == "weightedmean":
                positions = np.arange(1, hidden.shape[1] + 1, dtype=np.float32)[None, :, None]
                weighted = weights * (positions - original.argmax(axis=1)[:, None, None])
                pooled.append((hidden * weighted).sum(axis=1) / np.maximum(weighted.sum(axis=1), 1e-9))
            else:  # lasttoken: the last position the mask keeps (the first one, zeroed, when it keeps none)
                flipped = mask[:, ::-1]
                last = np.where(flipped.max(axis=1) == 0, 0, mask.shape[1] - 1 - flipped.argmax(axis=1))
                pooled.append((hidden * weights)[np.arange(len(hidden)), last])
        return np.concatenate(pooled, axis=-1).astype(np.float32, copy=False)


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (``torch.nn.functional.normalize``: norms floored at 1e-12)."""
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


class LightModel:
    """An exported model run without torch: the light runtime's engine, with what commands and the server
    need of a SentenceTransformer (``prompts``, ``default_prompt_name``, ``similarity_fn_name``,
    ``truncate_dim``, ``max_seq_length``, ``get_embedding_dimension()`` and ``encode()`` behave as its);
    ``runner`` runs the graph ``file``, ``source_fingerprint`` names the weights exported (or None)."""

    def __init__(self, tokenizer: FastTokenizer, runner: Runner, file: Path, pooling: Pooling, *,
                 normalizes: bool, settings: dict[str, Any], source_fingerprint: str | None) -> None:
        self.tokenizer, self.runner, self.file, self.pooling, self.normalizes = (tokenizer, runner, file, pooling,
                                                                                 normalizes)
        self.prompts: dict[str, str] = dict(settings.get("prompts") or {})
        self.default_prompt_name: str | None = settings.get("default_prompt_name")
        self.similarity_fn_name: str = settings.get("similarity_fn_name") or "cosine"
        self.truncate_dim: int | None = settings.get("truncate_dim")
        self.source_fingerprint = source_fingerprint
        self._prompt_lengths: dict[str, int] = {}

    #: the exported graph computes over the padded batch (NeoBERT's export included)
    unpads = False

    @property
    def max_seq_length(self) -> int:
        """Inputs are truncated to this many tokens."""
        return self.tokenizer.max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        self.tokenizer.set_max_seq_length(value)

    @property
    def dimension(self) -> int:
        """Width of the sentence vectors (``truncate_dim`` when the model saved one)."""
        return min(self.truncate_dim or self.pooling.output_dimension, self.pooling.output_dimension)

    def get_embedding_dimension(self) -> int:
        return self.dimension

    def _prompt_length(self, prompt: str) -> int:
        """Tokens of the prompt alone, less a trailing special token (sentence-transformers' rule)."""
        if prompt not in self._prompt_lengths:
            ids = self.tokenizer.batch([prompt])["input_ids"][0]
            self._prompt_lengths[prompt] = len(ids) - int(int(ids[-1]) in self.tokenizer.special_ids)
        return self._prompt_lengths[prompt]

    def tokenize(self, texts: Sequence[str], prompt: str | None) -> Tokenized:
        """``texts`` with ``prompt`` prepended, tokenized once (truncated, counted); the prompt's length
        travels with them for the pooling (``include_prompt``). Safe from any thread."""
        tokenized = self.tokenizer.tokenize([prompt + text for text in texts] if prompt else list(texts))
        if prompt:
            tokenized = replace(tokenized, shared={"prompt_length": self._prompt_length(prompt)})
        return tokenized

    def forward(self, features: dict[str, np.ndarray | object], *, normalize: bool = False) -> np.ndarray:
        """The runtime's forward of one padded batch, pooled (and normalized, cut) as the pipeline says."""
        hidden = self.runner({name: np.ascontiguousarray(features[name]) for name in self.runner.input_names})
        prompt_length = features.get("prompt_length")
        vectors = self.pooling(np.asarray(hidden, dtype=np.float32), features["attention_mask"],  # type: ignore[arg-type]
                               int(prompt_length) if prompt_length else None)  # type: ignore[call-overload]
        if self.normalizes:
            vectors = _unit_rows(vectors)
        vectors = vectors[:, :self.truncate_dim] if self.truncate_dim else vectors
        return _unit_rows(vectors).astype(np.float32, copy=False) if normalize else vectors

    def encode_chunk(self, tokenized: Tokenized, batch_size: int, normalize: bool) -> np.ndarray:
        """One tokenized chunk, in batches cut by the pipeline's rule (within the CPU token budget)."""
        out = np.empty((len(tokenized), self.dimension), dtype=np.float32)
        for rows in plan_cpu_batches(tokenized.lengths, batch_size):
            out[rows] = self.forward(tokenized.batch(rows), normalize=normalize)
        return out

    def release(self) -> None:
        """Nothing to hand back: the runtime owns its memory."""

    def encode(self, texts: Sequence[str], *, batch_size: int = 32, prompt: str | None = None,
               prompt_name: str | None = None, normalize_embeddings: bool = False, show_progress_bar: bool = False,
               convert_to_numpy: bool = True) -> np.ndarray:
        """``SentenceTransformer.encode`` for texts, through the one encoding loop: ``prompt``, else the saved
        ``prompt_name``, else the default prompt; float32 rows. No progress bar; always numpy.

        Example:
            >>> model.encode(["a cat"], prompt_name="query", normalize_embeddings=True).shape
            (1, 384)
        """
        if prompt is None and prompt_name is not None:
            if prompt_name not in self.prompts:
                raise ValueError(f"prompt name {prompt_name!r} not found; saved prompts: {sorted(self.prompts)}")
            prompt = self.prompts[prompt_name]
        elif prompt is None and self.default_prompt_name:
            prompt = self.prompts.get(self.default_prompt_name)
        return pipeline.encode(self, list(texts), prompt=prompt or None, batch_size=batch_size,
                               normalize=normalize_embeddings)

    @property
    def description(self) -> str:
        """One phrase for ``used:`` lines: the runtime, that torch is not involved, and the runtime's details."""
        return f"{self.runner.name}, light runtime: no torch ({self.runner.description})"


def default_threads() -> int:
    """Compute threads of a runtime when none are asked for: the CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def source_fingerprint(directory: str | Path) -> str | None:
    """The fingerprint of the weights an export came from (in ``export.json``), or None.

    Example:
        >>> source_fingerprint("runs/minilm-onnx")
        'b1946ac92492d234'
    """
    if not EXPORT.exists(directory):
        return None
    value = EXPORT.read(directory).get("source_fingerprint")
    return value if isinstance(value, str) else None


def exported_runtime(model: str | Path) -> str | None:
    """The runtime of an ``export`` output (``onnx`` or ``openvino``: the graph it holds), else None.

    Why: ``index`` commands and ``serve`` are handed a model, not a backend; an export's own graph is
    what it was made to run.

    Example:
        >>> exported_runtime("runs/minilm-onnx"), exported_runtime("sentence-transformers/all-MiniLM-L6-v2")
        ('onnx', None)
    """
    directory = Path(model)
    if not (directory.is_dir() and EXPORT.exists(directory)):
        return None
    found = EXPORT.read(directory).get("format")
    if found in BACKENDS and (directory / GRAPH_FILES[found][0]).is_file():
        return str(found)
    return next((backend for backend in BACKENDS if (directory / GRAPH_FILES[backend][0]).is_file()), None)


def _pipeline(directory: Path, modules: list[SavedModule]) -> tuple[Pooling, bool]:
    """The Pooling and whether a Normalize follows; any module the light runtime cannot run is an error."""
    where = directory / MODULES_FILE
    kinds = [entry.type.rsplit(".", 1)[-1] for entry in modules]
    for entry, kind in zip(modules, kinds, strict=True):
        if kind not in RUNS or not entry.type.startswith("sentence_transformers."):
            raise UserInputError(f"{where}: module {entry.name!r} ({entry.type}) is not one the light runtime runs "
                                 f"(it runs {', '.join(RUNS)}); {TORCH_HINT}")
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise UserInputError(f"{where}: modules {' → '.join(kinds)}: the light runtime runs Transformer → Pooling "
                             f"(→ Normalize); {TORCH_HINT}")
    return Pooling.read(directory / modules[1].path), len(kinds) == 3


def load_light_model(path: str | Path, backend: str, *, threads: int | None = None, device: str | None = None,
                     quantized: bool = False, inference_precision: str | None = None) -> LightModel:
    """Load a directory written by ``neobert-embed export`` (or any SentenceTransformer directory with the
    graph beside its Transformer module and a ``tokenizer.json``) to run on ``backend`` without torch;
    ``threads`` default to the CPUs this process may run on. A missing graph or tokenizer, a module the
    light runtime cannot run, or a file that differs from the export's pins is one UserInputError naming it.

    Example:
        >>> load_light_model("runs/minilm-openvino", "openvino", inference_precision="fp32").description
        'OpenVINO, light runtime: no torch (openvino 2025.1.0 (CPU, f32, 2 threads))'
    """
    directory = Path(path)
    located = locate_graph(directory, backend, quantized, inference_precision)
    verify_export(directory, located.file)  # every file read below is the one the export wrote
    pooling, normalizes = _pipeline(directory, located.modules)
    settings = _json(located.transformer_dir / "sentence_bert_config.json")
    task = settings.get("transformer_task", "feature-extraction")
    if task != "feature-extraction" or set(settings.get("modality_config") or {"text": None}) != {"text"}:
        raise UserInputError(f"{located.transformer_dir / 'sentence_bert_config.json'}: a {task} Transformer with "
                             f"modalities {sorted(settings.get('modality_config') or ['text'])} is not one the light "
                             f"runtime runs (text feature extraction); {TORCH_HINT}")
    tokenizer = read_tokenizer(located.transformer_dir, settings.get("max_seq_length"),
                               bool(settings.get("do_lower_case", False)))
    runner = make_runner(located.file, backend, threads or default_threads(), device, inference_precision)
    return LightModel(tokenizer, runner, located.file, pooling, normalizes=normalizes,
                      settings=_json(directory / "config_sentence_transformers.json"),
                      source_fingerprint=source_fingerprint(directory))
