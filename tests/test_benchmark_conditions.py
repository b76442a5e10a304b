"""Every benchmark report says how its figures were obtained: one ``"conditions"`` block per script.

Why: a figure without its data, selection, protocol, precision and timing method cannot be compared
or checked, and a benchmark is run rarely (minutes to hours), so a script that silently stopped
recording them would be noticed late. These tests hold it without running any benchmark: each
``benchmarks/*.py`` is read as source (an ``ast``), and :func:`conditions` itself is called once with
made-up facts. Example of what they require in a script::

    report["conditions"] = conditions(data="STS-B dev, all pairs", precision="fp32", protocol="...",
                                      selection="nothing selected", timing="best of 3 after 1 warm-up")
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(path for path in BENCHMARKS.glob("*.py") if path.name != "conditions.py")
#: What every call must state (keyword arguments without a default in ``conditions``).
REQUIRED = {"data", "precision", "protocol", "selection", "timing"}


def _helper():
    """``benchmarks/conditions.py`` imported by path (``benchmarks/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("benchmark_conditions", BENCHMARKS / "conditions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reported_calls(tree: ast.AST) -> list[ast.Call]:
    """``conditions(...)`` calls stored under a ``"conditions"`` key: ``{"conditions": conditions(...)}``
    or ``report["conditions"] = conditions(...)``."""
    def is_call(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "conditions"

    def is_key(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value == "conditions"

    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            calls += [value for key, value in zip(node.keys, node.values, strict=True) if is_key(key) and is_call(value)]
        elif (isinstance(node, ast.Assign) and is_call(node.value)
              and any(isinstance(t, ast.Subscript) and is_key(t.slice) for t in node.targets)):
            calls.append(node.value)
    return calls


def _problems(source: str) -> list[str]:
    """What a benchmark's source lacks: the import, a reported call, or a required fact in that call."""
    tree = ast.parse(source)
    problems = []
    if not any(isinstance(node, ast.ImportFrom) and node.module == "conditions"
               and any(alias.name == "conditions" for alias in node.names) for node in ast.walk(tree)):
        problems.append("no `from conditions import conditions`")
    calls = _reported_calls(tree)
    if not calls:
        problems.append('no conditions(...) under a "conditions" key of the report')
    reserved = set(_helper().KEYS) - REQUIRED - {"threads", "device"}
    for call in calls:
        given = {keyword.arg for keyword in call.keywords}
        if call.args or None in given:
            problems.append("conditions() takes keyword arguments only, spelled out")
        if REQUIRED - given:
            problems.append(f"conditions() without {sorted(REQUIRED - given)}")
        if given & reserved:
            problems.append(f"conditions() given its own keys {sorted(given & reserved)}")
        for keyword in call.keywords:
            if keyword.arg in REQUIRED and isinstance(keyword.value, ast.Constant) and not keyword.value.value:
                problems.append(f"conditions({keyword.arg}=...) is empty")
    return problems


def test_there_are_benchmarks_to_check():
    assert len(SCRIPTS) >= 15, [path.name for path in SCRIPTS]  # issue 48 deleted the scripts named nowhere


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_benchmark_reports_its_conditions(script: Path):
    assert _problems(script.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("source, problem", [
    ('import json\nprint(json.dumps({"figure": 1}))\n', "no `from conditions import conditions`"),
    ('from conditions import conditions\nreport = {"conditions": {"cpus": 2}}\n', 'no conditions(...) under'),
    ('from conditions import conditions\nx = conditions(data="d", precision="fp32", protocol="p", selection="s", '
     'timing="t")\n', 'no conditions(...) under'),
    ('from conditions import conditions\nreport["conditions"] = conditions(data="d", precision="fp32", '
     'protocol="p", timing="t")\n', "without ['selection']"),
    ('from conditions import conditions\nreport["conditions"] = conditions(data="", precision="fp32", '
     'protocol="p", selection="s", timing="t")\n', "conditions(data=...) is empty"),
    ('from conditions import conditions\nreport["conditions"] = conditions(data="d", precision="fp32", '
     'protocol="p", selection="s", timing="t", machine="mine")\n', "given its own keys ['machine']"),
])
def test_the_source_check_catches_a_report_without_its_conditions(source: str, problem: str):
    assert any(problem in found for found in _problems(source)), _problems(source)


def test_conditions_returns_every_documented_key_as_json():
    helper = _helper()
    record = helper.conditions(data="synthetic: 10 texts (seed 0)", precision={"ours": "int8", "peer": "fp32"},
                               protocol="encode", selection="nothing selected", timing="best of 3 after 1 warm-up",
                               threads=[1, 2], model="tiny", where=Path("/tmp/x"), shape=(2, 3))
    assert list(record)[:len(helper.KEYS)] == list(helper.KEYS)
    assert json.loads(json.dumps(record)) == record  # JSON as it is, no custom encoder needed
    assert record["precision"] == {"ours": "int8", "peer": "fp32"} and record["threads"] == [1, 2]
    assert (record["model"], record["where"], record["shape"]) == ("tiny", "/tmp/x", [2, 3])
    machine = record["machine"]
    assert set(helper.MACHINE_KEYS) <= set(machine), machine
    assert machine["name"] and machine["cpus"] >= 1 and machine["summary"].startswith("cpu ")
    assert record["python"] == ".".join(map(str, sys.version_info[:3]))
    assert record["device"] == "cpu" and record["command"].startswith("python ")


def test_conditions_refuses_an_extra_fact_named_like_its_own_keys():
    with pytest.raises(TypeError, match="machine"):
        _helper().conditions(data="d", precision="fp32", protocol="p", selection="s", timing="t", machine="mine")


def test_conditions_does_not_import_torch_into_a_process_that_did_not_use_it():
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from conditions import conditions; "
            "c = conditions(data='d', precision='fp32', protocol='p', selection='s', timing='t'); "
            "print(json.dumps([c['threads'], c['machine']['torch_capability'], 'torch' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code, str(BENCHMARKS)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    # no torch here: no thread count to claim and no dispatch level, and torch was not imported to find out
    assert json.loads(done.stdout) == [None, None, False]


def test_every_neobert_embed_module_a_benchmark_imports_exists():
    """A module moved in the package (``index/shards.py`` → ``shards.py``) must move in the benchmarks too."""
    missing = []
    for script in SCRIPTS:
        for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("neobert_embed"):
                path = ROOT.joinpath(*node.module.split("."))
                if not (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()):
                    missing.append(f"{script.name}: {node.module}")
    assert missing == []
