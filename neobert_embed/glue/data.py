"""GLUE data, from the hub or from a local task directory, checked and normalized.

Why: every task reaches the trainer in one shape — ``sentence1``, ``sentence2`` (pair tasks only),
``label`` (class id, or a float for STS-B), ``idx`` — so the trainer never needs to know where the
data came from. Local files are checked row by row before any model is loaded; a bad row is an
error naming its file and line, and nothing has been written yet.

A local task directory::

    DIR/task.json          {"glue_task": "stsb"}
    DIR/train.jsonl        {"sentence1": ..., "sentence2": ..., "label": 3.8}
    DIR/validation.jsonl   (MNLI: validation_matched.jsonl and validation_mismatched.jsonl)
    DIR/test.jsonl         optional, labels may be absent (MNLI: test_matched/test_mismatched.jsonl)

Labels are class ids (``0``/``1``; MNLI ``0`` entailment, ``1`` neutral, ``2`` contradiction, as on
the hub) or the class names of :data:`~neobert_embed.glue.tasks.TASKS`.

Example:
    >>> data = load_glue_data(task_dir="tasks/stsb")
    >>> data.task.name, data.splits["train"].column_names
    ('stsb', ['sentence1', 'sentence2', 'label', 'idx'])
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, field_validator

from neobert_embed.errors import UserInputError, located
from neobert_embed.files import iter_jsonl
from neobert_embed.glue.tasks import GlueTask, get_task
from neobert_embed.recipes import TASK_FILE, read_spec
from neobert_embed.records import check_fields

if TYPE_CHECKING:
    from datasets import Dataset

HUB_DATASET = "nyu-mll/glue"


@dataclass
class GlueData:
    """One task's splits (``datasets.Dataset`` each) and where they came from."""

    task: GlueTask
    splits: dict[str, Any]
    source: str
    test_splits: list[str] = field(default_factory=list)


def _label(task: GlueTask, value: object, path: Path, line: int, required: bool) -> float | int | None:
    if value is None or (value == -1 and not required):
        if required:
            raise located(path, line, f"field 'label' is missing; {task.title} rows need one")
        return None
    if task.is_regression:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise located(path, line, f"label {value!r} is not a number; STS-B labels are similarity "
                                      "scores such as 3.8")
        return float(value)
    if isinstance(value, str) and value in task.labels:
        return task.labels.index(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and value in range(task.num_labels):
        return int(value)
    classes = ", ".join(f"{i} ({name})" for i, name in enumerate(task.labels))
    raise located(path, line, f"label {value!r} is not one of {task.title}'s classes: {classes}")


def _text(record: dict[str, Any], key: str, path: Path, line: int, task: GlueTask) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        what = "missing" if value is None else "empty" if isinstance(value, str) else "not a string"
        hint = " (a sentence-pair task)" if key == "sentence2" else ""
        raise located(path, line, f"field {key!r} is {what}; {task.title}{hint} rows need "
                                  f"{'sentence1 and sentence2' if task.is_pair else 'sentence1'}")
    return value


def read_split(path: str | Path, task: GlueTask, labelled: bool = True) -> dict[str, list]:
    """Read one JSON-lines split into columns, checking every row (errors name file and line).

    Example:
        >>> read_split("tasks/rte/train.jsonl", TASKS["rte"])["label"][:3]
        [1, 0, 1]
    """
    path = Path(path)
    columns: dict[str, list] = {"sentence1": [], "label": [], "idx": []}
    if task.is_pair:
        columns["sentence2"] = []
    for line, record in iter_jsonl(path):
        columns["sentence1"].append(_text(record, "sentence1", path, line, task))
        if task.is_pair:
            columns["sentence2"].append(_text(record, "sentence2", path, line, task))
        label = _label(task, record.get("label"), path, line, required=labelled)
        columns["label"].append(-1 if label is None else label)
        columns["idx"].append(int(record.get("idx", len(columns["idx"]))))
    if not columns["sentence1"]:
        raise UserInputError(f"{path}: the split is empty; it needs at least one row")
    return columns


def _from_columns(columns: dict[str, list], task: GlueTask) -> Dataset:
    from datasets import Dataset, Features, Value

    features = {"sentence1": Value("string"), **({"sentence2": Value("string")} if task.is_pair else {}),
                "label": Value("float32" if task.is_regression else "int64"), "idx": Value("int64")}
    return Dataset.from_dict({k: columns[k] for k in features}, features=Features(features))


class GlueTaskSpec(BaseModel):
    """The ``task.json`` of a local GLUE task directory: which GLUE task its files hold (other keys,
    such as a note on where the data came from, are allowed and ignored)."""

    glue_task: str

    @field_validator("glue_task")
    @classmethod
    def _known(cls, name: str) -> str:
        get_task(name)  # an unknown name is this field's error, with the known ones listed
        return name


def load_task_dir(directory: str | Path) -> GlueData:
    """Read and check a local task directory (see the module docstring).

    Example:
        >>> load_task_dir("tasks/mrpc").splits["validation"].num_rows
        408
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise UserInputError(f"{directory}: task directory not found")
    example = f'a GLUE task directory\'s {TASK_FILE} names its task, e.g. {{"glue_task": "stsb"}}'
    spec = read_spec(directory / TASK_FILE, "GLUE task", example)
    task = get_task(check_fields(spec.source, spec.data, GlueTaskSpec, example, text=spec.text).glue_task)
    needed = ["train", *(split for _, split in task.validation_splits)]
    splits = {}
    for split in needed:
        path = directory / f"{split}.jsonl"
        if not path.is_file():
            raise UserInputError(f"{path}: file not found; a {task.title} task directory needs "
                                 f"{', '.join(s + '.jsonl' for s in needed)}")
        splits[split] = _from_columns(read_split(path, task), task)
    tests = [split for split, _ in task.test_files if (directory / f"{split}.jsonl").is_file()]
    for split in tests:
        splits[split] = _from_columns(read_split(directory / f"{split}.jsonl", task, labelled=False), task)
    return GlueData(task, splits, str(directory.resolve()), tests)


def load_hub_task(name: str) -> GlueData:
    """The task from the hub's GLUE dataset (``nyu-mll/glue``), columns renamed to the local layout.

    Example:
        >>> load_hub_task("rte").splits["validation"].num_rows
        277
    """
    from datasets import load_dataset

    task = get_task(name)
    try:
        raw = load_dataset(HUB_DATASET, task.name)
    except (OSError, ValueError, ConnectionError) as exc:
        raise UserInputError(f"cannot load {HUB_DATASET}/{task.name} from the hub ({exc.__class__.__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}); offline, pass --task-dir "
                             "with a local task directory (see docs/glue.md)") from None
    first, second = task.hub_columns
    renames = {first: "sentence1", **({second: "sentence2"} if second else {})}
    keep = ["sentence1", *(["sentence2"] if second else []), "label", "idx"]
    splits = {split: dataset.rename_columns({k: v for k, v in renames.items() if k != v}).select_columns(keep)
              for split, dataset in raw.items()}
    tests = [split for split, _ in task.test_files if split in splits]
    return GlueData(task, splits, f"hub:{HUB_DATASET}/{task.name}", tests)


def load_glue_data(task: str | None = None, task_dir: str | Path | None = None) -> GlueData:
    """One task's data: ``task_dir`` (offline layout) or ``task`` by name from the hub.

    Example:
        >>> load_glue_data(task_dir="tasks/stsb").task.title
        'STS-B'
    """
    if (task is None) == (task_dir is None):
        raise ValueError("pass exactly one of task and task_dir")
    return load_task_dir(task_dir) if task_dir is not None else load_hub_task(task)
