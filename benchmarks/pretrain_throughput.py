"""Pretraining throughput on CPU: packed rows vs padded rows, in real tokens per second.

Prints one JSON document (stdout). The corpus is real and mixed-length: the docstrings of the
Python standard library (median ~80 tokens, a long tail past the row length). Four ways to build
the same micro-batches (``--rows`` rows of ``--seq-length`` tokens), all trained through the
public :func:`neobert_embed.pretraining.pretrain` on a small NeoBERT:

* ``packed``: documents concatenated into full rows, attention kept within each document
  (``cu_seqlens``, the varlen path) — this toolkit's default;
* ``packed_per_length_groups``: the same packed rows with the CPU attention layout forced to one
  SDPA call per distinct document length (what ``packed`` did before the layout cost rule);
* ``padded``: one document (or chunk) per row, padded, dense attention over the padding
  (``model.attention_backend: padded``) — the classic baseline;
* ``padded_unpadded``: the same padded rows, but NeoBERT drops the pad tokens before every
  layer (``attention_backend: auto``) — shows how much of packing's gain un-padding alone recovers.

Throughput counts REAL tokens only (padding is not work). ``attention_calls_per_forward``
counts the SDPA calls of one forward of the packed model on a real packed micro-batch, as the
model runs it now (the cost rule's layout: one masked call per group of equal-length rows) and
with the per-length-groups layout it used before (one call per distinct document length).
Each figure is the median per-step rate from ``metrics.jsonl`` after ``--warmup`` steps; modes run interleaved ``--rounds`` times so
background load hits them alike, and the best round is kept. Compare ratios within one run.

Example:
    .venv/bin/python benchmarks/pretrain_throughput.py --quick
    .venv/bin/python benchmarks/pretrain_throughput.py > runs/pretrain_throughput.json
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402

MODES = {
    "packed": {"packing": True, "attention_backend": "auto"},
    "packed_per_length_groups": {"packing": True, "attention_backend": "auto"},
    "padded": {"packing": False, "attention_backend": "padded"},
    "padded_unpadded": {"packing": False, "attention_backend": "auto"},
}
MODULES = ("json", "os", "re", "collections", "pathlib", "argparse", "logging", "functools", "itertools",
           "shutil", "textwrap", "datetime", "subprocess", "inspect", "email", "http.client", "unittest",
           "asyncio", "urllib.request", "tarfile", "zipfile", "socket", "threading", "decimal", "fractions")


def write_corpus(path: Path) -> int:
    """Every distinct stdlib docstring longer than 40 characters, one JSON line each."""
    import importlib

    seen: dict[str, None] = {}
    for name in MODULES:
        for _, obj in inspect.getmembers(importlib.import_module(name)):
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 40:
                seen.setdefault(doc)
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in seen), encoding="utf-8")
    return len(seen)


def recipe_for(mode: str, args: argparse.Namespace):
    from neobert_embed.pretraining.recipe import parse_pretrain_recipe

    return parse_pretrain_recipe({
        "model": {"hidden_size": args.hidden, "num_hidden_layers": args.layers, "num_attention_heads": 4,
                  "intermediate_size": 4 * args.hidden, "max_length": args.seq_length,
                  "attention_backend": MODES[mode]["attention_backend"]},
        "data": {"seq_length": args.seq_length, "packing": MODES[mode]["packing"]},
        "optimizer": {"lr": 1e-3},
        "schedule": {"warmup_steps": 5},
        "training": {"max_steps": args.steps, "micro_batch_size": args.rows, "precision": "fp32",
                     "engine": args.engine, "log_every_steps": 1},
        "checkpoint": {"every_steps": 10**6, "keep_last": 1},
    }, f"<{mode}>")


def measure(mode: str, corpus: Path, work: Path, args: argparse.Namespace, round_index: int) -> dict:
    from neobert_embed.modeling import attention
    from neobert_embed.pretraining import pretrain

    with contextlib.ExitStack() as stack:
        if mode == "packed_per_length_groups":  # free calls and gathers: the rule always picks per-length groups
            stack.enter_context(mock.patch.object(attention, "CALL_COST", 0.0))
            stack.enter_context(mock.patch.object(attention, "GATHER_COST", 0.0))
        result = pretrain(recipe_for(mode, args), corpus, work / f"{mode}-{round_index}", progress=False)
    rows = [json.loads(line) for line in result.metrics_path.read_text().splitlines()]
    timed = rows[args.warmup:]
    return {"real_tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
            "real_token_fraction": statistics.fmean(r["real_token_fraction"] for r in timed),
            "final_loss": rows[-1]["loss"], "timed_steps": len(timed)}


def attention_calls(corpus_path: Path, args: argparse.Namespace) -> dict:
    """SDPA calls in one forward of the packed model on a real packed micro-batch."""
    import torch

    from neobert_embed.modeling import NeoBERTConfig, NeoBERTModel
    from neobert_embed.modeling.attention import build_varlen_batch
    from neobert_embed.pretraining.packing import DocumentStream, collate_rows
    from neobert_embed.pretraining.prepared import load_prepared

    corpus = load_prepared(corpus_path)
    stream = DocumentStream(corpus.lengths, seed=0)
    rows = [stream.next_row(args.seq_length, packed=True) for _ in range(args.rows)]
    batch = collate_rows(corpus, rows, args.seq_length, corpus.tokenizer.pad_token_id)
    model = NeoBERTModel(NeoBERTConfig(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=4,
                                       intermediate_size=4 * args.hidden, vocab_size=len(corpus.tokenizer),
                                       max_length=args.seq_length)).eval()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", wraps=sdpa) as counted, \
            torch.no_grad():
        model(**{k: batch[k] for k in ("input_ids", "attention_mask", "position_ids", "cu_seqlens")})
    shape = tuple(batch["input_ids"].shape)
    plans = {layout: build_varlen_batch(batch["attention_mask"], batch["cu_seqlens"], shape, batch["position_ids"],
                                        layout=layout) for layout in ("auto", "documents")}
    return {"documents_per_micro_batch": int((batch["cu_seqlens"].diff() > 0).sum()),
            "layout_now": plans["auto"].layout, "now": counted.call_count,
            "before_per_length_groups": plans["documents"].kernel_calls * args.layers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps, one round (a smoke run)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", type=int, default=8, help="rows per micro-batch")
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--engine", default="deepspeed", choices=["deepspeed", "torch"])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: stable on shared cores)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds, args.warmup = 8, 1, 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import torch

    from neobert_embed.pretraining import prepare_corpus

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="pretrain-bench-") as tmp:
        work = Path(tmp)
        documents = write_corpus(work / "docstrings.jsonl")
        prepared = prepare_corpus(work / "docstrings.jsonl", work / "prepared", tokenizer="train",
                                  vocab_size=4096, progress=False)
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed logs on stdout; stdout is the JSON
            for round_index in range(args.rounds):
                for mode in MODES:
                    runs[mode].append(measure(mode, prepared.path, work, args, round_index))
        best = {mode: max(results, key=lambda r: r["real_tokens_per_s"]) for mode, results in runs.items()}
        lengths = prepared.lengths
        report = {
            "benchmark": "pretrain_throughput",
            "corpus": {"source": "Python stdlib docstrings", "documents": documents,
                       "tokens": int(lengths.sum()),
                       "length_percentiles": {str(q): int(np.percentile(lengths, q)) for q in (10, 50, 90, 99)},
                       "longer_than_row": float((lengths > args.seq_length).mean())},
            "settings": {"seq_length": args.seq_length, "rows_per_step": args.rows, "steps": args.steps,
                         "warmup_steps_excluded": args.warmup, "rounds": args.rounds, "engine": args.engine,
                         "model": f"NeoBERT {args.layers}x{args.hidden}, vocab 4096", "threads": args.threads,
                         "precision": "fp32"},
            "results": best,
            "attention_calls_per_forward": attention_calls(prepared.path, args),
            "packed_vs_padded_speedup": best["packed"]["real_tokens_per_s"] / best["padded"]["real_tokens_per_s"],
            "packed_vs_padded_unpadded_speedup":
                best["packed"]["real_tokens_per_s"] / best["padded_unpadded"]["real_tokens_per_s"],
            "packed_per_length_groups_vs_padded_unpadded_speedup":
                best["packed_per_length_groups"]["real_tokens_per_s"] / best["padded_unpadded"]["real_tokens_per_s"],
            "machine": {"python": sys.version.split()[0], "torch": torch.__version__,
                        "platform": platform.platform(), "cpus": os.cpu_count()},
            "conditions": conditions(
                data=(f"Python stdlib docstrings longer than 40 characters from {len(MODULES)} modules ({documents} "
                      "documents), prepared with a tokenizer trained on them (vocab 4096); rows drawn in the "
                      "recipe's seeded document order (the same seed in every mode)"),
                precision="fp32 (the recipe's training.precision)",
                protocol=(f"pretrain() on NeoBERT {args.layers} x {args.hidden}, {args.rows} rows x {args.seq_length} "
                          f"tokens per micro-batch, {args.steps} steps, engine {args.engine}: packed vs packed with "
                          "per-length groups vs padded vs padded with un-padding; real tokens only"),
                selection="nothing selected",
                timing=(f"per mode: median per-step tokens/s from metrics.jsonl after {args.warmup} warm-up steps; "
                        f"best of {args.rounds} round(s), modes interleaved"),
                threads=args.threads),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
