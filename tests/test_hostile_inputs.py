"""Property: every command, given a hostile input, exits 2 with ONE line of error that names the
fault (the case's key words: the file, the flag, the guard's record), no traceback, and leaves its
output location exactly as it was.

The table covers corrupt model files, corrupt index files, unusable outputs, impossible options
and out-of-range numbers. Each case runs the console script's ``main()`` in-process (its real
error handling) so the whole table takes seconds. Every input other than the hostile one is valid
(the export and convert sources are a real pretraining run and an official-format checkpoint; ``index
add`` reads documents the index does not hold yet), so the guard named by the key words is what fires.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from safety_helpers import REPO, run_main, small_inputs, snapshot, write_jsonl


@dataclass(frozen=True)
class Case:
    """``args`` may name placeholders filled from the world: {model}, {index}, {tmp} …"""

    name: str
    args: tuple[str, ...]
    expect: tuple[str, ...]  # words (placeholders allowed) the one-line error must contain, any case
    output: str | None = None  # placeholder path whose state must not change
    prepare: Callable[[dict[str, Path]], None] | None = None


class World(dict):
    """Paths of the shared fixtures and of per-case scratch files."""


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    from official_checkpoint import write_official_checkpoint
    from pretraining_helpers import single_thread, tiny_recipe

    from neobert_embed.index import build_index
    from neobert_embed.pretraining import prepare_corpus, pretrain
    from neobert_embed.pretraining.recipe import parse_pretrain_recipe

    inputs = small_inputs(tmp_path_factory.mktemp("hostile"))
    root, model, corpus = inputs["root"], inputs["model"], inputs["corpus"]
    index = root / "index"
    build_index(model, corpus, index, index_type="flat", show_progress=False, compute_precision="fp32")
    other = root / "other-index"
    build_index(model, write_jsonl(root / "small.jsonl", [{"_id": "x", "text": "one"}, {"_id": "y", "text": "two"}]),
                other, index_type="flat", show_progress=False, compute_precision="fp32")
    foreign = root / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine", encoding="utf-8")
    a_file = root / "a-file"
    a_file.write_text("not a directory", encoding="utf-8")
    new_docs = write_jsonl(root / "new-docs.jsonl", [{"_id": f"n{i}", "text": f"new doc {i}"} for i in range(5)])
    task = root / "task"  # a valid BEIR task for `index eval`
    (task / "qrels").mkdir(parents=True)
    write_jsonl(task / "queries.jsonl", [{"_id": "q1", "text": "doc 1"}])
    (task / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n", encoding="utf-8")
    # real sources for export and convert, so only their output guard can refuse (~3 s: the tiny
    # BERT's tokenizer, no tokenizer training)
    prepared = prepare_corpus(inputs["texts"], root / "prepared", tokenizer=str(model), progress=False)
    with single_thread():
        pretrain(parse_pretrain_recipe(tiny_recipe(max_steps=2)), prepared.path, root / "run", progress=False)
    official = write_official_checkpoint(root / "official", tokenizer=True)
    return World(**inputs, index=index, other=other, foreign=foreign, file=a_file, new_docs=new_docs,
                 run=root / "run", official=official, task=task, pretrain_recipe=REPO / "recipes" / "pretrain-tiny.yaml")


def _broken_model(kind: str) -> Callable[[dict[str, Path]], None]:
    def make(paths: dict[str, Path]) -> None:
        target = paths["case"] / "model"
        if kind == "empty":
            target.mkdir()
            return
        shutil.copytree(paths["model"], target)
        weights = target / "model.safetensors"
        if kind == "truncated":
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        elif kind == "garbage":
            weights.write_bytes(os.urandom(4096))
        elif kind == "config":
            (target / "config.json").write_text("{not json", encoding="utf-8")
        elif kind == "no-weights":
            weights.unlink()
        elif kind == "bin-garbage":
            weights.unlink()
            (target / "pytorch_model.bin").write_bytes(os.urandom(2048))
        elif kind == "bin-bad-pickle":  # passes the format sniff; torch's unpickler fails on a non-UTF-8 name
            weights.unlink()
            (target / "pytorch_model.bin").write_bytes(b"\x80\x02c\xf7\xfe\n" + bytes(2048))
    return make


def _broken_index(kind: str) -> Callable[[dict[str, Path]], None]:
    def make(paths: dict[str, Path]) -> None:
        target = paths["case"] / "index"
        shutil.copytree(paths["index"], target)
        faiss_file, store = target / "index.faiss", target / "documents.sqlite"
        if kind == "faiss-garbage":
            faiss_file.write_bytes(os.urandom(faiss_file.stat().st_size))
        elif kind == "faiss-truncated":
            faiss_file.write_bytes(faiss_file.read_bytes()[:100])
        elif kind == "faiss-other":
            shutil.copy2(paths["other"] / "index.faiss", faiss_file)
        elif kind == "sqlite-garbage":
            store.write_bytes(os.urandom(store.stat().st_size))
        elif kind == "sqlite-other":
            shutil.copy2(paths["other"] / "documents.sqlite", store)
        elif kind == "manifest":
            (target / "manifest.json").write_text('{"format_version": 1}', encoding="utf-8")
        elif kind == "no-manifest":
            (target / "manifest.json").unlink()
    return make


def _calibration(content: str) -> Callable[[dict[str, Path]], None]:
    def make(paths: dict[str, Path]) -> None:
        (paths["case"] / "cal.json").write_text(content, encoding="utf-8")
    return make


def _foreign_npy(paths: dict[str, Path]) -> None:
    np.save(paths["case"] / "out.npy", np.zeros(3))


M, T, OUT = "{model}", "{texts}", "{case}/out.npy"
ENCODE = ("encode", "--input", T, "--output", OUT)
BUILD = ("index", "build", "--corpus", "{corpus}", "--output", "{case}/new-index")
TRAIN = ("train-contrastive", "--data", "p={pairs}", "--recipe", "{recipe}", "--max-steps", "1")
MINE = ("mine-negatives", "--data", "{pairs}", "--output", "{case}/mined.jsonl")
SEARCH = ("index", "search", "{case}/index", "hello")
ADD = ("index", "add", "{case}/index", "--corpus", "{new_docs}")  # ids the index does not hold yet
MODEL_WORDS = {"empty": ("{case}/model", "empty directory"), "truncated": ("model.safetensors", "truncated"),
               "garbage": ("model.safetensors", "corrupt"), "config": ("config.json", "damaged model file", "invalid json"),
               "no-weights": ("{case}/model", "no weights"), "bin-garbage": ("pytorch_model.bin", "corrupt"),
               "bin-bad-pickle": ("{case}/model", "could not be loaded")}
INDEX_WORDS = {"faiss-garbage": ("index.faiss", "recorded checksum"),  # same size: the checksum tells
               "faiss-truncated": ("index.faiss", "100 bytes", "recorded in the manifest"),
               "faiss-other": ("index.faiss", "recorded in the manifest"),
               "sqlite-garbage": ("documents.sqlite", "recorded checksum"),
               "sqlite-other": ("documents.sqlite", "another index"),
               "manifest": ("manifest.json", "field required"),
               "no-manifest": ("{case}/index", "not an index", "manifest.json")}
IS_A_FILE = ("{file}", "is a file")
MAX_LENGTH = ("--max-length", "100000", "128")

CASES = [
    # corrupt or wrong model files
    *[Case(f"encode model {k}", ("encode", "--model", "{case}/model", "--input", T, "--output", OUT),
           MODEL_WORDS[k], OUT, _broken_model(k)) for k in MODEL_WORDS],
    Case("encode model is a file", ("encode", "--model", "{file}", "--input", T, "--output", OUT),
         ("--model", *IS_A_FILE), OUT),
    Case("index build truncated model", ("index", "build", "--model", "{case}/model", "--corpus", "{corpus}",
                                         "--output", "{case}/new-index"), MODEL_WORDS["truncated"],
         "{case}/new-index", _broken_model("truncated")),
    Case("train empty model", (*TRAIN, "--model", "{case}/model", "--output", "{case}/run"), MODEL_WORDS["empty"],
         "{case}/run", _broken_model("empty")),
    Case("mine garbage model", ("mine-negatives", "--model", "{case}/model", "--data", "{pairs}", "--output",
                                "{case}/mined.jsonl"), MODEL_WORDS["garbage"], "{case}/mined.jsonl",
         _broken_model("garbage")),
    Case("index add with broken --model", (*ADD, "--model", "{case}/model"), MODEL_WORDS["config"], "{case}/index",
         lambda p: (_broken_index("none")(p), _broken_model("config")(p))),
    # corrupt index files
    *[Case(f"search {k}", SEARCH, INDEX_WORDS[k], "{case}/index", _broken_index(k)) for k in INDEX_WORDS],
    *[Case(f"add {k}", ADD, INDEX_WORDS[k], "{case}/index", _broken_index(k))
      for k in ("faiss-garbage", "faiss-other", "sqlite-garbage")],
    Case("verify manifest", ("index", "verify", "{case}/index"), INDEX_WORDS["manifest"], "{case}/index",
         _broken_index("manifest")),
    Case("eval no manifest", ("index", "eval", "{case}/index", "--task-dir", "{task}"), INDEX_WORDS["no-manifest"],
         "{case}/index", _broken_index("no-manifest")),
    # unusable outputs
    Case("encode output is a directory", ("encode", "--model", M, "--input", T, "--output", "{foreign}"),
         ("{foreign}", "is a directory"), "{foreign}"),
    Case("encode output is the input", ("encode", "--model", M, "--input", T, "--output", T),
         ("{texts}", "also an input"), T),
    Case("encode output under a file", ("encode", "--model", M, "--input", T, "--output", "{file}/x.npy"),
         IS_A_FILE, "{file}"),
    Case("encode output exists", ("encode", "--model", M, *ENCODE[1:]), (OUT, "already exists", "--overwrite"), OUT,
         _foreign_npy),
    Case("encode output unwritable", ("encode", "--model", M, "--input", T, "--output", "/proc/1/out.npy"),
         ("/proc/1", "cannot write"), "/proc/1/out.npy"),  # /proc/1 is read-only even for root
    Case("build output unwritable", ("index", "build", "--model", M, "--corpus", "{corpus}", "--output",
                                     "/proc/1/new-index"), ("/proc/1", "cannot write"), "/proc/1/new-index"),
    Case("encode --overwrite foreign", ("encode", "--model", M, *ENCODE[1:], "--overwrite"),
         (OUT, "not written by neobert-embed", "out.npy.json"), OUT, _foreign_npy),
    Case("mine output is the data", ("mine-negatives", "--model", M, "--data", "{pairs}", "--output", "{pairs}"),
         ("{pairs}", "also an input"), "{pairs}"),
    Case("mine output is a directory", ("mine-negatives", "--model", M, "--data", "{pairs}", "--output",
                                        "{foreign}"), ("{foreign}", "is a directory"), "{foreign}"),
    Case("train output is a file", (*TRAIN, "--model", M, "--output", "{file}"), IS_A_FILE, "{file}"),
    Case("train --overwrite foreign", (*TRAIN, "--model", M, "--output", "{foreign}", "--overwrite"),
         ("notes.txt", "run.json", "nothing was deleted"), "{foreign}"),
    Case("build output is a file", ("index", "build", "--model", M, "--corpus", "{corpus}", "--output", "{file}"),
         IS_A_FILE, "{file}"),
    Case("build output foreign", ("index", "build", "--model", M, "--corpus", "{corpus}", "--output",
                                  "{foreign}"), ("notes.txt", "manifest.json", "nothing was deleted"), "{foreign}"),
    Case("build output is the corpus", ("index", "build", "--model", M, "--corpus", "{corpus}", "--output",
                                        "{corpus}"), ("{corpus}", "also an input"), "{corpus}"),
    Case("export into foreign", ("pretrain", "export", "{run}", "--output", "{foreign}"),
         ("notes.txt", "export.json", "nothing was deleted"), "{foreign}"),
    Case("export into a file", ("pretrain", "export", "{run}", "--output", "{file}"), IS_A_FILE, "{file}"),
    Case("demo fresh foreign", ("demo", "--fresh", "--quick", "--output", "{foreign}"),
         ("notes.txt", "stages.json", "nothing was deleted"), "{foreign}"),
    Case("demo output is a file", ("demo", "--quick", "--output", "{file}"), IS_A_FILE, "{file}"),
    Case("pretrain output is a file", ("pretrain", "--recipe", "{pretrain_recipe}", "--corpus", T, "--output",
                                       "{file}"), IS_A_FILE, "{file}"),
    Case("convert --overwrite foreign", ("convert", "{official}", "--output", "{foreign}", "--overwrite"),
         ("notes.txt", "convert.json", "nothing was deleted"), "{foreign}"),
    Case("mine output exists", (*MINE, "--model", M), ("{case}/mined.jsonl", "already exists"), "{case}/mined.jsonl",
         lambda p: (p["case"] / "mined.jsonl").write_text("{}\n", encoding="utf-8")),
    # impossible options
    Case("factory too many lists", (*BUILD, "--model", M, "--factory", "IVF99999,Flat"),
         ("IVF99999", "99999 documents", "has 30"), "{case}/new-index"),
    Case("factory not faiss", (*BUILD, "--model", M, "--factory", "Bogus77"),
         ("Bogus77", "not a valid faiss factory"), "{case}/new-index"),
    Case("factory pq needs 256", (*BUILD, "--model", M, "--factory", "PQ4"), ("PQ4", "256", "has 30"),
         "{case}/new-index"),
    Case("unknown index type", (*BUILD, "--model", M, "--index-type", "magic"), ("--index-type", "magic"),
         "{case}/new-index"),
    Case("unknown precision", ("encode", "--model", M, *ENCODE[1:], "--store-precision", "int4"),
         ("--store-precision", "int4"), OUT),
    Case("unknown store precision of an index", (*BUILD, "--model", M, "--store-precision", "int4"),
         ("--store-precision", "int4", "float16"), "{case}/new-index"),
    Case("calibration missing", ("encode", "--model", M, *ENCODE[1:], "--store-precision", "int8", "--calibration",
                                 "{case}/none.json"), ("{case}/none.json", "not found"), OUT),
    Case("calibration corrupt", ("encode", "--model", M, *ENCODE[1:], "--store-precision", "int8", "--calibration",
                                 "{case}/cal.json"), ("{case}/cal.json", "invalid json"), OUT,
         _calibration("{oops")),
    Case("calibration wrong shape", ("encode", "--model", M, *ENCODE[1:], "--store-precision", "int8",
                                     "--calibration", "{case}/cal.json"), ("{case}/cal.json", "'ranges'", "32"), OUT,
         _calibration('{"precision": "int8", "dimension": 32, "ranges": [[0, 1]]}')),
    Case("int8 calibration without ranges", ("encode", "--model", M, *ENCODE[1:], "--store-precision", "int8",
                                             "--calibration", "{case}/cal.json"), ("{case}/cal.json", "'ranges'"),
         OUT, _calibration('{"precision": "int8", "dimension": 32}')),
    Case("calibration of a sidecar without ranges", ("encode", "--model", M, *ENCODE[1:], "--store-precision", "int8",
                                                     "--calibration", "{case}/cal.json"),
         ("{case}/cal.json:3", "'calibration.ranges'", "two rows"), OUT,
         _calibration('{"writer": "neobert-embed encode",\n "calibration": {"precision": "int8", "dimension": 32,\n'
                      '                 "ranges": null}}')),
    Case("row ids with replace", (*ADD, "--row-ids", "--on-duplicate", "replace"),
         ("--on-duplicate replace", "--row-ids"), "{case}/index", _broken_index("none")),
    Case("unknown duplicate policy", (*ADD, "--on-duplicate", "merge"), ("--on-duplicate", "merge"), "{case}/index",
         _broken_index("none")),
    Case("search neither query nor file", ("index", "search", "{case}/index"), ("query", "--queries"),
         "{case}/index", _broken_index("none")),
    # out-of-range numbers
    Case("encode max length", ("encode", "--model", M, *ENCODE[1:], "--max-length", "100000"), MAX_LENGTH, OUT),
    Case("encode batch 0", ("encode", "--model", M, *ENCODE[1:], "--batch-size", "0"), ("--batch-size",), OUT),
    Case("mine batch 0", (*MINE, "--model", M, "--batch-size", "0"), ("--batch-size",), "{case}/mined.jsonl"),
    Case("mine negatives 0", (*MINE, "--model", M, "--num-negatives", "0"), ("--num-negatives",),
         "{case}/mined.jsonl"),
    Case("build max length", (*BUILD, "--model", M, "--max-length", "100000"), MAX_LENGTH, "{case}/new-index"),
    Case("build chunk 0", (*BUILD, "--model", M, "--chunk-size", "0"), ("--chunk-size",), "{case}/new-index"),
    Case("build batch -1", (*BUILD, "--model", M, "--batch-size", "-1"), ("--batch-size",), "{case}/new-index"),
    Case("search k 0", (*SEARCH, "--k", "0"), ("--k",), "{case}/index", _broken_index("none")),
    Case("train max length", (*TRAIN, "--model", M, "--output", "{case}/run", "--max-length", "100000"),
         MAX_LENGTH, "{case}/run"),
    Case("train batch 0", (*TRAIN, "--model", M, "--output", "{case}/run", "--batch-size", "0"),
         ("--batch-size",), "{case}/run"),
]


def test_the_table_is_large_enough():
    assert len(CASES) >= 40 and len({c.name for c in CASES}) == len(CASES)
    assert all(case.expect for case in CASES)


BAR = re.compile("━")  # the last frame of a progress bar, which a non-terminal stderr keeps (a terminal erases it)


def _fill(text: str, paths: dict[str, Path]) -> str:
    return text.format(**{k: str(v) for k, v in paths.items()})


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_input_exits_2_naming_the_fault_and_changes_nothing(case, world, tmp_path, capsys):
    paths = {**world, "case": tmp_path}
    if case.prepare:
        case.prepare(paths)
    args = [_fill(arg, paths) for arg in case.args]
    watched = Path(_fill(case.output, paths)) if case.output else None
    before = snapshot(watched) if watched else None
    code, out, err = run_main(args, capsys)
    lines = [line for line in err.splitlines() if line.strip() and not BAR.search(line)]
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    missing = [word for word in case.expect if _fill(word, paths).lower() not in lines[0].lower()]
    assert not missing, f"{missing} not in: {lines[0]}"
    if watched:
        assert snapshot(watched) == before
