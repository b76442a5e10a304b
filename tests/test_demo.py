"""`neobert-embed demo`: every stage runs offline end to end and a rerun skips finished stages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from neobert_embed.demo.docstring_data import collect_stdlib_docstrings, split_pairs, write_demo_data

STAGES = ["corpus", "pretrain", "untrained baseline", "contrastive", "MiniLM contrastive", "evaluate", "index"]
MODELS = {"untrained", "MLM only", "fine-tuned", "all-MiniLM-L6-v2", "all-MiniLM-L6-v2 + contrastive"}
NOISE = ("FutureWarning", "UserWarning", "it/s]", "examples/s]", "Loading weights", "%|")


def test_stdlib_corpus_has_real_pairs_and_a_consistent_heldout_task(tmp_path):
    docs = collect_stdlib_docstrings()
    assert len(docs) > 2000 and len({d.name for d in docs}) == len(docs)
    split = split_pairs(docs)
    assert len(split.train) > 1000 and len(split.heldout) > 200
    assert not {d.summary for d in split.train} & {d.summary for d in split.heldout}
    paths = write_demo_data(docs[:400], split_pairs(docs[:400]), tmp_path)
    queries = [json.loads(line) for line in (paths["task"] / "queries.jsonl").read_text().splitlines()]
    corpus_ids = {json.loads(line)["_id"] for line in (paths["task"] / "corpus.jsonl").read_text().splitlines()}
    qrels = (paths["task"] / "qrels" / "test.tsv").read_text().splitlines()[1:]
    assert len(qrels) == len(queries) > 0
    assert all(line.split("\t")[1] in corpus_ids for line in qrels)
    pairs = [json.loads(line) for line in paths["pairs"].read_text().splitlines()]
    assert not {p["query"] for p in pairs} & {q["text"] for q in queries}
    full = write_demo_data(docs, split, tmp_path / "full", corpus_size=1000)["task"]
    ids = [json.loads(line)["_id"] for line in (full / "corpus.jsonl").read_text().splitlines()]
    assert len(ids) == len(set(ids)) == 1000 and {d.name for d in split.heldout} <= set(ids)
    modules = {name.split(".")[0] for name in ids if name not in {d.name for d in split.heldout}}
    assert len(modules) > 50, "distractors should come from across the standard library"


def test_quick_demo_runs_every_stage_speaks_with_one_voice_and_rerun_skips_them(tmp_path):
    output = tmp_path / "demo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "neobert_embed.cli", "demo", "--quick", "--output", str(output)]
    first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    stages = json.loads((output / "stages.json").read_text())
    assert [s["name"] for s in stages] == STAGES
    assert "held-out retrieval nDCG@10" in first.stdout and "neobert-embed demo" in first.stdout
    scores = next(s for s in stages if s["name"] == "evaluate")["data"]["scores"]
    assert set(scores) == MODELS and all(0 <= v <= 1 for v in scores.values())
    summary = json.loads((output / "summary.json").read_text())
    assert summary["models"] == {name: {"ndcg_at_10": scores[name]} for name in MODELS}
    assert (output / "summary.png").read_bytes()[:4] == b"\x89PNG"
    assert (output / "index" / "manifest.json").is_file() and (output / "models" / "fine-tuned" / "modules.json").is_file()
    # one voice: the libraries' warnings and progress bars are in the log, not on the console
    log = (output / "demo.log").read_text()
    assert not [noise for noise in NOISE if noise in first.stdout], first.stdout
    assert [noise for noise in NOISE if noise in log], "the log should hold the third-party output"
    assert str(output / "demo.log") in first.stdout
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0 and "✓ corpus (" in again.stdout
    assert json.loads((output / "stages.json").read_text()) == stages  # nothing was redone


def test_stage_spinner_on_a_terminal_leaves_the_captured_streams_alone(tmp_path):
    """rich's ``console.status`` swaps sys.stdout/sys.stderr for proxies to the screen on a terminal,
    which would put third-party output back on screen; the demo's spinner must not."""
    import io

    from rich.console import Console

    from neobert_embed.commands import StageDisplay
    from neobert_embed.console import capture_third_party

    screen = io.StringIO()
    with capture_third_party(tmp_path / "run.log"), StageDisplay(Console(file=screen, force_terminal=True)) as display:
        captured = sys.stdout, sys.stderr
        display.start("pretrain")
        assert (sys.stdout, sys.stderr) == captured
        print("third-party chatter")
    assert "third-party chatter" in (tmp_path / "run.log").read_text()
    assert "third-party chatter" not in screen.getvalue()
