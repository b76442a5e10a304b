"""Reading retrieval tasks in the BEIR layout, shared by the MTEB runner and ``index eval``.

Why: a retrieval task is judged the same way whether it goes through mteb or through a FAISS
index; both must read the same files the same way and reject the same mistakes with the file
and line named.

Layout of a task directory (split ``test`` shown)::

    corpus.jsonl        {"_id": "d1", "title": "optional", "text": "..."}
    queries.jsonl       {"_id": "q1", "text": "..."}
    qrels/test.tsv      header line, then: query-id <TAB> corpus-id <TAB> score

Example:
    >>> task = read_beir_task("tasks/my-retrieval")
    >>> len(task.queries), len(task.corpus), task.qrels["q1"]
    (50, 1000, {'d7': 1})
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from neobert_embed.errors import UserInputError, located
from neobert_embed.files import atomic_directory, atomic_write_text, iter_jsonl, iter_text_lines


@dataclass
class BeirTask:
    """A retrieval task held in memory: id → text maps and graded relevance judgements."""

    corpus: dict[str, dict[str, str]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def _required_text(path: Path, line: int, record: dict, field: str) -> str:
    value = record.get(field)
    if not isinstance(value, str):
        raise located(path, line, f"field {field!r} is missing or not a string; every row needs it")
    return value


def _read_id_text_file(path: Path, with_title: bool) -> dict:
    """Read ``{_id, text[, title]}`` rows, refusing duplicate or missing ids."""
    rows: dict = {}
    for line, record in iter_jsonl(path):
        raw_id = record.get("_id", record.get("id"))
        if raw_id is None or str(raw_id) == "":
            raise located(path, line, "field '_id' is missing; every row needs a unique _id")
        doc_id = str(raw_id)
        if doc_id in rows:
            raise located(path, line, f"duplicate _id {doc_id!r}; ids must be unique")
        text = _required_text(path, line, record, "text")
        rows[doc_id] = {"title": str(record.get("title") or ""), "text": text} if with_title else text
    if not rows:
        raise UserInputError(f"{path}: no rows; the file is empty")
    return rows


QRELS_HEADER = ("query-id", "corpus-id", "score")
GRADE = re.compile(r"[+-]?[0-9]+")


def read_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """Read a BEIR qrels TSV (header, then ``query-id corpus-id score``) into nested dicts: the one
    reader of judgements (``mteb``'s local tasks and ``index eval`` both come here).

    Strict, since a judgement read loosely scores silently wrong: the first line must be the
    header; a grade is an integer (``0.5`` was read as 0, ``inf`` was a traceback); a pair judged
    twice is refused (the last row used to win); every refusal names the file and line.

    Example:
        >>> read_qrels("task/qrels/test.tsv")["q1"]
        {'d3': 1}
    """
    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"{path}: file not found (expected qrels/<split>.tsv in the BEIR layout)")
    qrels: dict[str, dict[str, int]] = {}
    lines: dict[tuple[str, str], int] = {}
    for number, text in iter_text_lines(path):  # blank lines skipped; a line that is not UTF-8 is named
        parts = [part.strip() for part in text.split("\t")]
        if len(parts) != 3:
            raise located(path, number, f"expected 3 tab-separated fields (query-id, corpus-id, score), "
                          f"got {len(parts)}")
        if not lines and not qrels and number == 1:
            if _is_number(parts[2]):  # a judgement where the header belongs: it would be skipped unread
                raise located(path, number, f"expected the header {chr(9).join(QRELS_HEADER)!r}, got {text!r}; "
                              "add the header line (the first line is never read as a judgement)")
            continue
        if not parts[0] or not parts[1]:
            raise located(path, number, f"empty {'query-id' if not parts[0] else 'corpus-id'}")
        if not GRADE.fullmatch(parts[2]):
            raise located(path, number, f"score {parts[2]!r} is not an integer grade (0 = not relevant, "
                          "1, 2, … more relevant); write whole numbers")
        pair = (parts[0], parts[1])
        if pair in lines:
            raise located(path, number, f"query {pair[0]!r} judges document {pair[1]!r} again (first on line "
                          f"{lines[pair]}); keep one row per pair")
        lines[pair] = number
        qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    if not qrels:
        raise UserInputError(f"{path}: no judgements after the header line")
    return qrels


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_judged_documents(qrels_path: str | Path, qrels: Mapping[str, Mapping[str, int]],
                           unknown: Callable[[list[str]], list[str]], where: str) -> None:
    """Refuse judgements of documents that ``unknown`` (ids → those absent) says are not in ``where``
    (a corpus file, an index): a judgement of a missing document silently lowers every score.

    Example:
        >>> check_judged_documents("t/qrels/test.tsv", {"q1": {"d9": 1}}, lambda ids: ids, "t/corpus.jsonl")
        Traceback (most recent call last):
        UserInputError: t/qrels/test.tsv: corpus-id 'd9' (query 'q1') is not in t/corpus.jsonl; ...
    """
    judged = sorted({doc_id for docs in qrels.values() for doc_id in docs})
    missing = set(unknown(judged))
    for query_id, docs in qrels.items():
        absent = [doc_id for doc_id in docs if doc_id in missing]
        if absent:
            raise UserInputError(f"{qrels_path}: corpus-id {absent[0]!r} (query {query_id!r}) is not in {where}"
                                 f"{f' ({len(missing)} judged documents are missing)' if len(missing) > 1 else ''}; "
                                 "judge only documents it holds")


def read_beir_task(directory: str | Path, split: str = "test", *, with_corpus: bool = True) -> BeirTask:
    """Read a BEIR-layout task and check that every judged id exists.

    Args:
        directory: folder with ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``.
        split: which qrels file to read.
        with_corpus: False when the corpus lives elsewhere (e.g. inside a FAISS index).

    Example:
        >>> task = read_beir_task("tasks/my-retrieval", with_corpus=False)
    """
    directory = Path(directory)
    corpus = _read_id_text_file(directory / "corpus.jsonl", with_title=True) if with_corpus else {}
    queries = _read_id_text_file(directory / "queries.jsonl", with_title=False)
    qrels_path = directory / "qrels" / f"{split}.tsv"
    qrels = read_qrels(qrels_path)
    for query_id in qrels:
        if query_id not in queries:
            raise UserInputError(f"{qrels_path}: query-id {query_id!r} is not in {directory / 'queries.jsonl'}")
    if with_corpus:
        check_judged_documents(qrels_path, qrels, lambda ids: [i for i in ids if i not in corpus],
                               str(directory / "corpus.jsonl"))
    return BeirTask(corpus=corpus, queries=queries, qrels=qrels)


def write_triplet_task(rows: Iterable[Mapping[str, str]], directory: str | Path, split: str = "test") -> BeirTask:
    """Write a BEIR-layout retrieval task made of ``anchor``/``positive``/``negative`` rows and return it.

    Why: (anchor, entailed, contradicting) triplets such as SNLI's are the cheapest honest retrieval
    task: each anchor is a query (``q0``, ``q1``, … in row order) whose one relevant document is its
    positive, and every positive and negative, deduplicated (``d0``, ``d1``, …), is the corpus, so the
    negatives are hard distractors. ``index eval`` and ``mteb`` read the result like any BEIR task.

    Example:
        >>> task = write_triplet_task(rows[:1500], "tasks/snli-retrieval")
        >>> len(task.queries), task.qrels["q0"]
        (1500, {'d0': 1})
    """
    rows = list(rows)
    ids: dict[str, str] = {}
    for row in rows:
        for text in (row["positive"], row["negative"]):
            ids.setdefault(text, f"d{len(ids)}")
    task = BeirTask(corpus={doc_id: {"title": "", "text": text} for text, doc_id in ids.items()},
                    queries={f"q{i}": row["anchor"] for i, row in enumerate(rows)},
                    qrels={f"q{i}": {ids[row["positive"]]: 1} for i, row in enumerate(rows)})
    return write_beir_task(task, directory, split)


def write_beir_task(task: BeirTask, directory: str | Path, split: str = "test") -> BeirTask:
    """Write ``task`` in the BEIR layout (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``) as one
    unit (a directory appears complete or not at all); other files in ``directory`` are kept.

    Example:
        >>> write_beir_task(BeirTask({"d0": {"title": "", "text": "a cat"}}, {"q0": "cat"}, {"q0": {"d0": 1}}), "t")
    """
    with atomic_directory(directory, keep_others=True) as staged:  # corpus, queries and qrels: one unit
        atomic_write_text(staged / "corpus.jsonl", "".join(
            json.dumps({"_id": doc_id, "title": doc["title"], "text": doc["text"]} if doc.get("title")
                       else {"_id": doc_id, "text": doc["text"]}) + "\n" for doc_id, doc in task.corpus.items()))
        atomic_write_text(staged / "queries.jsonl", "".join(json.dumps({"_id": qid, "text": text}) + "\n"
                                                            for qid, text in task.queries.items()))
        atomic_write_text(staged / "qrels" / f"{split}.tsv", "query-id\tcorpus-id\tscore\n" + "".join(
            f"{qid}\t{doc_id}\t{score}\n" for qid, judged in task.qrels.items() for doc_id, score in judged.items()))
    return task
