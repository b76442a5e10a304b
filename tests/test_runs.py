"""Run directories (neobert_embed.runs) through the commands that use them: a resume with changed
settings is refused naming every key, Ctrl-C prints the resume command (only the CLI does), the
printed command finishes the run, and metrics.jsonl never holds a step twice."""

from __future__ import annotations

import json
import shlex
import shutil
import signal
from pathlib import Path

import pytest
import yaml
from contrastive_helpers import TINY_RECIPE, one_torch_thread, paraphrase_rows, write_jsonl
from pretraining_helpers import ctrl_c_at_step, tiny_recipe, write_docstring_corpus
from tiny_models import build_tiny_model
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.errors import UserInputError
from neobert_embed.records import PREPARE_STATE, RUN
from neobert_embed.runs import MetricsFile, check_resume, partial_directory, promoted, read_metrics

runner = CliRunner()

_one_thread = pytest.fixture(autouse=True)(one_torch_thread)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return build_tiny_model("bert", tmp_path_factory.mktemp("models") / "bert")


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def _resume_words(output: str) -> list[str]:
    assert "Resume with:" in output, output
    return shlex.split(output.split("Resume with:")[1].strip().splitlines()[0])


# the mechanism ------------------------------------------------------------------------------------


def test_resume_check_lists_every_changed_key_and_allows_operational_ones(tmp_path):
    RUN.write(tmp_path, {"model": "bert", "recipe": {"lr": 1e-4, "seed": 0, "log_every": 10, "betas": (0.9, 0.98)}})
    same = {"model": "bert", "recipe": {"lr": 1e-4, "seed": 0, "log_every": 50, "betas": [0.9, 0.98]}}
    assert check_resume(tmp_path, same, operational={"recipe.log_every"})["model"] == "bert"
    with pytest.raises(UserInputError, match=r"run.json: --resume must continue the same run, but model "
                       r"\('bert' → 'roberta'\), recipe.lr \(0.0001 → 0.001\), recipe.seed \(0 → None\) changed"):
        check_resume(tmp_path, {"model": "roberta", "recipe": {"lr": 1e-3, "log_every": 10, "betas": [0.9, 0.98]}})
    assert check_resume(tmp_path / "empty", same) is None  # nothing recorded: nothing to continue
    PREPARE_STATE.write(tmp_path, {"fingerprint": "a" * 64})
    with pytest.raises(UserInputError, match=r"prepare.json: .*fingerprint \('aaaa[a…]+'? → 'bbbb") as refused:
        check_resume(tmp_path, {"fingerprint": "b" * 64}, record=PREPARE_STATE)
    assert "a" * 64 not in str(refused.value)  # long values (hashes) are shortened


def test_metrics_file_drops_lines_past_the_resumed_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    metrics = MetricsFile(path, resume_step=0)
    for step in range(1, 6):
        metrics.write({"step": step, "loss": 1.0 / step})
    with open(path, "a") as handle:
        handle.write('{"step": 6, "lo')  # killed while writing a line
    MetricsFile(path, resume_step=3).write({"step": 4, "loss": 0.0})
    assert _steps(path) == [1, 2, 3, 4]
    assert [row["step"] for row in read_metrics(path)] == [1, 2, 3, 4]


def test_a_damaged_metrics_line_before_the_last_is_a_located_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo}\n{"step": 3, "loss": 1.0}\n', encoding="utf-8")
    with pytest.raises(UserInputError, match=rf"^{path}:2: damaged training log line \(invalid JSON"):
        MetricsFile(path, resume_step=3)
    assert read_metrics(tmp_path / "absent.jsonl") == []
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n{"step": 2, "note": "\xff"}\n{"step": 3, "loss": 1.0}\n')
    with pytest.raises(UserInputError, match=rf"^{path}:2: damaged training log line \(not UTF-8"):
        read_metrics(path)
    path.write_bytes('{"step": 1, "note": "caf\u00e9"}\n{"step": 2, "note": "caf\u00e9"}'.encode()[:-3])  # cut in "é"
    assert [row["step"] for row in read_metrics(path)] == [1]


def test_promotion_carries_the_run_files_and_leaves_the_run_intact_on_failure(tmp_path):
    run = tmp_path / "run"
    RUN.write(run, {"model": "bert"})
    (run / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(RuntimeError), promoted(run) as tmp:
        (tmp / "model.safetensors").write_text("half")
        raise RuntimeError("reload check failed")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl", "run.json"]
    assert not list(tmp_path.glob(".run.*"))
    with promoted(run) as tmp:
        (tmp / "model.safetensors").write_text("weights")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl", "model.safetensors", "run.json"]
    assert (run / "checkpoints" / "checkpoint-2").is_dir()


# train-contrastive ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def triplets(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("contrastive") / "triplets.jsonl", paraphrase_rows(negatives=1))


@pytest.fixture(scope="module")
def contrastive_recipe(tmp_path_factory):
    recipe = yaml.safe_load(TINY_RECIPE.read_text()) | {"max_steps": 6, "save_steps": 2, "save_total_limit": 3}
    path = tmp_path_factory.mktemp("recipes") / "contrastive.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _contrastive(model, triplets, recipe, output, *extra):
    return runner.invoke(app, ["train-contrastive", "--model", str(model), "--recipe", str(recipe),
                               "--data", f"t={triplets}", "--output", str(output), *extra])


def test_contrastive_ctrl_c_prints_the_resume_command_that_finishes_without_duplicate_metrics(
        tiny_bert, triplets, contrastive_recipe, tmp_path, monkeypatch):
    from neobert_embed.contrastive.trainer import GracefulInterrupt

    original = GracefulInterrupt.on_step_end

    def ctrl_c_at_step_3(self, args, state, control, **kwargs):
        if state.global_step == 3:
            signal.raise_signal(signal.SIGINT)
        return original(self, args, state, control, **kwargs)

    monkeypatch.setattr(GracefulInterrupt, "on_step_end", ctrl_c_at_step_3)
    out = tmp_path / "run"
    result = _contrastive(tiny_bert, triplets, contrastive_recipe, out, "--overwrite")
    assert result.exit_code == 130, result.output
    assert "interrupted: stopped at step 3; checkpoint saved" in result.output
    words = _resume_words(result.output)
    assert words[:2] == ["neobert-embed", "train-contrastive"] and words[-1] == "--resume"
    assert "--overwrite" not in words and not (out / "modules.json").exists()
    monkeypatch.setattr(GracefulInterrupt, "on_step_end", original)
    shutil.rmtree(out / "checkpoints" / "checkpoint-3")  # as if killed after step 3: metrics are ahead
    assert _steps(out / "metrics.jsonl") == [1, 2, 3]

    resumed = runner.invoke(app, words[1:])
    assert resumed.exit_code == 0, resumed.output
    assert _steps(out / "metrics.jsonl") == [1, 2, 3, 4, 5, 6]
    assert json.loads((out / "summary.json").read_text())["resumed_from"].endswith("checkpoint-2")


def test_contrastive_resume_with_changed_settings_names_every_key(tiny_bert, triplets, contrastive_recipe,
                                                                  tmp_path):
    out = tmp_path / "run"
    assert _contrastive(tiny_bert, triplets, contrastive_recipe, out, "--max-steps", "2").exit_code == 0
    result = _contrastive(tiny_bert, triplets, contrastive_recipe, out, "--max-steps", "2", "--lr", "0.5",
                          "--temperature", "0.5", "--resume")
    assert isinstance(result.exception, UserInputError), result.output
    message = str(result.exception)
    assert "recipe.learning_rate (" in message and "→ 0.5)" in message and "recipe.temperature (" in message
    assert message.startswith(f"{out / 'run.json'}: --resume must continue the same run")


# index build ----------------------------------------------------------------------------------------------


def test_index_resume_with_changed_settings_names_every_key(tiny_bert, tmp_path, monkeypatch):
    from neobert_embed.index.encoder import IndexEncoder

    corpus = write_jsonl(tmp_path / "c.jsonl", [{"_id": f"d{i}", "text": f"document number {i} about cats"}
                                                for i in range(40)])
    original = IndexEncoder.encode_in_length_order
    calls = []

    def ctrl_c_on_second_chunk(self, texts, kind, advance=None):
        calls.append(len(texts))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(self, texts, kind, advance)

    monkeypatch.setattr(IndexEncoder, "encode_in_length_order", ctrl_c_on_second_chunk)
    out = tmp_path / "index"
    build = ["index", "build", "--model", str(tiny_bert), "--corpus", str(corpus), "--output", str(out)]
    result = runner.invoke(app, [*build, "--chunk-size", "16", "--overwrite"])
    assert result.exit_code == 130 and "16 of 40 documents encoded" in result.output, result.output
    assert _resume_words(result.output) == ["neobert-embed", *build, "--chunk-size", "16", "--resume"]

    changed = runner.invoke(app, [*build, "--chunk-size", "8", "--max-seq-length", "16", "--title-field", "",
                                  "--resume"])
    assert isinstance(changed.exception, UserInputError), changed.output
    assert ("chunk_size (16 → 8), max_seq_length (None → 16), title_field ('title' → '') changed"
            in str(changed.exception))
    resumed = runner.invoke(app, _resume_words(result.output)[1:])
    assert resumed.exit_code == 0, resumed.output
    assert calls[2:] == [16, 8]  # only the chunks that were not finished were encoded


# pretrain prepare ------------------------------------------------------------------------------------


def test_prepare_ctrl_c_says_to_rerun_and_a_changed_rerun_names_every_key(tmp_path, monkeypatch):
    from neobert_embed.pretraining import prepare as prepare_module

    raw = write_docstring_corpus(tmp_path / "docs.jsonl", limit=90)
    out = tmp_path / "prepared"
    command = ["pretrain", "prepare", "--corpus", str(raw), "--tokenizer", "train", "--vocab-size", "300",
               "--shard-documents", "30", "--output", str(out)]
    original = prepare_module._tokenize_shard

    def ctrl_c_on_second_shard(job):
        if job[0] == 1:
            raise KeyboardInterrupt
        return original(job)

    monkeypatch.setattr(prepare_module, "_tokenize_shard", ctrl_c_on_second_shard)
    result = runner.invoke(app, command)
    assert result.exit_code == 130, result.output
    assert "1 finished shard(s) of 30 documents are kept" in result.output
    assert _resume_words(result.output) == ["neobert-embed", *command]  # rerun as is: prepare has no --resume
    monkeypatch.setattr(prepare_module, "_tokenize_shard", original)

    changed = runner.invoke(app, [*command[:-6], "--vocab-size", "400", "--shard-documents", "20",
                                  "--output", str(out)])
    assert isinstance(changed.exception, UserInputError), changed.output
    assert ("rerunning prepare must continue the same run, but shard_documents (30 → 20), vocab_size "
            "(300 → 400) changed" in str(changed.exception))
    assert not out.exists()  # the unfinished preparation waits in a hidden sibling, never in --output
    first = (partial_directory(out) / "shards" / "000000.arrow").stat().st_mtime_ns
    assert runner.invoke(app, command).exit_code == 0
    assert json.loads((out / "corpus.json").read_text())["num_documents"] == 90
    assert (out / "shards" / "000000.arrow").stat().st_mtime_ns == first  # the finished shard was kept


# pretrain ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from neobert_embed.pretraining import prepare_corpus

    root = tmp_path_factory.mktemp("pretrain")
    raw = write_docstring_corpus(root / "docs.jsonl", limit=200)
    return prepare_corpus(raw, root / "prepared", tokenizer="train", vocab_size=300, progress=False).path


def _write_recipe(path: Path, **changes) -> Path:
    recipe = tiny_recipe()
    for section, values in changes.items():
        recipe[section] = recipe.get(section, {}) | values
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_pretrain_ctrl_c_prints_the_resume_command_and_metrics_have_no_duplicate_steps(prepared, tmp_path,
                                                                                        monkeypatch):
    undo = ctrl_c_at_step(monkeypatch, 3)
    run = tmp_path / "run"
    command = ["pretrain", "--recipe", str(_write_recipe(tmp_path / "r.yaml")), "--corpus", str(prepared),
               "--output", str(run)]
    result = runner.invoke(app, command)
    assert result.exit_code == 130, result.output
    assert "interrupted: checkpoint of step 3 saved" in result.output
    assert _resume_words(result.output) == ["neobert-embed", *command, "--resume"]
    undo()
    shutil.rmtree(run / "checkpoints" / "step-00000003")  # as if killed after step 3: metrics are ahead
    assert _steps(run / "metrics.jsonl") == [1, 2, 3]

    resumed = runner.invoke(app, _resume_words(result.output)[1:])
    assert resumed.exit_code == 0, resumed.output
    assert _steps(run / "metrics.jsonl") == [1, 2, 3, 4, 5, 6]
    assert (run / "final" / "model.safetensors").is_file()


def test_pretrain_resume_refuses_changed_recipe_keys_and_corpus_but_not_operational_ones(prepared, tmp_path):
    run = tmp_path / "run"
    base = ["--corpus", str(prepared), "--output", str(run)]
    ok = runner.invoke(app, ["pretrain", "--recipe", str(_write_recipe(tmp_path / "r.yaml")), *base,
                             "--stop-after-steps", "2"])
    assert ok.exit_code == 0, ok.output
    changed = _write_recipe(tmp_path / "changed.yaml", optimizer={"lr": 1e-3}, masking={"rate": 0.3},
                            training={"log_every_steps": 2, "max_steps": 4})
    result = runner.invoke(app, ["pretrain", "--recipe", str(changed), *base, "--resume"])
    assert isinstance(result.exception, UserInputError), result.output
    assert str(result.exception).endswith(
        "--resume must continue the same run, but masking.rate (0.2 → 0.3), optimizer.lr (0.003 → 0.001) "
        "changed; resume with the run's recipe and corpus, or start a new --output")
    other = runner.invoke(app, ["pretrain", "--recipe", str(tmp_path / "r.yaml"), "--corpus", str(tmp_path),
                                "--output", str(run), "--resume"])
    assert isinstance(other.exception, UserInputError) and "but corpus (" in str(other.exception)
    operational = _write_recipe(tmp_path / "op.yaml", training={"log_every_steps": 2, "max_steps": 4})
    result = runner.invoke(app, ["pretrain", "--recipe", str(operational), *base, "--resume"])
    assert result.exit_code == 0, result.output
    assert _steps(run / "metrics.jsonl") == [1, 2, 4]


def test_resume_command_keeps_brackets_and_the_torchrun_launcher(tiny_bert, tmp_path, monkeypatch):
    from neobert_embed.index import build
    from neobert_embed.runs import Interrupted

    def stop(*args, **kwargs):
        raise Interrupted("2 of 3 chunks encoded in runs/exp[lr=1e-4]")

    monkeypatch.setattr(build, "build_index", stop)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    output = tmp_path / "exp[lr=1e-4]"
    result = CliRunner().invoke(app, ["index", "build", "--model", str(tiny_bert), "--corpus", "c.jsonl",
                                      "--output", str(output)])
    assert result.exit_code == 130, result.output
    assert "runs/exp[lr=1e-4]" in result.output
    assert _resume_words(result.output) == ["torchrun", "--nproc-per-node=2", "-m", "neobert_embed.cli", "index",
                                            "build", "--model", str(tiny_bert), "--corpus", "c.jsonl",
                                            "--output", str(output), "--resume"]


def test_a_file_a_library_writes_appears_whole_or_not_at_all(tmp_path):
    """FAISS and Arrow write files by name: through ``atomic_path`` a failure mid-write leaves the old
    file and no temporary behind, and success replaces it in one rename."""
    from neobert_embed.files import atomic_path

    target = tmp_path / "index.faiss"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["index.faiss"]
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old"  # readers still see the old file until the rename
    assert target.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["index.faiss"]


def test_updated_directory_replaces_a_finished_output_whole_or_not_at_all(tmp_path):
    from neobert_embed.runs import updated_directory

    output = tmp_path / "out"
    output.mkdir()
    RUN.write(output, {"steps": 1})
    (output / "kept.txt").write_text("old", encoding="utf-8")
    with pytest.raises(RuntimeError), updated_directory(output, record=RUN, command="test") as work:
        (work / "kept.txt").write_text("half-written", encoding="utf-8")
        raise RuntimeError("stopped half way")
    assert (output / "kept.txt").read_text(encoding="utf-8") == "old"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no staged copy left behind

    with updated_directory(output, record=RUN, command="test") as work:
        RUN.write(work, {"steps": 2})
        with pytest.raises(UserInputError, match="is being written by"), updated_directory(output, record=RUN,
                                                                               command="second", wait=False):
            pass  # a second writer is refused while the first holds the directory
    assert RUN.read(output) == {"steps": 2} and not (output / "kept.txt").exists()

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("a user's", encoding="utf-8")
    with pytest.raises(UserInputError, match="did not write"), updated_directory(foreign, record=RUN,
                                                                                 command="test"):
        pass
    assert (foreign / "notes.txt").read_text(encoding="utf-8") == "a user's"


def test_an_earlier_versions_unfinished_output_is_adopted_once(tmp_path):
    """runs.adopt_unfinished: an index build's visible OUT.partial and a preparation kept in place
    (earlier versions) move to the hidden partial directory; a newer one there is never replaced."""
    from neobert_embed.runs import adopt_unfinished

    output = tmp_path / "prepared"
    PREPARE_STATE.write(output, {"fingerprint": "old"})
    (output / "shards").mkdir()
    (output / "shards" / "000000.arrow").write_bytes(b"kept")
    adopt_unfinished(output, output, PREPARE_STATE)
    partial = partial_directory(output)
    assert not output.exists() and (partial / "shards" / "000000.arrow").read_bytes() == b"kept"
    PREPARE_STATE.write(output, {"fingerprint": "older"})
    adopt_unfinished(output, output, PREPARE_STATE)  # a newer unfinished job is there: left alone
    assert PREPARE_STATE.read(partial) == {"fingerprint": "old"} and PREPARE_STATE.exists(output)
    adopt_unfinished(tmp_path / "absent", tmp_path / "absent", PREPARE_STATE)  # nothing to adopt
    assert not partial_directory(tmp_path / "absent").exists()
