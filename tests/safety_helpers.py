"""Shared pieces of the data-safety tests: the CLI run in-process exactly as the console script
runs it, snapshots of output locations, and a tiny indexable model."""

from __future__ import annotations

import hashlib
import json
import os
import sys
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


def build_prompted_bert(directory: Path) -> Path:
    """A tiny BERT saved as a SentenceTransformer with query/document prompts."""
    from tiny_models import build_tiny_model

    from neobert_embed.sentence import load_sentence_model

    plain = build_tiny_model("bert", directory / "plain", seed=0)
    load_sentence_model(str(plain), prompts=PROMPTS).save(str(directory / "bert"))
    return directory / "bert"
