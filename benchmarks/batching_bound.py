"""How much dynamic batching can gain on this machine: GEMM rate by batch rows, and forward time per text.

Why: the serving target "dynamic batching >= 3x one request at a time" assumes the device is idle
between single requests, as a GPU is. On a CPU, one text already keeps the matrix multiplications
busy, so batching can only recover the difference in GEMM efficiency between few and many rows
(plus per-call overhead). This measures both in one process, one torch thread (as the servers in
``serve_load.py`` run), on NeoBERT 4 x 768 with random weights and the same mixed-length texts:

* ``gemm_gflops_by_rows``: a 768 x 3072 matmul (the FFN's shape) at 12 / 37 / 150 / 1184 rows;
* ``forward_ms_per_text``: the server's own ``Embedder.forward`` one text at a time and 32 at a time;
* ``matmul_share_one_at_a_time``: the fraction of one-at-a-time CPU time spent in ``aten::mm``,
  which bounds the gain: ``1 / ((1 - share) + share / gemm_gain)``.

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/batching_bound.py [--texts 128] [--device cuda]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conditions import conditions  # noqa: E402
from serve_load import STSB_DEV, mixed_texts, random_neobert  # noqa: E402


def gemm_rates(device: str) -> dict[str, float]:
    """GFLOP/s of an (M x 768) @ (768 x 3072) matmul, best of 5."""
    import torch

    weight = torch.randn(768, 3072, device=device)
    rates = {}
    for rows in (12, 37, 150, 1184):
        x = torch.randn(rows, 768, device=device)
        repeats = max(3, 4000 // rows)
        best = float("inf")
        for _ in range(6):
            start = time.perf_counter()
            for _ in range(repeats):
                x @ weight
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - start) / repeats)
        rates[str(rows)] = round(2 * rows * 768 * 3072 / best / 1e9, 1)
    return rates


def forward_times(model_dir: str, texts: list[str], device: str) -> dict:
    """ms per text through the server's Embedder, one at a time and 32 at a time; mm share of the former."""
    from torch.profiler import profile

    from neobert_embed.inference.runtime import load_inference_model
    from neobert_embed.serve.engine import Embedder

    engine = Embedder(load_inference_model(model_dir, "fp32", device=device), "neobert")
    engine.forward(texts[:8], [None] * 8)
    result: dict = {}
    for batch in (1, 32):
        start = time.perf_counter()
        for first in range(0, len(texts), batch):
            chunk = texts[first:first + batch]
            engine.forward(chunk, [None] * len(chunk))
        result[str(batch)] = round(1000 * (time.perf_counter() - start) / len(texts), 2)
    with profile() as prof:
        for text in texts[:32]:
            engine.forward([text], [None])
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm", "aten::bmm"))
    tokens = engine.count_tokens(texts, None)
    return {"forward_ms_per_text": result, "batched_over_one_at_a_time": round(result["1"] / result["32"], 2),
            "matmul_share_one_at_a_time": round(matmul / total, 3) if total else None,
            "mean_tokens": round(sum(tokens) / len(tokens), 1), "max_tokens": max(tokens)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import os

    import torch

    torch.set_num_threads(args.threads)
    report: dict = {"benchmark": "batching_bound", "device": args.device, "torch_threads": args.threads,
                    "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    report["gemm_gflops_by_rows"] = gemm_rates(args.device)
    rates = report["gemm_gflops_by_rows"]
    report["gemm_gain_1184_over_37_rows"] = round(rates["1184"] / rates["37"], 2)
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        model = random_neobert(Path(tmp) / "neobert-4x768")
        report.update(forward_times(model, mixed_texts(args.texts, seed=1), args.device))
    share = report["matmul_share_one_at_a_time"]
    if share:
        gain = report["gemm_gain_1184_over_37_rows"]
        report["bound_from_gemm_efficiency"] = round(1 / ((1 - share) + share / gain), 2)
    source = "STS-B dev sentences (../shared/data/stsb/dev.jsonl)" if STSB_DEV.is_file() else "synthetic sentences"
    report["conditions"] = conditions(
        data=(f"{args.texts} texts drawn from {source}, 1 in 5 a paragraph of 4-10 of them (serve_load.mixed_texts, "
              "seed 1); GEMM inputs random"),
        precision="fp32 (load_inference_model(..., 'fp32'); fp32 random GEMM operands)",
        protocol=("(M x 768) @ (768 x 3072) matmul at 12/37/150/1184 rows; the server's Embedder.forward over "
                  "every text 1 and 32 at a time; torch.profiler share of aten::mm/addmm/bmm over 32 texts one at "
                  "a time; NeoBERT 4 x 768 with random weights"),
        selection="nothing selected",
        timing=("GEMM: best of 6 runs, each the mean of max(3, 4000 // rows) products; forward: one pass over all "
                "texts after an 8-text warm-up"),
        threads=args.threads, device=args.device)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
