"""``neobert-embed export`` and the light runtime: ONNX / OpenVINO files that compute what torch does.

Every export runs through the console script's entry point; the exported files are loaded back by
the light runtime (``load_light_model``, what ``--backend onnx|openvino`` runs) and compared with the
torch fp32 model on real texts (STS-B dev sentences and AG News articles from ``../shared/data``): fp32
graphs to a mean cosine of 0.9999, MiniLM's int8 ONNX file to the quantization target (mean 0.995,
minimum 0.98 over 256 texts).

These cases run in their own interpreter (``tests/test_export.py``): once OpenVINO's runtime has run
in a process, a SIGINT raised later in that process by the training tests' Ctrl-C cases crashed it
(SIGSEGV under pytest; not reproduced outside it), and a command of the toolkit loads OpenVINO only
in its own process (``export``, ``--backend openvino``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safety_helpers import snapshot
from tiny_models import build_tiny_model

PROMPTS = {"query": "query: ", "document": "passage: "}


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def real_texts(shared_data: Path) -> list[str]:
    """256 real texts of mixed length: 128 STS-B dev sentences and 128 AG News articles."""
    texts: list[str] = []
    with open(shared_data / "stsb" / "dev.jsonl", encoding="utf-8") as rows:
        for line in rows:
            row = json.loads(line)
            texts += [row["sentence1"], row["sentence2"]]
            if len(texts) >= 128:
                break
    with open(shared_data / "ag_news" / "test.jsonl", encoding="utf-8") as rows:
        for line in rows:
            texts.append(json.loads(line)["text"])
            if len(texts) >= 256:
                break
    return texts


@pytest.fixture(scope="module")
def neobert_dir(tmp_path_factory) -> Path:
    """A tiny random NeoBERT saved as a SentenceTransformer with query/document prompts."""
    from neobert_embed.sentence import load_sentence_model

    root = tmp_path_factory.mktemp("neobert")
    plain = build_tiny_model("neobert", root / "plain", seed=0)
    load_sentence_model(str(plain), prompts=PROMPTS).save(str(root / "st"))
    return root / "st"


@pytest.fixture(scope="module")
def minilm_reference(minilm_path: Path, real_texts: list[str]) -> np.ndarray:
    """The torch fp32 all-MiniLM-L6-v2 embeddings of the real texts."""
    from neobert_embed.sentence import load_sentence_model

    return load_sentence_model(str(minilm_path), device="cpu").encode(real_texts, batch_size=32)


@pytest.fixture(scope="module")
def neobert_onnx(neobert_dir: Path, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("exports") / "neobert-onnx"
    _export(neobert_dir, output, "onnx")
    return output


def _export(model: Path, output: Path, format: str, *extra: str) -> str:  # noqa: A002
    """Run ``neobert-embed export`` through the console script's entry point; its one stdout line."""
    code, out, err = _main(["export", model, "--format", format, "--output", output, *extra])
    assert code == 0, err
    assert out.startswith("exported ") and "cosine to torch fp32" in out, out
    return out


def _main(args: list) -> tuple[int, str, str]:
    """:func:`safety_helpers.run_main` without ``capsys`` (module-scoped fixtures cannot use it)."""
    import contextlib
    import io
    import sys
    from unittest import mock

    from neobert_embed.cli import main

    out, err = io.StringIO(), io.StringIO()
    with mock.patch.object(sys, "argv", ["neobert-embed", *map(str, args)]), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def _graph_inputs(file: Path) -> dict[str, list]:
    import onnx

    graph = onnx.load(str(file), load_external_data=False).graph
    return {value.name: [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]
            for value in graph.input}


def test_neobert_onnx_matches_the_unpadded_torch_model(neobert_dir, neobert_onnx, real_texts):
    from neobert_embed.inference.light import load_light_model
    from neobert_embed.sentence import load_sentence_model

    record = json.loads((neobert_onnx / "export.json").read_text())
    assert record["writer"] == "neobert-embed export" and record["fp32"]["mean"] >= 0.9999
    assert _graph_inputs(neobert_onnx / "onnx" / "model.onnx") == {
        "input_ids": ["batch_size", "sequence_length"], "attention_mask": ["batch_size", "sequence_length"]}
    torch_model = load_sentence_model(str(neobert_dir), device="cpu")
    assert torch_model[0].auto_model.config.attention_backend == "auto"  # the saved model runs un-padded
    exported = load_light_model(neobert_onnx, "onnx", threads=1)
    assert exported.runner.name == "ONNX Runtime" and exported.prompts == torch_model.prompts
    assert exported.max_seq_length == torch_model.max_seq_length
    assert exported.similarity_fn_name == torch_model.similarity_fn_name
    texts = real_texts[::4]  # 64 texts, long and short in each batch
    for kwargs in ({}, {"prompt_name": "query", "normalize_embeddings": True}):
        reference = torch_model.encode(texts, batch_size=16, **kwargs)
        vectors = exported.encode(texts, batch_size=16, **kwargs)
        assert vectors.shape == reference.shape
        assert _cosines(vectors, reference).mean() >= 0.9999, kwargs


def test_an_exported_graph_runs_and_is_recorded_on_the_cpu_where_models_default_to_a_gpu(neobert_onnx,
                                                                                         monkeypatch):
    """ONNX Runtime runs an export on its CPU device unless told otherwise, so on a GPU machine the
    record (and the int8 check) must name the CPU, not the GPU the torch backend would use."""
    from neobert_embed import devices
    from neobert_embed.inference.runtime import load_inference_model

    monkeypatch.setattr(devices, "default_device", lambda: "cuda")
    loaded = load_inference_model(neobert_onnx, "auto", backend="onnx")
    assert loaded.choice.machine.startswith("cpu "), loaded.choice.machine
    # a device given is the one the runtime is asked for, never described while the CPU runs it
    from neobert_embed.errors import UserInputError

    with pytest.raises(UserInputError, match="this onnxruntime runs on"):
        load_inference_model(neobert_onnx, "auto", backend="onnx", device="cuda")


def test_neobert_openvino_replaces_an_earlier_export_only_with_overwrite(neobert_dir, neobert_onnx, tmp_path,
                                                                        real_texts):
    import shutil

    from neobert_embed.inference.light import load_light_model
    from neobert_embed.sentence import load_sentence_model

    output = tmp_path / "neobert"
    shutil.copytree(neobert_onnx, output)
    code, _, err = _main(["export", neobert_dir, "--format", "openvino", "--output", output])
    assert code == 2 and "--overwrite" in err, err
    _export(neobert_dir, output, "openvino", "--overwrite")
    assert sorted(p.name for p in (output / "openvino").iterdir()) == ["openvino_model.bin", "openvino_model.xml"]
    assert not (output / "onnx").exists()  # the whole earlier export was replaced
    assert json.loads((output / "export.json").read_text())["format"] == "openvino"
    texts = real_texts[1::4]
    reference = load_sentence_model(str(neobert_dir), device="cpu").encode(texts, prompt_name="document")
    vectors = load_light_model(output, "openvino", inference_precision="fp32").encode(texts, prompt_name="document")
    assert _cosines(vectors, reference).mean() >= 0.9999


def test_minilm_onnx_fp32_and_int8(minilm_path, minilm_reference, real_texts, tmp_path):
    from neobert_embed.inference.light import load_light_model

    output = tmp_path / "minilm-onnx"
    line = _export(minilm_path, output, "onnx", "--quantize", "int8")
    assert "model_qint8_avx512_vnni.onnx" in line
    inputs = _graph_inputs(output / "onnx" / "model.onnx")
    assert list(inputs) == ["input_ids", "attention_mask", "token_type_ids"]  # BERT's tokenizer makes them
    assert inputs["input_ids"] == ["batch_size", "sequence_length"]
    assert (output / "onnx" / "model_qint8_avx512_vnni.onnx").stat().st_size < 0.4 * (
        output / "onnx" / "model.onnx").stat().st_size
    fp32 = load_light_model(output, "onnx").encode(real_texts[::4], batch_size=32)
    assert _cosines(fp32, minilm_reference[::4]).mean() >= 0.9999
    int8 = _cosines(load_light_model(output, "onnx", quantized=True).encode(real_texts, batch_size=32),
                    minilm_reference)
    assert int8.mean() >= 0.995 and int8.min() >= 0.98, (int8.mean(), int8.min())


def test_minilm_openvino_matches_torch(minilm_path, minilm_reference, real_texts, tmp_path):
    from neobert_embed.errors import UserInputError
    from neobert_embed.inference.light import load_light_model

    output = tmp_path / "minilm-openvino"
    _export(minilm_path, output, "openvino")
    vectors = load_light_model(output, "openvino", inference_precision="fp32").encode(real_texts[::4], batch_size=32)
    assert _cosines(vectors, minilm_reference[::4]).mean() >= 0.9999
    with pytest.raises(UserInputError, match="openvino_model_qint8_quantized.xml not found"):
        load_light_model(output, "openvino", quantized=True)  # no int8 file was asked for


@pytest.mark.parametrize(("arch", "inputs"), [
    ("bert", ["input_ids", "attention_mask", "token_type_ids"]),
    ("roberta", ["input_ids", "attention_mask"]),  # its tokenizer makes no token_type_ids
    ("nomicbert", ["input_ids", "attention_mask", "token_type_ids"]),
    ("modernbert", ["input_ids", "attention_mask"]),  # its forward takes none
])
def test_every_backbone_exports(arch, inputs, tmp_path):
    from neobert_embed.inference.export import export_model

    model = build_tiny_model(arch, tmp_path / arch, seed=1)
    if arch == "roberta":  # the shared BERT vocabulary, but no token_type_ids, as RoBERTa's own tokenizer
        settings = json.loads((model / "tokenizer_config.json").read_text())
        settings["model_input_names"] = ["input_ids", "attention_mask"]
        (model / "tokenizer_config.json").write_text(json.dumps(settings))
    report = export_model(model, tmp_path / "onnx", "onnx")
    assert report.fp32.mean >= 0.9999 and report.fp32.texts == 16
    assert list(report.inputs) == inputs == list(_graph_inputs(tmp_path / "onnx" / "onnx" / "model.onnx"))


def test_foreign_output_is_refused_and_left_intact(neobert_dir, tmp_path):
    output = tmp_path / "mine"
    output.mkdir()
    (output / "notes.txt").write_bytes(b"precious \x00 bytes")
    before = snapshot(output)
    for extra in ([], ["--overwrite"]):
        code, _, err = _main(["export", neobert_dir, "--format", "onnx", "--output", output, *extra])
        assert code == 2 and str(output) in err and "nothing was deleted" in err, err
        assert snapshot(output) == before
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = _main(["export", neobert_dir, "--format", "onnx", "--output", blocker / "out"])
    assert code == 2 and "is a file" in err


def test_a_failed_export_leaves_nothing(neobert_dir, tmp_path, monkeypatch):
    from neobert_embed.errors import UserInputError
    from neobert_embed.inference import export

    monkeypatch.setattr(export, "_agreement", lambda *_: export.Agreement(mean=0.5, minimum=0.1, texts=16))
    with pytest.raises(UserInputError, match="mean cosine 0.500000"):
        export.export_model(neobert_dir, tmp_path / "out", "onnx")
    assert [p.name for p in tmp_path.iterdir() if p.suffix != ".lock"] == []  # no output, no temporary sibling


def test_bad_format_fails_naming_the_flag(neobert_dir, tmp_path):
    code, _, err = _main(["export", neobert_dir, "--format", "bogus", "--output", tmp_path / "x"])
    assert code == 2 and "--format" in err and "onnx, openvino" in err
    code, _, err = _main(["export", neobert_dir, "--format", "onnx", "--quantize", "int4", "--output",
                             tmp_path / "x"])
    assert code == 2 and "--quantize" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("backend", ["onnx", "openvino"])
def test_a_truncated_graph_is_one_located_error(neobert_dir, neobert_onnx, tmp_path, backend):
    """An exported graph cut short (a full disk, an interrupted copy) is named with what to do, through
    ``encode --backend``; the runtimes' own errors (onnxruntime's InvalidProtobuf) were tracebacks."""
    import shutil

    output = tmp_path / "export"
    if backend == "onnx":
        shutil.copytree(neobert_onnx, output)
    else:
        _export(neobert_dir, output, "openvino")
    graph = next((output / backend).glob("*.onnx" if backend == "onnx" else "*.xml"))
    graph.write_bytes(graph.read_bytes()[:100])
    texts = tmp_path / "texts.txt"
    texts.write_text("a sentence\n", encoding="utf-8")
    # the export's pins catch it first; a directory without them (made by hand) reaches the runtime's error
    for start, again in ((f"error: {graph}: 100 bytes, but", "export the model again"),
                         (f"error: {graph}: not a readable", "export it again")):
        code, _, err = _main(["encode", "--model", output, "--backend", backend, "--input", texts, "--output",
                              tmp_path / "out.npy"])
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and "Traceback" not in err, err[-2000:]
        assert lines[-1].startswith(start) and again in lines[-1], lines[-1]
        assert not (tmp_path / "out.npy").exists()
        (output / "export.json").unlink(missing_ok=True)
