"""Hash pins of an export: every file that decides its vectors, recorded at export and checked at load.

Why: an export used to be trusted on its ``export.json`` alone. A same-size corruption of
``model.onnx`` encoded all-NaN matrices with exit 0, a pooling edited from mean to CLS or a
``tokenizer.json`` without lower-casing appended other vectors to an index built with the original
model, and another model's graph dropped under the original ``export.json`` was accepted. The
export now records the size and SHA-256 (:class:`~neobert_embed.files.FilePin`) of every file it
wrote but its prose (``*.md``) under ``pins`` in ``export.json``; loading checks the files the
chosen runtime reads (every settings and tokenizer file, and the one graph or the torch weights)
and refuses, in one line naming the file, one that is missing, changed, or present without a pin.

SHA-256 is what checkpoints and indexes pin already; on a 2-core EPYC it hashes ~1.6 GB/s, so the
33.6 MB int8 graph of all-MiniLM-L6-v2 costs ~21 ms (``docs/data-safety.md`` has the whole-process
figures). Graphs of the other runtime and precision, and the torch weights, are not read by the light
runtime and not hashed by it (the torch backend hashes the weights and skips the graphs).

An export written before pins existed is refused with one line saying to export it again: its
``source_fingerprint`` covered the weights only, so an index could not tell its pooling or
tokenizer from another's.

Example:
    >>> record["pins"] = pin_export(Path("runs/x-onnx"))   # at export, after every file is written
    >>> verify_export(Path("runs/x-onnx"), Path("runs/x-onnx/onnx/model.onnx"))   # at load
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from neobert_embed.errors import UserInputError
from neobert_embed.files import FilePin
from neobert_embed.records import EXPORT

PINS_KEY = "pins"
GRAPH_SUFFIXES = (".onnx", ".xml")
PROSE_SUFFIXES = (".md",)
REEXPORT = "export the model again with `neobert-embed export MODEL --output DIR --overwrite`"


def _pinned_files(directory: Path) -> list[str]:
    """Relative names of the files an export pins: all but hidden ones, its record and its prose."""
    names = []
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if (path.is_file() and not any(part.startswith(".") for part in relative.parts)
                and path.name not in EXPORT.names and path.suffix not in PROSE_SUFFIXES):
            names.append(relative.as_posix())
    return names


def pin_export(directory: str | Path) -> dict[str, dict[str, object]]:
    """``{relative name: {"size", "sha256"}}`` of every file of the export in ``directory`` (its record's ``pins``).

    Example:
        >>> sorted(pin_export(Path("runs/x-onnx")))[:2]
        ['1_Pooling/config.json', 'config.json']
    """
    directory = Path(directory)
    return {name: asdict(FilePin.of(directory / name)) for name in _pinned_files(directory)}


def _graph_part(name: str, names: set[str]) -> bool:
    """A graph file, or the ``.bin`` weights beside an OpenVINO ``.xml``."""
    path = Path(name)
    return path.suffix in GRAPH_SUFFIXES or (path.suffix == ".bin" and path.with_suffix(".xml").as_posix() in names)


def _torch_weights(name: str) -> bool:
    path = Path(name)
    return path.suffix == ".safetensors" or path.name.startswith("pytorch_model")


def _read_by(name: str, names: set[str], graph: str | None) -> bool:
    """Whether a runtime that loads ``graph`` (None: torch) reads the file ``name``."""
    if _graph_part(name, names):
        return graph is not None and Path(name).with_suffix("") == Path(graph).with_suffix("")
    return graph is None or not _torch_weights(name)


def verify_export(directory: str | Path, graph: str | Path | None) -> None:
    """Refuse an export whose files differ from the pins in its ``export.json``, in one line naming the file.

    ``graph`` is the graph file the light runtime loads; None checks what the torch backend reads (every
    pinned file but the graphs). A directory whose ``export.json`` is not a graph export's (``pretrain export``
    writes one too), or that has none (a SentenceTransformer directory made by hand), has nothing to check
    against and passes.

    Example:
        >>> verify_export("runs/x-onnx", "runs/x-onnx/onnx/model.onnx")
        Traceback (most recent call last):
        UserInputError: runs/x-onnx/onnx/model.onnx: contents differ from the recorded checksum (same size) ...
    """
    directory = Path(directory)
    record = EXPORT.read(directory) if EXPORT.exists(directory) else {}
    if PINS_KEY not in record and "format" not in record:  # not a graph export (``pretrain export`` writes one)
        return
    pins = record.get(PINS_KEY)
    if not isinstance(pins, dict) or not pins:
        raise UserInputError(f"{EXPORT.path(directory)}: this export records no hashes of its files (it predates "
                             f"them), so a changed or damaged file cannot be told apart; {REEXPORT}")
    relative = None if graph is None else Path(graph).resolve().relative_to(directory.resolve()).as_posix()
    present = set(_pinned_files(directory))
    names = present | set(pins)
    for name in sorted(names):
        if not _read_by(name, names, relative):
            continue
        path = directory / name
        if name not in pins:
            raise UserInputError(f"{path}: not one of the files the export wrote (no hash in {EXPORT.name}), yet "
                                 f"it would be read; remove it or {REEXPORT}")
        try:
            pin = FilePin(**pins[name])
        except TypeError:
            raise UserInputError(f"{EXPORT.path(directory)}: damaged entry for {name!r}; {REEXPORT}") from None
        difference = pin.difference(path)
        if difference is not None:
            raise UserInputError(f"{path}: {difference}{' since the export' if difference == 'missing' else ''}"
                                 f" (changed or damaged after `neobert-embed export`); {REEXPORT}")
