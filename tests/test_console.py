"""One console: every long command keeps third-party chatter in OUTPUT.log, says so in one line,
and shows it with --verbose; renamed flags work and their old spellings still work with a warning."""

from __future__ import annotations

import json
import logging
import shlex
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from safety_helpers import small_inputs, write_jsonl
from typer.testing import CliRunner

from neobert_embed.cli import app

PRINTED, LOGGED, WARNED = "chatty print from a library", "chatty log record", "chatty FutureWarning"
TASK = {"name": "ConsoleSTS", "type": "STS"}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    from neobert_embed.index import build_index

    inputs = small_inputs(tmp_path_factory.mktemp("console"))
    build_index(inputs["model"], inputs["corpus"], inputs["root"] / "index", index_type="flat", show_progress=False)
    task = inputs["root"] / "task"
    task.mkdir()
    (task / "task.json").write_text(json.dumps(TASK), encoding="utf-8")
    write_jsonl(task / "test.jsonl", [{"sentence1": f"a {i}", "sentence2": f"b {i % 3}", "score": float(i % 5)}
                                      for i in range(12)])
    from glue_helpers import tiny_task_dir
    from pretraining_helpers import tiny_recipe

    from neobert_embed.pretraining import prepare_corpus

    recipe = inputs["root"] / "pretrain.yaml"
    recipe.write_text(yaml.safe_dump(tiny_recipe(max_steps=2)), encoding="utf-8")
    prepared = prepare_corpus(inputs["corpus"], inputs["root"] / "prepared", tokenizer=str(inputs["model"]),
                              progress=False).path
    glue = tiny_task_dir(inputs["root"], "stsb", train=16, validation=8)
    return inputs | {"task": task, "pretrain_recipe": recipe, "prepared": prepared, "glue": glue}


# (command, output) with {placeholders}; each loads a tokenizer through transformers inside the run.
COMMANDS = {
    "encode": ("encode --model {model} --input {texts} --output {out}/e.npy", "{out}/e.npy"),
    "index build": ("index build --model {model} --corpus {corpus} --output {out}/idx --index-type flat",
                    "{out}/idx"),
    "index add": ("index add {out}/index --corpus {more}", "{out}/index"),
    "mine-negatives": ("mine-negatives --model {model} --data {pairs} --output {out}/mined.jsonl -n 1",
                       "{out}/mined.jsonl"),
    "train-contrastive": ("train-contrastive --model {model} --data p={pairs} --recipe {recipe} --max-steps 1 "
                          "--output {out}/run", "{out}/run"),
    "pretrain prepare": ("pretrain prepare --corpus {corpus} --output {out}/prepared --tokenizer {model}",
                         "{out}/prepared"),
    "mteb": ("mteb --model {model} --task-dir {task} --output {out}/mteb", "{out}/mteb"),
    "pretrain": ("pretrain --recipe {pretrain_recipe} --corpus {prepared} --output {out}/pretrain", "{out}/pretrain"),
    "glue": ("glue --model {model} --task-dir {glue} --output {out}/glue --seeds 1 --epochs 1 --batch-size 8 "
             "--lr 1e-3", "{out}/glue"),
}


@pytest.fixture
def chatty(monkeypatch):
    """Make transformers' config/tokenizer loading print, log and warn, as real libraries do."""
    import transformers

    def wrap(cls):
        original = cls.from_pretrained.__func__

        def from_pretrained(klass, *args, **kwargs):
            print(PRINTED, file=sys.stderr)
            logging.getLogger("thirdparty.chatty").warning(LOGGED)
            warnings.warn(WARNED, FutureWarning, stacklevel=2)
            return original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(from_pretrained))

    wrap(transformers.AutoConfig)
    wrap(transformers.AutoTokenizer)


def _run(world: dict[str, Path], tmp_path: Path, name: str, extra: list[str]) -> tuple[object, Path]:
    import shutil

    shutil.copytree(world["root"] / "index", tmp_path / "index")
    more = write_jsonl(tmp_path / "more.jsonl", [{"_id": "new", "text": "fresh news"}])
    values = {key: str(value) for key, value in world.items()} | {"out": str(tmp_path), "more": str(more)}
    args, output = (part.format(**values) for part in COMMANDS[name])
    result = CliRunner().invoke(app, args.split() + extra)
    assert result.exit_code == 0, result.output
    return result, Path(output + ".log")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_third_party_output_goes_to_the_runs_log_with_one_summary_line(name, world, tmp_path, chatty, capfd):
    result, log = _run(world, tmp_path, name, [])
    screen = result.output + "".join(capfd.readouterr())
    for chatter in (PRINTED, LOGGED, WARNED):
        assert chatter not in screen, screen
        assert chatter in log.read_text(encoding="utf-8")
    lines = log.read_bytes().count(b"\n")
    assert f"third-party output: {lines} lines in {log}" in " ".join(screen.split())


@pytest.mark.parametrize("name", ["encode", "index add", "pretrain prepare"])
def test_verbose_leaves_third_party_output_on_screen(name, world, tmp_path, chatty):
    result, log = _run(world, tmp_path, name, ["--verbose"])
    assert PRINTED in result.output and "third-party output" not in result.output  # warnings: pytest keeps them
    assert not log.exists()


def test_store_precision_is_apart_from_the_compute_precision(world, tmp_path):
    base = ["encode", "--model", str(world["model"]), "--input", str(world["texts"])]
    new = CliRunner().invoke(app, [*base, "--output", str(tmp_path / "a.npy"), "--store-precision", "float16"])
    assert new.exit_code == 0 and "deprecated" not in new.output, new.output
    assert np.load(tmp_path / "a.npy").dtype == np.float16
    # --precision was once a hidden spelling of --store-precision; a stored format given to it is refused
    old = CliRunner().invoke(app, [*base, "--output", str(tmp_path / "b.npy"), "--precision", "float16"])
    assert old.exit_code != 0 and not (tmp_path / "b.npy").exists()
    assert "--store-precision" in str(old.exception) and "--precision 'float16'" in str(old.exception)
    help_text = " ".join(CliRunner().invoke(app, ["encode", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "--store-precision" in help_text and "--precision" in help_text and "Compute precision" in help_text


def test_index_build_max_length_and_its_old_spelling(world, tmp_path):
    from neobert_embed.index.manifest import read_manifest

    base = ["index", "build", "--model", str(world["model"]), "--corpus", str(world["corpus"]),
            "--index-type", "flat"]
    new = CliRunner().invoke(app, [*base, "--output", str(tmp_path / "a"), "--max-length", "16",
                                   "--store-precision", "float16"])
    assert new.exit_code == 0 and "deprecated" not in new.output, new.output
    old = CliRunner().invoke(app, [*base, "--output", str(tmp_path / "b"), "--max-seq-length", "16",
                                   "--store-precision", "float16"])
    assert old.exit_code == 0, old.output
    assert "--max-seq-length is deprecated; use --max-length" in old.output
    first, second = read_manifest(tmp_path / "a"), read_manifest(tmp_path / "b")
    assert first.max_seq_length == second.max_seq_length == 16 and first.precision == second.precision == "float16"
    help_text = CliRunner().invoke(app, ["index", "build", "--help"]).output
    assert "--max-length" in help_text and "--max-seq-length" not in help_text


@pytest.mark.parametrize(("rank", "shown"), [("0", {"status", "careful", "broken"}), ("1", {"broken"})])
def test_status_lines_come_from_process_zero_only_and_errors_from_every_process(rank, shown, monkeypatch):
    import io

    from neobert_embed.console import show_records

    monkeypatch.setenv("RANK", rank)
    screen = io.StringIO()
    handler = show_records(screen)
    try:
        log = logging.getLogger("neobert_embed.pretraining.train")
        log.info("status")
        log.warning("careful")
        log.error("broken")
    finally:
        handler.detach()
    assert {word for word in ("status", "careful", "broken") if word in screen.getvalue()} == shown


def test_json_stdout_holds_only_the_json_even_inside_the_run_log(tmp_path):
    """Commands nest ``json_only_stdout`` inside ``third_party_log``: descriptor-level writes (C
    libraries) must still leave stdout, although sys.stdout is the log file by then."""
    import subprocess

    code = ("import os\nfrom neobert_embed.console import json_only_stdout, third_party_log\n"
            f"with third_party_log({str(tmp_path / 'out')!r}), json_only_stdout(True):\n"
            "    os.write(1, b'C-level noise\\n')\n    print('python noise')\n"
            "print('{\"ok\": 1}')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == '{"ok": 1}\n'
    assert "C-level noise" in result.stderr and "python noise" in (tmp_path / "out.log").read_text()


@pytest.mark.parametrize("command", ["index search {out}/index 'fresh news' --k 2",
                                     "index eval {out}/index --task-dir {task}"])
def test_read_only_index_commands_draw_no_third_party_bars(command, world, tmp_path, capfd):
    """search and eval have no run folder for a log: loading bars are switched off, not drawn."""
    import shutil

    if "eval" in command:
        pytest.importorskip("pytrec_eval")
        task = tmp_path / "beir"
        (task / "qrels").mkdir(parents=True)
        write_jsonl(task / "queries.jsonl", [{"_id": "q1", "text": "fresh news"}])
        (task / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n", encoding="utf-8")
    shutil.copytree(world["root"] / "index", tmp_path / "index")
    args = shlex.split(command.format(out=tmp_path, task=tmp_path / "beir"))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    screen = result.output + "".join(capfd.readouterr())
    assert "Loading weights" not in screen and "it/s]" not in screen, screen


def test_the_toolkits_own_lines_reach_the_commands_streams(world, tmp_path):
    """Tables and verdicts go through the one user console, onto the streams the command started
    with: a caller that captures them (CliRunner here, a shell pipe for a user) gets every line."""
    import shutil

    shutil.copytree(world["root"] / "index", tmp_path / "index")
    verified = CliRunner().invoke(app, ["index", "verify", str(tmp_path / "index")])
    searched = CliRunner().invoke(app, ["index", "search", str(tmp_path / "index"), "fresh news", "--k", "1"])
    assert verified.exit_code == 0 and "OK (" in verified.output, verified.output
    assert searched.exit_code == 0 and "query: fresh news" in searched.output, searched.output


def test_no_console_is_made_outside_console_py():
    """One console: a ``Console(`` anywhere else in the package would bypass capturing and the
    process-0 rule (the count was 6 before this test)."""
    package = Path(__file__).resolve().parents[1] / "neobert_embed"
    raw = [f"{path.relative_to(package)}:{number}" for path in sorted(package.rglob("*.py"))
           if path.name != "console.py"
           for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if "Console(" in line]
    assert raw == []


def test_a_log_handler_made_inside_the_block_still_writes_after_it(tmp_path, capfd):
    """``datasets`` makes its handler at its first record, on the ``sys.stderr`` of that moment: inside
    a command, the run's log. Once the command is over that log is closed, and every later record
    (a notebook's next cell) printed '--- Logging error --- I/O operation on closed file'."""
    from neobert_embed.console import capture_third_party

    late = logging.getLogger("thirdparty.late")
    with capture_third_party(tmp_path / "run.log"):
        handler = logging.StreamHandler()
        late.addHandler(handler)
        late.warning("inside the block")
    try:
        late.warning("after the block")
    finally:
        late.removeHandler(handler)
    err = capfd.readouterr().err
    assert "after the block" in err and "Logging error" not in err, err
    assert "inside the block" in (tmp_path / "run.log").read_text(encoding="utf-8")


def test_a_library_handler_made_inside_one_capture_still_works_in_the_next(tmp_path):
    """transformers makes its default handler at first use with ``handler.flush = sys.stderr.flush``:
    made inside a capture, that flush is the log's; the next command (a notebook's, a torchrun worker's,
    a test's second CLI call) failed with "I/O operation on closed file" before its first record."""
    from neobert_embed.console import capture_third_party

    library = logging.getLogger("a_library_like_transformers")
    with capture_third_party(tmp_path / "first.log"):
        handler = logging.StreamHandler()  # on sys.stderr of this moment: the first log
        handler.flush = sys.stderr.flush
        library.addHandler(handler)
        library.warning("first command")
    try:
        assert handler.stream is sys.__stderr__ and "flush" not in handler.__dict__
        with capture_third_party(tmp_path / "second.log"):
            library.warning("second command")
    finally:
        library.removeHandler(handler)
    assert "first command" in (tmp_path / "first.log").read_text()
    assert "second command" in (tmp_path / "second.log").read_text()


def test_what_a_child_process_writes_goes_to_the_log_not_the_screen(tmp_path, capfd):
    """DeepSpeed's op probes run a compiler that writes to the process's descriptor 2."""
    import subprocess

    from neobert_embed.console import capture_third_party, child_output_captured

    log = tmp_path / "run.log"
    with capture_third_party(log), child_output_captured():
        subprocess.run([sys.executable, "-c", "import os; os.write(1, b'out of gcc\\n'); os.write(2, b'ld: no aio\\n')"],
                       check=True)
    screen = capfd.readouterr()
    assert "out of gcc" not in screen.out + screen.err and "no aio" not in screen.out + screen.err
    assert "out of gcc" in log.read_text() and "ld: no aio" in log.read_text()
    print("after the block")  # the descriptors are back
    assert "after the block" in capfd.readouterr().out


def test_the_spinner_leaves_the_streams_to_the_run_log_even_on_a_terminal():
    """console.spinner (convert, the demo's stages) never swaps sys.stdout/sys.stderr, which rich's
    console.status does on a terminal: third-party output during the step must reach the log."""
    import io

    from rich.console import Console

    from neobert_embed.console import spinner

    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True)
    streams = (sys.stdout, sys.stderr)
    with spinner("converting …", terminal):
        assert (sys.stdout, sys.stderr) == streams
    with terminal.status("converting …"):  # what convert used: rich swaps the streams on a terminal
        assert (sys.stdout, sys.stderr) != streams
    assert "converting" in screen.getvalue()
