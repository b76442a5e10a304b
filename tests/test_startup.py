"""Start-up: each command imports only what it needs, the weights check stays exact, exit is cheap.

``benchmarks/startup.py`` measures the seconds; these tests hold the properties behind them without
timing anything, so a regression fails here rather than as a slower benchmark: a top-level import
of mteb, faiss, fastapi, matplotlib or deepspeed in a module that ``encode``, ``index search`` or
``serve`` loads shows up in that command's ``sys.modules``. (sentence-transformers itself imports
datasets, scikit-learn and pandas, so those cannot be held back from a command that runs a model.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

#: Never needed by the three start-up commands (serve's web stack aside, which serve needs).
NOT_FOR_ENCODING = {"mteb", "matplotlib", "deepspeed", "openvino", "onnxruntime", "onnx", "nncf", "optimum"}
WEB = {"fastapi", "uvicorn", "starlette"}
COMMANDS = {
    "encode": NOT_FOR_ENCODING | WEB | {"faiss"},
    "index search": NOT_FOR_ENCODING | WEB,
    "serve": NOT_FOR_ENCODING | {"faiss"},  # without --index
}
RUN_AND_LIST = """
import json, sys
if {no_server}:
    import uvicorn
    uvicorn.run = lambda *args, **kwargs: None  # everything serve does up to listening, without a port
from neobert_embed.cli import main
sys.argv = ["neobert-embed", *json.loads(sys.argv[1])]
try:
    main()
finally:
    with open({listing!r}, "w") as out:
        json.dump(sorted({{name.split(".")[0] for name in sys.modules}}), out)
"""


def _top_level_modules_after(code: str, timeout: int = 60) -> set[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout))


def test_resolving_the_startup_commands_imports_no_heavy_library():
    """The command line, with encode / index search / serve resolved and their options parsed, is
    typer and rich only: the model's libraries load inside the command."""
    code = """
import json, sys, typer
from neobert_embed.cli import app
root = typer.main.get_command(app)
for argv in (["encode", "-m", "m", "-i", "in.txt", "-o", "out.npy"], ["index", "search", "idx", "q"],
             ["serve", "--model", "m"]):
    ctx = root.make_context("neobert-embed", list(argv), resilient_parsing=True)
    name, command, rest = root.resolve_command(ctx, list(argv))
    while rest and hasattr(command, "resolve_command"):
        sub = command.make_context(name, list(rest), parent=ctx, resilient_parsing=True)
        name, command, rest = command.resolve_command(sub, list(rest))
    command.make_context(name, list(rest), parent=ctx)
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""
    imported = _top_level_modules_after(code)
    assert "typer" in imported  # the probe sees real imports
    heavy = {"torch", "transformers", "sentence_transformers", "datasets", "sklearn", "numpy", "faiss"}
    assert not imported & (heavy | NOT_FOR_ENCODING | WEB), sorted(imported & (heavy | NOT_FOR_ENCODING | WEB))


@pytest.fixture(scope="module")
def small_index(minilm_path, tmp_path_factory) -> Path:
    from neobert_embed.index import build_index

    root = tmp_path_factory.mktemp("startup")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"document {i} about topic {i % 3}"}) + "\n"
                              for i in range(12)), encoding="utf-8")
    build_index(str(minilm_path), corpus, root / "index", index_type="flat", compute_precision="fp32",
                show_progress=False)
    return root


@pytest.mark.slow
def test_each_startup_command_runs_without_the_libraries_it_does_not_need(minilm_path, small_index):
    """encode, index search and serve (up to listening), each in a fresh process on the real
    all-MiniLM-L6-v2: what they imported once their work is done. Run side by side."""
    texts = small_index / "texts.txt"
    texts.write_text("a first text\na second text\n", encoding="utf-8")
    argvs = {
        "encode": ["encode", "--model", str(minilm_path), "--input", str(texts), "--output",
                   str(small_index / "out.npy"), "--overwrite"],
        "index search": ["index", "search", str(small_index / "index"), "topic 1", "--json"],
        "serve": ["serve", "--model", str(minilm_path)],
    }
    procs = {}
    for name, argv in argvs.items():
        listing = small_index / f"modules-{name.replace(' ', '-')}.json"
        code = RUN_AND_LIST.format(no_server=name == "serve", listing=str(listing))
        procs[name] = (listing, subprocess.Popen([sys.executable, "-c", code, json.dumps(argv)],
                                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for name, (listing, proc) in procs.items():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{name}: {err[-2000:]}"
        imported = set(json.loads(listing.read_text(encoding="utf-8")))
        assert "sentence_transformers" in imported, name  # the probe saw the model load
        unneeded = imported & COMMANDS[name]
        assert not unneeded, f"{name} imported {sorted(unneeded)}, which it does not use"
    assert "faiss" in set(json.loads((small_index / "modules-index-search.json").read_text()))


def test_weights_check_names_nan_and_inf_in_every_dtype():
    """The fast (numpy) path for CPU fp16/fp32/fp64 weights and torch's path for bf16 find the same
    tensors and tell NaN from Inf."""
    import torch

    from neobert_embed.errors import UserInputError
    from neobert_embed.sentence import _all_finite, check_finite_weights

    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).to(dtype)
        check_finite_weights(model, "ok")  # finite weights pass
        assert _all_finite(torch.full((3,), torch.finfo(dtype).max, dtype=dtype))  # the largest finite values
        for bad, kind in ((float("nan"), "NaN"), (float("inf"), "Inf"), (float("-inf"), "Inf")):
            with torch.no_grad():
                model[1].weight[1, 2] = bad
            with pytest.raises(UserInputError, match=rf"m: weight 1\.weight holds {kind} values"):
                check_finite_weights(model, "m")
            with torch.no_grad():
                model[1].weight[1, 2] = 0.0


def test_the_console_script_freezes_the_heap_at_exit_only():
    """main() asks for the collector's objects to be frozen at interpreter exit (not before: a
    process calling main() several times still collects), and registers that once."""
    code = """
import atexit, gc, sys
calls = []
atexit.register = lambda function, *a, **k: calls.append(function)
atexit.unregister = lambda function: calls.remove(function) if function in calls else None
from neobert_embed.cli import main
for _ in range(2):
    sys.argv = ["neobert-embed", "--help"]
    try:
        main()
    except SystemExit:
        pass
assert gc.get_freeze_count() == 0, gc.get_freeze_count()
print(calls.count(gc.freeze))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1:] == ["1"]
