"""Checking a model's files before loading it: one clear line instead of a 50-line traceback.

Why: a truncated download, an interrupted conversion or a wrong ``--model`` path used to surface
deep inside transformers or safetensors as a long traceback, sometimes after minutes of other
work. This module reads only small things (``config.json``, ``modules.json`` and each
``.safetensors`` file's header and size; no weights, no torch) so a command can refuse a broken
model, or a length flag the model cannot honour, in a fraction of a second and *before* loading.

Example:
    >>> check_model_files("runs/my-embedder")          # raises UserInputError naming the bad file
    >>> position_limit("runs/my-embedder")
    512
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from neobert_embed.backbones import BACKBONES, resolve_model_name, usable_max_length
from neobert_embed.errors import UserInputError
from neobert_embed.files import NAME_HINT, name_problem, read_json
from neobert_embed.records import read_record

WEIGHT_NAMES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
FIX = "re-download the model, or re-convert/re-export it (`neobert-embed convert`, `pretrain export`)"
MODULES_FILE = "modules.json"  # a SentenceTransformer directory's list of modules, in order
# The JSON objects transformers and sentence-transformers read while loading a model or a module.
SETTINGS_FILES = ("config.json", "config_sentence_transformers.json", "sentence_bert_config.json",
                  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def local_model_dir(name_or_path: str | Path) -> Path | None:
    """The model's local path when ``name_or_path`` is one (registry keys and hub ids give None)."""
    text = str(name_or_path)
    if text in BACKBONES:
        return None
    path = Path(text)
    return path if path.exists() else None


def _read_json(path: Path) -> Any:
    return read_json(path, "model file", FIX)


def check_safetensors(path: str | Path) -> None:
    """Refuse a ``.safetensors`` file whose header is unreadable or whose data is truncated.

    ``safetensors.safe_open`` validates the header and that the data ends where the last tensor
    does, reading only the header (no weights, no torch).

    Example:
        >>> check_safetensors("model/model.safetensors")
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy"):
            pass
    except SafetensorError as exc:
        raise UserInputError(f"{path}: corrupt or truncated safetensors file ({exc}); {FIX}") from None


def check_torch_bin(path: str | Path) -> None:
    """Refuse a ``pytorch_model*.bin`` that is neither a ``torch.save`` zip archive nor a legacy pickle.

    Why: random or truncated bytes otherwise reach torch's unpickler, whose error (UnpicklingError,
    UnicodeDecodeError, EOFError …) depends on the bytes.

    Example:
        >>> check_torch_bin("model/pytorch_model.bin")
    """
    path = Path(path)
    if zipfile.is_zipfile(path):
        return
    with open(path, "rb") as handle:
        first = handle.read(1)
    if first != b"\x80":  # a legacy torch.save file starts with a pickle (protocol >= 2) opcode
        raise UserInputError(f"{path}: corrupt PyTorch weights (neither a torch.save archive nor a pickle); {FIX}")


@dataclass(frozen=True)
class SavedModule:
    """One entry of a SentenceTransformer directory's ``modules.json``: the module's name, its folder
    (relative to the directory; ``""`` for the directory itself), its class path and the keyword
    arguments ``forward`` takes (sentence-transformers' ``kwargs``).

    Example:
        >>> saved_modules("runs/my-embedder")[1]
        SavedModule(name='1', path='1_Pooling', type='sentence_transformers.models.Pooling', kwargs=())
    """

    name: str
    path: str
    type: str
    kwargs: tuple[str, ...] = ()

    @property
    def is_transformer(self) -> bool:
        """Whether this is the encoder (``models.Transformer`` or a backend's stand-in for it)."""
        return self.type.endswith("Transformer")


def saved_modules(directory: str | Path) -> list[SavedModule]:
    """The modules listed in ``directory/modules.json``, in order; ``[]`` when there is no such file.

    Why one reader: the encoder's folder, the embedding width, GLUE's backbone and the ONNX/OpenVINO
    loader all read this list, and a damaged one (cut short, not a list, an entry without a ``path``)
    must be the same located error everywhere, not a ``KeyError`` in whichever read it first.

    Example:
        >>> saved_modules("runs/cut-short")
        Traceback (most recent call last):
        UserInputError: runs/cut-short/modules.json:1: damaged SentenceTransformer module list (invalid JSON: ...
    """
    file = Path(directory) / MODULES_FILE
    if not file.is_file():
        return []
    entries = read_record(file, "SentenceTransformer module list", FIX, shape=list)
    if not entries:
        raise UserInputError(f"{file}: expected a non-empty list of modules; {FIX}")
    modules = []
    for position, entry in enumerate(entries):
        fields = entry if isinstance(entry, dict) else {}
        path, kind = fields.get("path"), fields.get("type")
        kwargs = fields.get("kwargs", [])
        if not (isinstance(path, str) and isinstance(kind, str) and isinstance(kwargs, list)
                and all(isinstance(name, str) for name in kwargs)):
            raise UserInputError(f"{file}: module {position} needs a string 'path' and 'type' (and 'kwargs', "
                                 f"when given, a list of names), got {entry!r}; {FIX}")
        if path and name_problem(path) is not None:  # a module's folder is read (and code-free loaded) from it
            raise UserInputError(f"{file}: module {position}'s path {path!r} {name_problem(path)}; {NAME_HINT}")
        modules.append(SavedModule(str(fields.get("name", position)), path, kind, tuple(kwargs)))
    return modules


def transformer_module(directory: str | Path) -> SavedModule | None:
    """The encoder module of the SentenceTransformer at ``directory`` (None when it lists none).

    Example:
        >>> transformer_module("runs/my-embedder").path
        ''
    """
    return next((module for module in saved_modules(directory) if module.is_transformer), None)


def shard_files(index: str | Path) -> list[str]:
    """The weight files a sharded checkpoint's index (``model.safetensors.index.json``) names, after
    checking that it is an object whose ``weight_map`` maps tensor names to files that are there.

    Why here: transformers reads this file with no check of its shape, and the converter reads it
    too; a damaged one must be the same located error before either loads anything.

    Example:
        >>> shard_files("models/neobert/model.safetensors.index.json")
        ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors']
    """
    index = Path(index)
    weight_map = read_record(index, "shard index", FIX).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(file, str) for file in weight_map.values()):
        raise UserInputError(f"{index}: damaged shard index (no 'weight_map' of tensor names to files); {FIX}")
    files = sorted(set(weight_map.values()))
    missing = [file for file in files if not (index.parent / file).is_file()]
    if missing:
        raise UserInputError(f"{index}: names shard files that are not there ({', '.join(missing)}); {FIX}")
    return files


def _transformer_dir(directory: Path) -> Path:
    """Where the encoder's ``config.json`` lives: the directory, or a SentenceTransformer's module."""
    module = transformer_module(directory)
    return directory / module.path if module is not None else directory


def _settings_files(directory: Path) -> list[Path]:
    """The JSON settings that loading a model reads, in its folder and its modules' folders; each
    is an object. Other JSON files a model repository carries are not read (all-MiniLM-L6-v2's
    ``data_config.json`` is a list of its training sets), and ``modules.json`` is :func:`saved_modules`'."""
    files = {*directory.glob("*.json"), *directory.glob("*/*.json")}
    return sorted((file for file in files if file.name in SETTINGS_FILES and not file.parent.name.startswith(".")),
                  key=lambda file: (file.name != "config.json", file))


@dataclass(frozen=True)
class CheckedModel:
    """A model source whose files :func:`check_model_files` inspected: the one value a command's
    preflight hands its loader (:func:`~neobert_embed.sentence.load_sentence_model`,
    :func:`~neobert_embed.inference.runtime.load_inference_model`), so the files are read once per command.

    Example:
        >>> str(check_model_files("runs/my-embedder"))
        'runs/my-embedder'
    """

    source: str

    def __str__(self) -> str:
        return self.source


def check_model_files(name_or_path: str | Path | CheckedModel, max_length: int | None = None,
                      flag: str = "--max-length") -> CheckedModel:
    """Refuse a local model directory that cannot load: not a directory, empty, no or corrupt
    ``config.json``, no weights, or a corrupt/truncated ``.safetensors`` file; and any model under a
    memory limit it cannot load in (:func:`~neobert_embed.machine.check_memory_for`); and a length
    ``flag`` of ``max_length`` above what it supports (:func:`check_length_flag`). Hub ids and
    registry keys pass the file checks (their download is checked by the hub client). A value this
    function returned is not inspected again.

    Example:
        >>> check_model_files("runs/empty")
        Traceback (most recent call last):
        UserInputError: runs/empty: empty directory, not a model; ...
    """
    if isinstance(name_or_path, CheckedModel):
        check_length_flag(name_or_path.source, max_length, flag)
        return name_or_path
    check_length_flag(name_or_path, max_length, flag)
    _check_files(name_or_path)
    return CheckedModel(str(name_or_path))


def _check_files(name_or_path: str | Path) -> None:
    """:func:`check_model_files`' inspection of the files."""
    from neobert_embed.machine import check_memory_for

    directory = local_model_dir(name_or_path)
    if directory is None:
        check_memory_for(str(name_or_path), 0)  # its size is not known before the download
        return
    if not directory.is_dir():
        raise UserInputError(f"--model {directory} is a file; pass the model's directory")
    if not any(directory.iterdir()):
        raise UserInputError(f"{directory}: empty directory, not a model; point --model at a saved model "
                             f"or {FIX}")
    encoder_dir = _transformer_dir(directory)
    config = encoder_dir / "config.json"
    if not config.is_file():
        raise UserInputError(f"{directory}: no config.json, so not a Hugging Face or SentenceTransformer "
                             f"model directory; {FIX}")
    for settings in _settings_files(directory):  # config.json first: the encoder's is the likeliest damaged
        refuse_remote_code(settings, read_record(settings, "model file", FIX))  # each an object, or one line
    refuse_module_code(directory)
    if not any((encoder_dir / name).is_file() for name in WEIGHT_NAMES) and not any(
            encoder_dir.glob("*.safetensors")):
        raise UserInputError(f"{encoder_dir}: no weights (model.safetensors or pytorch_model.bin); {FIX}")
    if not any((encoder_dir / name).is_file() for name in ("model.safetensors", "pytorch_model.bin")):
        for index in sorted(encoder_dir.glob("*.index.json")):  # sharded: the index is what loads
            shard_files(index)
    for weights in sorted({*directory.glob("*.safetensors"), *directory.glob("*/*.safetensors")}):
        check_safetensors(weights)
    for weights in sorted({*directory.glob("pytorch_model*.bin"), *directory.glob("*/pytorch_model*.bin")}):
        check_torch_bin(weights)
    from neobert_embed.artifact_hashes import verify_export

    verify_export(directory, None)  # an export's files as it wrote them (none of its graphs: torch reads none)
    check_memory_for(str(directory), weights_size(directory))


def refuse_remote_code(settings: Path, values: dict[str, Any]) -> None:
    """Refuse, in one line, a settings file that makes transformers run Python code shipped with the model.

    Why: nothing the toolkit reads runs code. An ``auto_map`` names classes in the model's own ``.py``
    files; transformers either runs them (``trust_remote_code``) or fails with a traceback. It is
    harmless only where transformers has the architecture itself (``model_type`` known, NeoBERT
    included: the official checkpoint carries an ``auto_map`` and loads natively), or for a tokenizer
    whose ``tokenizer_class`` transformers has.

    Example:
        >>> refuse_remote_code(Path("m/config.json"), {"model_type": "mine", "auto_map": {"AutoModel": "m.Mine"}})
        Traceback (most recent call last):
        UserInputError: m/config.json: the model needs its own Python code (auto_map: m.Mine) ...
    """
    auto_map = values.get("auto_map")
    if not auto_map:
        return
    try:
        import transformers
        from transformers import CONFIG_MAPPING
    except ImportError:  # no transformers: nothing here could run the model's code
        return
    if settings.name == "config.json":
        native = values.get("model_type") in CONFIG_MAPPING
    else:
        wanted = values.get("tokenizer_class")
        native = isinstance(wanted, str) and hasattr(transformers, wanted)
    if native:
        return
    named = auto_map.values() if isinstance(auto_map, dict) else auto_map if isinstance(auto_map, list) else [auto_map]
    classes = sorted({str(v) for value in named for v in (value if isinstance(value, list) else [value]) if v})
    raise UserInputError(f"{settings}: the model needs its own Python code (auto_map: {', '.join(classes)[:160]}), "
                         "and neobert-embed never runs code from model files; use a model whose architecture "
                         "transformers has, or convert this one to such an architecture")


def refuse_module_code(directory: Path) -> None:
    """Refuse, in one line, a ``modules.json`` entry whose class is not one an installed package holds
    (sentence-transformers', or another library's): its code would come from the model's own files.

    Example:
        >>> refuse_module_code(Path("runs/custom-pooling"))
        Traceback (most recent call last):
        UserInputError: runs/custom-pooling/modules.json: module '1' (my_pooling.MyPooling) is code shipped ...
    """
    import importlib.util

    for entry in saved_modules(directory):
        top = entry.type.split(".")[0]
        shipped = (directory / f"{top}.py").exists() or (directory / top).is_dir()
        if not shipped and (top == "sentence_transformers" or (top and importlib.util.find_spec(top) is not None)):
            continue  # sentence-transformers' own (installed or not: the light runtime runs its modules itself)
        raise UserInputError(f"{directory / MODULES_FILE}: module {entry.name!r} ({entry.type}) is code shipped with "
                             "the model, not a class of an installed package, and neobert-embed never runs code "
                             "from model files; use sentence-transformers' modules")


def weights_size(directory: str | Path) -> int:
    """Bytes of a local model's weight files (safetensors and torch ``.bin``, in any module folder):
    what loading it reads, exporting it writes again, and a checkpoint of it holds.

    Example:
        >>> weights_size("models/minilm")
        90868376
    """
    directory = Path(directory)
    files = {*directory.glob("*.safetensors"), *directory.glob("*/*.safetensors"), *directory.glob("*.bin"),
             *directory.glob("*/*.bin")}
    return sum(file.stat().st_size for file in files if file.is_file())


def model_bytes(name_or_path: str | Path, copies: float = 1.0) -> int:
    """``copies`` times the size of a local model's weights (0 for a hub id or registry key, whose
    size is not known before the download): what an output holding them needs on the disk.

    Example:
        >>> model_bytes("models/minilm", copies=2)
        181736752
    """
    directory = local_model_dir(name_or_path)
    return int(copies * weights_size(directory)) if directory is not None and directory.is_dir() else 0


def read_model_config(name_or_path: str | Path) -> dict[str, Any] | None:
    """The encoder's ``config.json`` as a dict, from a local directory or the local hub cache
    (never downloading); None when it is not available without loading the model.

    Example:
        >>> read_model_config("runs/my-embedder")["model_type"]
        'bert'
    """
    directory = local_model_dir(name_or_path)
    if directory is not None:
        path: Path | None = _transformer_dir(directory) / "config.json"
    else:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(resolve_model_name(str(name_or_path)), "config.json")
        path = Path(cached) if isinstance(cached, str) else None
    data = _read_json(path) if path is not None and path.is_file() else None
    return data if isinstance(data, dict) else None


def position_limit(name_or_path: str | Path) -> int | None:
    """Longest input (tokens) the model's positions allow, read from its config without weights;
    None when unknown (the model then caps lengths itself when loaded).

    Example:
        >>> position_limit("bert")   # from the registry: 512
        512
    """
    config = read_model_config(name_or_path)
    if config is not None and ("max_position_embeddings" in config or "max_length" in config):
        positions = config.get("max_position_embeddings") or config.get("max_length")
        return usable_max_length(SimpleNamespace(**{**config, "max_position_embeddings": positions}))
    backbone = BACKBONES.get(str(name_or_path))
    return backbone.max_length if backbone else None


def check_length_flag(name_or_path: str | Path, value: int | None, flag: str) -> None:
    """Refuse a length flag above what the model supports (or below 1), before loading it.

    Example:
        >>> check_length_flag("bert", 100_000, "--max-length")
        Traceback (most recent call last):
        UserInputError: --max-length 100000 is more than model 'bert' supports (512 tokens) ...
    """
    if value is None:
        return
    if value < 1:
        raise UserInputError(f"{flag} must be at least 1, got {value}")
    limit = position_limit(name_or_path)
    if limit is not None and value > limit:
        raise UserInputError(f"{flag} {value} is more than model {str(name_or_path)!r} supports ({limit} "
                             f"tokens, from its config); pass at most {limit} or leave {flag} out")


def _pooled_dimension(config: dict[str, Any]) -> int | None:
    """Output width of a Pooling module (new ``pooling_mode`` or old ``pooling_mode_*`` configs)."""
    width = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    mode = config.get("pooling_mode")
    if mode is None:
        modes = sum(bool(v) for k, v in config.items() if k.startswith("pooling_mode_"))
    else:
        modes = 1 if isinstance(mode, str) else len(mode)
    return width if isinstance(width, int) and modes == 1 else None


def embedding_dimension(name_or_path: str | Path) -> int | None:
    """Width of the model's sentence embeddings read from its files (a SentenceTransformer's last
    Dense layer, else the encoder's ``hidden_size``); None when it cannot be told without loading.

    Example:
        >>> embedding_dimension("runs/my-embedder")
        384
    """
    directory = local_model_dir(name_or_path)
    modules = saved_modules(directory) if directory is not None else []
    if directory is not None and modules:
        dimension = None
        for module in modules:
            config = directory / module.path / "config.json"
            if not config.is_file():
                continue
            data = _read_json(config)
            if module.type.endswith("Dense") and isinstance(data, dict):
                dimension = data.get("out_features", dimension)
            elif module.type.endswith("Pooling") and isinstance(data, dict) and dimension is None:
                dimension = _pooled_dimension(data)
        if isinstance(dimension, int):
            return dimension
        if any(module.type.endswith(("Dense", "Pooling")) for module in modules):
            return None
    config = read_model_config(name_or_path)
    hidden = config.get("hidden_size") if config else None
    return hidden if isinstance(hidden, int) else None
