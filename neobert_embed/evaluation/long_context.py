"""Long-context retrieval: LongEmbed's synthetic tasks written offline, and scores by length bucket.

Why: the backbones the toolkit compares differ most in how much text they read (all-MiniLM-L6-v2 256
tokens, BERT 512, NomicBERT 2,048, NeoBERT 4,096, ModernBERT 8,192), and a score averaged over a
benchmark hides it. mteb's LongEmbed benchmark (Zhu et al., 2024) measures it with two synthetic
tasks, passkey and needle retrieval, at lengths of 256 to 32,768 tokens, one corpus per length, scored
by nDCG@1. Its data live on the hub; this module writes the same kind of task from any local text:

* :func:`write_synthetic_task` — ``kind`` ``passkey`` (a person's five-digit pass key stated once in a
  document, the query asks for that person's key) or ``needle`` (a fact about a city stated once, the
  query asks about the city), hidden at a seeded depth in ``lengths`` tokens of haystack cut from the
  given text (tokens of the given tokenizer), ``documents`` documents and queries per length. As in
  LongEmbed, the documents of one length share their haystack (one seeded stretch of the text) and
  differ only in their fact and where it lies, so only the fact tells them apart: a model that does
  not read as far as the fact is at chance. The same inputs and seed write the same bytes. The directory is a local task (``task.json`` + one BEIR
  subdirectory per length, ``test_<length>``), so ``neobert-embed mteb --task-dir`` runs it, as it runs
  LongEmbed's own tasks from local copies in the same layout (``{"mteb_task": "LEMBPasskeyRetrieval",
  "eval_splits": [...]}``).
* :func:`scores_by_length` — each model on each length, through an index with and without
  ``--passages`` (exact search, mteb's retrieval scorer; :func:`~neobert_embed.index.evaluate_index`),
  and :func:`plot_by_length`, a line per model and mode, score against length.

Example:
    >>> write_synthetic_task("passkey", "../shared/data/ag_news/test.jsonl", "tasks/passkey",
    ...                      lengths=[256, 1024, 4096], tokenizer="runs/minilm")
    >>> rows = scores_by_length(["runs/minilm"], ["tasks/passkey"], "runs/lengths")
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from neobert_embed.errors import UserInputError
from neobert_embed.files import atomic_write_bytes, atomic_write_text

logger = logging.getLogger(__name__)

KINDS = ("passkey", "needle")
TASK_NAMES = {"passkey": "SyntheticPasskeyRetrieval", "needle": "SyntheticNeedleRetrieval"}
#: LongEmbed's lengths (tokens); any others may be chosen.
LONGEMBED_LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
MAIN_SCORE = "ndcg_at_1"  # LongEmbed's for both synthetic tasks
SYNTHESIS_FILE = "synthesis.json"
#: Characters of haystack read at most (the text is cycled when a document needs more).
HAYSTACK_CHARACTERS = 4_000_000

_FIRST = ("Alice", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ingrid", "Jonas", "Kemal",
          "Lucia", "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Stefan", "Tamsin")
_LAST = ("Abbott", "Bianchi", "Castillo", "Dubois", "Eriksen", "Fischer", "Garcia", "Haddad", "Ivanova",
         "Jansen", "Kowalski", "Lindqvist", "Moreau", "Novak", "Okafor")
_CITIES = ("Lisbon", "Kyoto", "Cairo", "Oslo", "Lima", "Hanoi", "Dublin", "Nairobi", "Quito", "Tallinn", "Perth",
           "Krakow", "Havana", "Bergen", "Seville", "Busan", "Tbilisi", "Valparaiso", "Zanzibar", "Reykjavik",
           "Marrakesh", "Cusco", "Ljubljana", "Hobart", "Salzburg", "Cartagena", "Tromso", "Hue", "Porto", "Riga",
           "Granada", "Lucerne", "Bruges", "Siena", "Galway", "Mostar", "Essaouira", "Antigua", "Luang Prabang",
           "Kotor", "Sintra", "Bled", "Hallstatt", "Colmar", "Ronda", "Matera", "Ohrid", "Trogir", "Gdansk",
           "Vilnius")
_ACTIVITIES = ("eat a sandwich in the park on a sunny day", "watch the boats from the old harbour wall",
               "ride the night tram to the last stop", "swim in the cold lake before breakfast",
               "buy warm bread from the corner bakery", "climb the clock tower at noon",
               "listen to street musicians by the fountain", "fly a kite on the windy hill",
               "drink mint tea in the covered market", "rent a bicycle and follow the river")


@dataclass(frozen=True)
class Synthesis:
    """How a synthetic task was written (``synthesis.json``): enough to write the same bytes again."""

    kind: str
    lengths: list[int]
    documents: int
    seed: int
    tokenizer: str
    haystack: str
    haystack_sha256: str


def _haystack(path: str | Path) -> str:
    """The haystack's texts joined by spaces (at most :data:`HAYSTACK_CHARACTERS`)."""
    from neobert_embed.encoding import read_texts

    texts, size = [], 0
    for text in read_texts(path, "text", keep_blank=False):
        texts.append(" ".join(text.split()))
        size += len(texts[-1]) + 1
        if size >= HAYSTACK_CHARACTERS:
            break
    joined = " ".join(texts)
    if len(joined.split()) < 50:
        raise UserInputError(f"{path}: too little text for a haystack ({len(joined.split())} words); give a file "
                             "of at least a few paragraphs")
    return joined


def _needles(kind: str, count: int, rng: np.random.Generator) -> list[tuple[str, str]]:
    """``count`` (statement, question) pairs, each about a different person or city."""
    if kind == "passkey":
        people = [f"{first} {last}" for last in _LAST for first in _FIRST]
        if count > len(people):
            raise UserInputError(f"--documents {count}: the passkey task names at most {len(people)} people")
        chosen = rng.permutation(len(people))[:count]
        keys = rng.integers(10_000, 100_000, size=count)
        return [(f"{people[i]}'s pass key is {key}. Remember it. {key} is the pass key of {people[i]}.",
                 f"What is the pass key of {people[i]}?") for i, key in zip(chosen.tolist(), keys.tolist(), strict=True)]
    if count > len(_CITIES):
        raise UserInputError(f"--documents {count}: the needle task has {len(_CITIES)} cities")
    cities = rng.permutation(len(_CITIES))[:count]
    activities = rng.integers(0, len(_ACTIVITIES), size=count)
    return [(f"The best thing to do in {_CITIES[c]} is to {_ACTIVITIES[a]}.",
             f"What is the best thing to do in {_CITIES[c]}?") for c, a in zip(cities.tolist(), activities.tolist(),
                                                                               strict=True)]


class _Tokens:
    """A haystack tokenized once (the model's Rust tokenizer, with offsets), cut into documents by token count."""

    def __init__(self, tokenizer: str | Path, haystack: str) -> None:
        from transformers import AutoTokenizer

        from neobert_embed.inference.fast_tokenizer import FastTokenizer

        fast = FastTokenizer.of(AutoTokenizer.from_pretrained(str(tokenizer)), 1 << 30)
        if fast is None:
            raise UserInputError(f"{tokenizer}: its tokenizer has no fast (Rust) version to count tokens with")
        self.fast = fast
        self.text = haystack
        tokens = fast.offsets([haystack])[0]
        self.offsets = tokens.offsets
        self.specials = len(tokens.head) + len(tokens.tail)

    def count(self, text: str) -> int:
        return len(self.fast.offsets([text])[0].ids)

    def document(self, length: int, needle: str, start: int, rng: np.random.Generator) -> str:
        """``length`` tokens with special tokens: haystack from token ``start``, ``needle`` at a seeded depth."""
        filler = max(0, length - self.specials - self.count(needle))
        total = len(self.offsets)
        start = start % total
        pieces = []
        while filler > 0:  # cycle the haystack when it is shorter than the document
            take = min(filler, total - start)
            pieces.append(self.text[self.offsets[start, 0]:self.offsets[start + take - 1, 1]])
            filler -= take
            start = 0
        text = " ".join(pieces)
        words = [0, *[i + 1 for i, ch in enumerate(text) if ch == " "]]
        at = words[int(rng.integers(0, len(words)))] if text else 0
        return f"{text[:at]}{needle} {text[at:]}".strip()


def write_synthetic_task(kind: str, haystack: str | Path, output: str | Path, *, lengths: Sequence[int],
                         tokenizer: str | Path, documents: int = 50, seed: int = 0) -> Path:
    """Write a synthetic passkey or needle task (see the module docstring) to ``output``; returns it.

    Each length ``L`` is split ``test_L``: ``documents`` documents of about ``L`` tokens of ``tokenizer``
    (special tokens included, as LongEmbed counts), each stating one fact once at a seeded depth, and one
    query per document asking for it (relevant: that document alone).

    Example:
        >>> write_synthetic_task("needle", "notes.txt", "tasks/needle", lengths=[512, 2048], tokenizer="runs/m")
        PosixPath('tasks/needle')
    """
    from neobert_embed.beir import BeirTask, write_beir_task

    if kind not in KINDS:
        raise UserInputError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    lengths = sorted({int(length) for length in lengths})
    if not lengths or lengths[0] < 32:
        raise UserInputError(f"--lengths must be token counts of at least 32, got {lengths}")
    if documents < 2:
        raise UserInputError(f"--documents must be at least 2 (one document is always found), got {documents}")
    text = _haystack(haystack)
    tokens = _Tokens(tokenizer, text)
    output = Path(output)
    splits = [f"test_{length}" for length in lengths]
    for length, split in zip(lengths, splits, strict=True):
        rng = np.random.default_rng([seed, length])  # each length on its own: adding one changes no other
        needles = _needles(kind, documents, rng)
        start = int(rng.integers(0, len(tokens.offsets)))  # one haystack per length, as LongEmbed's shared filler
        corpus = {f"{split}-d{i}": {"title": "", "text": tokens.document(length, needle, start, rng)}
                  for i, (needle, _) in enumerate(needles)}
        queries = {f"{split}-q{i}": question for i, (_, question) in enumerate(needles)}
        qrels = {f"{split}-q{i}": {f"{split}-d{i}": 1} for i in range(documents)}
        write_beir_task(BeirTask(corpus=corpus, queries=queries, qrels=qrels), output / split, split)
    spec = {"name": TASK_NAMES[kind], "type": "Retrieval", "main_score": MAIN_SCORE, "eval_splits": splits,
            "description": f"Synthetic {kind} retrieval written by neobert-embed tasks synth (LongEmbed's design): "
                           f"{documents} documents per length, {', '.join(map(str, lengths))} tokens"}
    atomic_write_text(output / "task.json", json.dumps(spec, indent=1) + "\n")
    record = Synthesis(kind, lengths, documents, seed, str(tokenizer), str(haystack),
                       hashlib.sha256(text.encode("utf-8")).hexdigest())
    atomic_write_text(output / SYNTHESIS_FILE, json.dumps(asdict(record), indent=1) + "\n")
    return output


@dataclass(frozen=True)
class LengthScore:
    """One model's main score on one length of one task, with or without passages."""

    model: str
    task: str
    length: int
    passages: bool
    score: float
    metric: str
    documents: int
    vectors: int


def _split_length(split: str) -> int:
    try:
        return int(split.rsplit("_", 1)[1])
    except (IndexError, ValueError):
        raise UserInputError(f"split {split!r}: a length split is named test_<tokens>, e.g. test_4096") from None


def scores_by_length(models: Sequence[str | Path], task_dirs: Sequence[str | Path], output: str | Path, *,
                     passages: Sequence[bool] = (False, True), batch_size: int = 32,
                     compute_precision: str = "fp32") -> list[LengthScore]:
    """Every model on every length split of every task directory, through an exact index of each split's
    corpus built without and with ``--passages``; writes ``OUTPUT/by_length.json|md`` and the plot
    ``OUTPUT/by_length.png`` (a line per model and mode, score against length).

    Example:
        >>> [(s.length, s.passages, round(s.score, 2)) for s in scores_by_length(["m"], ["tasks/passkey"], "out")][:2]
        [(256, False, 1.0), (256, True, 1.0)]
    """
    from neobert_embed.evaluation.local_tasks import TaskSpec
    from neobert_embed.evaluation.task_data import split_directory
    from neobert_embed.index import build_index, evaluate_index
    from neobert_embed.recipes import TASK_FILE, load_spec

    rows: list[LengthScore] = []
    for task_dir in map(Path, task_dirs):
        spec = load_spec(task_dir / TASK_FILE, TaskSpec, "task")
        splits = spec.eval_splits or [spec.eval_split or "test"]
        metric = spec.main_score or MAIN_SCORE
        for model in models:
            for split in splits:
                source = split_directory(task_dir, split)
                for split_passages in passages:
                    with tempfile.TemporaryDirectory(prefix="neobert-lengths-") as scratch:
                        manifest = build_index(model, source / "corpus.jsonl", Path(scratch) / "index",
                                               index_type="flat", compute_precision=compute_precision,
                                               batch_size=batch_size, passages=split_passages, show_progress=False)
                        scores = evaluate_index(Path(scratch) / "index", source, split=split, batch_size=batch_size)
                    rows.append(LengthScore(str(model), spec.name or spec.mteb_task or task_dir.name,
                                            _split_length(split), split_passages, float(scores[metric]), metric,
                                            manifest.documents, manifest.vectors))
                    logger.info("%s %s %s %s: %s %.4f", Path(model).name, rows[-1].task, split,
                                "passages" if split_passages else "truncated", metric, rows[-1].score)
    write_length_report(rows, output)
    return rows


def write_length_report(rows: Sequence[LengthScore], output: str | Path) -> dict[str, Path]:
    """``by_length.json`` (every row), ``by_length.md`` (a table per task: a row per model and mode, a
    column per length) and ``by_length.png`` under ``output``."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    atomic_write_text(output / "by_length.json", json.dumps([asdict(row) for row in rows], indent=1) + "\n")
    lines = []
    for task in dict.fromkeys(row.task for row in rows):
        mine = [row for row in rows if row.task == task]
        lengths = sorted({row.length for row in mine})
        lines += [f"## {task} ({mine[0].metric} by length, tokens)", "",
                  "| model | mode | " + " | ".join(map(str, lengths)) + " |",
                  "|---|---|" + "---|" * len(lengths)]
        for model, passages in dict.fromkeys((row.model, row.passages) for row in mine):
            cells = {row.length: row.score for row in mine if (row.model, row.passages) == (model, passages)}
            lines.append(f"| {Path(model).name} | {'passages' if passages else 'truncated'} | "
                         + " | ".join(f"{cells[length]:.4f}" if length in cells else "" for length in lengths) + " |")
        lines.append("")
    atomic_write_text(output / "by_length.md", "\n".join(lines))
    return {"json": output / "by_length.json", "md": output / "by_length.md",
            "png": plot_by_length(rows, output / "by_length.png")}


def plot_by_length(rows: Sequence[LengthScore], path: str | Path) -> Path:
    """A panel per task: a line per model and mode (solid: passages, dashed: truncated), score against length."""
    from neobert_embed.charts import png_bytes, subplots

    tasks = list(dict.fromkeys(row.task for row in rows))
    figure, axes = subplots(ncols=len(tasks), figsize=(5.2 * len(tasks), 3.8), squeeze=False)
    for axis, task in zip(axes[0], tasks, strict=True):
        mine = [row for row in rows if row.task == task]
        for model, passages in dict.fromkeys((row.model, row.passages) for row in mine):
            line = sorted((row.length, row.score) for row in mine if (row.model, row.passages) == (model, passages))
            axis.plot([x for x, _ in line], [y for _, y in line], marker="o", linestyle="-" if passages else "--",
                      label=f"{Path(model).name} ({'passages' if passages else 'truncated'})")
        axis.set_xscale("log", base=2)
        axis.set_xlabel("document length (tokens)")
        axis.set_ylabel(mine[0].metric)
        axis.set_ylim(0, 1.05)
        axis.set_title(task)
        axis.legend(fontsize=7)
    path = Path(path)
    atomic_write_bytes(path, png_bytes(figure))
    return path
