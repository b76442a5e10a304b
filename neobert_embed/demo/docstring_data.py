"""A real English corpus that every machine has: the docstrings of the Python standard library.

Why: the demo must run offline on a fresh machine, on real text, with a retrieval task whose
answers are known. Docstrings give both: their text is the pretraining corpus, and a
docstring's summary line paired with its body is a natural (query, document) example.

Example:
    >>> docs = collect_stdlib_docstrings()
    >>> split = split_pairs(docs)
    >>> len(split.train) > len(split.heldout) > 0
    True
"""

from __future__ import annotations

import ast
import hashlib
import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from neobert_embed.files import atomic_write_text
from neobert_embed.recipes import TASK_FILE

SKIPPED_TOP_LEVEL = {"test", "idlelib", "site-packages", "dist-packages", "lib2to3", "tkinter", "turtledemo",
                     "ensurepip", "pydoc_data", "config-3.11-x86_64-linux-gnu"}
MIN_DOCSTRING_CHARS = 60
MIN_SUMMARY_CHARS = 20
MIN_BODY_CHARS = 80
RETRIEVAL_CORPUS_SIZE = 1000  # held-out bodies + training bodies as distractors; keeps MiniLM's scoring pass ~45 s
DOCUMENTABLE = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass(frozen=True)
class Docstring:
    """One documented object: its dotted name and its cleaned docstring."""

    name: str
    text: str

    @property
    def summary(self) -> str:
        """The first paragraph, on one line (what a user would type to find this object)."""
        return " ".join(self.text.split("\n\n", 1)[0].split())

    @property
    def body(self) -> str:
        """Everything after the first paragraph."""
        parts = self.text.split("\n\n", 1)
        return parts[1].strip() if len(parts) == 2 else ""


@dataclass
class PairSplit:
    """Docstrings with a summary and a body, split by a hash of their name (stable across machines)."""

    train: list[Docstring]
    heldout: list[Docstring]


def _python_files(root: Path) -> list[Path]:
    """The modules worth reading: not under a skipped top-level package, not in a test suite."""
    return [path for path in sorted(root.rglob("*.py"))
            if (parts := path.relative_to(root).parts)[0] not in SKIPPED_TOP_LEVEL and not {"test", "tests"} & set(parts)]


def collect_stdlib_docstrings(root: str | Path | None = None) -> list[Docstring]:
    """Parse (never import) every standard-library module and return its documented objects.

    Example:
        >>> docs = collect_stdlib_docstrings()
        >>> docs[0].name
        '__future__'
    """
    root = Path(root or sysconfig.get_paths()["stdlib"])
    found: list[Docstring] = []
    for path in _python_files(root):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        found.extend(_documented(tree, module))
    unique: dict[str, Docstring] = {}
    for doc in found:
        unique.setdefault(doc.name, doc)  # the first object of a name wins
    return list(unique.values())


def _documented(node: ast.AST, qualname: str) -> list[Docstring]:
    """Docstrings of ``node`` and of the classes and functions nested in it, with dotted names."""
    found = []
    text = ast.get_docstring(node) if isinstance(node, DOCUMENTABLE) else None
    if text and len(text) >= MIN_DOCSTRING_CHARS:
        found.append(Docstring(name=qualname, text=text))
    for child in ast.iter_child_nodes(node):
        if isinstance(child, DOCUMENTABLE):
            found.extend(_documented(child, f"{qualname}.{child.name}"))
        elif not isinstance(child, ast.expr):
            found.extend(_documented(child, qualname))
    return found


def _name_hash(doc: Docstring) -> float:
    """A number in [0, 1] fixed by the docstring's name: the same split and order on every machine."""
    return int(hashlib.sha1(doc.name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def split_pairs(docs: list[Docstring], heldout_fraction: float = 0.2) -> PairSplit:
    """Keep docstrings that have a real summary and body; hold out a stable ``heldout_fraction``.

    Example:
        >>> split = split_pairs(collect_stdlib_docstrings())
        >>> split.heldout[0].summary
        'Return the canonical path of the specified filename, ...'
    """
    seen: set[str] = set()
    train, heldout = [], []
    for doc in docs:
        if len(doc.summary) < MIN_SUMMARY_CHARS or len(doc.body) < MIN_BODY_CHARS or doc.summary in seen:
            continue
        seen.add(doc.summary)
        (heldout if _name_hash(doc) < heldout_fraction else train).append(doc)
    return PairSplit(train=train, heldout=heldout)


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_demo_data(docs: list[Docstring], split: PairSplit, directory: str | Path,
                    corpus_size: int = RETRIEVAL_CORPUS_SIZE) -> dict[str, Path]:
    """Write the demo's files: pretraining corpus, training pairs, a held-out BEIR task, the index corpus.

    The retrieval corpus holds the bodies of every held-out docstring plus training bodies as
    distractors, ``corpus_size`` documents in all (the held-out ones are never dropped); queries are
    the summaries of held-out docstrings only, which no training pair contains. Why a cap: encoding
    the corpus at all-MiniLM-L6-v2's 256 tokens is the demo's largest fixed cost (94 s for 2,173
    bodies on 2 cores), and the demo must finish within minutes.

    Example:
        >>> paths = write_demo_data(docs, split, "runs/demo/data")
        >>> sorted(paths)
        ['corpus', 'index_corpus', 'pairs', 'task']
    """
    directory = Path(directory)
    corpus = directory / "stdlib_docstrings.jsonl"
    atomic_write_text(corpus, _jsonl([{"text": doc.text} for doc in docs]))
    pairs = directory / "summary_body_pairs.jsonl"
    atomic_write_text(pairs, _jsonl([{"query": d.summary, "positive": d.body} for d in split.train]))
    task = directory / "tasks" / "stdlib-docstring-retrieval"
    distractors = sorted(split.train, key=_name_hash)[: max(0, corpus_size - len(split.heldout))]
    documents = split.heldout + distractors
    atomic_write_text(task / TASK_FILE, json.dumps({"name": "StdlibDocstringRetrieval", "type": "Retrieval"}))
    atomic_write_text(task / "corpus.jsonl", _jsonl([{"_id": d.name, "text": d.body} for d in documents]))
    atomic_write_text(task / "queries.jsonl", _jsonl([{"_id": f"q:{d.name}", "text": d.summary}
                                                      for d in split.heldout]))
    qrels = "query-id\tcorpus-id\tscore\n" + "".join(f"q:{d.name}\t{d.name}\t1\n" for d in split.heldout)
    atomic_write_text(task / "qrels" / "test.tsv", qrels)
    return {"corpus": corpus, "pairs": pairs, "task": task, "index_corpus": task / "corpus.jsonl"}
