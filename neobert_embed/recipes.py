"""Spec files (YAML or JSON) read into pydantic models, with errors that say file, line and key.

Why: recipes (contrastive, pretraining, evaluation, GLUE), local ``task.json`` files and index
manifests are all "a mapping checked by a pydantic model". One reader keeps the line of every key
while parsing, so any mistake — bad syntax, an unknown key, a bad value, in any kind of spec —
is reported the same way, as ``file:line: key 'a.b': what is wrong``, before any model loads.
The models themselves refuse unknown keys (``extra="forbid"``); this module only reads and reports.

Example:
    >>> from neobert_embed.contrastive.recipe import ContrastiveRecipe
    >>> load_spec("recipes/contrastive.yaml", ContrastiveRecipe, overrides={"max_steps": 20}).max_steps
    20
"""

from __future__ import annotations

import bisect
import json
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from neobert_embed.errors import UserInputError, located

M = TypeVar("M", bound=BaseModel)
Key = tuple[str | int, ...]
_SPACE = re.compile(r"[ \t\n\r]*")


@dataclass(frozen=True)
class Spec:
    """A parsed spec: its mapping, what to call it in errors, and the 1-based line of each key path.

    Example:
        >>> spec = read_spec("recipes/pretrain-tiny.yaml")
        >>> spec.lines[("model", "hidden_size")]
        4
    """

    source: str
    data: dict[str, Any]
    lines: dict[Key, int] = field(default_factory=dict)

    def validate(self, model: type[M], overrides: Mapping[str, Any] | None = None) -> M:
        """``model`` built from the mapping with top-level ``overrides`` applied (``None`` values
        are ignored); every validation error names this spec's file, the key's line and the key.

        Example:
            >>> read_spec("recipes/mteb-eval.yaml").validate(EvaluationRecipe, {"max_length": 512})
        """
        overrides = {key: value for key, value in (overrides or {}).items() if value is not None}
        unknown = sorted(set(overrides) - set(model.model_fields))
        if unknown:
            raise UserInputError(f"unknown recipe override(s) {unknown}; known keys: {', '.join(model.model_fields)}")
        data = {**self.data, **overrides}
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise UserInputError("; ".join(self._describe(item, model, data, set(overrides))
                                           for item in exc.errors())) from None

    def _describe(self, item: Any, model: type[BaseModel], data: dict[str, Any], overridden: set[str]) -> str:
        key = _data_key(data, item["loc"], item["type"] == "missing")
        dotted = ".".join(map(str, key))
        found = [self.lines[key[:n]] for n in range(len(key), 0, -1) if key[:n] in self.lines]
        where = f"{self.source}:{found[0]}" if found else self.source
        if key and key[0] in overridden:
            where = "override"  # the value came from the command line or the caller, not the file
        if item["type"] == "extra_forbidden":
            fields = _fields_at(model, item["loc"][:-1])
            known = f" (known keys: {', '.join(fields)})" if fields else ""
            return f"{where}: unknown key {dotted!r}{known}"
        message = re.sub(r"^(Value error|Assertion failed), ", "", item["msg"])
        return f"{where}: key {dotted!r}: {message}" if key else f"{where}: {message}"


def read_spec(path: str | Path, what: str = "recipe") -> Spec:
    """Parse a ``.json`` (JSON) or any other (YAML) spec file holding one mapping (empty → ``{}``).

    Bad syntax, bad UTF-8 and a top level that is not a mapping are errors naming the file (and
    the line); ``what`` names the file's role in them.

    Example:
        >>> read_spec("recipes/glue-quick.yaml", "preset").data["epochs"]
        3
    """
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"{path}: {what} file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserInputError(f"{path}: not valid UTF-8; re-encode the {what} as UTF-8") from None
    data, lines = _parse_json(path, text) if path.suffix.lower() == ".json" else _parse_yaml(path, text)
    if data is not None and not isinstance(data, dict):
        raise UserInputError(f"{path}: a {what} is a mapping of keys to values, got {type(data).__name__}")
    return Spec(str(path), dict(data or {}), lines)


def load_spec(path: str | Path | None, model: type[M], what: str = "recipe", default: str | None = None,
              overrides: Mapping[str, Any] | None = None) -> M:
    """Read and validate a spec file; ``path=None`` reads the bundled recipe ``default`` (found by
    :func:`neobert_embed.paths.recipe_path`) or, without one, takes the model's own defaults.

    Example:
        >>> load_spec(None, EvaluationRecipe, default="mteb-eval.yaml").max_length
        1024
    """
    from neobert_embed.paths import recipe_path

    if path is None and default is None:
        return Spec(f"{model.__name__} defaults", {}).validate(model, overrides)
    return read_spec(recipe_path(default) if path is None else path, what).validate(model, overrides)


def parse_spec(data: Any, model: type[M], source: str) -> M:
    """Validate a mapping that did not come from a file of its own (``source`` names it in errors).

    Example:
        >>> parse_spec({"model": {"init_from": "runs/stage1/final"}}, PretrainRecipe, "stage2").model.init_from
        'runs/stage1/final'
    """
    if not isinstance(data, dict):
        raise UserInputError(f"{source}: expected a mapping of keys to values, got {type(data).__name__}")
    return Spec(source, data).validate(model)


def _parse_yaml(path: Path, text: str) -> tuple[Any, dict[Key, int]]:
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = " ".join(filter(None, (getattr(exc, "problem", None), getattr(exc, "context", None)))) or exc
        raise located(path, mark.line + 1 if mark else None, f"invalid YAML: {problem}") from None
    finally:
        loader.dispose()
    lines: dict[Key, int] = {}
    _yaml_lines(node, (), lines, set())
    return data, lines


def _yaml_lines(node: Any, prefix: Key, lines: dict[Key, int], active: set[int]) -> None:
    """Record the line of every mapping key and list item below ``node`` (aliases visited once per path)."""
    import yaml

    if id(node) in active:
        return
    active.add(id(node))
    if isinstance(node, yaml.MappingNode):
        children = [((key.value,), key, value) for key, value in node.value if isinstance(key, yaml.ScalarNode)]
    elif isinstance(node, yaml.SequenceNode):
        children = [((index,), item, item) for index, item in enumerate(node.value)]
    else:
        children = []
    for part, marked, child in children:
        lines[prefix + part] = marked.start_mark.line + 1
        _yaml_lines(child, prefix + part, lines, active)
    active.discard(id(node))


def _parse_json(path: Path, text: str) -> tuple[Any, dict[Key, int]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise located(path, exc.lineno, f"invalid JSON ({exc.msg}, column {exc.colno})") from None
    return data, _json_lines(text)


def _json_lines(text: str) -> dict[Key, int]:
    """Line of every key and list item of a valid JSON text, found with json's own scanners."""
    starts = [0, *(match.end() for match in re.finditer("\n", text))]
    decoder = json.JSONDecoder()
    lines: dict[Key, int] = {}

    def skip(pos: int) -> int:
        return _SPACE.match(text, pos).end()

    def value(pos: int, path: Key) -> int:
        pos = skip(pos)
        if text[pos] not in "{[":
            return decoder.raw_decode(text, pos)[1]
        closer, index = "}" if text[pos] == "{" else "]", 0
        pos = skip(pos + 1)
        while text[pos] != closer:
            if closer == "}":
                name, end = json.decoder.scanstring(text, pos + 1)
                part, start = name, skip(end) + 1  # past the ':'
            else:
                part, start, index = index, pos, index + 1
            lines[path + (part,)] = bisect.bisect_right(starts, pos)
            pos = skip(value(start, path + (part,)))
            pos = skip(pos + 1) if text[pos] == "," else pos
        return pos + 1

    value(0, ())
    return lines


def _data_key(data: Any, loc: tuple[Any, ...], missing: bool) -> Key:
    """The parts of a pydantic error location that are keys of the data (union-member tags dropped)."""
    key: list[str | int] = []
    for number, part in enumerate(loc):
        if isinstance(data, dict) and part in data or isinstance(data, list) and isinstance(part, int):
            data = data[part] if isinstance(data, dict) or part < len(data) else None
            key.append(part)
        elif missing and number == len(loc) - 1:
            key.append(part)
    return tuple(key)


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (nested) model found at ``loc``; [] when it is not a model."""
    current: type[BaseModel] | None = model
    for part in loc:
        found = current.model_fields.get(part) if current is not None and isinstance(part, str) else None
        if found is not None:
            current = _model_in(found.annotation)
    return list(current.model_fields) if current is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_model_in, typing.get_args(annotation))), None)
