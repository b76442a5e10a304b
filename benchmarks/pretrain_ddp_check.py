"""2-process ``torchrun`` pretraining == 1 process with doubled gradient accumulation.

Why: data parallelism must not change what is learned. Two processes on 127.0.0.1 (gloo) with
accumulation A see the same micro-batches (rows and masked positions) as one process with
accumulation 2A, so per-step losses and final weights must agree to float rounding (≤ 1e-5).
Both runs go through the real CLI (``neobert-embed pretrain``), with DeepSpeed at each ``--zero-stages``.

Prints one JSON document (stdout): per stage, the largest per-step loss difference (must be
≤ 1e-5), the largest exported-weight difference (rounding only: ≤ 1e-4), and ``pass``.

Example:
    .venv/bin/python benchmarks/pretrain_ddp_check.py --quick
    .venv/bin/python benchmarks/pretrain_ddp_check.py --zero-stages 0,1,2
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conditions import conditions  # noqa: E402
from pretrain_throughput import write_corpus  # noqa: E402

TOLERANCE = 1e-5  # on every step's loss (the criterion)
# Final weights differ by float rounding only: 2 processes sum gradients as (g1+g2)+(g3+g4), one
# process as ((g1+g2)+g3)+g4, and Adam divides by sqrt(v), which magnifies that rounding for
# parameters whose gradients are tiny (rare embedding rows) to ~1e-5 after a few steps at lr 2e-3.
WEIGHT_SANITY = 1e-4


def recipe(zero_stage: int, accumulation: int, steps: int) -> dict:
    return {
        "model": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128,
                  "max_length": 128},
        "data": {"seq_length": 128},
        "optimizer": {"lr": 2e-3},
        "schedule": {"warmup_steps": 2},
        "training": {"max_steps": steps, "micro_batch_size": 2, "gradient_accumulation_steps": accumulation,
                     "precision": "fp32", "engine": "deepspeed", "zero_stage": zero_stage, "log_every_steps": 1},
        "checkpoint": {"every_steps": 10**6, "keep_last": 1},
    }


def run(command: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        sys.stderr.write(done.stdout[-4000:])
        raise SystemExit(f"command failed ({done.returncode}): {' '.join(command)}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def compare(one: Path, two: Path) -> dict:
    from safetensors.torch import load_file

    def losses(run_dir: Path) -> dict[int, float]:
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return {row["step"]: row["loss"] for row in rows}

    a, b = losses(one), losses(two)
    wa, wb = load_file(one / "final" / "model.safetensors"), load_file(two / "final" / "model.safetensors")
    loss_diff = max(abs(a[s] - b[s]) for s in a)
    weight_diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    processes = len(list(two.glob("checkpoints/step-*/rng-rank*.pt")))
    return {"steps": len(a), "processes_of_ddp_run": processes, "losses_1proc": [a[s] for s in sorted(a)],
            "max_loss_diff": loss_diff, "max_weight_diff": weight_diff,
            "pass": bool(processes == 2 and a.keys() == b.keys() and loss_diff <= TOLERANCE
                         and weight_diff <= WEIGHT_SANITY)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zero-stages", default="0,1,2")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="ZeRO-1 only, 3 steps")
    args = parser.parse_args()
    stages = [1] if args.quick else [int(s) for s in args.zero_stages.split(",")]
    steps = 3 if args.quick else args.steps
    venv_bin = Path(sys.executable).parent
    env = os.environ | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    report = {"benchmark": "pretrain_ddp_check", "loss_tolerance": TOLERANCE, "weight_sanity_bound": WEIGHT_SANITY,
              "stages": {}}
    with tempfile.TemporaryDirectory(prefix="ddp-check-") as tmp:
        work = Path(tmp)
        write_corpus(work / "docs.jsonl")
        cli = [str(venv_bin / "neobert-embed"), "pretrain"]
        run([*cli, "prepare", "--corpus", str(work / "docs.jsonl"), "--tokenizer", "train", "--vocab-size", "2048",
             "--output", str(work / "prepared")], env)
        for stage in stages:
            for name, accumulation in (("one", 4), ("two", 2)):
                (work / f"{name}-{stage}.yaml").write_text(yaml.safe_dump(recipe(stage, accumulation, steps)))
            args_common = ["pretrain", "--corpus", str(work / "prepared")]
            single_env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
            run([*cli, "--recipe", str(work / f"one-{stage}.yaml"), "--corpus", str(work / "prepared"),
                 "--output", str(work / f"one-{stage}")], single_env)
            run([str(venv_bin / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                 "--master-port", str(free_port()), "-m", "neobert_embed.cli", *args_common,
                 "--recipe", str(work / f"two-{stage}.yaml"), "--output", str(work / f"two-{stage}")], env)
            report["stages"][f"zero{stage}"] = compare(work / f"one-{stage}", work / f"two-{stage}")
    report["pass"] = all(s["pass"] for s in report["stages"].values())
    report["conditions"] = conditions(
        data=("Python stdlib docstrings (pretrain_throughput.write_corpus), prepared with a tokenizer trained on "
              "them (vocab 2048); both runs see the same micro-batches"),
        precision="fp32 (the recipe's training.precision)",
        protocol=(f"neobert-embed pretrain, NeoBERT 2 x 64, {steps} steps, micro-batch 2, DeepSpeed ZeRO stage(s) "
                  f"{stages}: 1 process with gradient accumulation 4 vs torchrun 2 processes (gloo, 127.0.0.1) with "
                  f"accumulation 2; per-step losses must agree within {TOLERANCE}, exported weights within "
                  f"{WEIGHT_SANITY}"),
        selection="nothing selected",
        timing="not timed (a correctness check)",
        threads="OMP_NUM_THREADS=1 in every process", probe_torch=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
