"""Hash pins of an export: every file that decides its vectors, recorded at export and checked at load.

Why: a same-size corruption of a graph, a pooling edited from mean to CLS or another model's graph
under the same ``export.json`` would otherwise encode other vectors with exit 0 (and append them to an
index built with the original model). Loading refuses, in one line naming the file, one that is missing,
changed, or present without a pin; an export without pins is refused too. The hash is XXH3-128 over a
memory map, not SHA-256, because it runs at every ``encode --backend onnx`` (docs/data-safety.md has
the cost); it detects damage and edits, it is not a signature. Examples: :func:`pin_export` (at
export), :func:`verify_export` (at load).
"""

from __future__ import annotations

import mmap
from dataclasses import asdict, dataclass
from pathlib import Path

from neobert_embed.errors import UserInputError
from neobert_embed.records import EXPORT

PINS_KEY = "pins"
GRAPH_SUFFIXES = (".onnx", ".xml")
PROSE_SUFFIXES = (".md",)
REEXPORT = "export the model again with `neobert-embed export MODEL --output DIR --overwrite`"


def content_digest(path: Path) -> str:
    """XXH3-128 of a file's bytes (hex), read through a memory map: no copy of the file is made.

    Example:
        >>> len(content_digest(Path("runs/x-onnx/onnx/model.onnx")))
        32
    """
    import xxhash

    if path.stat().st_size == 0:
        return xxhash.xxh3_128().hexdigest()
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
        return xxhash.xxh3_128(view).hexdigest()


@dataclass(frozen=True)
class ExportPin:
    """A file's size and :func:`content_digest` as the export wrote it: ``ExportPin.of(path).difference(path)``
    is None."""

    size: int
    xxh3_128: str

    @classmethod
    def of(cls, path: Path) -> ExportPin:
        return cls(size=path.stat().st_size, xxh3_128=content_digest(path))

    def difference(self, path: Path) -> str | None:
        """How ``path`` differs from this pin (None when it matches)."""
        if not path.is_file():
            return "missing"
        size = path.stat().st_size
        if size != self.size:
            return f"{size} bytes, but {self.size} were recorded"
        if content_digest(path) != self.xxh3_128:
            return "contents differ from the recorded hash (same size)"
        return None


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
    """``{relative name: {"size", "xxh3_128"}}`` of every file of the export in ``directory`` (its record's ``pins``).

    Example:
        >>> sorted(pin_export(Path("runs/x-onnx")))[:2]
        ['1_Pooling/config.json', 'config.json']
    """
    directory = Path(directory)
    return {name: asdict(ExportPin.of(directory / name)) for name in _pinned_files(directory)}


def _read_by(name: str, names: set[str], graph: str | None) -> bool:
    """Whether a runtime that loads ``graph`` (None: torch) reads the file ``name``: a graph (with its ``.bin``)
    only when it is that graph, the torch weights only under torch."""
    path = Path(name)
    if path.suffix in GRAPH_SUFFIXES or (path.suffix == ".bin" and path.with_suffix(".xml").as_posix() in names):
        return graph is not None and path.with_suffix("") == Path(graph).with_suffix("")
    return graph is None or not (path.suffix == ".safetensors" or path.name.startswith("pytorch_model"))


def verify_export(directory: str | Path, graph: str | Path | None) -> None:
    """Refuse an export whose files differ from the pins in its ``export.json``, in one line naming the file.

    ``graph`` is the graph file the light runtime loads; None checks what the torch backend reads. A
    directory without a graph export's ``export.json`` (made by hand, or by ``pretrain export``) passes.

    Example:
        >>> verify_export("runs/x-onnx", "runs/x-onnx/onnx/model.onnx")
        Traceback (most recent call last):
        UserInputError: runs/x-onnx/onnx/model.onnx: contents differ from the recorded hash (same size) ...
    """
    directory = Path(directory)
    record = EXPORT.read(directory) if EXPORT.exists(directory) else {}
    if PINS_KEY not in record and "format" not in record:
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
            pin = ExportPin(**pins[name])
        except TypeError:
            raise UserInputError(f"{EXPORT.path(directory)}: damaged entry for {name!r}; {REEXPORT}") from None
        difference = pin.difference(path)
        if difference is not None:
            raise UserInputError(f"{path}: {difference}{' since the export' if difference == 'missing' else ''}"
                                 f" (changed or damaged after `neobert-embed export`); {REEXPORT}")
