"""benchmarks/encoder_table10.py --quick: the Table 10 protocol runs end to end and its JSON holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~15 s of CPU; longer on a loaded machine (3 models built and swept in a subprocess)
def test_table10_quick_runs_on_cpu_and_reports_every_column():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "encoder_table10.py"), "--quick", "--threads", "1"],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    # one thread's fp32 matmul peak: an x86 core does at most 2 FMA units x 16 lanes x 2 FLOPs x ~5 GHz
    # = 0.32 TFLOP/s (a matrix coprocessor, a few); 10 leaves room, a GFLOP/TFLOP mix-up (x1000) does not fit
    assert report["dtype"] == "float32" and 0 < report["peak_tflops"] < 10
    assert report["paper_a100_tokens_per_s"]["neobert"] == {"512": 24500, "4096": 17200}
    table = {(row["model"], row["length"]): row for row in report["table"]}
    assert set(table) == {(m, n) for m in ("neobert", "modernbert", "bert") for n in (32, 64)}
    for row in table.values():
        sweep = {int(b): rate for b, rate in row["sweep"].items()}
        assert row["best_batch"] == max(sweep, key=sweep.get) and row["tokens_per_s"] == max(sweep.values())
        assert set(sweep) <= {1, 2, 4} and row["length"] * max(sweep) <= 128
        assert 0 < row["mfu"] <= 1  # a share of the measured peak: above 1, the FLOPs, the rate or the peak is wrong
    mixed = {(row["model"], row["length"]): row for row in report["mixed"]}
    assert set(mixed) == set(table)
    for length in (32, 64):
        neobert = mixed[("neobert", length)]
        assert neobert["padded_tokens_per_s"] > 0 and neobert["unpadded_tokens_per_s"] > 0
        assert neobert["real_token_fraction"] < 1
        assert neobert["unpadded_vs_padded"] == round(neobert["unpadded_tokens_per_s"] / neobert["padded_tokens_per_s"], 2)
        assert mixed[("modernbert", length)]["default_tokens_per_s"] > 0
