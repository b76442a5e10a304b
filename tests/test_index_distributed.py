"""Data-parallel index builds: torchrun (gloo on 127.0.0.1), --devices, a killed rank, and resume.

Every build here encodes 120 documents in chunks of 16 (8 chunks) with a tiny BERT, so each rank has
several chunks and a 2-process run takes seconds; the results are compared with the 1-process build.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from index_helpers import auto_without_candidates, tiny_bert_with_prompts, write_corpus  # noqa: F401
from typer.testing import CliRunner

from neobert_embed.cli import app
from neobert_embed.distributed import World, free_port, parse_devices
from neobert_embed.index import build_index, open_index

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ("cats", "dogs", "oil prices", "stock markets", "football", "rain")
QUERIES = ["cats with details", "oil prices today", "note 7 about football", "more rain", "dogs"]
CHUNK = 16


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return tiny_bert_with_prompts(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    texts = [f"note {i} about {TOPICS[i % 6]} with {i * 7 % 13} details" for i in range(120)]
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", texts)


@pytest.fixture(scope="module")
def reference(tiny_bert, corpus, tmp_path_factory) -> Path:
    """The 1-process build every distributed build must reproduce."""
    output = tmp_path_factory.mktemp("reference") / "index"
    build_index(tiny_bert, corpus, output, index_type="flat", chunk_size=CHUNK, show_progress=False)
    return output


def _environment() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _torchrun(*args: str, nproc: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--nnodes=1",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}", *args]


def _store_rows(index_dir: Path) -> list[tuple]:
    with sqlite3.connect(index_dir / "documents.sqlite") as db:
        return db.execute("SELECT row, doc_id, title, text, line, deleted FROM documents ORDER BY row").fetchall()


def assert_same_index(built: Path, reference: Path) -> None:
    """Same ids and store rows, vectors equal to 1e-6, same top-10 for every query."""
    assert _store_rows(built) == _store_rows(reference)
    with open_index(built) as got, open_index(reference) as want:
        assert got.manifest.documents == want.manifest.documents == 120
        assert got.manifest.factory == want.manifest.factory
        np.testing.assert_allclose(got.faiss_index.reconstruct_n(0, 120), want.faiss_index.reconstruct_n(0, 120),
                                   atol=1e-6, rtol=0)
        got_hits, want_hits = got.search(QUERIES, k=10), want.search(QUERIES, k=10)
    for mine, theirs in zip(got_hits, want_hits, strict=True):
        assert [h.doc_id for h in mine] == [h.doc_id for h in theirs]


def test_chunk_assignment_is_round_robin_over_unfinished_chunks():
    assert World(rank=0, size=2).my_chunks(8) == [0, 2, 4, 6]
    assert World(rank=1, size=3).my_chunks(8, finished={4}) == [1, 7]
    assert sorted(c for r in range(3) for c in World(rank=r, size=3).my_chunks(8)) == list(range(8))
    assert parse_devices("cpu, cpu") == ["cpu", "cpu"]


def test_index_build_refuses_a_device_this_machine_lacks_before_loading_anything(tiny_bert, corpus, tmp_path):
    result = CliRunner().invoke(app, ["index", "build", "--model", str(tiny_bert), "--corpus", str(corpus),
                                      "--output", str(tmp_path / "index"), "--devices", "cpu,cuda:99"])
    message = result.output + str(result.exception)
    assert result.exit_code != 0 and "--devices 'cuda:99'" in message, message
    assert not (tmp_path / "index").exists()


def test_torchrun_two_process_build_equals_one_process_build(tiny_bert, corpus, reference, tmp_path):
    output = tmp_path / "index"
    result = subprocess.run(_torchrun("-m", "neobert_embed.cli", "index", "build", "--model", str(tiny_bert),
                                      "--corpus", str(corpus), "--output", str(output), "--index-type", "flat",
                                      "--chunk-size", str(CHUNK)),
                            env=_environment(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("index of 120 documents") == 1   # rank 0 alone reports
    assert not output.with_name(".index.partial").exists()
    assert_same_index(output, reference)


def test_torchrun_build_with_the_lock_held_fails_on_every_rank_without_waiting(tiny_bert, corpus, tmp_path):
    from neobert_embed.locks import writer_lock

    output = tmp_path / "index"
    with writer_lock(output, command="test holding the lock"):   # rank 0 alone takes the lock: no deadlock
        result = subprocess.run(_torchrun("-m", "neobert_embed.cli", "index", "build", "--model", str(tiny_bert),
                                          "--corpus", str(corpus), "--output", str(output), "--index-type", "flat",
                                          "--chunk-size", str(CHUNK), "--no-wait"),
                                env=_environment(), capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert result.stderr.count("test holding the lock") >= 2, result.stderr[-3000:]  # both ranks say why
    assert not output.with_name(".index.partial").exists() and not (output / "manifest.json").exists()


def test_devices_cpu_cpu_spawns_two_workers_with_the_same_result(tiny_bert, corpus, reference, tmp_path):
    output = tmp_path / "index"
    result = CliRunner().invoke(app, ["index", "build", "--model", str(tiny_bert), "--corpus", str(corpus),
                                      "--output", str(output), "--index-type", "flat", "--chunk-size", str(CHUNK),
                                      "--devices", "cpu,cpu"])
    assert result.exit_code == 0, result.output
    assert_same_index(output, reference)


KILL_RANK_1 = """
import os, signal, sys
from neobert_embed.index import build_index

def kill_rank_1(done):
    if os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)

build_index(sys.argv[1], sys.argv[2], sys.argv[3], index_type="flat", chunk_size=16, show_progress=False,
            on_chunk=kill_rank_1)
"""


def test_rank_killed_mid_build_then_resume_with_one_process(tiny_bert, corpus, reference, tmp_path):
    script = tmp_path / "kill_rank_1.py"
    script.write_text(textwrap.dedent(KILL_RANK_1), encoding="utf-8")
    output = tmp_path / "index"
    killed = subprocess.run(_torchrun(str(script), str(tiny_bert), str(corpus), str(output)),
                            env=_environment(), capture_output=True, text=True, timeout=300)
    assert killed.returncode != 0
    assert f"Signal {int(signal.SIGKILL)}" in killed.stderr or "SIGKILL" in killed.stderr, killed.stderr[-3000:]
    partial = output.with_name(".index.partial")
    done = sorted(int(p.stem.split("-")[1]) for p in (partial / "shards").glob("chunk-*.npy"))
    assert 1 in done and len(done) < 8, done   # rank 1 wrote its first chunk, then died
    assert not output.exists()

    resumed: list[int] = []
    build_index(tiny_bert, corpus, output, index_type="flat", chunk_size=CHUNK, resume=True, show_progress=False,
                on_chunk=lambda chunk: resumed.append(chunk.chunk))
    assert sorted(resumed) == sorted(set(range(8)) - set(done))
    assert_same_index(output, reference)


def test_torchrun_encode_equals_one_process_encode(tiny_bert, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(f"note {i} about {TOPICS[i % 6]}\n" for i in range(40)), encoding="utf-8")
    single = CliRunner().invoke(app, ["encode", "--model", str(tiny_bert), "--input", str(texts),
                                      "--output", str(tmp_path / "one.npy"), "--json"])
    assert single.exit_code == 0, single.output
    result = subprocess.run(_torchrun("-m", "neobert_embed.cli", "encode", "--model", str(tiny_bert), "--input",
                                      str(texts), "--output", str(tmp_path / "two.npy"), "--json"),
                            env=_environment(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "two.npy"), np.load(tmp_path / "one.npy"), atol=1e-6, rtol=0)
    assert not (tmp_path / "two.npy.parts").exists()


def test_torchrun_index_add_equals_one_process_add(tiny_bert, corpus, tmp_path):
    """Rank 0 imports and writes, both ranks encode: the same rows, vectors and hits as one process."""
    import json
    import shutil

    lines = corpus.read_text(encoding="utf-8").splitlines()
    base, extra = tmp_path / "base.jsonl", tmp_path / "extra.jsonl"
    base.write_text("\n".join(lines[:60]) + "\n", encoding="utf-8")
    extra.write_text("".join(json.dumps({**json.loads(line), "_id": f"new{i}"}) + "\n"
                             for i, line in enumerate(lines[60:])), encoding="utf-8")
    build_index(tiny_bert, base, tmp_path / "one", index_type="flat", chunk_size=CHUNK, show_progress=False)
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    single = CliRunner().invoke(app, ["index", "add", str(tmp_path / "one"), "--corpus", str(extra)])
    assert single.exit_code == 0, single.output
    result = subprocess.run(_torchrun("-m", "neobert_embed.cli", "index", "add", str(tmp_path / "two"),
                                      "--corpus", str(extra)),
                            env=_environment(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("now holds") == 1, result.stderr[-3000:]   # rank 0 alone reports
    assert not list(tmp_path.glob(".two.*.tmp")) and not (tmp_path / "two" / ".add-shards").exists()
    assert_same_index(tmp_path / "two", tmp_path / "one")
