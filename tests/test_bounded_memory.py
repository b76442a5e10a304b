"""A big ``encode`` holds one chunk, not its matrix, and its native memory stays flat
(:mod:`neobert_embed.native_memory`, :func:`neobert_embed.encoding.encode_file`)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from typer.testing import CliRunner

from neobert_embed import native_memory
from neobert_embed.cli import app
from neobert_embed.encoding import encode_texts, quantize, streams
from neobert_embed.inference import pipeline as pipeline_module
from neobert_embed.inference.runtime import load_inference_model
from neobert_embed.quantization import load_calibration

TEXTS = [("word " * (1 + (i * 5) % 30)).strip() + f" {i}" for i in range(45)]


@pytest.fixture
def texts_file(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def fp32_minilm(minilm_path):
    return load_inference_model(str(minilm_path), "fp32").model


def encode(minilm_path, texts_file, output, *extra):
    result = CliRunner().invoke(app, ["encode", "--model", str(minilm_path), "--input", str(texts_file), "--output",
                                      str(output), "--precision", "fp32", "--batch-size", "8", *extra])
    return result


@pytest.mark.parametrize("stored", ["float32", "float16"])
def test_encode_writes_the_matrix_as_it_goes_with_np_save_bytes(minilm_path, fp32_minilm, texts_file, tmp_path,
                                                                 monkeypatch, stored):
    """Several chunks are written one after another, the whole matrix never collected, and the file is
    byte for byte what ``np.save`` writes for the matrix of ``encode_texts``."""
    monkeypatch.setattr(pipeline_module, "CHUNK_TEXTS", 10)  # 5 chunks

    def never(*args, **kwargs):
        raise AssertionError("encode collected the whole matrix")

    monkeypatch.setattr(pipeline_module, "encode", never)
    output = tmp_path / "vectors.npy"
    result = encode(minilm_path, texts_file, output, "--store-precision", stored)
    assert result.exit_code == 0, result.output
    monkeypatch.undo()
    expected = tmp_path / "expected.npy"
    np.save(expected, quantize(encode_texts(fp32_minilm, TEXTS, batch_size=8), stored), allow_pickle=False)
    written = np.load(output)
    assert written.shape == (len(TEXTS), 384) and written.dtype == np.dtype(stored)
    np.testing.assert_allclose(written.astype(np.float32), np.load(expected).astype(np.float32), atol=1e-4)
    assert output.read_bytes()[:128] == expected.read_bytes()[:128]  # the same header, padded alike
    assert json.loads((tmp_path / "vectors.npy.json").read_text())["texts"] == len(TEXTS)


def test_int8_with_a_calibration_streams_and_matches_the_whole_matrix(minilm_path, texts_file, tmp_path,
                                                                      monkeypatch):
    first = tmp_path / "docs.npy"
    assert encode(minilm_path, texts_file, first, "--store-precision", "int8").exit_code == 0
    monkeypatch.setattr(pipeline_module, "CHUNK_TEXTS", 10)
    again = tmp_path / "again.npy"
    result = encode(minilm_path, texts_file, again, "--store-precision", "int8", "--calibration",
                    str(tmp_path / "docs.npy.json"))
    assert result.exit_code == 0, result.output
    assert np.abs(np.load(again).astype(int) - np.load(first).astype(int)).max() <= 1
    assert streams("int8", load_calibration(tmp_path / "docs.npy.json")) and not streams("int8", None)


def test_a_failure_mid_stream_keeps_the_previous_pair_and_leaves_no_litter(minilm_path, texts_file, tmp_path,
                                                                           monkeypatch):
    output = tmp_path / "vectors.npy"
    assert encode(minilm_path, texts_file, output).exit_code == 0
    def pair_and_litter():  # everything but the log of the run's third-party output, which each run rewrites
        return {path.name: path.read_bytes() for path in tmp_path.iterdir() if path.suffix != ".log"}

    before = pair_and_litter()
    monkeypatch.setattr(pipeline_module, "CHUNK_TEXTS", 10)
    real_chunks = pipeline_module.encode_chunks  # the one encoding loop, for every runtime

    def full_disk_after_two(*args, **kwargs):
        for index, vectors in enumerate(real_chunks(*args, **kwargs)):
            if index == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            yield vectors

    monkeypatch.setattr(pipeline_module, "encode_chunks", full_disk_after_two)
    result = encode(minilm_path, texts_file, output, "--overwrite")
    assert result.exit_code != 0
    assert pair_and_litter() == before


def test_the_kernel_caches_are_bounded_unless_the_user_set_them(monkeypatch):
    for name in native_memory.KERNEL_CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "1024")
    entries = str(native_memory.kernel_cache_entries())
    assert native_memory.bound_kernel_caches() == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": entries,
                                                   "LRU_CACHE_CAPACITY": "1024"}
    assert native_memory.kernel_cache_entries(2) == 64 and native_memory.kernel_cache_entries(32) == 256


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_memory_goes_back_to_the_operating_system():
    """A freed block inside a thread's arena stays resident until ``malloc_trim``; this fails if the call
    disappears from the C library or stops being found."""
    script = textwrap.dedent("""
        import ctypes, threading
        from neobert_embed.native_memory import release_freed_memory
        def rss():
            return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) // 1024
        def fill():  # 1,600 blocks of 64 KiB (under the mmap threshold) in this thread's arena, the last kept: the heap cannot shrink
            blocks = [ctypes.create_string_buffer(64 * 1024) for _ in range(1600)]
            keep.append(blocks[-1]); del blocks
        keep = []
        worker = threading.Thread(target=fill); worker.start(); worker.join()
        held = rss()
        assert release_freed_memory()
        print(held - rss())
    """)
    freed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert int(freed.stdout.strip()) >= 50, freed.stdout  # ~100 MB was freed but still resident


def test_a_capped_cache_keeps_the_jit_code_of_new_shapes_flat():
    """oneDNN builds one JIT kernel per new row count; under the cap the executable memory stays flat.
    Fails if PyTorch's oneDNN stops reading the variables (the cap would silently do nothing)."""
    from neobert_embed.inference.kernels import packed_bf16_available

    if not packed_bf16_available():
        pytest.skip("no packed bf16 kernels on this CPU")
    script = textwrap.dedent("""
        import torch
        from neobert_embed.inference.kernels import PackedBf16Linear
        torch.set_num_threads(1)
        linear = PackedBf16Linear.from_linear(torch.nn.Linear(64, 256))
        with torch.inference_mode():
            for rows in range(16, 16 + 600):
                linear(torch.randn(rows, 64).to(torch.bfloat16))
        code = 0
        for line in open("/proc/self/smaps"):
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                executable = fields[1] == "rwxp" and len(fields) == 5
            elif fields[0] == "Rss:" and executable:
                code += int(fields[1])
        print(code)
    """)

    def jit_kib(capacity: str) -> int:
        env = {**os.environ, "ONEDNN_PRIMITIVE_CACHE_CAPACITY": capacity, "LRU_CACHE_CAPACITY": capacity}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True,
                              timeout=300)
        return int(done.stdout.strip())

    capped, default = jit_kib("8"), jit_kib("1024")
    assert capped * 3 < default, (capped, default)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_large_freed_blocks_go_back_at_once_under_the_fixed_threshold():
    """After one large block is freed, glibc keeps later ones of that size in its heap (its dynamic
    threshold); with the threshold fixed they are mapped on their own and returned when freed."""
    script = textwrap.dedent("""
        import ctypes, sys
        from neobert_embed.native_memory import MMAP_THRESHOLD_BYTES, fix_mmap_threshold
        def rss():
            return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) // 1024
        if sys.argv[1] == "fixed":
            assert fix_mmap_threshold(MMAP_THRESHOLD_BYTES)
        size = 2 * MMAP_THRESHOLD_BYTES
        ctypes.create_string_buffer(size)  # freed at once: that raises the dynamic threshold above its size
        before = rss()
        blocks = [ctypes.create_string_buffer(size) for _ in range(12)]
        keep = blocks[-1]; del blocks
        print(rss() - before)
    """)

    def held_mb(mode: str) -> int:
        env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
        done = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, env=env,
                              check=True, timeout=120)
        return int(done.stdout.strip())

    assert held_mb("dynamic") >= 60  # 11 freed blocks of 8 MiB still resident: what the fix is for
    assert held_mb("fixed") <= 20
