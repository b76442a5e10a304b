"""Encoder throughput on CPU: NeoBERT un-padded vs padded, ModernBERT and BERT on the same inputs.

Prints one JSON document (stdout). Every timing is the best of ``--repeats`` runs after a warm-up,
with the paths being compared run interleaved so background load hits them alike; compare
ratios within one run. Throughput counts REAL tokens only (padding is not work), and each figure
is also given as a fraction of the machine's measured matmul peak for its dtype, using the
estimated useful FLOPs: 2 × (linear weights) per real token + 4 × hidden × (attended keys) per
real token per layer.

Inputs: (i) a mixed-length batch of 32 with lengths uniform in 16–512; (ii) fixed lengths 128,
512, 2048 (2048 tokens per batch). Models: NeoBERT, transformers' ModernBERT-base and BERT-base
configurations with random weights, at equal depth (``--layers``, default 4 × 768: the ≥2×
criterion) and, unless ``--quick``, at full depth (28 / 22 / 12 layers) on the mixed batch.

Example:
    .venv/bin/python benchmarks/encode_throughput.py --quick
    .venv/bin/python benchmarks/encode_throughput.py > runs/encode_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402

FULL_DEPTH = {"neobert": 28, "modernbert": 22, "bert": 12}


@dataclass(frozen=True)
class Batch:
    name: str
    lengths: list[int]

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    def tensors(self, pad_id: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        width = max(self.lengths)
        mask = (torch.arange(width)[None, :] < torch.tensor(self.lengths)[:, None]).long()
        ids = torch.randint(1000, 30000, (len(self.lengths), width), generator=g)
        return ids.masked_fill(mask == 0, pad_id), mask


def evenly_spread(count: int, low: int, high: int) -> list[int]:
    """``count`` lengths spread exactly uniformly over [low, high], in shuffled order.

    Why not random draws: 32 draws from U(16, 512) put the real-token fraction anywhere between
    ~0.45 and ~0.6 depending on the seed, which moves the un-padded/padded ratio by ±15%; the
    evenly spread batch IS the uniform distribution (mean 264, max 512, real fraction 0.516).
    """
    lengths = [low + round((high - low) * i / (count - 1)) for i in range(count)]
    random.Random(0).shuffle(lengths)
    return lengths


def batches(quick: bool) -> list[Batch]:
    if quick:
        return [Batch("mixed-8x[16,128]", evenly_spread(8, 16, 128)), Batch("fixed-128", [128] * 4)]
    return [Batch("mixed-32x[16,512]", evenly_spread(32, 16, 512)),
            Batch("fixed-128", [128] * 16), Batch("fixed-512", [512] * 4), Batch("fixed-2048", [2048])]


def matmul_peak(dtype: torch.dtype, size: int, repeats: int) -> float:
    """Best GFLOP/s of a square matmul: the machine's practical peak for ``dtype``."""
    from neobert_embed.modeling.flops import measured_matmul_tflops

    return measured_matmul_tflops(dtype, "cpu", size, repeats) * 1e3


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def build(kind: str, layers: int, dtype: torch.dtype) -> torch.nn.Module:
    """A random-weight encoder of family ``kind`` (base sizes: 768 wide, 12 heads)."""
    from transformers import AutoModel, BertConfig, ModernBertConfig

    from neobert_embed.modeling import NeoBERTConfig

    if kind == "neobert":
        config = NeoBERTConfig(num_hidden_layers=layers)
    elif kind == "modernbert":
        config = ModernBertConfig(num_hidden_layers=layers)
    else:
        config = BertConfig(num_hidden_layers=layers)
    torch.manual_seed(0)
    return AutoModel.from_config(config, dtype=dtype).eval()


def useful_gflop(model: torch.nn.Module, lengths: list[int]) -> float:
    """Estimated GFLOPs of the real tokens (see :mod:`neobert_embed.modeling.flops`).

    ``useful_gflop(model, [max(lengths)] * len(lengths))`` is what the padded path computes.
    """
    from neobert_embed.modeling.flops import forward_flops

    return forward_flops(model, lengths) / 1e9


def pad_id(model: torch.nn.Module) -> int:
    return model.config.pad_token_id or 0


def set_path(model: torch.nn.Module, path: str) -> None:
    """Select NeoBERT's attention path: ``unpadded`` (forced varlen) | ``auto`` | ``padded``."""
    model.config.attention_backend = {"unpadded": "varlen", "auto": "auto", "padded": "padded"}[path]


def time_paths(model: torch.nn.Module, batch: Batch, paths: list[str], repeats: int) -> dict[str, float]:
    """Best seconds per path; paths interleaved per repeat so load drift hits them alike."""
    ids, mask = batch.tensors(pad_id(model))
    best = dict.fromkeys(paths, float("inf"))
    with torch.inference_mode():
        for path in paths:  # warm-up on a slice that still has padding, so each path really runs
            _maybe_set(model, path)
            model(input_ids=ids[:4], attention_mask=mask[:4])
        for _ in range(repeats):
            for path in paths:
                _maybe_set(model, path)
                best[path] = min(best[path], _seconds(lambda: model(input_ids=ids, attention_mask=mask)))
    return best


def _maybe_set(model: torch.nn.Module, path: str) -> None:
    if path != "default":
        set_path(model, path)


def measure(kind: str, layers: int, dtype: torch.dtype, inputs: list[Batch], repeats: int,
            peaks: dict[str, float]) -> list[dict]:
    model = build(kind, layers, dtype)
    rows = []
    for batch in inputs:
        positions = getattr(model.config, "max_position_embeddings", 0)
        if max(batch.lengths) > positions:
            rows.append({"model": kind, "layers": layers, "dtype": str(dtype).split(".")[-1],
                         "input": batch.name, "not_applicable": f"longer than {positions} positions"})
            continue
        if kind != "neobert":
            paths = ["default"]
        elif batch.name.startswith("mixed"):
            paths = ["auto", "padded"]  # auto = the model's own forward = un-padded here
        else:
            paths = ["unpadded", "padded"]  # no padding: auto would be the padded code path
        gflop = useful_gflop(model, batch.lengths)
        padded_gflop = useful_gflop(model, [max(batch.lengths)] * len(batch.lengths))
        for path, seconds in time_paths(model, batch, paths, repeats).items():
            dtype_name = str(dtype).split(".")[-1]
            rows.append({
                "model": kind, "layers": layers, "dtype": dtype_name, "input": batch.name, "path": path,
                "real_tokens": batch.real_tokens, "padded_tokens": len(batch.lengths) * max(batch.lengths),
                "seconds": round(seconds, 4), "tokens_per_s": round(batch.real_tokens / seconds, 1),
                "useful_gflop_per_s": round(gflop / seconds, 2),
                "fraction_of_peak": round(gflop / seconds / peaks[dtype_name], 3),
                "flop_bound": round(padded_gflop / gflop, 3),
            })
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def speedups(rows: list[dict]) -> list[dict]:
    """NeoBERT's own forward (auto = un-padded on padded batches) vs the padded reference, next to
    the FLOP bound (padded FLOPs / useful FLOPs): no exact method can beat that bound by much."""
    out = []
    for row in rows:
        if row.get("model") == "neobert" and row.get("path") in ("auto", "unpadded"):
            padded = next(r for r in rows if r.get("path") == "padded" and
                          all(r[k] == row[k] for k in ("layers", "dtype", "input")))
            out.append({"layers": row["layers"], "dtype": row["dtype"], "input": row["input"],
                        "path": row["path"], "vs_padded": round(padded["seconds"] / row["seconds"], 2),
                        "flop_bound": row["flop_bound"]})
    return out


def _cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny inputs, 2 layers, 1 repeat (~1 min)")
    parser.add_argument("--layers", type=int, default=None, help="equal-depth comparison (default 4; quick 2)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per figure (default 3; quick 1)")
    parser.add_argument("--no-full-depth", action="store_true", help="skip the 28/22/12-layer mixed-batch run")
    parser.add_argument("--full-depth-dtypes", default="float32,bfloat16",
                        help="dtypes of the full-depth run (comma-separated)")
    parser.add_argument("--full-depth-models", default="neobert,modernbert,bert",
                        help="models of the full-depth run (comma-separated)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's choice); 1 avoids OpenMP stalls on a busy machine")
    parser.add_argument("--models", default="neobert,modernbert,bert", help="equal-depth models (comma-separated)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="equal-depth dtypes (comma-separated)")
    parser.add_argument("--inputs", default="mixed,fixed", help="input kinds to run (comma-separated prefixes)")
    args = parser.parse_args()
    args.layers = args.layers or (2 if args.quick else 4)
    args.repeats = args.repeats or (1 if args.quick else 3)
    return args


def run_plan(args: argparse.Namespace, inputs: list[Batch]) -> list[tuple]:
    """(model, layers, dtype, inputs, repeats) in order of importance: equal depth, then full depth."""
    dtypes = [getattr(torch, name) for name in args.dtypes.split(",")]
    plan = [(kind, args.layers, dtype, inputs, args.repeats) for dtype in dtypes for kind in args.models.split(",")]
    if not (args.quick or args.no_full_depth):
        mixed = [b for b in inputs if b.name.startswith("mixed")]
        plan += [(kind, FULL_DEPTH[kind], getattr(torch, name), mixed, max(1, args.repeats - 1))
                 for name in args.full_depth_dtypes.split(",") for kind in args.full_depth_models.split(",")]
    return plan


def measure_peaks(quick: bool, dtypes: set[str]) -> dict[str, float]:
    """Matmul peaks of the dtypes the run uses only (a CPU without bf16 units takes minutes for bf16)."""
    size, repeats = (1024, 3) if quick else (2048, 5)
    return {name: round(matmul_peak(getattr(torch, name), size, repeats), 1) for name in sorted(dtypes)}


def rebase_on_best_peak(rows: list[dict], before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The best peak seen (before/after the run) is the machine's; fractions are re-based on it."""
    peaks = {name: max(value, after[name]) for name, value in before.items()}
    for row in rows:
        if "fraction_of_peak" in row:
            row["fraction_of_peak"] = round(row["useful_gflop_per_s"] / peaks[row["dtype"]], 3)
    return peaks


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    inputs = [b for b in batches(args.quick) if b.name.startswith(tuple(args.inputs.split(",")))]
    plan = run_plan(args, inputs)
    used = {str(dtype).split(".")[-1] for _, _, dtype, _, _ in plan}
    peaks_before = measure_peaks(args.quick, used)
    print(f"matmul peak GFLOP/s: {peaks_before}", file=sys.stderr)
    rows: list[dict] = []
    for kind, depth, dtype, batch_list, runs in plan:  # rows stream to stderr
        print(f"{kind} {depth} layers {dtype}: {', '.join(b.name for b in batch_list)}", file=sys.stderr)
        rows += measure(kind, depth, dtype, batch_list, runs, peaks_before)
    peaks = rebase_on_best_peak(rows, peaks_before, measure_peaks(args.quick, used))
    criterion = [s for s in speedups(rows) if s["layers"] == args.layers and s["dtype"] == "float32"
                 and s["input"].startswith("mixed")]
    print(json.dumps({
        "machine": {"cpu": _cpu_name(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__, "matmul_peak_gflop_per_s": peaks,
                    "load_average_1min_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]},
        "settings": {"quick": args.quick, "layers": args.layers, "repeats": args.repeats,
                     "inputs": {b.name: {"sequences": len(b.lengths), "real_tokens": b.real_tokens}
                                for b in inputs}},
        "speedups": speedups(rows),
        "criterion_own_forward_2x_faster_than_padded_fp32_mixed": (
            criterion[0]["vs_padded"] >= 2.0 if criterion else None),
        "results": rows,
        "conditions": conditions(
            data=("synthetic: random token ids (seed 0) in batches "
                  + "; ".join(f"{b.name} ({len(b.lengths)} sequences, {b.real_tokens} real tokens)" for b in inputs)
                  + "; mixed lengths spread evenly over the range, shuffled (seed 0)"),
            precision={"equal_depth": args.dtypes.split(","),
                       "full_depth": [] if args.quick or args.no_full_depth else args.full_depth_dtypes.split(","),
                       "how": "weights and activations in that dtype (from_config(dtype=...)), no autocast"},
            protocol=(f"forward only under inference_mode, random-weight NeoBERT / ModernBERT / BERT configurations "
                      f"({args.layers} layers x 768, and unless quick/--no-full-depth the mixed batch at 28/22/12 "
                      "layers); NeoBERT un-padded (auto/varlen) vs padded on the same inputs; real tokens only"),
            selection=("fraction_of_peak: over the better of two matmul-peak measurements (before and after the run); "
                       "nothing else selected"),
            timing=(f"best of {args.repeats} runs (full depth: {max(1, args.repeats - 1)}) after a warm-up on a "
                    "4-row slice, paths interleaved per repeat"),
            threads=torch.get_num_threads()),
    }, indent=1))


if __name__ == "__main__":
    main()
