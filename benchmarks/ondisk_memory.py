"""Peak RSS of building an index from a build's shards: in-memory flat vs ``--on-disk`` IVF-PQ.

Why: ``--on-disk`` promises that RAM during the build stays at the coarse quantizer, the training
sample and one shard instead of the whole corpus. This writes ``--vectors`` clustered 384-d vectors
as shards of ``--chunk-size`` rows (what ``index build`` leaves after encoding), then builds each
index in a fresh process exactly as ``index build`` does after encoding, and reports each process's
peak RSS (``ru_maxrss``). Prints one JSON object.

Usage:
    .venv/bin/python benchmarks/ondisk_memory.py --vectors 1000000
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402

DIMENSION = 384
CLUSTERS = 1000


def write_shards(directory: Path, n: int, chunk_size: int, noise: float) -> int:
    """Clustered unit vectors (as in index_bench.py) streamed to ``chunk-*.npy`` shards."""
    from neobert_embed.shards import ShardDirectory

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((CLUSTERS, DIMENSION), dtype=np.float32)
    shards = ShardDirectory(directory)
    for chunk, start in enumerate(range(0, n, chunk_size)):
        size = min(chunk_size, n - start)
        block = rng.standard_normal((size, DIMENSION), dtype=np.float32) * noise + centres[rng.integers(0, CLUSTERS, size)]
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        shards.write(chunk, block)
    return chunk + 1


def build(mode: str, directory: Path, n: int, chunk_size: int, n_chunks: int) -> dict:
    """One build in this process; ``mode`` is ``flat`` (in memory) or ``ondisk`` (IVF-PQ, on-disk lists)."""
    from neobert_embed.index.build import SAMPLE_SEED, _sample_rows, calibrate_index, fill_index
    from neobert_embed.index.factory import choose_index_spec, write_faiss_index
    from neobert_embed.index.ondisk import build_on_disk, train_index
    from neobert_embed.index.rerank import RERANK_K_FACTOR, RERANK_NAME, with_rerank, write_rerank_vectors
    from neobert_embed.shards import ShardDirectory

    shards = ShardDirectory(directory / "shards")
    blocks = functools.partial(shards.blocks, n_chunks)
    sample = functools.partial(shards.gather, chunk_size=chunk_size)
    out = directory / mode
    out.mkdir(exist_ok=True)
    start = time.perf_counter()
    result: dict = {"mode": mode}
    if mode == "flat":
        spec = choose_index_spec("flat", n, DIMENSION)
        index = fill_index(spec, DIMENSION, blocks, sample, n)
        write_faiss_index(index, out / "index.faiss")
    else:
        spec = choose_index_spec("ivfpq", n, DIMENSION)
        trained, train_s = train_index(spec, DIMENSION, sample, _sample_rows(n, spec.train_size, SAMPLE_SEED))
        index = build_on_disk(trained, spec, blocks(), out)
        write_rerank_vectors(out / RERANK_NAME, blocks(), n, DIMENSION)
        params, calibration = calibrate_index(with_rerank(index, out, RERANK_K_FACTOR), spec, blocks, sample, n)
        result.update(train_vectors=min(n, spec.train_size), train_s=round(train_s, 1), search_params=params,
                      calibration_recall_at_10=round(calibration.recall_at_10, 4))
    result.update(factory=spec.factory, seconds=round(time.perf_counter() - start, 1),
                  ntotal=int(index.ntotal),
                  peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  files_mb={p.name: round(p.stat().st_size / 2**20, 1) for p in out.iterdir()})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vectors", type=int, default=1_000_000)
    parser.add_argument("--chunk-size", type=int, default=65_536)
    parser.add_argument("--noise", type=float, default=2.0)
    parser.add_argument("--worker", choices=("flat", "ondisk"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--directory", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--chunks", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(build(args.worker, args.directory, args.vectors, args.chunk_size, args.chunks)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        start = time.perf_counter()
        n_chunks = write_shards(directory / "shards", args.vectors, args.chunk_size, args.noise)
        report: dict = {"benchmark": "ondisk_memory", "vectors": args.vectors, "dimension": DIMENSION,
                        "chunk_size": args.chunk_size, "shards": n_chunks,
                        "shards_written_s": round(time.perf_counter() - start, 1)}
        for mode in ("flat", "ondisk"):
            done = subprocess.run([sys.executable, __file__, "--worker", mode, "--directory", str(directory),
                                   "--vectors", str(args.vectors), "--chunk-size", str(args.chunk_size),
                                   "--chunks", str(n_chunks)], capture_output=True, text=True, check=True)
            report[mode] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{mode}: {json.dumps(report[mode])}", file=sys.stderr, flush=True)
    report["ondisk_over_flat_peak_rss"] = round(report["ondisk"]["peak_rss_mb"] / report["flat"]["peak_rss_mb"], 3)
    report["below_half"] = bool(report["ondisk_over_flat_peak_rss"] < 0.5)
    report["conditions"] = conditions(
        data=(f"synthetic: {args.vectors} unit {DIMENSION}-d vectors around {CLUSTERS} random centres, noise "
              f"{args.noise} (seed 0), written as {report['shards']} shards of {args.chunk_size} rows"),
        precision=("float32 vectors; ondisk: IVF-PQ codes on disk, float16 re-rank vectors; flat: float32 in "
                   "memory"),
        protocol=("each index built from the shards in a fresh process exactly as index build does after encoding "
                  "(flat in memory vs --on-disk IVF-PQ with calibration); peak RSS = that process's ru_maxrss"),
        selection="nothing selected",
        timing="one build per mode (peak RSS is the figure; seconds are one run)",
        threads="faiss's default in each worker process (not set)")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
