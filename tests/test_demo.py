"""`neobert-embed demo`: every stage runs offline end to end and a rerun skips finished stages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from neobert_embed.demo.docstring_data import collect_stdlib_docstrings, split_pairs, write_demo_data

STAGES = ["corpus", "pretrain", "untrained baseline", "contrastive", "MiniLM contrastive", "evaluate", "search"]
MINILM, MINILM_TUNED = "all-MiniLM-L6-v2", "all-MiniLM-L6-v2 + contrastive"
TINY_KEYS = ("untrained", "MLM only", "fine-tuned")
MODELS = {*TINY_KEYS, MINILM, MINILM_TUNED}
NOISE = ("FutureWarning", "UserWarning", "it/s]", "examples/s]", "Loading weights", "%|")
STAGE_MODELS = ("tiny NeoBERT (2×128)", MINILM, "every model above", "data only")


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


def _row(stdout: str, start: str) -> str:
    """The first line of the first table row whose first cell starts with ``start``."""
    return next(line for line in stdout.splitlines() if line.startswith(f"│ {start}"))


def test_quick_demo_runs_every_stage_speaks_with_one_voice_and_rerun_skips_them(tmp_path):
    output = tmp_path / "demo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}  # wide tables: one line per row
    command = [sys.executable, "-m", "neobert_embed.cli", "demo", "--quick", "--output", str(output)]
    first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    stages = json.loads((output / "stages.json").read_text())
    assert [s["name"] for s in stages] == STAGES
    assert "held-out retrieval nDCG@10" in first.stdout and "neobert-embed demo" in first.stdout
    scores = next(s for s in stages if s["name"] == "evaluate")["data"]["scores"]
    assert set(scores) == MODELS and all(0 <= v <= 1 for v in scores.values())
    # the README's claim, on the real all-MiniLM-L6-v2: the demo's recipe helps it on held-out queries
    assert scores[MINILM_TUNED] > scores[MINILM], scores
    summary = json.loads((output / "summary.json").read_text())
    assert {key: model["ndcg_at_10"] for key, model in summary["models"].items()} == scores
    names = {key: model["name"] for key, model in summary["models"].items()}
    assert all(names[key].startswith("tiny NeoBERT (2×128), ") for key in TINY_KEYS)
    assert (names[MINILM], names[MINILM_TUNED]) == (MINILM, MINILM_TUNED)
    assert (output / "summary.png").read_bytes()[:4] == b"\x89PNG"
    assert (output / "models" / "fine-tuned" / "modules.json").is_file()
    # every table row names its model: the stage table's model column, the score table's rows
    for stage in STAGES:
        assert any(model in _row(first.stdout, stage) for model in STAGE_MODELS), stage
    for key, score in scores.items():
        assert f"{score:.4f}" in _row(first.stdout, names[key])
    # the example searches: held-out queries, the best model (fine-tuned MiniLM) with its starting point beside
    search = next(s for s in stages if s["name"] == "search")["data"]
    assert (search["tuned"], search["base"]) == (MINILM_TUNED, MINILM)
    assert all((output / "indexes" / name / "manifest.json").is_file() for name in ("minilm", "minilm-fine-tuned"))
    searches = summary["searches"]
    assert (searches["model"], searches["beside"]) == (MINILM_TUNED, MINILM)
    task = output / "data" / "tasks" / "stdlib-docstring-retrieval"
    heldout = {json.loads(line)["text"] for line in (task / "queries.jsonl").read_text().splitlines()}
    trained = {json.loads(line)["query"] for line in (output / "data" / "summary_body_pairs.jsonl").read_text().splitlines()}
    assert len(searches["examples"]) == 4
    for example in searches["examples"]:
        assert example["query"] in heldout and example["query"] not in trained
        assert set(example["hits"]) == set(example["answer_rank"]) == {MINILM, MINILM_TUNED}
        row = _row(first.stdout, example["query"][:20])
        for model in (MINILM, MINILM_TUNED):
            hits, rank = example["hits"][model], example["answer_rank"][model]
            assert hits and (rank == 1) == (hits[0] == example["answer"])
            assert f"{'✓' if rank == 1 else '✗'} {hits[0][:20]}" in row
    top1 = searches["top1_correct"]
    assert top1[MINILM_TUNED] - top1[MINILM] == searches["top1_fixed"] - searches["top1_broken"]
    assert f"{MINILM} {top1[MINILM]}/{searches['queries']} → {MINILM_TUNED} {top1[MINILM_TUNED]}/" in first.stdout
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


def _old_journal(minilm: bool) -> list[dict]:
    """stages.json as a demo before the "search" stage left it (its last stage: "index", one tiny-model index)."""
    def stage(name: str, data: dict) -> dict:
        return {"name": name, "seconds": 1.0, "figure": "", "outputs": [], "data": data}

    scores = {"untrained": 0.06, "MLM only": 0.02, "fine-tuned": 0.14}
    journal = [stage("corpus", {"corpus": "c.jsonl", "pairs": "p.jsonl", "task": "task", "index_corpus": "i.jsonl"}),
               stage("pretrain", {"model": "models/mlm-only"}), stage("untrained baseline", {"model": "models/untrained"}),
               stage("contrastive", {"model": "models/fine-tuned"})]
    if minilm:
        journal.append(stage("MiniLM contrastive", {"model": "models/minilm-fine-tuned"}))
        scores |= {MINILM: 0.56, MINILM_TUNED: 0.58}
    return [*journal, stage("evaluate", {"scores": scores}),
            stage("index", {"examples": {"compress data with gzip": ["_pydecimal.Context"]}})]


@pytest.mark.parametrize("minilm", [True, False], ids=["with MiniLM", "MiniLM package missing"])
def test_a_demo_from_before_the_search_stage_resumes_with_it_and_keeps_its_files(tmp_path, monkeypatch, minilm):
    """An older runs/demo continues: finished stages are kept (the old "index" record and directory too), only
    the searches run, with the best fine-tuned model at hand and its starting point beside it."""
    import io

    from rich.console import Console

    from neobert_embed.demo import run
    from neobert_embed.demo.summary import print_summary

    output = tmp_path / "demo"
    (output / "index").mkdir(parents=True)
    (output / "index" / "manifest.json").write_text("{}")
    (output / "stages.json").write_text(json.dumps(_old_journal(minilm)))
    searched = []

    def fake_search(out, models, base, tuned, corpus, task):
        searched.append((base, tuned))
        example = {"query": "Compress data in one shot.", "answer": "gzip.compress",
                   "hits": {base: ["zlib.compress"], tuned: ["gzip.compress"]}, "answer_rank": {base: 2, tuned: 1}}
        return "figure", [], {"base": base, "tuned": tuned, "queries": 1, "top1": {base: 0, tuned: 1},
                              "top10": {base: 1, tuned: 1}, "fixed": 1, "broken": 0, "examples": [example],
                              "indexes": {}}

    monkeypatch.setattr(run, "_available_minilm", lambda: "minilm-dir" if minilm else None)
    monkeypatch.setattr(run, "_search", fake_search)
    report = run.run_demo(output, run.DemoSettings.quick())
    best = (MINILM, MINILM_TUNED) if minilm else ("MLM only", "fine-tuned")
    assert searched == [best]
    journal = json.loads((output / "stages.json").read_text())
    assert [stage["name"] for stage in journal][-2:] == ["index", "search"]
    assert (output / "index" / "manifest.json").read_text() == "{}"
    assert [stage.name for stage in report.stages][-2:] == ["evaluate", "search"]
    searches = json.loads((output / "summary.json").read_text())["searches"]
    assert (searches["beside"], searches["model"]) == tuple(report.name(key) for key in best)
    screen = io.StringIO()
    print_summary(report, Console(file=screen, width=200))
    text = screen.getvalue()
    assert f"top hit of {report.name(best[1])} beside {report.name(best[0])}" in text
    assert "✓ gzip.compress" in text and "✗ zlib.compress" in text and "answer at #2" in text
    assert "0/1 → " in text and "1/1 (+1: fine-tuning fixed 1 top hits, broke 0)" in text
