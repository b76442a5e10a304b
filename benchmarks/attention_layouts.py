"""Measures the cost rule that picks NeoBERT's CPU attention layout for packed rows.

Why: ``sdpa_varlen`` can attend packed documents per group of equal-length documents
(``documents``: Σ n² scores, one SDPA call + gather per distinct length) or per packed row with a
block-diagonal mask (``rows``: Σ T² scores, mostly masked, one call per distinct row length).
Which is cheaper depends on the per-call overhead against the per-score cost; this script
times both layouts (attention forward + backward, the training case) on synthetic packed rows
with short to long documents, fits

    seconds ≈ a · calls + b · hidden · Σ unmasked scores + b · m · hidden · Σ masked scores

by least squares, and prints ``CALL_COST_CHANNELS = a / b`` and ``MASKED_SCORE_COST = m`` (the
constants in ``neobert_embed/modeling/attention.py``) with how often the rule picks the faster
layout. Timings are the best of ``--repeats``, layouts interleaved; the machine may be shared.

Example:
    .venv/bin/python benchmarks/attention_layouts.py --quick
    .venv/bin/python benchmarks/attention_layouts.py > runs/attention_layouts.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time

import torch


def packed_rows(rows: int, length: int, mean_doc: int, seed: int) -> list[int]:
    """cu_seqlens of ``rows`` packed rows: exponential document lengths, split at row ends."""
    rng = random.Random(seed)
    boundaries, cursor = [0], 0
    for _ in range(rows):
        room = length
        while room:
            piece = min(room, max(1, int(rng.expovariate(1 / mean_doc))))
            cursor += piece
            room -= piece
            boundaries.append(cursor)
    return boundaries


def time_layout(plan, heads: int, head_dim: int, repeats: int) -> float:
    from neobert_embed.modeling.attention import varlen_attention

    tokens = plan.num_tokens
    q, k, v = (torch.randn(tokens, heads, head_dim, requires_grad=True) for _ in range(3))
    grad = torch.randn(tokens, heads, head_dim)

    def step() -> float:
        start = time.perf_counter()
        varlen_attention(q, k, v, plan).backward(grad)
        return time.perf_counter() - start

    step()
    return min(step() for _ in range(repeats))


def features(plan, hidden: int) -> tuple[float, float, float]:
    masked = sum(g.count * g.length**2 for g in plan.groups if g.mask is not None)
    plain = sum(g.count * g.length**2 for g in plan.groups if g.mask is None)
    return float(len(plan.groups)), float(hidden * plain), float(hidden * masked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two shapes, one repeat (seconds)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    from neobert_embed.modeling.attention import CALL_COST_CHANNELS, MASKED_SCORE_COST, build_varlen_batch

    torch.set_num_threads(args.threads)
    heads_dims = [(4, 32), (12, 64)]
    shapes = [(8, 128), (8, 256), (4, 512), (2, 1024)]
    means = [4, 16, 48, 128, 384]
    repeats = args.repeats
    if args.quick:
        heads_dims, shapes, means, repeats = [(4, 32)], [(4, 128)], [8, 64], 1
    rows_out, xs, ys = [], [], []
    for heads, head_dim in heads_dims:
        hidden = heads * head_dim
        for rows, length in shapes:
            for mean in means:
                if mean > 2 * length:
                    continue
                cu = torch.tensor(packed_rows(rows, length, mean, seed=mean + length), dtype=torch.int32)
                plans = {layout: build_varlen_batch(None, cu, (rows, length), layout=layout, hidden_size=hidden)
                         for layout in ("documents", "rows")}
                seconds = dict.fromkeys(plans, float("inf"))
                for _ in range(repeats):
                    for layout, plan in plans.items():
                        seconds[layout] = min(seconds[layout], time_layout(plan, heads, head_dim, 1))
                auto = build_varlen_batch(None, cu, (rows, length), hidden_size=hidden).layout
                for layout, plan in plans.items():
                    xs.append(features(plan, hidden))
                    ys.append(seconds[layout])
                rows_out.append({"heads": heads, "head_dim": head_dim, "rows": rows, "length": length,
                                 "mean_doc": mean, "documents": len(cu) - 1,
                                 "calls": {k: p.kernel_calls for k, p in plans.items()},
                                 "ms": {k: round(s * 1e3, 3) for k, s in seconds.items()},
                                 "faster": min(seconds, key=seconds.get), "rule_picks": auto})
                print(json.dumps(rows_out[-1]), file=sys.stderr, flush=True)
    x, y = torch.tensor(xs, dtype=torch.float64), torch.tensor(ys, dtype=torch.float64)
    weights = 1 / y  # relative error: small and large shapes count alike
    a, b, bm = torch.linalg.lstsq(x * weights[:, None], y * weights).solution.tolist()
    agree = sum(r["faster"] == r["rule_picks"] for r in rows_out)
    print(json.dumps({
        "benchmark": "attention_layouts",
        "fit": {"seconds_per_call": a, "seconds_per_score_channel": b,
                "CALL_COST_CHANNELS": a / b if b > 0 else None,
                "MASKED_SCORE_COST": bm / b if b > 0 else None},
        "constants_in_code": {"CALL_COST_CHANNELS": CALL_COST_CHANNELS, "MASKED_SCORE_COST": MASKED_SCORE_COST},
        "rule_picks_faster_layout": f"{agree}/{len(rows_out)}",
        "cases": rows_out,
        "machine": {"torch": torch.__version__, "threads": torch.get_num_threads(), "platform": platform.platform(),
                    "cpus": os.cpu_count(), "load_average_1min": round(os.getloadavg()[0], 2)},
    }, indent=1))


if __name__ == "__main__":
    main()
