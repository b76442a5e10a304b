"""Fault injection: every command of the CLI against hostile inputs, outputs and option values.

Property, for each case: exit status 2, ONE line on stderr that starts with ``error:`` and names
what is wrong (the case's key words: a file, a row, a flag, a tensor), no traceback, and every file
that existed before the command (the shared inputs, the foreign files, the case's own scratch
files) byte-identical afterwards. Where the fault needs no model, it must also be found before the
model loads (within a few seconds).

The classes (issue: no data loss, round 2), each exercised on every command that has it:
foreign files in and beside outputs (sidecars included), outputs that are files, lie under a file
or are not writable, every numeric option at 0, negative, NaN and huge, corrupt and truncated
artefacts, NaN weights, blank and malformed rows, bad devices. ``test_hostile_inputs.py`` holds the
first round's table; this one covers the commands and classes that round did not name.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from safety_helpers import fault_world, run_main, snapshot, write_jsonl
from safety_helpers import in_turn as _both

READ_ONLY = "/proc/1/out"  # /proc/1 is read-only even for root


@dataclass(frozen=True)
class Case:
    """One hostile command line; ``args`` take placeholders filled from the world ({model}, {case}…).

    ``expect``: words the one-line error must contain (case-insensitive), so a case passes because
    its guard fired, not because something else failed first. ``fast``: the fault needs no model,
    so the command must fail before loading one (under :data:`FAST_SECONDS`).
    """

    name: str
    args: tuple[str, ...]
    expect: tuple[str, ...]
    prepare: Callable[[dict[str, Path]], None] | None = None
    fast: bool = True
    keep: tuple[str, ...] = field(default=())  # extra paths (placeholders) that must stay as they were


FAST_SECONDS = 5.0


@dataclass(frozen=True)
class World:
    paths: dict[str, Path]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    inputs = fault_world(tmp_path_factory.mktemp("faults"))
    root = inputs["root"]
    a_file = root / "a-file"
    a_file.write_text("not a directory", encoding="utf-8")
    blank = root / "blank.txt"
    blank.write_text("\n  \n\t\n", encoding="utf-8")
    short_csv = root / "short.csv"
    short_csv.write_text("_id,text\nd1,first\nd2\n", encoding="utf-8")
    nan_model = root / "nan-model"
    shutil.copytree(inputs["model"], nan_model)
    _poison(nan_model)
    return World({**inputs, "file": a_file, "blank": blank, "short": short_csv, "nan_model": nan_model})


def _poison(model_dir: Path) -> None:
    """Set one weight tensor of a saved model to NaN (a diverged training run's checkpoint)."""
    from safetensors.torch import load_file, save_file

    weights = next(model_dir.rglob("model.safetensors"))
    tensors = load_file(str(weights))
    name = next(key for key in sorted(tensors) if key.endswith("dense.weight"))
    tensors[name] = tensors[name] * float("nan")
    save_file(tensors, str(weights), metadata={"format": "pt"})


def _foreign(relative: str, content: str = "mine") -> Callable[[dict[str, Path]], None]:
    """A file the user made, at ``{case}/relative``."""
    def make(paths: dict[str, Path]) -> None:
        target = paths["case"] / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    return make


def _copy_index(kind: str = "none") -> Callable[[dict[str, Path]], None]:
    def make(paths: dict[str, Path]) -> None:
        target = paths["case"] / "index"
        shutil.copytree(paths["index"], target)
        faiss_file = target / "index.faiss"
        if kind == "faiss-truncated":
            faiss_file.write_bytes(faiss_file.read_bytes()[:64])
        elif kind == "manifest-garbage":
            (target / "manifest.json").write_text("{\"format_version\": ", encoding="utf-8")
    return make


def _damaged_model(file: str, text: str = '[{"idx": 0, "name": ') -> Callable[[dict[str, Path]], None]:
    """A copy of the model at ``{case}/model`` whose ``file`` (one its loaders read) holds ``text``
    (by default: cut short)."""
    def make(paths: dict[str, Path]) -> None:
        shutil.copytree(paths["model"], paths["case"] / "model")
        (paths["case"] / "model" / file).write_text(text, encoding="utf-8")
    return make


def _sharded_model(index: str) -> Callable[[dict[str, Path]], None]:
    """A copy of the model at ``{case}/model`` saved as one shard, with ``index`` as its shard index."""
    def make(paths: dict[str, Path]) -> None:
        model = paths["case"] / "model"
        shutil.copytree(paths["model"], model)
        (model / "model.safetensors").rename(model / "model-00001-of-00001.safetensors")
        (model / "model.safetensors.index.json").write_text(index, encoding="utf-8")
    return make


def _file_text(relative: str, text: str) -> Callable[[dict[str, Path]], None]:
    return _foreign(relative, text)


M, T = "{model}", "{texts}"
ENCODE = ("encode", "--model", M, "--input", T, "--output", "{case}/out.npy")
BUILD = ("index", "build", "--model", M, "--corpus", "{corpus}", "--output", "{case}/new-index")
ADD = ("index", "add", "{case}/index", "--corpus", "{new_docs}")
SEARCH = ("index", "search", "{case}/index", "hello")
EVAL = ("index", "eval", "{case}/index", "--task-dir", "{task}")
MINE = ("mine-negatives", "--model", M, "--data", "{pairs}", "--output", "{case}/mined.jsonl")
TRAIN = ("train-contrastive", "--model", M, "--data", "p={pairs}", "--recipe", "{recipe}", "--max-steps", "1",
         "--output", "{case}/run")
MTEB = ("mteb", "--model", M, "--task-dir", "{task}")
COMPARE = ("compare", "--models", M, "--data", "p={pairs}", "--recipe", "{recipe}", "--task-dir", "{task}")
GLUE = ("glue", "--model", M, "--task-dir", "{task}", "--output", "{case}/glue")
SERVE = ("serve", "--model", M)
PREPARE = ("pretrain", "prepare", "--corpus", T, "--tokenizer", M)
PRETRAIN = ("pretrain", "--recipe", "{repo}/recipes/pretrain-tiny.yaml", "--corpus", T)
EXPORT = ("export", M, "--format", "onnx")
PLAN = ("index", "plan", "--vectors", "1000", "--dim", "32")


def _numbers(prefix: tuple[str, ...], flag: str, values: tuple[str, ...], *, prepare=None) -> list[Case]:
    """One case per hostile value of ``flag``; the error must name the flag."""
    return [Case(f"{' '.join(prefix[:2])} {flag} {value}", (*prefix, flag, value), (flag,), prepare)
            for value in values]


BAD_COUNT = ("0", "-1", "nan", "10000000000000")  # an integer option that counts things
BAD_RATE = ("0", "-1", "nan", "inf")  # a float that must be positive and finite

CASES = [
    # --- encode ---------------------------------------------------------------------------------
    Case("encode output suffix", (*ENCODE[:-1], "{case}/out.txt"), (".npy",)),
    Case("encode sidecar is foreign", ENCODE, ("out.npy.json",), _foreign("out.npy.json")),
    Case("encode --overwrite own npy, foreign sidecar", (*ENCODE, "--overwrite"), ("out.npy",),
         _both(_foreign("out.npy"), _foreign("out.npy.json", '{"writer": "someone else"}'))),
    Case("encode output read-only", (*ENCODE[:-1], f"{READ_ONLY}.npy"), ("/proc/1",)),
    Case("encode sidecar would be the input", ("encode", "--model", M, "--input", "{case}/x.npy.json",
                                                "--output", "{case}/x.npy"), ("input",),
         _foreign("x.npy.json", "just one text\n")),
    Case("encode NaN weights", ("encode", "--model", "{nan_model}", "--input", T, "--output", "{case}/out.npy"),
         ("dense.weight", "nan"), fast=False),
    Case("encode blank input", ("encode", "--model", M, "--input", "{blank}", "--output", "{case}/out.npy"),
         ("blank.txt", "no text")),
    Case("encode missing input", ("encode", "--model", M, "--input", "{case}/none.txt", "--output",
                                  "{case}/out.npy"), ("none.txt",)),
    Case("encode short csv row", ("encode", "--model", M, "--input", "{short}", "--output", "{case}/out.npy"),
         ("short.csv", "3")),
    Case("encode bad precision", (*ENCODE, "--precision", "int3"), ("--precision",)),
    Case("encode bad backend", (*ENCODE, "--backend", "tensorrt"), ("--backend",)),
    *_numbers(ENCODE, "--batch-size", ("nan", "10000000000000")),
    *_numbers(ENCODE, "--max-length", ("-1", "nan")),
    Case("encode max length beyond the model", (*ENCODE, "--max-length", "4096"), ("--max-length", "128"),
         fast=False),
    # --- index build / add / search / eval / verify / plan ---------------------------------------
    Case("build output read-only", (*BUILD[:-1], READ_ONLY), ("/proc/1",)),
    Case("build output under a file", (*BUILD[:-1], "{file}/index"), ("a-file",)),
    Case("build blank corpus", ("index", "build", "--model", M, "--corpus", "{blank}", "--row-ids", "--output",
                                "{case}/new-index"), ("blank.txt",)),
    Case("build short csv row", ("index", "build", "--model", M, "--corpus", "{short}", "--output",
                                 "{case}/new-index"), ("short.csv", "3")),
    Case("build NaN weights", ("index", "build", "--model", "{nan_model}", "--corpus", "{corpus}", "--output",
                               "{case}/new-index"), ("dense.weight", "nan"), fast=False),
    Case("build bad device", (*BUILD, "--device", "tpu7"), ("--device", "tpu7")),
    Case("build --overwrite foreign file inside", (*BUILD, "--overwrite"), ("notes.txt",),
         _both(_copy_index(), lambda p: shutil.copytree(p["case"] / "index", p["case"] / "new-index"),
               _foreign("new-index/notes.txt")), fast=False),
    Case("build --overwrite foreign chunks folder inside", (*BUILD, "--overwrite"), ("chunks",),
         _both(_copy_index(), lambda p: shutil.copytree(p["case"] / "index", p["case"] / "new-index"),
               _foreign("new-index/chunks/mine.txt")), fast=False),
    *_numbers(BUILD, "--chunk-size", ("nan", "10000000000000")),
    *_numbers(BUILD, "--batch-size", ("0", "nan")),
    Case("add truncated index", ADD, ("index.faiss",), _copy_index("faiss-truncated")),
    Case("add damaged manifest", ADD, ("manifest.json",), _copy_index("manifest-garbage")),
    Case("add NaN weights", (*ADD, "--model", "{nan_model}"), ("dense.weight", "nan"), _copy_index(),
         fast=False),
    Case("add blank corpus", ("index", "add", "{case}/index", "--corpus", "{blank}", "--row-ids"),
         ("blank.txt",), _copy_index()),
    Case("add bad device", (*ADD, "--device", "tpu7"), ("--device", "tpu7"), _copy_index()),
    *_numbers(ADD, "--batch-size", ("0", "-1", "nan"), prepare=_copy_index()),
    Case("search empty query", ("index", "search", "{case}/index", ""), ("query",), _copy_index()),
    Case("search blank query", ("index", "search", "{case}/index", "   "), ("query",), _copy_index()),
    Case("search damaged manifest", SEARCH, ("manifest.json",), _copy_index("manifest-garbage")),
    Case("search bad device", (*SEARCH, "--device", "tpu7"), ("--device", "tpu7"), _copy_index()),
    *_numbers(SEARCH, "--k", ("-1", "nan", "10000000000000"), prepare=_copy_index()),
    Case("eval damaged manifest", EVAL, ("manifest.json",), _copy_index("manifest-garbage")),
    Case("eval task without queries", ("index", "eval", "{case}/index", "--task-dir", "{case}"),
         ("queries",), _copy_index()),
    *_numbers(EVAL, "--k", ("0", "nan", "10000000000000"), prepare=_copy_index()),
    Case("verify damaged manifest", ("index", "verify", "{case}/index"), ("manifest.json",),
         _copy_index("manifest-garbage")),
    *_numbers(PLAN, "--vectors", ("0", "-5", "nan")),
    *_numbers(PLAN, "--dim", ("0", "nan", "10000000000000")),
    # --- mine-negatives ---------------------------------------------------------------------------
    Case("mine output suffix", (*MINE[:-1], "{case}/mined.npy"), (".jsonl",)),
    Case("mine sidecar is foreign", MINE, ("mined.jsonl.json",), _foreign("mined.jsonl.json")),
    Case("mine output read-only", (*MINE[:-1], f"{READ_ONLY}.jsonl"), ("/proc/1",)),
    Case("mine NaN weights", ("mine-negatives", "--model", "{nan_model}", "--data", "{pairs}", "--output",
                              "{case}/mined.jsonl"), ("dense.weight", "nan"), fast=False),
    Case("mine bad range", (*MINE, "--range", "9:2"), ("--range",)),
    Case("mine bad device", (*MINE, "--device", "tpu7"), ("--device", "tpu7")),
    *_numbers(MINE, "--num-negatives", ("-1", "nan", "10000000000000")),
    *_numbers(MINE, "--margin", ("nan", "inf", "-5")),
    # --- train-contrastive -------------------------------------------------------------------------
    *_numbers(TRAIN, "--lr", BAD_RATE),
    *_numbers(TRAIN, "--temperature", BAD_RATE),
    *_numbers(TRAIN, "--seed", ("-1", "nan")),
    *_numbers(TRAIN, "--max-steps", ("0", "nan", "10000000000000")),
    Case("train output read-only", (*TRAIN[:-1], READ_ONLY), ("/proc/1",)),
    Case("train output under a file", (*TRAIN[:-1], "{file}/run"), ("a-file",)),
    Case("train blank data", ("train-contrastive", "--model", M, "--data", "p={blank}", "--recipe", "{recipe}",
                              "--max-steps", "1", "--output", "{case}/run"), ("blank.txt",)),
    Case("train NaN weights", ("train-contrastive", "--model", "{nan_model}", "--data", "p={pairs}", "--recipe",
                               "{recipe}", "--max-steps", "1", "--output", "{case}/run"), ("dense.weight", "nan"),
         fast=False),
    Case("train damaged run record", (*TRAIN, "--resume"), ("run.json",), _foreign("run/run.json", "{oops")),
    # --- mteb / compare ----------------------------------------------------------------------------
    Case("mteb output is a file", (*MTEB, "--output", "{file}"), ("a-file",)),
    Case("mteb output under a file", (*MTEB, "--output", "{file}/results"), ("a-file",)),
    Case("mteb output read-only", (*MTEB, "--output", READ_ONLY), ("/proc/1",)),
    Case("mteb output is the model", (*MTEB, "--output", M), ("input",)),
    Case("mteb bad device", (*MTEB, "--output", "{case}/r", "--device", "tpu7"), ("--device", "tpu7")),
    Case("mteb missing task dir", ("mteb", "--model", M, "--task-dir", "{case}/nothing", "--output", "{case}/r"),
         ("nothing",)),
    *_numbers((*MTEB, "--output", "{case}/r"), "--batch-size", ("0", "nan")),
    Case("compare output is a file", (*COMPARE, "--output", "{file}"), ("a-file",)),
    Case("compare output under a file", (*COMPARE, "--output", "{file}/cmp"), ("a-file",)),
    Case("compare output read-only", (*COMPARE, "--output", READ_ONLY), ("/proc/1",)),
    Case("compare foreign output", (*COMPARE, "--output", "{case}/cmp"), ("cmp",), _foreign("cmp/notes.txt")),
    # --- glue --------------------------------------------------------------------------------------
    Case("glue output is a file", ("glue", "--model", M, "--task-dir", "{task}", "--output", "{file}"),
         ("a-file",)),
    Case("glue output under a file", ("glue", "--model", M, "--task-dir", "{task}", "--output", "{file}/g"),
         ("a-file",)),
    Case("glue output read-only", ("glue", "--model", M, "--task-dir", "{task}", "--output", READ_ONLY),
         ("/proc/1",)),
    Case("glue foreign output", GLUE, ("glue",), _foreign("glue/notes.txt")),
    *_numbers(GLUE, "--epochs", BAD_RATE),
    *_numbers(GLUE, "--lr", BAD_RATE),
    *_numbers(GLUE, "--batch-size", ("0", "-1", "nan")),
    # --- serve -------------------------------------------------------------------------------------
    *_numbers(SERVE, "--port", ("-1", "70000", "nan")),
    *_numbers(SERVE, "--max-wait-ms", ("-1", "nan", "inf")),
    Case("serve bad device", (*SERVE, "--device", "tpu7"), ("--device", "tpu7")),
    Case("serve truncated index", (*SERVE, "--index", "{case}/index"), ("index.faiss",),
         _copy_index("faiss-truncated")),
    Case("serve NaN weights", ("serve", "--model", "{nan_model}"), ("dense.weight", "nan"), fast=False),
    # --- pretrain prepare / pretrain / pretrain export / convert / export / demo ---------------------
    Case("prepare output is a file", (*PREPARE, "--output", "{file}"), ("a-file",)),
    Case("prepare output under a file", (*PREPARE, "--output", "{file}/p"), ("a-file",)),
    Case("prepare output read-only", (*PREPARE, "--output", READ_ONLY), ("/proc/1",)),
    Case("prepare foreign output", (*PREPARE, "--output", "{case}/p"), ("notes.txt",), _foreign("p/notes.txt")),
    Case("prepare output is the corpus", (*PREPARE, "--output", T), ("input",)),
    *_numbers(("pretrain", "prepare", "--corpus", T, "--tokenizer", "train", "--output", "{case}/p"),
              "--vocab-size", ("0", "-5", "nan")),
    Case("pretrain output under a file", (*PRETRAIN, "--output", "{file}/run"), ("a-file",)),
    Case("pretrain output read-only", (*PRETRAIN, "--output", READ_ONLY), ("/proc/1",)),
    *_numbers((*PRETRAIN, "--output", "{case}/run"), "--max-steps", ("0", "-1", "nan")),
    *_numbers((*PRETRAIN, "--output", "{case}/run"), "--stop-after-steps", ("0", "-1")),
    Case("pretrain damaged run record", (*PRETRAIN, "--output", "{case}/run", "--resume"), ("run.json",),
         _foreign("run/run.json", "[1, 2")),
    Case("pretrain unknown recipe key", ("pretrain", "--recipe", "{case}/bad.yaml", "--corpus", T, "--output",
                                         "{case}/runs/run"), ("bad.yaml", "learning_rat"),
         _foreign("bad.yaml", "training:\n  learning_rat: 0.1\n")),
    Case("pretrain export output read-only", ("pretrain", "export", "{root}", "--output", READ_ONLY),
         ("/proc/1",)),
    Case("convert output under a file", ("convert", "{root}", "--output", "{file}/x"), ("a-file",)),
    Case("convert output read-only", ("convert", "{root}", "--output", READ_ONLY), ("/proc/1",)),
    Case("export output is a file", (*EXPORT, "--output", "{file}"), ("a-file",)),
    Case("export output under a file", (*EXPORT, "--output", "{file}/x"), ("a-file",)),
    Case("export output read-only", (*EXPORT, "--output", READ_ONLY), ("/proc/1",)),
    Case("export foreign output", (*EXPORT, "--output", "{case}/e"), ("notes.txt",), _foreign("e/notes.txt")),
    Case("export output is the model", (*EXPORT, "--output", M), ("input",)),
    Case("export bad format", ("export", M, "--format", "tflite", "--output", "{case}/e"), ("--format",)),
    Case("export --overwrite foreign file inside", (*EXPORT, "--output", "{case}/e", "--overwrite"),
         ("notes.txt",), _both(_foreign("e/export.json", '{"format": "onnx"}'), _foreign("e/notes.txt"))),
    # --- damaged model files: every command that loads a model names the file (issue: one record reader)
    Case("encode damaged modules.json", ("encode", "--model", "{case}/model", "--input", T, "--output",
                                         "{case}/out.npy"), ("modules.json", "damaged"), _damaged_model("modules.json")),
    Case("build damaged config.json", ("index", "build", "--model", "{case}/model", "--corpus", "{corpus}",
                                       "--output", "{case}/new-index"), ("config.json", "damaged"),
         _damaged_model("config.json")),
    Case("mine damaged modules.json", ("mine-negatives", "--model", "{case}/model", "--data", "{pairs}",
                                       "--output", "{case}/mined.jsonl"), ("modules.json", "damaged"),
         _damaged_model("modules.json")),
    Case("train damaged modules.json", ("train-contrastive", "--model", "{case}/model", "--data", "p={pairs}",
                                        "--recipe", "{recipe}", "--max-steps", "1", "--output", "{case}/run"),
         ("modules.json", "damaged"), _damaged_model("modules.json")),
    Case("mteb damaged config.json", ("mteb", "--model", "{case}/model", "--task-dir", "{case}/sts", "--output",
                                      "{case}/r"), ("config.json", "damaged"),
         _both(_damaged_model("config.json"), _foreign("sts/task.json", '{"name": "S", "type": "STS"}'),
               _foreign("sts/test.jsonl", '{"sentence1": "a", "sentence2": "b", "score": 1.0}\n'))),
    Case("glue damaged modules.json", ("glue", "--model", "{case}/model", "--task-dir", "{task}", "--output",
                                       "{case}/glue"), ("modules.json", "damaged"), _damaged_model("modules.json")),
    Case("serve damaged modules.json", ("serve", "--model", "{case}/model"), ("modules.json", "damaged"),
         _damaged_model("modules.json")),
    Case("export damaged config.json", ("export", "{case}/model", "--format", "onnx", "--output", "{case}/e"),
         ("config.json", "damaged"), _damaged_model("config.json")),
    # --- a modules.json of the wrong shape: one reader (model_files.saved_modules) for every command
    Case("encode modules.json not a list", ("encode", "--model", "{case}/model", "--input", T, "--output",
                                            "{case}/out.npy"), ("modules.json", "array"), _damaged_model("modules.json", "{}")),
    Case("encode modules.json empty", ("encode", "--model", "{case}/model", "--input", T, "--output",
                                       "{case}/out.npy"), ("modules.json", "non-empty"), _damaged_model("modules.json", "[]")),
    Case("build modules.json entry without a path", ("index", "build", "--model", "{case}/model", "--corpus",
                                                     "{corpus}", "--output", "{case}/new-index"),
         ("modules.json", "module 0", "path"), _damaged_model("modules.json", '[{"name": "0", "type": "x.Transformer"}]')),
    Case("glue modules.json entry not an object", ("glue", "--model", "{case}/model", "--task-dir", "{task}",
                                                   "--output", "{case}/glue"), ("modules.json", "module 1"),
         _damaged_model("modules.json", '[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}, '
                         '3]')),
    Case("serve modules.json kwargs not a list", ("serve", "--model", "{case}/model"), ("modules.json", "kwargs"),
         _damaged_model("modules.json", '[{"name": "0", "path": "", "type": "sentence_transformers.models.Transformer", '
                         '"kwargs": 1}]')),
    Case("encode sharded model with a damaged index", ("encode", "--model", "{case}/model", "--input", T,
                                                       "--output", "{case}/out.npy"),
         ("model.safetensors.index.json", "object"), _sharded_model("[]")),
    Case("build sharded model whose index names a missing shard", ("index", "build", "--model", "{case}/model",
                                                                   "--corpus", "{corpus}", "--output", "{case}/i"),
         ("model.safetensors.index.json", "model-00002-of-00002.safetensors"),
         _sharded_model('{"weight_map": {"a": "model-00001-of-00001.safetensors", '
                        '"b": "model-00002-of-00002.safetensors"}}')),
    # --- every JSON settings file of a model is an object, checked before loading (sentence-transformers'
    # own reads gave tracebacks, and an array in sentence_bert_config.json was silently taken as no settings)
    Case("encode damaged pooling config", ("encode", "--model", "{case}/model", "--input", T, "--output",
                                           "{case}/out.npy"), ("1_Pooling/config.json", "damaged"),
         _damaged_model("1_Pooling/config.json")),
    Case("build sentence_bert_config.json not an object", ("index", "build", "--model", "{case}/model", "--corpus",
                                                           "{corpus}", "--output", "{case}/i"),
         ("sentence_bert_config.json", "object"), _damaged_model("sentence_bert_config.json", "[]")),
    Case("serve damaged config_sentence_transformers.json", ("serve", "--model", "{case}/model"),
         ("config_sentence_transformers.json", "object"), _damaged_model("config_sentence_transformers.json", "[1]")),
    Case("mine damaged tokenizer.json", ("mine-negatives", "--model", "{case}/model", "--data", "{pairs}",
                                         "--output", "{case}/mined.jsonl"), ("tokenizer.json", "damaged"),
         _damaged_model("tokenizer.json")),
    # --- tasks synth / tasks lengths (long-context tasks) --------------------------------------------------
    Case("tasks synth bad kind", ("tasks", "synth", "--kind", "haystack", "--haystack", T, "--tokenizer", M,
                                  "--output", "{case}/task"), ("--kind", "passkey")),
    Case("tasks synth lengths not numbers", ("tasks", "synth", "--kind", "passkey", "--haystack", T, "--tokenizer",
                                             M, "--lengths", "256,4k", "--output", "{case}/task"), ("--lengths", "4k")),
    Case("tasks synth lengths too short", ("tasks", "synth", "--kind", "needle", "--haystack", T, "--tokenizer", M,
                                           "--lengths", "8", "--output", "{case}/task"), ("--lengths",)),
    Case("tasks synth missing haystack", ("tasks", "synth", "--kind", "passkey", "--haystack", "{case}/none.txt",
                                          "--tokenizer", M, "--output", "{case}/task"), ("none.txt",)),
    Case("tasks lengths bad passages", ("tasks", "lengths", "--models", M, "--task-dir", "{task}", "--passages",
                                        "some", "--output", "{case}/lengths"), ("--passages",)),
    Case("tasks lengths missing task dir", ("tasks", "lengths", "--models", M, "--task-dir", "{case}/nothing",
                                            "--output", "{case}/lengths"), ("nothing",)),
    Case("demo output under a file", ("demo", "--quick", "--output", "{file}/demo"), ("a-file",)),
    Case("demo output read-only", ("demo", "--quick", "--output", READ_ONLY), ("/proc/1",)),
    Case("demo damaged journal", ("demo", "--quick", "--output", "{case}/demo"), ("stages.json",),
         _foreign("demo/stages.json", "{")),
]


def test_the_table_covers_every_command_with_at_least_80_cases():
    from neobert_embed.cli import app

    commands = {" ".join(c.args[:2]) if c.args[0] in {"index", "pretrain", "tasks"} and not c.args[1].startswith("-")
                else c.args[0] for c in CASES}
    names = {info.name for info in app.registered_commands} | {f"{group.name} {info.name}" for group in
                                                               app.registered_groups
                                                               for info in group.typer_instance.registered_commands}
    runnable = {name for name in names if name not in {"index", "pretrain", "tasks"}} | {"pretrain"}
    assert len(CASES) >= 80 and len({c.name for c in CASES}) == len(CASES)
    assert runnable <= commands | {"index plan"}, runnable - commands


BAR = re.compile("━")  # the last frame of a progress bar, which a non-terminal stderr keeps (a terminal erases it)


# What a refused command may leave: its writer lock file (``.NAME.lock``: deleting a lock file that a
# waiting process has open would let two writers in), its third-party log (``NAME.log``: what the
# libraries said, for the user who wants to know more than the one error line) and an index build's
# ``NAME.partial`` (resume state; the next build replaces it when it holds no encoded chunk).
KEPT_ON_REFUSAL = re.compile(r"(/\.[^/]+\.lock|\.log|\.partial(/.*)?)$")


def _files(root: Path) -> dict[str, object]:
    """Every file and folder under ``root``: existing ones must not change, new ones must not appear
    (but for :data:`KEPT_ON_REFUSAL`)."""
    return {str(path): snapshot(path) if path.is_file() else "dir" for path in root.rglob("*")}


def _fill(text: str, paths: dict[str, Path]) -> str:
    return text.format(**{k: str(v) for k, v in paths.items()})


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_case_exits_2_naming_the_fault_and_changes_nothing(case, world, tmp_path, capsys):
    from safety_helpers import REPO

    paths = {**world.paths, "case": tmp_path, "repo": REPO}
    if case.prepare:
        case.prepare(paths)
    args = [_fill(arg, paths) for arg in case.args]
    before = _files(world.paths["root"]) | _files(tmp_path)
    started = time.perf_counter()
    code, out, err = run_main(args, capsys)
    seconds = time.perf_counter() - started
    lines = [line for line in err.splitlines() if line.strip() and not BAR.search(line)]
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    message = lines[0].lower()
    missing = [word for word in case.expect if _fill(word, paths).lower() not in message]
    assert not missing, f"{missing} not in: {lines[0]}"
    after = _files(world.paths["root"]) | _files(tmp_path)
    assert {path: after.get(path) for path in before} == before
    left = sorted(path for path in set(after) - set(before) if not KEPT_ON_REFUSAL.search(path))
    assert not left, f"a refused command left files behind: {left}"
    if case.fast:
        assert seconds < FAST_SECONDS, f"took {seconds:.1f} s to refuse"


def test_a_failed_prepare_leaves_nothing_and_a_rerun_works(world, tmp_path, capsys):
    """A corpus with a bad byte: prepare stops naming the line, leaves no output (its finished
    shards wait in a hidden sibling for a rerun), and a rerun works once the corpus is fixed."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"".join(b"document number %d about things\n" % i for i in range(50)) + b"bad \xff byte\n")
    output = tmp_path / "prepared"
    args = ["pretrain", "prepare", "--corpus", str(corpus), "--tokenizer", str(world.paths["model"]),
            "--output", str(output), "--shard-documents", "10"]
    code, _, err = run_main(args, capsys)
    assert code == 2 and "corpus.txt:51" in err, err
    assert not output.exists()
    corpus.write_bytes(corpus.read_bytes().replace(b"\xff", b"x"))
    code, _, err = run_main(args, capsys)
    assert code == 0, err
    assert json.loads((output / "corpus.json").read_text(encoding="utf-8"))["num_documents"] == 51
    # no unfinished preparation left behind; the writer lock file stays (see KEPT_ON_REFUSAL)
    assert [path.name for path in tmp_path.glob(".prepared*")] in ([], [".prepared.lock"])


def test_a_document_without_text_is_skipped_and_said(world, tmp_path, capsys):
    """A row with an empty text and no title is not indexed as the vector of "" (which every query
    would find); the build says how many it skipped and where the first one is."""
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"_id": "a", "text": "cats purr"}, {"_id": "b", "text": "  "},
                                                {"_id": "c", "text": "oil prices rose"}])
    code, _, err = run_main(["index", "build", "--model", world.paths["model"], "--corpus", corpus, "--output",
                             tmp_path / "idx", "--precision", "fp32"], capsys)
    assert code == 0, err
    assert "skipped 1 document(s) with no text" in err and "c.jsonl:2" in err, err
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["documents"] == 2
