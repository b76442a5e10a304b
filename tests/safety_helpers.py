"""Shared pieces of the data-safety tests: the CLI run in-process exactly as the console script
runs it, snapshots of output locations, and a tiny indexable model."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
PROMPTS = {"query": "query: ", "document": "passage: "}


def run_main(args: list, capsys) -> tuple[int, str, str]:
    """Run ``neobert_embed.cli.main`` (the console script, with its error handling) in-process.

    Returns (exit status, stdout, stderr). An exception that main() does not turn into an exit
    status propagates, so a traceback fails the calling test.
    """
    from neobert_embed.cli import main

    capsys.readouterr()
    with mock.patch.object(sys, "argv", ["neobert-embed", *map(str, args)]):
        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def main_status(args: list) -> int:
    """Run the console script in-process outside a test's capsys (a module fixture) and return its exit status."""
    from neobert_embed.cli import main

    with mock.patch.object(sys, "argv", ["neobert-embed", *map(str, args)]):
        try:
            main()
        except SystemExit as stop:
            return stop.code if isinstance(stop.code, int) else 1
    return 0


def in_turn(*steps: Callable[[dict[str, Path]], None]) -> Callable[[dict[str, Path]], None]:
    """One preparation of a fault case made of ``steps`` (each given the case's paths), run in turn."""
    def make(paths: dict[str, Path]) -> None:
        for step in steps:
            step(paths)
    return make


def cli_env() -> dict[str, str]:
    """Environment for CLI subprocesses that import this checkout."""
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1"}


def snapshot(path: Path) -> object:
    """Everything observable about ``path``: absent, a file's bytes hash, or a directory tree's."""
    path = Path(path)
    if not path.exists():
        return None
    if path.is_file():
        return ("file", hashlib.sha256(path.read_bytes()).hexdigest(), oct(path.stat().st_mode))
    return ("dir", sorted((str(p.relative_to(path)), snapshot(p) if p.is_file() else "dir")
                          for p in path.rglob("*")))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def small_inputs(root: Path) -> dict[str, Path]:
    """A prompted tiny BERT and small inputs for every reading command: texts, an id'd corpus, pairs."""
    texts = root / "texts.txt"
    texts.write_text("".join(f"text number {i} about things\n" for i in range(30)), encoding="utf-8")
    corpus = write_jsonl(root / "corpus.jsonl", [{"_id": f"d{i}", "text": f"doc {i} on topic {i % 4}"}
                                                 for i in range(30)])
    pairs = write_jsonl(root / "pairs.jsonl", [{"query": f"q {i}", "document": f"answer {i}"} for i in range(20)])
    return {"root": root, "model": build_prompted_bert(root / "models"), "texts": texts, "corpus": corpus,
            "pairs": pairs, "recipe": REPO / "recipes" / "contrastive-tiny.yaml"}


def fault_world(root: Path) -> dict[str, Path]:
    """:func:`small_inputs` plus what the fault tables' commands read: an index of the corpus, a
    retrieval task with one query, and new documents for ``index add``."""
    from neobert_embed.index import build_index

    inputs = small_inputs(root)
    build_index(inputs["model"], inputs["corpus"], root / "index", index_type="flat", show_progress=False,
                compute_precision="fp32")
    task = root / "task"
    (task / "qrels").mkdir(parents=True)
    write_jsonl(task / "queries.jsonl", [{"_id": "q1", "text": "doc 1"}])
    (task / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n", encoding="utf-8")
    new_docs = write_jsonl(root / "new-docs.jsonl", [{"_id": f"n{i}", "text": f"new doc {i}"} for i in range(5)])
    return {**inputs, "index": root / "index", "task": task, "new_docs": new_docs}


def build_prompted_bert(directory: Path) -> Path:
    """A tiny BERT saved as a SentenceTransformer with query/document prompts."""
    from tiny_models import build_tiny_model

    from neobert_embed.sentence import load_sentence_model

    plain = build_tiny_model("bert", directory / "plain", seed=0)
    load_sentence_model(str(plain), prompts=PROMPTS).save(str(directory / "bert"))
    return directory / "bert"
