"""Shared pieces of the pretraining tests: a real corpus (Python stdlib docstrings, always
available offline), tiny recipes, and a single-thread setting that keeps 2 shared cores usable."""

from __future__ import annotations

import contextlib
import inspect
import json
from pathlib import Path

from contrastive_helpers import one_torch_thread

STDLIB_MODULES = ("json", "os", "re", "collections", "pathlib", "argparse", "logging", "functools",
                  "itertools", "shutil", "textwrap", "datetime", "subprocess")


def write_docstring_corpus(path: Path, limit: int = 400) -> Path:
    """Write stdlib docstrings (real, mixed-length English + code text) as a JSON-lines corpus.

    Submodules are skipped: ``logging.handlers`` becomes an attribute of ``logging`` only once some
    earlier code imports it, so counting it would make the corpus, and every loss trained on it,
    depend on which tests ran before (a stage-2 margin of 0.40 alone fell to 0.29994 in the suite).
    """
    import importlib

    docs = []
    for name in STDLIB_MODULES:
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module):
            if inspect.ismodule(obj):
                continue
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 40 and doc not in docs:
                docs.append(doc)
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:limit]), encoding="utf-8")
    return path


def tiny_recipe(**training) -> dict:
    """A hidden-32, 2-layer NeoBERT recipe over 64-token rows (dict form, for parse_pretrain_recipe)."""
    return {
        "model": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                  "intermediate_size": 64, "max_length": 64},
        "data": {"seq_length": 64},
        "optimizer": {"lr": 3e-3},
        "schedule": {"warmup_steps": 1},
        "training": {"max_steps": 6, "micro_batch_size": 4, "gradient_accumulation_steps": 1,
                     "precision": "fp32", "engine": "torch", "log_every_steps": 1} | training,
        "checkpoint": {"every_steps": 2, "keep_last": 3},
    }


def losses(metrics_path: Path) -> dict[int, float]:
    """step -> loss from a metrics.jsonl."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    return {row["step"]: row["loss"] for row in rows}


def single_thread():
    """Context manager: torch on one thread (2 shared cores thrash badly with OpenMP spinning)."""
    return contextlib.contextmanager(one_torch_thread)()


def ctrl_c_at_step(monkeypatch, step: int):
    """Make the training loop raise KeyboardInterrupt (as Ctrl-C does) when it reaches ``step``;
    returns a function that removes the interruption."""
    from neobert_embed.pretraining.batches import BatchMaker

    original = BatchMaker.step_batches

    def interrupted(self, stream, at):
        if at == step:
            raise KeyboardInterrupt
        return original(self, stream, at)

    monkeypatch.setattr(BatchMaker, "step_batches", interrupted)
    return lambda: monkeypatch.setattr(BatchMaker, "step_batches", original)
