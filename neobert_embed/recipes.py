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
import types
import typing
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ValidationError

from neobert_embed.errors import UserInputError, located
from neobert_embed.files import NAME_HINT, name_problem

M = TypeVar("M", bound=BaseModel)


def _file_name(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(f"{value!r} {problem}; {NAME_HINT}")
    return value


FileName = Annotated[str, AfterValidator(_file_name)]
"""A spec field whose value becomes a file name (a task's name, a split, a file an index lists): one
path component (:func:`~neobert_embed.files.name_problem`), refused otherwise with the spec's file and line."""
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
        for key in _yes_no_for_numbers(model, data):  # pydantic takes true for 1
            where = f"{self.source}:{self.lines[key]}" if key in self.lines else self.source
            raise UserInputError(f"{where}: key {'.'.join(map(str, key))!r}: {_at(data, key)!r} is a yes/no value, "
                                 "but a number is expected here; write the number")
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
        data = json.loads(text, object_pairs_hook=_unique_keys) if path.suffix.lower() == ".json" \
            else yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except UnicodeDecodeError:
        raise UserInputError(f"{path}: not valid UTF-8; re-encode the {what} as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise located(path, exc.lineno, f"invalid JSON ({exc.msg}, column {exc.colno})") from None
    except _DuplicateKey as exc:
        raise located(path, exc.line or _key_lines(text).get((exc.key,)), f"key {exc.key!r} appears twice in one "
                      "mapping (only one value can hold); keep one") from None
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


class _DuplicateKey(ValueError):
    def __init__(self, key: str, line: int | None = None) -> None:
        super().__init__(key)
        self.key, self.line = key, line


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; a key given twice is refused (``json`` keeps the last silently)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(key)
        data[key] = value
    return data


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader refusing a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable) and key in seen:
                raise _DuplicateKey(str(key), key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yes_no_for_numbers(model: Any, data: Any, prefix: Key = ()) -> Iterator[Key]:
    """Key paths of ``data`` holding ``true``/``false`` where ``model``'s field takes a number
    (pydantic's lax mode reads ``max_steps: true`` as 1), nested models and lists included."""
    fields = getattr(model, "model_fields", None)
    if fields is None or not isinstance(data, dict):
        return
    for name, value in data.items():
        field = fields.get(name)
        if field is not None:
            yield from _bad_values(field.annotation, value, prefix + (name,))


def _bad_values(annotation: Any, value: Any, key: Key) -> Iterator[Key]:
    kinds = _kinds(annotation)
    if isinstance(value, bool) and kinds & {int, float} and not kinds & {bool, Any, object}:
        yield key
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _bad_values(_item_type(annotation), item, key + (index,))
    elif isinstance(value, dict):
        inner = _model_in(annotation)
        if inner is not None:
            yield from _yes_no_for_numbers(inner, value, key)


def _kinds(annotation: Any) -> set[Any]:
    """The plain types an annotation admits (``int | None`` → {int, NoneType}; ``Annotated`` unwrapped)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        return _kinds(args[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*map(_kinds, args))
    if typing.get_origin(annotation) is typing.Literal:
        return {type(arg) for arg in args}
    return {annotation}


def _item_type(annotation: Any) -> Any:
    """The element type of a list annotation (through ``Optional``/``Annotated``), else Any."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _item_type(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        found = [_item_type(arg) for arg in typing.get_args(annotation) if arg is not type(None)]
        return found[0] if len(found) == 1 else Any
    args = typing.get_args(annotation)
    return args[0] if typing.get_origin(annotation) in (list, tuple) and args else Any


def _at(data: Any, key: Key) -> Any:
    for part in key:
        data = data[part]
    return data


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
