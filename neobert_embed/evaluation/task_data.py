"""Reading a local task's data files into the dataset shapes mteb's task classes evaluate.

Why: offline copies and private data must be scored by mteb's own evaluators, so each file is
turned into exactly what the abstract task expects after its hub loading (columns, splits,
``RetrievalSplitData``), and every mistake is reported with the file and line.

Files for split ``test`` (other splits alike)::

    STS                 test.jsonl   {sentence1, sentence2, score}
    PairClassification  test.jsonl   {sentence1, sentence2, label (0/1)}
    Classification      train.jsonl and test.jsonl  {text, label}
    Clustering          test.jsonl   {text, label}
    Retrieval           corpus.jsonl, queries.jsonl, qrels/test.tsv (BEIR layout)
    Reranking           Retrieval files + candidates.jsonl {query-id, candidates: [corpus ids]}

Example:
    >>> columns = read_split_rows(Path("tasks/stsb-dev/test.jsonl"),
    ...                           {"sentence1": TEXT, "sentence2": TEXT, "score": NUMBER})
    >>> sorted(columns)
    ['score', 'sentence1', 'sentence2']
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from neobert_embed.beir import read_beir_task
from neobert_embed.errors import UserInputError, located
from neobert_embed.files import iter_jsonl

if TYPE_CHECKING:
    from mteb import AbsTask
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

TEXT = (str,)
NUMBER = (int, float)
LABEL = (str, int)


def _check_value(path: Path, line: int, record: dict, field: str, kinds: tuple[type, ...]) -> Any:
    if field not in record:
        raise located(path, line, f"field {field!r} is missing; every row needs it")
    value = record[field]
    if isinstance(value, bool) or not isinstance(value, kinds):
        wanted = " or ".join(kind.__name__ for kind in kinds)
        raise located(path, line, f"field {field!r} must be {wanted}, got {type(value).__name__} {value!r}")
    return value


def read_split_rows(path: Path, fields: dict[str, tuple[type, ...]]) -> dict[str, list]:
    """Read a JSON-lines file into columns, checking each required field's type.

    Raises :class:`UserInputError` naming the file (and line) when it is missing, empty, or a row
    lacks a field. Extra fields are ignored.
    """
    if not path.is_file():
        raise UserInputError(f"{path}: file not found; this task type needs it (see the task "
                             "directory layout in `neobert-embed mteb --help`)")
    columns: dict[str, list] = {name: [] for name in fields}
    for line, record in iter_jsonl(path):
        for name, kinds in fields.items():
            columns[name].append(_check_value(path, line, record, name, kinds))
    if not next(iter(columns.values())):
        raise UserInputError(f"{path}: no rows; the file is empty")
    return columns


def read_binary_labels(path: Path) -> dict[str, list]:
    """Pair-classification rows; labels must be 0 or 1 (mteb computes average precision on them)."""
    columns = read_split_rows(path, {"sentence1": TEXT, "sentence2": TEXT, "label": (int,)})
    for row, label in enumerate(columns["label"]):
        if label not in (0, 1):
            raise UserInputError(f"{path}: row {row + 1}: label must be 0 or 1, got {label!r}")
    return columns


def read_retrieval_split(directory: Path, split: str, *, reranking: bool) -> RetrievalSplitData:
    """A BEIR-layout split as mteb's ``RetrievalSplitData`` (with ``top_ranked`` for reranking); a split with a
    corpus of its own (LongEmbed's lengths) is the BEIR task in the subdirectory named after it."""
    from datasets import Dataset

    task = read_beir_task(split_directory(directory, split), split=split)
    corpus = Dataset.from_dict({
        "id": list(task.corpus),
        "title": [doc["title"] for doc in task.corpus.values()],
        "text": [doc["text"] for doc in task.corpus.values()],
    })
    judged = {qid: text for qid, text in task.queries.items() if qid in task.qrels}
    queries = Dataset.from_dict({"id": list(judged), "text": list(judged.values())})
    top_ranked = read_candidates(directory / "candidates.jsonl", task) if reranking else None
    return {"corpus": corpus, "queries": queries, "relevant_docs": task.qrels, "top_ranked": top_ranked}


def split_directory(directory: Path, split: str) -> Path:
    """Where a retrieval split's files are: ``DIR/<split>/`` when it holds a ``corpus.jsonl`` (each split its
    own corpus, as LongEmbed's lengths), else ``DIR`` (one corpus, ``qrels/<split>.tsv`` per split).

    Example:
        >>> split_directory(Path("tasks/passkey"), "test_4096")
        PosixPath('tasks/passkey/test_4096')
    """
    own = Path(directory) / split
    return own if (own / "corpus.jsonl").is_file() else Path(directory)


def read_candidates(path: Path, task: AbsTask) -> dict[str, list[str]]:
    """Reranking candidates ``{query-id, candidates: [corpus ids]}``; every id must exist."""
    candidates: dict[str, list[str]] = {}
    for line, record in iter_jsonl(path):
        query_id = str(_check_value(path, line, record, "query-id", LABEL))
        if query_id in candidates:
            raise located(path, line, f"duplicate query-id {query_id!r}; give each query one row")
        if query_id not in task.queries:
            raise located(path, line, f"query-id {query_id!r} is not in queries.jsonl")
        docs = _check_value(path, line, record, "candidates", (list,))
        unknown = [str(doc) for doc in docs if str(doc) not in task.corpus]
        if unknown:
            raise located(path, line, f"candidate {unknown[0]!r} is not in corpus.jsonl")
        candidates[query_id] = [str(doc) for doc in docs]
    if not candidates:
        raise UserInputError(f"{path}: no rows; the file is empty")
    missing = [qid for qid in task.qrels if qid not in candidates]
    if missing:
        raise UserInputError(f"{path}: judged query {missing[0]!r} has no candidates row; add one")
    return candidates
