"""The runner reproduces plain ``mteb.evaluate`` with the real all-MiniLM-L6-v2 (reference figures).

STSBenchmarkDev 0.8672 cosine Spearman and TRECCoarse 0.5272 accuracy were measured with mteb 2.26
``mteb.evaluate`` on ../shared/data/tasks (see its README). The local tasks define no instruction,
so the uniform recipe encodes them without any prefix, exactly as plain mteb does; normalization
does not change MiniLM's (already normalized) embeddings.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from neobert_embed.cli import app

REFERENCE = {"STSBenchmarkDev": 0.8672, "TRECCoarse": 0.5272}


@pytest.mark.slow
def test_minilm_reproduces_plain_mteb_evaluate(shared_data, minilm_path, tmp_path):
    command = ["mteb", "--model", str(minilm_path), "--task-dir", str(shared_data / "tasks"),
               "--output", str(tmp_path), "--json"]
    first = CliRunner().invoke(app, command)
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    assert report["failures"] == {}
    for task, expected in REFERENCE.items():
        assert report["scores"][task] == pytest.approx(expected, abs=1e-4)
    assert {o["status"] for o in report["outcomes"]} == {"done"}

    rerun = json.loads(CliRunner().invoke(app, command).stdout)
    assert {o["status"] for o in rerun["outcomes"]} == {"cached"}
    assert rerun["scores"] == pytest.approx(report["scores"], abs=1e-6)
    assert "| model | 52.72 | — | — | — | — | 86.72 | — | 69.72 |" in (tmp_path / "summary.md").read_text()
