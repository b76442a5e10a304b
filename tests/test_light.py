"""The light runtime: exported models encode, search and serve without torch, as sentence-transformers would.

* vector equality: :func:`~neobert_embed.inference.light.load_light_model` against sentence-transformers'
  torch model saved in the same export directory for the real all-MiniLM-L6-v2, a tiny NeoBERT (mean
  pooling without the prompt's tokens) and tiny BERTs with CLS and the other pooling modes, with and
  without prompts, the default prompt, lower-casing and truncation;
* modules it cannot run (Dense, a custom module) are one error naming the module and ``--backend torch``;
* ``encode``, ``index search`` and ``serve`` (one request) in processes where importing torch,
  transformers or sentence-transformers raises ImportError, and ``--backend torch`` failing there in one
  line naming what to install;
* an index built with the torch model gives the same top-10 through its export, and refuses an export
  of another model in one line.

OpenVINO runs in subprocesses only (see ``tests/export_cases.py``: its runtime and a later SIGINT in
the same pytest process do not mix).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from tiny_models import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = {"query": "query: ", "document": "passage: "}
TEXTS = [
    "A man is playing a guitar on the street.",
    "how do I reset my password?",
    "ok",
    "",
    "Le chat dort sur le canapé pendant que la pluie tombe.",
    "東京は日本の首都です。",
    "MIXED Case Words And ÜMLAUTS",
    "The quarterly report shows revenue grew 12.5% to $4.2 billion, driven by cloud services. " * 12,  # truncated
    "def add(a, b):\n    return a + b  # adds two numbers",
]
BLOCKER = '''
import sys

class _Blocked:
    """Importing torch, transformers or sentence-transformers fails, as where they are not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "sentence_transformers"):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None

sys.meta_path.insert(0, _Blocked())
'''


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _export(model: Path, output: Path, backend: str = "onnx") -> Path:
    from neobert_embed.inference.export import export_model

    export_model(model, output, backend)
    return output


def _saved(plain: Path, directory: Path, modes: tuple[str, ...], *, include_prompt: bool = True,
           normalize: bool = False, lower_case: bool = False, default_prompt: str | None = None) -> Path:
    """A SentenceTransformer over ``plain`` with the given pooling, prompts and (optionally) Normalize."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    transformer = Transformer(str(plain), max_seq_length=64, do_lower_case=lower_case)
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode=modes if len(modes) > 1 else modes[0],
                      include_prompt=include_prompt)
    modules = [transformer, pooling, *([Normalize()] if normalize else [])]
    SentenceTransformer(modules=modules, prompts=PROMPTS, default_prompt_name=default_prompt,
                        device="cpu").save(str(directory))
    return directory


@pytest.fixture(scope="module")
def minilm_onnx(minilm_path, tmp_path_factory) -> Path:
    return _export(minilm_path, tmp_path_factory.mktemp("light") / "minilm-onnx")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    return build_tiny_model("bert", tmp_path_factory.mktemp("light") / "bert", seed=1)


def _torch_model(export: Path):
    """sentence-transformers' torch model of an export directory (its saved weights, not the graph)."""
    from neobert_embed.sentence import load_sentence_model

    return load_sentence_model(str(export), device="cpu")


def _assert_same_vectors(export: Path, **encode) -> None:
    """The light model's vectors equal sentence-transformers' torch model's (cosine ≥ 0.99999)."""
    from neobert_embed.inference.light import load_light_model

    light = load_light_model(export, "onnx", threads=1)
    reference = _torch_model(export)
    assert light.max_seq_length == reference.max_seq_length
    assert light.prompts == reference.prompts and light.default_prompt_name == reference.default_prompt_name
    assert light.get_embedding_dimension() == reference.get_embedding_dimension()
    expected = reference.encode(TEXTS, batch_size=4, **encode)
    vectors = light.encode(TEXTS, batch_size=4, **encode)
    assert vectors.shape == expected.shape and vectors.dtype == np.float32
    cosines = _cosines(vectors, expected)
    assert cosines.min() >= 0.99999, (encode, cosines.min())


@pytest.mark.parametrize("encode", [{}, {"prompt": "query: "}, {"normalize_embeddings": True}])
def test_minilm_export_encodes_as_sentence_transformers_does(minilm_onnx, encode):
    _assert_same_vectors(minilm_onnx, **encode)


def test_neobert_export_leaves_the_prompt_out_of_its_pooling(tmp_path):
    plain = build_tiny_model("neobert", tmp_path / "plain", seed=0)
    export = _export(_saved(plain, tmp_path / "st", ("mean",), include_prompt=False), tmp_path / "onnx")
    for encode in ({}, {"prompt_name": "query"}, {"prompt_name": "document", "normalize_embeddings": True}):
        _assert_same_vectors(export, **encode)
    from neobert_embed.inference.light import load_light_model

    light = load_light_model(export, "onnx")
    assert not np.allclose(light.encode(["a text"], prompt_name="query"), light.encode(["a text"]))


@pytest.mark.parametrize("modes", [("cls",), ("max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")])
def test_bert_exports_pool_as_sentence_transformers_does(tiny_bert, tmp_path, modes):
    """CLS (normalized, the default prompt applied, lower-cased) and the other modes concatenated."""
    st = _saved(tiny_bert, tmp_path / "st", modes, normalize=True, lower_case=True, default_prompt="query",
                include_prompt=modes != ("cls",))
    export = _export(st, tmp_path / "onnx")
    for encode in ({}, {"prompt_name": "document"}, {"prompt": ""}):
        _assert_same_vectors(export, **encode)


@pytest.mark.parametrize("include_prompt", [True, False])
@pytest.mark.parametrize("mode", ["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"])
def test_pooling_equals_sentence_transformers_with_left_and_right_padding(mode, include_prompt):
    """Each mode on random hidden states, right- and left-padded batches, a prompt of 2 tokens (and a row
    the prompt fills entirely), against sentence-transformers' Pooling module itself."""
    import torch
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling as TorchPooling

    from neobert_embed.inference.light import Pooling

    hidden = np.random.default_rng(0).standard_normal((3, 6, 4)).astype(np.float32)
    right = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]], dtype=np.int64)
    for mask in (right, right[:, ::-1].copy()):
        reference = TorchPooling(4, pooling_mode=mode, include_prompt=include_prompt)(
            {"token_embeddings": torch.from_numpy(hidden), "attention_mask": torch.from_numpy(mask),
             "prompt_length": 2})["sentence_embedding"].numpy()
        pooled = Pooling((mode,), 4, include_prompt)(hidden, mask, 2)
        np.testing.assert_allclose(pooled, reference, rtol=1e-5, atol=1e-6)


def test_a_module_the_light_runtime_cannot_run_is_one_error_naming_it(minilm_onnx, tmp_path):
    from neobert_embed.errors import UserInputError
    from neobert_embed.inference.light import load_light_model

    export = tmp_path / "dense"
    shutil.copytree(minilm_onnx, export)
    (export / "export.json").unlink()  # a SentenceTransformer directory made by hand: no pins to check
    modules = json.loads((export / "modules.json").read_text())
    dense = {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.base.modules.dense.Dense"}
    (export / "modules.json").write_text(json.dumps([*modules, dense]))
    with pytest.raises(UserInputError, match=r"module '3' \(sentence_transformers.base.modules.dense.Dense\).*"
                                             r"--backend torch"):
        load_light_model(export, "onnx")
    modules[1]["type"] = "my_package.MyPooling"
    (export / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UserInputError, match=r"module '1' \(my_package.MyPooling\).*--backend torch"):
        load_light_model(export, "onnx")


def test_an_export_records_the_fingerprint_of_the_weights_it_came_from(minilm_path, minilm_onnx):
    from neobert_embed.inference.light import exported_runtime, source_fingerprint
    from neobert_embed.inference.runtime import model_fingerprint
    from neobert_embed.sentence import load_sentence_model

    assert source_fingerprint(minilm_onnx) == model_fingerprint(load_sentence_model(str(minilm_path), device="cpu"))
    assert exported_runtime(minilm_onnx) == "onnx" and exported_runtime(minilm_path) is None


def test_export_checks_its_files_through_the_light_runtime(tiny_bert, tmp_path, monkeypatch):
    """The figures ``export`` reports are the cosines of the light runtime's vectors (what ``--backend onnx``
    runs) to the torch fp32 model's, on the same texts."""
    from neobert_embed.inference import export, light
    from neobert_embed.sentence import load_sentence_model

    encoded = []
    real_encode = light.LightModel.encode

    def recorded(self, *args, **kwargs):
        encoded.append(real_encode(self, *args, **kwargs))
        return encoded[-1]

    monkeypatch.setattr(light.LightModel, "encode", recorded)
    report = export.export_model(tiny_bert, tmp_path / "onnx", "onnx")
    assert len(encoded) == 1
    torch_model = load_sentence_model(str(tiny_bert), device="cpu", precision="fp32")
    reference = torch_model.encode(list(export.CHECK_TEXTS), batch_size=8)
    assert report.fp32 == export._agreement(reference, encoded[0])
    again = light.load_light_model(tmp_path / "onnx", "onnx").encode(list(export.CHECK_TEXTS))
    np.testing.assert_allclose(again, encoded[0], atol=1e-6)


def test_a_pipeline_the_light_runtime_refuses_is_checked_on_the_graphs_output(tiny_bert, tmp_path, monkeypatch):
    """A Dense module after the pooling: ``export`` checks the file with sentence-transformers' modules
    around the graph's hidden states, so a graph that computes something else is refused."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    from neobert_embed.errors import UserInputError
    from neobert_embed.inference import runners
    from neobert_embed.inference.export import export_model

    transformer = Transformer(str(tiny_bert), max_seq_length=64)
    width = transformer.get_embedding_dimension()
    SentenceTransformer(modules=[transformer, Pooling(width), Dense(width, 16)], prompts=PROMPTS,
                        default_prompt_name="query", device="cpu").save(str(tmp_path / "st"))
    report = export_model(tmp_path / "st", tmp_path / "onnx", "onnx")
    assert report.fp32.mean >= 0.9999 and report.fp32.texts == 16
    real_runner = runners.make_runner

    class Noisy:  # the graph's hidden states, plus noise
        def __init__(self, *args, **kwargs) -> None:
            self.runner = real_runner(*args, **kwargs)
            self.input_names = self.runner.input_names

        def __call__(self, arrays):
            hidden = self.runner(arrays)
            return hidden + np.random.default_rng(0).standard_normal(hidden.shape).astype(np.float32)

    monkeypatch.setattr(runners, "make_runner", Noisy)
    with pytest.raises(UserInputError, match="does not compute what the torch model does"):
        export_model(tmp_path / "st", tmp_path / "noisy", "onnx")


# --- whole processes without torch -------------------------------------------------------------------------


def _blocked_env(tmp_path: Path, blocked: bool = True) -> dict[str, str]:
    """An environment running this checkout whose interpreter cannot import torch, transformers or
    sentence-transformers (``blocked``)."""
    blocker = tmp_path / "blocker"
    if blocked:
        blocker.mkdir(exist_ok=True)
        (blocker / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    path = os.pathsep.join(filter(None, (str(blocker) if blocked else None, str(ROOT), os.environ.get("PYTHONPATH"))))
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _cli(args: list, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neobert_embed.cli", *map(str, args)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_the_blocker_blocks(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import torch"], env=_blocked_env(tmp_path), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and "blocked by the test" in done.stderr


@pytest.fixture(scope="module")
def minilm_index(minilm_path, tmp_path_factory) -> Path:
    """A flat index of 60 short documents built with the torch all-MiniLM-L6-v2."""
    from neobert_embed.index import build_index

    root = tmp_path_factory.mktemp("light-index")
    corpus = root / "corpus.jsonl"
    topics = ("cats", "stock markets", "football", "cooking pasta", "volcanoes", "jazz music")
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"Note {i}: a few words about {topics[i % 6]} "
                                          f"and item {i}."}) + "\n" for i in range(60)), encoding="utf-8")
    build_index(str(minilm_path), corpus, root / "index", index_type="flat", compute_precision="fp32",
                show_progress=False)
    return root / "index"


def test_encode_runs_an_export_without_torch(minilm_onnx, tmp_path):
    env = _blocked_env(tmp_path)
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS[:3]) + "\n", encoding="utf-8")
    done = _cli(["encode", "-m", minilm_onnx, "-i", "texts.txt", "-o", "out.npy", "--backend", "onnx"], env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "light runtime: no torch" in done.stderr and "onnxruntime" in done.stderr, done.stderr
    expected = _torch_model(minilm_onnx).encode(TEXTS[:3])
    assert _cosines(np.load(tmp_path / "out.npy"), expected).min() >= 0.99999
    refused = _cli(["encode", "-m", minilm_onnx, "-i", "texts.txt", "-o", "torch.npy"], env, tmp_path)
    assert refused.returncode == 2 and not (tmp_path / "torch.npy").exists()
    line, = refused.stderr.strip().splitlines()
    assert "--backend torch needs torch, transformers and sentence-transformers" in line and "install" in line


def test_encode_runs_an_openvino_export_without_torch(minilm_path, tmp_path):
    exported = _cli(["export", minilm_path, "--format", "openvino", "--output", "ov"],
                    _blocked_env(tmp_path, blocked=False), tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS[:3]) + "\n", encoding="utf-8")
    done = _cli(["encode", "-m", "ov", "-i", "texts.txt", "-o", "out.npy", "--backend", "openvino"],
                _blocked_env(tmp_path), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "openvino" in done.stderr and "light runtime: no torch" in done.stderr, done.stderr
    assert np.load(tmp_path / "out.npy").shape == (3, 384)


def test_index_search_through_an_export_without_torch_finds_the_torch_top_10(minilm_index, minilm_onnx, tmp_path):
    from neobert_embed.index import open_index

    queries = ["which notes talk about cats?", "market prices", "how to cook pasta", "lava and eruptions"]
    (tmp_path / "queries.txt").write_text("\n".join(queries) + "\n", encoding="utf-8")
    done = _cli(["index", "search", minilm_index, "--queries", "queries.txt", "--model", minilm_onnx, "--json"],
                _blocked_env(tmp_path), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "light runtime: no torch" in done.stderr, done.stderr
    light = [[hit["id"] for hit in json.loads(line)["hits"]] for line in done.stdout.splitlines()]
    with open_index(minilm_index, backend="torch") as index:
        reference = [[hit.doc_id for hit in hits] for hits in index.search(queries, k=10)]
    assert light == reference


def test_an_index_refuses_the_export_of_another_model_in_one_line(minilm_index, tiny_bert, tmp_path):
    from neobert_embed.sentence import load_sentence_model

    load_sentence_model(str(tiny_bert), device="cpu").save(str(tmp_path / "st"))
    other = _export(tmp_path / "st", tmp_path / "other-onnx")
    done = _cli(["index", "search", minilm_index, "cats", "--model", other], _blocked_env(tmp_path), tmp_path)
    assert done.returncode == 2
    line, = done.stderr.strip().splitlines()
    assert "was built with model" in line and "vectors are not comparable" in line, line


def test_an_index_built_through_an_export_records_its_source_weights(minilm_index, minilm_onnx, tmp_path):
    from neobert_embed.index import build_index, read_manifest

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"e{i}", "text": f"entry {i} on cats"}) + "\n" for i in range(5)))
    manifest = build_index(str(minilm_onnx), corpus, tmp_path / "index", index_type="flat", show_progress=False)
    assert manifest.model_fingerprint == read_manifest(minilm_index).model_fingerprint
    assert "light runtime: no torch" in manifest.compute["reason"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_serve_answers_with_an_export_without_torch(minilm_onnx, tmp_path):
    port = _free_port()
    log = tmp_path / "serve.log"
    with open(log, "w", encoding="utf-8") as stderr:
        server = subprocess.Popen([sys.executable, "-m", "neobert_embed.cli", "serve", "--model", str(minilm_onnx),
                                   "--backend", "onnx", "--port", str(port)], env=_blocked_env(tmp_path),
                                  cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/embed", data=json.dumps(
            {"inputs": TEXTS[:2], "prompt_name": "query"}).encode(), headers={"Content-Type": "application/json"})
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    vectors = np.array(json.loads(response.read()), dtype=np.float32)
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert "light runtime: no torch" in log.read_text()
    expected = _torch_model(minilm_onnx).encode(TEXTS[:2], prompt_name="query")
    assert _cosines(vectors, expected).min() >= 0.99999


def test_snli_queries_through_the_export_reach_the_torch_top_10(minilm_path, minilm_onnx, shared_data, tmp_path):
    """The SNLI retrieval task of ``benchmarks/precision_retrieval.py`` (first 300 triplets): every query's
    top-10 through the export against the torch model's on the same flat index (recall@10 ≥ 0.99)."""
    from neobert_embed.beir import write_triplet_task
    from neobert_embed.index import build_index, open_index

    with open(shared_data / "snli_pairs" / "triplets.jsonl", encoding="utf-8") as rows:
        triplets = [json.loads(line) for _, line in zip(range(300), rows, strict=False)]
    write_triplet_task(triplets, tmp_path / "task")
    build_index(str(minilm_path), tmp_path / "task" / "corpus.jsonl", tmp_path / "index", index_type="flat",
                compute_precision="fp32", show_progress=False)
    queries = [json.loads(line)["text"] for line in (tmp_path / "task" / "queries.jsonl").open(encoding="utf-8")]
    with open_index(tmp_path / "index", backend="torch") as index:
        reference = [{hit.doc_id for hit in hits} for hits in index.search(queries, k=10)]
    with open_index(tmp_path / "index", model=minilm_onnx) as index:
        assert "light runtime" in index.encoder.choice.reason
        light = [{hit.doc_id for hit in hits} for hits in index.search(queries, k=10)]
    recall = np.mean([len(a & b) / len(a) for a, b in zip(reference, light, strict=True)])
    assert recall >= 0.99, recall


def test_index_eval_scores_queries_encoded_through_the_export(minilm_index, minilm_onnx, tmp_path, monkeypatch):
    """``index eval --backend onnx --model EXPORT``: the judged queries go through the light runtime and
    score what the torch model's queries score."""
    from neobert_embed.index.evaluate import evaluate_index
    from neobert_embed.inference import light as light_module

    loaded = []
    real_load = light_module.load_light_model
    monkeypatch.setattr(light_module, "load_light_model", lambda *a, **k: loaded.append(a) or real_load(*a, **k))
    task = tmp_path / "task"
    (task / "qrels").mkdir(parents=True)
    queries = {"q1": "which notes talk about cats?", "q2": "how to cook pasta", "q3": "lava and eruptions"}
    (task / "queries.jsonl").write_text("".join(json.dumps({"_id": qid, "text": text}) + "\n"
                                                for qid, text in queries.items()), encoding="utf-8")
    judged = {"q1": (0, 6, 12), "q2": (3, 9, 15), "q3": (4, 10, 16)}
    (task / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{qid}\td{doc}\t1\n" for qid, docs in judged.items() for doc in docs), encoding="utf-8")
    light = evaluate_index(minilm_index, task, model=minilm_onnx, backend="onnx")
    torch_scores = evaluate_index(minilm_index, task, backend="torch")
    assert len(loaded) == 1  # the torch run loads no light model
    assert light["queries"] == 3 and abs(light["ndcg_at_10"] - torch_scores["ndcg_at_10"]) < 1e-4
