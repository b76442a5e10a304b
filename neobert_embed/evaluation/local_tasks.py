"""Local MTEB tasks: a directory with ``task.json`` and data files becomes an mteb task.

Why: users evaluate on offline copies of MTEB data and on private data, and must get the exact
numbers mteb would give. So a local task is an mteb task class — mteb's evaluators, metrics and
settings — whose ``load_data`` reads the directory instead of the hub. Nothing is re-implemented.

Two kinds of ``task.json``:

* ``{"mteb_task": "STSBenchmark", "eval_split": "test", "hf_subset": "en"}`` — the REGISTERED task
  with all its own settings (main score, classifier, undersampling, score range, ...); results
  carry the official name. As in MTEB(eng): the ``test`` split where the task has one (MSMARCO:
  ``dev``) and, for multilingual tasks, the English-only subset; ``eval_split`` and ``hf_subset``
  override those choices. The files hold the task's data in the layout below (the standard
  columns, i.e. after mteb's own ``dataset_transform``, which is not applied again).
* ``{"name": "MyTask", "type": "STS", "main_score": "cosine_spearman", "min_score": 0,
  "max_score": 5, "eval_split": "test", "instruction": "..."}`` — a new task of one of the six
  types, evaluated with that type's mteb defaults (a new Clustering task embeds every text and
  bootstraps samples of its own size). ``eval_splits`` (a list) names several splits instead of one;
  a retrieval split may have a corpus of its own in ``DIR/<split>/`` (LongEmbed's lengths,
  :mod:`neobert_embed.evaluation.long_context`). ``main_score``, ``eval_split`` (default
  ``test``) and ``instruction`` (a string, or ``{"query": ..., "document": ...}``) are optional;
  ``min_score``/``max_score`` are for STS only (default 0 and 5).

Example:
    >>> task = load_task_dir("../shared/data/tasks/stsb-dev")
    >>> task.metadata.name, task.metadata.main_score
    ('STSBenchmarkDev', 'cosine_spearman')
    >>> [t.metadata.name for t in load_task_dirs(["../shared/data/tasks"])]
    ['STSBenchmarkDev', 'TRECCoarse']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from neobert_embed.errors import UserInputError
from neobert_embed.evaluation import task_data
from neobert_embed.evaluation.task_data import LABEL, NUMBER, TEXT
from neobert_embed.files import directory_digest
from neobert_embed.recipes import TASK_FILE, FileName, load_spec

if TYPE_CHECKING:
    from datasets import Dataset
    from mteb import AbsTask
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

TASK_TYPES = ("STS", "PairClassification", "Classification", "Clustering", "Retrieval", "Reranking")
DEFAULT_MAIN_SCORES = {"STS": "cosine_spearman", "PairClassification": "max_ap",
                       "Classification": "accuracy", "Clustering": "v_measure",
                       "Retrieval": "ndcg_at_10", "Reranking": "map_at_1000"}


class TaskSpec(BaseModel):
    """The validated content of a ``task.json``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mteb_task: str | None = None
    name: FileName | None = None  # names become file names: <name>.json results, <split>.jsonl data
    type: Literal[TASK_TYPES] | None = None  # type: ignore[valid-type]
    main_score: str | None = None
    min_score: float | None = None
    max_score: float | None = None
    eval_split: FileName | None = None
    eval_splits: list[FileName] | None = None
    hf_subset: FileName | None = None
    instruction: str | dict[Literal["query", "document"], str] | None = None
    description: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> TaskSpec:
        if self.eval_split is not None and self.eval_splits is not None:
            raise ValueError("give 'eval_split' (one split) or 'eval_splits' (several), not both")
        if self.eval_splits is not None and not self.eval_splits:
            raise ValueError("'eval_splits' is empty; name at least one split")
        if self.mteb_task is not None:
            extra = [key for key in ("name", "type", "main_score", "min_score", "max_score", "instruction")
                     if getattr(self, key) is not None]
            if extra:
                raise ValueError(f"'mteb_task' runs the registered task with its own settings; remove {extra}")
            return self
        if not self.name or not self.type:
            raise ValueError("give either 'mteb_task' (a registered task) or both 'name' and 'type' "
                             f"(one of {', '.join(TASK_TYPES)})")
        if self.type != "STS" and (self.min_score is not None or self.max_score is not None):
            raise ValueError("'min_score'/'max_score' only apply to type STS")
        if self.hf_subset is not None:
            raise ValueError("'hf_subset' only applies to 'mteb_task' directories")
        return self


class LocalTask:
    """Mixin marking every task built here: its data come from a directory, never the hub."""


def _read_split(task_type: str, directory: Path, split: str, columns: dict[str, str]) -> Dataset | RetrievalSplitData:
    """One split of ``task_type`` as the Dataset (or RetrievalSplitData) mteb evaluates."""
    from datasets import Dataset

    path = directory / f"{split}.jsonl"
    if task_type in ("Retrieval", "Reranking"):
        return task_data.read_retrieval_split(directory, split, reranking=task_type == "Reranking")
    if task_type == "STS":
        rows = task_data.read_split_rows(path, {"sentence1": TEXT, "sentence2": TEXT, "score": NUMBER})
    elif task_type == "PairClassification":
        rows = task_data.read_binary_labels(path)
    else:
        rows = task_data.read_split_rows(path, {"text": TEXT, "label": LABEL})
    renamed = {columns.get(name, name): values for name, values in rows.items()}
    if columns.get("one_row"):
        renamed = {name: [values] for name, values in renamed.items()}
    return Dataset.from_dict(renamed)


def _column_names(task_class: type, task_type: str) -> dict[str, Any]:
    """Map the file's field names to the columns this task class reads."""
    if task_type == "STS":
        first, second = task_class.column_names
        return {"sentence1": first, "sentence2": second}
    if task_type == "PairClassification":
        return {"sentence1": task_class.input1_column_name, "sentence2": task_class.input2_column_name,
                "label": task_class.label_column_name}
    if task_type == "Clustering":
        from mteb.abstasks.clustering_legacy import AbsTaskClusteringLegacy

        return {"text": task_class.input_column_name, "label": task_class.label_column_name,
                "one_row": issubclass(task_class, AbsTaskClusteringLegacy)}
    if task_type == "Classification":
        return {"text": task_class.input_column_name, "label": task_class.label_column_name}
    return {}


def _make_loader(directory: Path, task_type: str, splits: list[str], subset: str,
                 size_clusters_to_data: bool = False) -> Callable[..., None]:
    def load_data(self: Any, num_proc: int | None = None, **kwargs: Any) -> None:
        if self.data_loaded:
            return
        from datasets import DatasetDict

        columns = _column_names(type(self), task_type)
        wanted = list(splits)
        if task_type == "Classification" and not getattr(self, "is_cross_validation", False):
            wanted.append(self.train_split)
        data = {split: _read_split(task_type, directory, split, columns) for split in dict.fromkeys(wanted)}
        self.dataset = {subset: data if task_type in ("Retrieval", "Reranking") else DatasetDict(data)}
        if size_clusters_to_data:
            self.max_documents_per_cluster = min(type(self).max_documents_per_cluster,
                                                 min(len(split) for split in data.values()))
        self.data_loaded = True

    return load_data


def _registered_task(spec: TaskSpec, directory: Path) -> AbsTask:
    import mteb

    try:
        official = mteb.get_task(spec.mteb_task)
    except KeyError:
        raise UserInputError(f"{directory / TASK_FILE}: 'mteb_task' {spec.mteb_task!r} is not a task "
                             f"registered in mteb {mteb.__version__}; check the spelling or define a new task "
                             "with 'name' and 'type'") from None
    task_type = official.metadata.type
    if task_type not in TASK_TYPES:
        raise UserInputError(f"{directory / TASK_FILE}: {spec.mteb_task} is a {task_type} task; local "
                             f"copies support {', '.join(TASK_TYPES)}")
    subsets = list(official.hf_subsets)
    english = list(official.filter_languages(["eng"], exclusive_language_filter=True).hf_subsets)
    subset = spec.hf_subset or (subsets[0] if len(subsets) == 1 else english[0] if len(english) == 1 else None)
    if subset not in subsets:
        raise UserInputError(f"{directory / TASK_FILE}: {spec.mteb_task} has subsets {subsets}; set "
                             "'hf_subset' to the one these files hold")
    # as MTEB(eng) runs it: the test split where the task has one (MSMARCO: dev), the English subset
    default_splits = ["test"] if "test" in official.eval_splits else list(official.eval_splits)
    splits = spec.eval_splits or ([spec.eval_split] if spec.eval_split else default_splits)
    base = type(official)
    metadata = base.metadata.model_copy(update={
        "dataset": {"path": str(directory.resolve()), "revision": "local-" + directory_digest(directory)},
        "eval_splits": splits})
    task_class = type(base.__name__, (base, LocalTask), {
        "metadata": metadata, "load_data": _make_loader(directory, task_type, splits, subset),
        "__module__": __name__})
    task = task_class()
    task.hf_subsets = [subset]
    return task


def _new_task(spec: TaskSpec, directory: Path) -> AbsTask:
    from mteb import TaskMetadata
    from mteb.abstasks import (
        AbsTaskClassification,
        AbsTaskClustering,
        AbsTaskPairClassification,
        AbsTaskRetrieval,
        AbsTaskSTS,
    )

    base = {"STS": AbsTaskSTS, "PairClassification": AbsTaskPairClassification,
            "Classification": AbsTaskClassification, "Clustering": AbsTaskClustering,
            "Retrieval": AbsTaskRetrieval, "Reranking": AbsTaskRetrieval}[spec.type]
    splits = spec.eval_splits or [spec.eval_split or "test"]
    prompt = spec.instruction
    if spec.type in ("Retrieval", "Reranking") and isinstance(prompt, str):
        prompt = {"query": prompt}
    metadata = TaskMetadata(
        name=spec.name, type=spec.type, main_score=spec.main_score or DEFAULT_MAIN_SCORES[spec.type],
        description=spec.description or f"Local {spec.type} task read from {directory}",
        dataset={"path": str(directory.resolve()), "revision": "local-" + directory_digest(directory)},
        category="t2t", modalities=["text"], eval_splits=splits, eval_langs=["eng-Latn"], prompt=prompt,
    )
    # New clustering tasks embed every text and bootstrap samples of the data's own size: mteb's
    # defaults (4% of the texts, 16,384 draws per experiment) are sized for its large hub sets.
    clustering = spec.type == "Clustering"
    attributes: dict[str, Any] = {"metadata": metadata, "__module__": __name__,
                                  "load_data": _make_loader(directory, spec.type, splits, "default",
                                                            size_clusters_to_data=clustering)}
    if spec.type == "STS":
        attributes.update(min_score=spec.min_score if spec.min_score is not None else 0,
                          max_score=spec.max_score if spec.max_score is not None else 5)
    if clustering:
        attributes["max_fraction_of_documents_to_embed"] = None
    return type(f"Local{spec.type}Task", (base, LocalTask), attributes)()


def load_task_dir(directory: str | Path) -> AbsTask:
    """Build the mteb task (an ``mteb.AbsTask``) that a local task directory describes.

    The data are read lazily by mteb (``load_data``); :func:`check_task_data` reads them now.

    Example:
        >>> task = load_task_dir("tasks/my-sts")
        >>> mteb.evaluate(model, task, cache=None)
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise UserInputError(f"{directory}: not a directory; --task-dir takes a task directory "
                             f"(with {TASK_FILE}) or a folder of them")
    spec = load_spec(directory / TASK_FILE, TaskSpec, "task")
    return _registered_task(spec, directory) if spec.mteb_task else _new_task(spec, directory)


def check_task_data(task: AbsTask) -> None:
    """Read a local task's files now, so bad data fails before any model work."""
    task.load_data()


def find_task_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Expand ``--task-dir`` values: a task directory itself, or a folder whose children are tasks."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if (path / TASK_FILE).is_file():
            found.append(path)
            continue
        if not path.is_dir():
            raise UserInputError(f"{path}: no such directory (--task-dir)")
        children = sorted(child for child in path.iterdir() if (child / TASK_FILE).is_file())
        if not children:
            raise UserInputError(f"{path}: neither a task directory (no {TASK_FILE}) nor a folder of task "
                                 "directories; see `neobert-embed mteb --help` for the layout")
        found.extend(children)
    return found


def load_task_dirs(paths: Iterable[str | Path]) -> list[AbsTask]:
    """All tasks under the given ``--task-dir`` values, with unique names.

    Example:
        >>> [t.metadata.name for t in load_task_dirs(["../shared/data/tasks"])]
        ['STSBenchmarkDev', 'TRECCoarse']
    """
    tasks, seen = [], {}
    for directory in find_task_dirs(paths):
        task = load_task_dir(directory)
        name = task.metadata.name
        if name in seen:
            raise UserInputError(f"{directory / TASK_FILE}: task name {name!r} is also used by {seen[name]}; "
                                 "task names must be unique")
        seen[name] = directory
        tasks.append(task)
    return tasks
