"""The NeoBERT paper's Table 10 protocol: encoder inference throughput by sequence length.

Prints one JSON document (stdout; progress on stderr). For NeoBERT, ModernBERT-base and BERT-base
(the last at 512 only: it has 512 positions), all with random weights and their published sizes,
at sequence lengths 512, 1024, 2048, 4096 and 8192:

* ``tokens_per_s``: the best over a batch-size sweep (powers of two up to ``--max-tokens`` per
  batch, or until the device runs out of memory) of full-length batches, forward only, under
  ``torch.inference_mode``, bf16 on a GPU;
* ``mfu``: useful FLOPs per second (:mod:`neobert_embed.modeling.flops`) over the device's peak
  (the datasheet's dense bf16 peak for known GPUs, ``--peak-tflops`` to override; a measured
  matmul peak on CPU);
* ``mixed``: a padded-versus-un-padded column: one batch (the best batch size) whose lengths are
  spread evenly over [16, L], real tokens per second through NeoBERT's padded reference path and
  through its default (un-padded) path, and through the other models' default paths.

The paper reports NeoBERT at 24.5k tokens/s at 512 and 17.2k at 4096 on an A100 (bf16); those
figures come with the JSON (``paper_a100_tokens_per_s``) for comparison, with ``device``.

One command on a GPU (about 10 minutes on an A100/H100)::

    python benchmarks/encoder_table10.py > runs/encoder_table10.json

``--quick`` shrinks everything (1-layer models, lengths 32 and 64, batches ≤ 4) to run on a CPU
in seconds; it checks the protocol, not the hardware.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402

PAPER_A100 = {"neobert": {"512": 24500, "4096": 17200}}
MODELS = ("neobert", "modernbert", "bert")
POSITIONS = {"bert": 512}


def build(kind: str, dtype: torch.dtype, device: torch.device, layers: int | None, max_length: int):
    """A random-weight encoder at its published size (``layers`` overrides the depth)."""
    from transformers import AutoModel, BertConfig, ModernBertConfig

    from neobert_embed.modeling import NeoBERTConfig

    depth = {} if layers is None else {"num_hidden_layers": layers}
    if kind == "neobert":
        config = NeoBERTConfig(max_length=max(4096, max_length), **depth)  # random weights: no trained limit
    elif kind == "modernbert":
        config = ModernBertConfig(**depth)
    else:
        config = BertConfig(**depth)
    torch.manual_seed(0)
    return AutoModel.from_config(config, dtype=dtype).to(device).eval()


def random_batch(lengths: list[int], device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded random ids (never a special token) and their attention mask."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(1000, 30000, (len(lengths), width), generator=g) * mask
    return ids.to(device), mask.to(device)


def time_forward(model, ids: torch.Tensor, mask: torch.Tensor, warmup: int, repeats: int) -> float:
    """Best seconds of one forward."""
    from neobert_embed.modeling.flops import seconds

    with torch.inference_mode():
        for _ in range(warmup):
            model(input_ids=ids, attention_mask=mask)
        return min(seconds(lambda: model(input_ids=ids, attention_mask=mask), ids.device) for _ in range(repeats))


def sweep(model, length: int, batches: list[int], device: torch.device, args) -> dict[int, float]:
    """Tokens per second of full-length batches, per batch size, stopping at out-of-memory."""
    rates: dict[int, float] = {}
    for batch in batches:
        try:
            ids, mask = random_batch([length] * batch, device)
            rates[batch] = batch * length / time_forward(model, ids, mask, args.warmup, args.repeats)
        except torch.OutOfMemoryError:
            break
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        print(f"  batch {batch}: {rates[batch]:,.0f} tokens/s", file=sys.stderr, flush=True)
    return rates


def mixed_lengths(count: int, longest: int) -> list[int]:
    """``count`` lengths spread evenly over [min(16, longest), longest]."""
    low = min(16, longest)
    if count == 1:
        return [longest]
    return [low + round((longest - low) * i / (count - 1)) for i in range(count)]


def mixed_row(model, kind: str, length: int, batch: int, device: torch.device, args) -> dict:
    """Real tokens/s on one mixed-length batch: padded reference vs the model's default path."""
    lengths = mixed_lengths(batch, length)
    ids, mask = random_batch(lengths, device, seed=1)
    paths = {"default": None}
    if kind == "neobert":
        paths = {"padded": "padded", "unpadded": "auto"}
    row = {"model": kind, "length": length, "batch": batch, "real_token_fraction": round(sum(lengths) / (batch * length), 3)}
    for path, backend in paths.items():
        if backend is not None:
            model.config.attention_backend = backend
        try:
            row[f"{path}_tokens_per_s"] = round(sum(lengths) / time_forward(model, ids, mask, args.warmup, args.repeats), 1)
        except torch.OutOfMemoryError:
            row[f"{path}_tokens_per_s"] = None
    if kind == "neobert":
        model.config.attention_backend = "auto"
        if row["padded_tokens_per_s"] and row["unpadded_tokens_per_s"]:
            row["unpadded_vs_padded"] = round(row["unpadded_tokens_per_s"] / row["padded_tokens_per_s"], 2)
    return row


def device_peak(device: torch.device, dtype: torch.dtype, override: float | None, quick: bool) -> tuple[float, str]:
    from neobert_embed.modeling.flops import gpu_peak_tflops, measured_matmul_tflops

    if override:
        return override, "--peak-tflops"
    if device.type == "cuda":
        peak, name = gpu_peak_tflops(device)
        if peak is not None:
            return peak, f"datasheet dense bf16/fp16 peak of {name}"
        return measured_matmul_tflops(dtype, device, 8192, 5), f"measured matmul peak of {name} (not in table)"
    size, repeats = (1024, 10) if quick else (2048, 8)  # best of many: one slow run must not lower the peak below the model
    return measured_matmul_tflops(dtype, device, size, repeats), "measured matmul peak (CPU)"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1-layer models, lengths 32,64, CPU-sized (seconds)")
    parser.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    parser.add_argument("--dtype", default=None, help="bfloat16 | float16 | float32 (default: bf16 on GPU, fp32 on CPU)")
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--max-tokens", type=int, default=2**18, help="largest batch × length in the sweep")
    parser.add_argument("--max-batch", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=None, help="override every model's depth")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (default: datasheet)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.max_tokens, args.max_batch, args.layers = "32,64", 128, 4, args.layers or 1
        args.warmup, args.repeats = 1, 1
    return args


def main() -> None:
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    lengths = [int(n) for n in args.lengths.split(",")]
    peak, peak_source = device_peak(device, dtype, args.peak_tflops, args.quick)
    from neobert_embed.modeling.flops import forward_flops

    table, mixed = [], []
    for kind in args.models.split(","):
        model = build(kind, dtype, device, args.layers, max(lengths))
        attention = getattr(model.config, "attention_backend", None) or model.config._attn_implementation
        for length in lengths:
            if length > POSITIONS.get(kind, length):
                continue
            print(f"{kind} @ {length}", file=sys.stderr, flush=True)
            batches = [2**i for i in range(20) if 2**i * length <= args.max_tokens and 2**i <= args.max_batch] or [1]
            rates = sweep(model, length, batches, device, args)
            if not rates:
                table.append({"model": kind, "length": length, "out_of_memory": True})
                continue
            best = max(rates, key=rates.get)
            flops_per_token = forward_flops(model, [length]) / length
            table.append({"model": kind, "length": length, "best_batch": best, "tokens_per_s": round(rates[best], 1),
                          "useful_tflops": rates[best] * flops_per_token / 1e12,
                          "sweep": {str(b): round(r, 1) for b, r in rates.items()}, "attention": attention,
                          "parameters": sum(p.numel() for p in model.parameters())})
            # the padded-vs-un-padded column needs several sequences: the largest batch that fit
            mixed.append(mixed_row(model, kind, length, max(rates), device, args))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if peak_source.startswith("measured"):  # measured again after the models: the faster of the two is the peak
        peak = max(peak, device_peak(device, dtype, args.peak_tflops, args.quick)[0])
        peak_source += ", best of before and after the models"
    for row in table:
        if "useful_tflops" in row:
            row["mfu"] = round(row.pop("useful_tflops") / peak, 4)
    print(json.dumps({
        "benchmark": "encoder_table10",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "peak_tflops": round(peak, 3), "peak_source": peak_source,
        "settings": {"quick": args.quick, "lengths": lengths, "max_tokens": args.max_tokens,
                     "layers": args.layers or "published", "warmup": args.warmup, "repeats": args.repeats},
        "table": table,
        "mixed": mixed,
        "paper_a100_tokens_per_s": PAPER_A100,
        "machine": {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                    "load_average_1min": round(os.getloadavg()[0], 2)},
        "conditions": conditions(
            data=(f"synthetic: random token ids (never special tokens; seed 0) in full-length batches at lengths "
                  f"{lengths}; mixed column: lengths spread evenly over [16, L] (seed 1)"),
            precision=(f"{str(dtype).removeprefix('torch.')} weights and activations (from_config(dtype=...)), "
                       "no autocast"),
            protocol=("the NeoBERT paper's Table 10: forward only under inference_mode, random weights, "
                      f"models {', '.join(args.models.split(','))} at {args.layers or 'their published'} layers; batch sizes "
                      f"powers of two up to {args.max_tokens} tokens and {args.max_batch} rows or out of memory; "
                      f"mfu over {peak_source}"),
            selection=("tokens_per_s and mfu: the best batch size of each length's sweep (the protocol's figure); "
                       "the mixed column runs at the largest batch that fit"),
            timing=(f"best of {args.repeats} forwards after {args.warmup} warm-up forwards, per batch size "
                    "(synchronized on a GPU)"),
            threads=torch.get_num_threads(), device=str(device)),
    }, indent=1))


if __name__ == "__main__":
    main()
