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


@dataclass(frozen=True)
class Spec:
    """A parsed spec: its mapping, what to call it in errors, and the 1-based line of each key path.

    Example:
        >>> read_spec("recipes/pretrain-tiny.yaml").lines[("model", "hidden_size")]
        7
    """

    source: str
    data: dict[str, Any]
    lines: dict[Key, int] = field(default_factory=dict)

    def validate(self, model: type[M], overrides: Mapping[str, Any] | None = None) -> M:
        """``model`` built from the mapping with top-level ``overrides`` applied (``None`` values
        are ignored); every validation error names this spec's file, the key's line and the key.
        Validators find the spec's folder in ``info.context["directory"]`` (for relative paths).

        Example:
            >>> read_spec("recipes/mteb-eval.yaml").validate(EvaluationRecipe, {"max_length": 512})
        """
        overrides = {key: value for key, value in (overrides or {}).items() if value is not None}
        data = {**self.data, **overrides}
        try:
            return model.model_validate(data, context={"directory": Path(self.source).parent})
        except ValidationError as exc:
            raise UserInputError("; ".join(self._describe(item, model, data, set(overrides))
                                           for item in exc.errors())) from None

    def _describe(self, item: Any, model: type[BaseModel], data: dict[str, Any], overridden: set[str]) -> str:
        key = _data_key(data, item["loc"], item["type"] == "missing")
        found = [self.lines[key[:n]] for n in range(len(key), 0, -1) if key[:n] in self.lines]
        where = f"{self.source}:{found[0]}" if found else self.source
        if key and key[0] in overridden:
            where = "override"  # the value came from the command line or the caller, not the file
        if item["type"] == "extra_forbidden":
            fields = _fields_at(model, item["loc"][:-1])
            return f"{where}: unknown key {'.'.join(map(str, key))!r}" + (f" (known keys: {', '.join(fields)})"
                                                                        if fields else "")
        message = re.sub(r"^(Value error|Assertion failed), ", "", item["msg"])
        return f"{where}: key {'.'.join(map(str, key))!r}: {message}" if key else f"{where}: {message}"


def read_spec(path: str | Path, what: str = "recipe", hint: str = "") -> Spec:
    """Parse a ``.json`` (JSON) or any other (YAML) spec file holding one mapping (empty → ``{}``).

    Bad syntax, bad UTF-8 and a top level that is not a mapping are errors naming the file (and
    the line); ``what`` names the file's role in them, ``hint`` says what to pass when it is missing.

    Example:
        >>> read_spec("recipes/glue-quick.yaml", "preset").data["epochs"]
        3
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"{path}: {what} file not found" + (f"; {hint}" if hint else ""))
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except UnicodeDecodeError:
        raise UserInputError(f"{path}: not valid UTF-8; re-encode the {what} as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise located(path, exc.lineno, f"invalid JSON ({exc.msg}, column {exc.colno})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = " ".join(filter(None, (getattr(exc, "problem", None), getattr(exc, "context", None))))
        raise located(path, mark.line + 1 if mark else None, f"invalid YAML: {problem or exc}") from None
    if data is not None and not isinstance(data, dict):
        raise UserInputError(f"{path}: a {what} is a mapping of keys to values, got {type(data).__name__}")
    return Spec(str(path), dict(data or {}), _key_lines(text))


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


def _key_lines(text: str) -> dict[Key, int]:
    """Line of every mapping key and list item, from YAML's node marks. Valid JSON is read the same
    way: it holds no raw tab inside strings, so tabs can become spaces (YAML refuses tab indents).
    A node reached again through an alias keeps the line of its first path."""
    import yaml

    lines: dict[Key, int] = {}
    try:
        stack = [((), yaml.compose(text.replace("\t", " ")))]
    except yaml.YAMLError:
        return lines
    seen: set[int] = set()
    while stack:
        prefix, node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            children = [(key.value, key, value) for key, value in node.value if isinstance(key, yaml.ScalarNode)]
        else:
            children = [(index, item, item) for index, item in enumerate(getattr(node, "value", []))
                        if isinstance(node, yaml.SequenceNode)]
        for part, marked, child in children:
            lines[prefix + (part,)] = marked.start_mark.line + 1
            stack.append((prefix + (part,), child))
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
    """Field names of the (nested) model at ``loc`` (dict keys and list indexes are stepped over)."""
    current: Any = model
    for part in loc:
        found = current.model_fields.get(part) if isinstance(part, str) and current is not None else None
        current = _model_in(found.annotation) if found is not None else current
    return list(current.model_fields) if current is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_model_in, typing.get_args(annotation))), None)
