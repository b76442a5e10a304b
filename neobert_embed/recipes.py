"""Spec files (YAML or JSON) read into pydantic models, with errors that say file, line and key.

Why: recipes (contrastive, pretraining, evaluation, GLUE), local ``task.json`` files and index
manifests are all a mapping checked by a pydantic model (which refuses unknown keys). One reader
keeps the line of every key, so any mistake in any of them reads ``file:line: key 'a.b': problem``.

Example:
    >>> from neobert_embed.contrastive.recipe import ContrastiveRecipe
    >>> load_spec("recipes/contrastive.yaml", ContrastiveRecipe, overrides={"max_steps": 20}).max_steps
    20
"""

from __future__ import annotations

import functools
import json
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from neobert_embed.errors import UserInputError, located

M = TypeVar("M", bound=BaseModel)
TASK_FILE = "task.json"  # what makes a directory a local task (GLUE, MTEB, the demo's retrieval task)
Key = tuple[str | int, ...]


@dataclass(frozen=True)
class Spec:
    """A parsed spec: its mapping, what to call it in errors, and the 1-based line of each key path.

    A mapping that did not come from a file of its own (one embedded in a checkpoint, say) is
    validated the same way, without lines: ``Spec("stage2", data).validate(PretrainRecipe)``.

    Example:
        >>> read_spec("recipes/pretrain-tiny.yaml").lines[("model", "hidden_size")]
        7
    """

    source: str
    data: dict[str, Any]
    text: str = ""

    @functools.cached_property
    def lines(self) -> dict[Key, int]:
        """Line of each key path, found only when an error needs one (a pass over the whole text)."""
        return _key_lines(self.text) if self.text else {}

    def validate(self, model: type[M], overrides: Mapping[str, Any] | None = None) -> M:
        """``model`` built from the mapping with top-level ``overrides`` applied (``None`` values
        are ignored); every validation error names this spec's file, the key's line and the key.
        Validators find a spec file's folder in ``info.context["directory"]`` (for relative paths).

        Example:
            >>> read_spec("recipes/mteb-eval.yaml").validate(EvaluationRecipe, {"max_length": 512})
        """
        overrides = {key: value for key, value in (overrides or {}).items() if value is not None}
        data = {**self.data, **overrides} if overrides else self.data
        try:
            folder = Path(self.source).parent if Path(self.source).is_file() else None
            return model.model_validate(data, context={"directory": folder} if folder else None)
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
            known = ", ".join(_fields_at(model, item["loc"][:-1]))
            return f"{where}: unknown key {'.'.join(map(str, key))!r}" + (f" (known keys: {known})" if known else "")
        message = re.sub(r"^(Value error|Assertion failed), ", "", item["msg"])
        message = re.sub(r"valid dictionary or instance of \w+", "JSON object", message)  # no class names
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
        mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None) or exc
        raise located(path, mark.line + 1 if mark else None, f"invalid YAML: {problem}") from None
    if data is not None and not isinstance(data, dict):
        raise UserInputError(f"{path}: a {what} is a mapping of keys to values, got {type(data).__name__}")
    return Spec(str(path), dict(data or {}), text)


def load_spec(path: str | Path | None, model: type[M], what: str = "recipe", default: str | None = None,
              overrides: Mapping[str, Any] | None = None) -> M:
    """Read and validate a spec file (``path=None``: the bundled recipe ``default``, via ``paths.recipe_path``).

    Example:
        >>> load_spec(None, EvaluationRecipe, default="mteb-eval.yaml").max_length
        1024
    """
    from neobert_embed.paths import recipe_path

    return read_spec(recipe_path(default) if path is None else path, what).validate(model, overrides)


def _key_lines(text: str) -> dict[Key, int]:
    """Line of every mapping key and list item, from YAML's node marks (a node reached again through
    an alias keeps its first path). Valid JSON holds no raw tab in strings: tabs become spaces for YAML."""
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
        children = ([(key.value, key, value) for key, value in node.value if isinstance(key, yaml.ScalarNode)]
                    if isinstance(node, yaml.MappingNode) else [(index, item, item) for index, item in
                    enumerate(node.value)] if isinstance(node, yaml.SequenceNode) else [])
        for part, marked, child in children:
            lines[prefix + (part,)] = marked.start_mark.line + 1
            stack.append((prefix + (part,), child))
    return lines


def _data_key(data: Any, loc: tuple[Any, ...], missing: bool) -> Key:
    """The parts of a pydantic error location that are keys of the data (union-member tags dropped)."""
    key: list[str | int] = []
    for number, part in enumerate(loc):
        if isinstance(data, dict) and part in data or isinstance(data, list) and isinstance(part, int):
            data = data[part]  # pydantic only reports indexes that exist
        elif not (missing and number == len(loc) - 1):
            continue
        key.append(part)
    return tuple(key)


def _fields_at(model: Any, loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (nested) model at ``loc`` (dict keys and list indexes are stepped over)."""
    for part in loc:
        found = model.model_fields.get(part) if isinstance(part, str) and model is not None else None
        model = _model_in(found.annotation) if found is not None else model
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_model_in, typing.get_args(annotation))), None)
