"""``neobert-embed compare``: five tiny backbones, one tiny recipe, one local task → table + plots."""

from __future__ import annotations

import json
from pathlib import Path

from contrastive_helpers import TINY_RECIPE, paraphrase_rows, write_jsonl
from tiny_models import ARCHITECTURES, build_tiny_model
from typer.testing import CliRunner

from neobert_embed.cli import app


def local_sts_task(root: Path) -> Path:
    directory = root / "tasks" / "pets"
    directory.mkdir(parents=True)
    (directory / "task.json").write_text(json.dumps({"name": "PetsSTS", "type": "STS"}))
    rows = [{"sentence1": r["query"], "sentence2": r["document"], "score": 5.0} for r in paraphrase_rows()[:16]]
    rows += [{"sentence1": a["query"], "sentence2": b["document"], "score": 1.0}
             for a, b in zip(paraphrase_rows()[:16], paraphrase_rows()[16:32], strict=True)]
    write_jsonl(directory / "test.jsonl", rows)
    return directory.parent


def test_compare_five_backbones_end_to_end_and_resume(tmp_path):
    models = [str(build_tiny_model(arch, tmp_path / "backbones" / arch)) for arch in ARCHITECTURES]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(TINY_RECIPE.read_text().replace("max_steps: 20", "max_steps: 2"))
    data = write_jsonl(tmp_path / "pairs.jsonl", paraphrase_rows(negatives=0, extra=False))
    command = ["compare", "--models", ",".join(models), "--recipe", str(recipe), "--data", f"pets={data}",
               "--task-dir", str(local_sts_task(tmp_path)), "--output", str(tmp_path / "cmp"), "--json"]

    first = CliRunner().invoke(app, command)
    assert first.exit_code == 0, first.output
    outcome = json.loads(first.stdout)
    assert outcome["failures"] == {}
    assert sorted(outcome["models"]) == sorted(ARCHITECTURES)
    for arch in ARCHITECTURES:
        assert (tmp_path / "cmp" / "models" / arch / "modules.json").is_file()
    table = (tmp_path / "cmp" / "summary.md").read_text()
    assert "fine-tuned with the same contrastive recipe" in table and "no checkpoint is selected" in table
    for arch in ARCHITECTURES:
        assert f"| {arch} | — | — | — | — | — | " in table
    csv_rows = (tmp_path / "cmp" / "summary.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + len(ARCHITECTURES) and all(",true," in row for row in csv_rows[1:])
    plot = tmp_path / "cmp" / "plots" / "STS.png"
    assert outcome["plots"] == [str(plot)] and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    weights = {arch: (tmp_path / "cmp" / "models" / arch / "model.safetensors").stat().st_mtime_ns
               for arch in ARCHITECTURES}
    second = CliRunner().invoke(app, command)
    assert second.exit_code == 0, second.output
    assert json.loads(second.stdout)["failures"] == {}
    assert weights == {arch: (tmp_path / "cmp" / "models" / arch / "model.safetensors").stat().st_mtime_ns
                       for arch in ARCHITECTURES}  # finished trainings were reused, not redone
    assert (tmp_path / "cmp" / "summary.md").read_text() == table
