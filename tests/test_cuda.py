"""On a CUDA GPU, for real: what the CPU suite checks through substitutes.

Why: on CPU, ``tests/test_attention_dispatch.py`` checks the CUDA path by handing the model a
reference kernel in place of PyTorch's ``varlen_attn``, and the precision tests pretend a GPU
through a fake :class:`~neobert_embed.machine.Machine`. Those checks cannot catch a
kernel that disagrees with its reference, a dtype or layout the real kernel refuses, or a GPU
``auto`` that picks a precision its own tolerance rejects. This module runs them on a GPU and is
skipped everywhere else (CI has none); run it where one is lent::

    python -m pytest tests/test_cuda.py

Tolerances: bf16 paths are compared with the fp32 padded reference (cosine per real token) and
with each other (the un-padded kernel may not be less accurate than the padded one); fp32 paths
must equal the reference to fp32 rounding.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from neobert_embed.modeling import NeoBERTConfig, NeoBERTForMaskedLM, NeoBERTModel, attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

HEADS, HEAD_DIM = 4, 64  # a head size the flash kernels take (multiple of 8, ≤ 256)
LENGTHS = [1, 40, 17, 17, 200, 64, 3]
WORDS = ["the", "a", "an", "of", "to", "in", "and", "is", "was", "for", "on", "with", "as", "by", "at", "from",
         "that", "this", "it", "be", "are", "were", "not", "or", "but", "model", "models", "text", "texts",
         "vector", "vectors", "search", "index", "query", "document", "passage", "encoder", "attention", "token",
         "tokens", "long", "short", "sentence", "sentences", "cat", "dog", "sat", "mat", "quick", "brown", "fox",
         "jumps", "over", "lazy"]


def neobert(layers: int = 2, **config) -> NeoBERTModel:
    torch.manual_seed(0)
    return NeoBERTModel(NeoBERTConfig(hidden_size=HEADS * HEAD_DIM, num_hidden_layers=layers,
                                      num_attention_heads=HEADS, intermediate_size=512, vocab_size=1000,
                                      max_length=512, **config)).eval()


def mixed_batch(lengths: list[int], device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    width = max(lengths)
    ids = torch.randint(5, 1000, (len(lengths), width), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return (ids * mask).to(device), mask.to(device)


def token_cosine(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(reference.double(), other.double(), dim=-1)


class CountingVarlen:
    """PyTorch's own ``varlen_attn``, counting its calls (the model must really reach it)."""

    def __init__(self) -> None:
        from torch.nn.attention.varlen import varlen_attn

        self.kernel, self.calls = varlen_attn, 0

    def __call__(self, *args, **kwargs) -> torch.Tensor:
        self.calls += 1
        return self.kernel(*args, **kwargs)


@pytest.fixture
def counted_varlen(monkeypatch) -> CountingVarlen:
    spy = CountingVarlen()
    monkeypatch.setattr(attention, "load_native_varlen", lambda: spy)
    return spy


def test_bf16_runs_pytorch_s_varlen_kernel_and_is_as_accurate_as_the_padded_reference(counted_varlen):
    ids, mask = mixed_batch(LENGTHS)
    model = neobert().cuda()
    model.config.attention_backend = "padded"
    with torch.inference_mode():
        reference = model(ids, mask).last_hidden_state
    half = copy.deepcopy(model).to(torch.bfloat16)
    outputs = {}
    for backend in ("padded", "auto"):
        half.config.attention_backend = backend
        with torch.inference_mode():
            outputs[backend] = half(ids, mask).last_hidden_state.float()
    assert half.attention_kernel(mask, None) == "native_varlen"
    assert counted_varlen.calls == model.config.num_hidden_layers  # one call per layer for the whole batch
    real = mask.bool()
    assert not outputs["auto"][~real].any()
    cosines = {name: token_cosine(reference[real], out[real]) for name, out in outputs.items()}
    errors = {name: (out[real] - reference[real]).abs().mean().item() for name, out in outputs.items()}
    assert cosines["auto"].min() >= 0.999, cosines["auto"].min()
    assert errors["auto"] <= 1.5 * errors["padded"], errors


def test_bf16_autocast_over_fp32_weights_dispatches_to_the_varlen_kernel(counted_varlen):
    ids, mask = mixed_batch(LENGTHS)
    model = neobert().cuda()
    with torch.inference_mode():
        reference = model(ids, mask).last_hidden_state
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert model.attention_kernel(mask, None) == "native_varlen"
            mixed = model(ids, mask).last_hidden_state.float()
    assert counted_varlen.calls == model.config.num_hidden_layers
    real = mask.bool()
    assert token_cosine(reference[real], mixed[real]).min() >= 0.999


def test_fp32_on_a_gpu_runs_one_padded_sdpa_call_and_equals_the_grouped_varlen_path():
    """fp32 has no flash kernel: on a GPU the padded batch with its key mask (one SDPA call per layer)
    replaces the per-length loop, which stays the CPU's path; both give the same hidden states."""
    ids, mask = mixed_batch(LENGTHS)
    model = neobert().cuda()
    assert model.attention_kernel(mask, None) == "padded"
    with torch.inference_mode():
        padded = model(ids, mask).last_hidden_state
        model.config.attention_backend = "sdpa_varlen"
        grouped = model(ids, mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(grouped[real], padded[real], atol=1e-4, rtol=1e-4)


def test_packed_rows_train_through_the_varlen_kernel_with_the_sdpa_path_s_gradients(counted_varlen):
    """Packed pretraining rows under bf16 autocast: documents stay isolated, and loss and gradients
    match the CPU-checked SDPA path (``varlen_attn``'s backward is PyTorch's flash backward)."""
    ids = torch.randint(5, 1000, (2, 256), generator=torch.Generator().manual_seed(2)).cuda()
    mask = torch.ones_like(ids)
    mask[1, 230:] = 0
    cu_seqlens = torch.tensor([0, 50, 51, 256, 300, 450, 512], dtype=torch.int32, device="cuda")
    labels = ids.masked_fill(mask == 0, -100)
    losses, grads = {}, {}
    for backend in ("auto", "sdpa_varlen"):
        torch.manual_seed(0)
        mlm = NeoBERTForMaskedLM(neobert(attention_backend=backend).config).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = mlm(ids, mask, cu_seqlens=cu_seqlens, labels=labels).loss
        loss.backward()
        losses[backend] = loss.item()
        grads[backend] = torch.cat([p.grad.flatten().double() for p in mlm.parameters()])
    assert counted_varlen.calls == mlm.config.num_hidden_layers  # the backward is PyTorch's, not a second call
    assert losses["auto"] == pytest.approx(losses["sdpa_varlen"], rel=1e-2)
    assert token_cosine(grads["auto"], grads["sdpa_varlen"]).item() >= 0.999
    # isolation: the third document (ids[0, 51:256]) alone gives what it gave inside the packed row
    model = neobert().cuda()
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        packed = model(ids, mask, cu_seqlens=cu_seqlens).last_hidden_state[0, 51:256].float()
        alone = model(ids[:1, 51:256]).last_hidden_state[0].float()
    assert token_cosine(alone, packed).min() >= 0.999


def test_unpadded_bert_layers_on_a_gpu_give_the_library_s_hidden_states():
    from transformers import BertConfig, BertModel

    from neobert_embed.inference.unpadded import unpad_encoders

    torch.manual_seed(0)
    encoder = BertModel(BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=512, max_position_embeddings=256)).cuda().eval()
    ids, mask = mixed_batch(LENGTHS)
    with torch.inference_mode():
        expected = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        assert unpad_encoders(encoder) == ["BertModel"]
        got = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        with torch.autocast("cuda", dtype=torch.bfloat16):
            half = encoder(input_ids=ids, attention_mask=mask).last_hidden_state.float()
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=1e-4)
    assert token_cosine(expected[real], half[real]).min() >= 0.999


@pytest.fixture(scope="module")
def sentence_bert(tmp_path_factory):
    """A BERT (4 × 512) saved with its own small WordPiece vocabulary (no hub, no model package)."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    directory = tmp_path_factory.mktemp("models") / "bert"
    directory.mkdir()
    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab), model_max_length=256)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                         intermediate_size=2048, max_position_embeddings=256)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def sentence_neobert(sentence_bert, tmp_path_factory):
    """A NeoBERT (2 × 256, head size 64) with the same vocabulary, saved as an encoder directory."""
    from transformers import AutoTokenizer

    directory = tmp_path_factory.mktemp("models") / "neobert"
    tokenizer = AutoTokenizer.from_pretrained(str(sentence_bert))
    model = NeoBERTModel(NeoBERTConfig(hidden_size=HEADS * HEAD_DIM, num_hidden_layers=2, num_attention_heads=HEADS,
                                       intermediate_size=512, vocab_size=len(tokenizer), max_length=256))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def sample_texts(count: int = 96) -> list[str]:
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 200)))) for _ in range(count)]


def test_auto_precision_on_a_gpu_keeps_its_own_tolerance_and_says_what_it_chose(sentence_bert):
    from neobert_embed.inference.runtime import AUTO_TOLERANCE, cosine_to, load_inference_model
    from neobert_embed.machine import describe_machine

    machine = describe_machine("cuda")
    assert machine.bf16_units == torch.cuda.get_device_name(0)  # every GPU this toolkit targets has bf16
    texts = sample_texts()
    fp32 = load_inference_model(sentence_bert, "fp32", device="cuda")
    chosen = load_inference_model(sentence_bert, "auto", device="cuda", sample_texts=texts)
    assert next(chosen.model.parameters()).device.type == "cuda"
    assert [trial.precision for trial in chosen.choice.trials] == ["fp32", "bf16", "fp16"]
    assert chosen.choice.layout == fp32.choice.layout == "un-padded BertModel layers"
    print(chosen.choice.description, chosen.choice.trials)
    reference = fp32.model.encode(texts, convert_to_numpy=True)
    vectors = chosen.model.encode(texts, convert_to_numpy=True)
    cosine = cosine_to(reference, vectors)
    if chosen.choice.precision != "fp32":
        assert machine.name in chosen.choice.description
    assert AUTO_TOLERANCE.admits(float(cosine.mean()), float(cosine.min())), (cosine.mean(), cosine.min())


def test_bf16_asked_for_on_a_gpu_runs_in_bf16_autocast(sentence_bert):
    from neobert_embed.inference.runtime import cosine_to, load_inference_model

    texts = sample_texts(32)
    reference = load_inference_model(sentence_bert, "fp32", device="cuda").model.encode(texts)
    bf16 = load_inference_model(sentence_bert, "bf16", device="cuda")
    assert bf16.choice.description.startswith("bf16 (asked for)")
    cosine = cosine_to(reference, bf16.model.encode(texts))
    assert cosine.min() >= 0.999 and cosine.mean() < 1.0  # computed in bf16, not silently fp32


def test_training_on_a_gpu_defaults_to_bf16_autocast():
    from neobert_embed.devices import default_device
    from neobert_embed.training_precision import chosen_precision

    assert default_device() == "cuda"
    assert chosen_precision("auto", "cuda").label == f"bf16 autocast: {torch.cuda.get_device_name(0)}"


@pytest.mark.parametrize("model_fixture", ["sentence_bert", "sentence_neobert"])
def test_the_encode_command_on_a_gpu_runs_auto_and_records_it(model_fixture, request, tmp_path):
    """The user's default command on a GPU machine: ``encode`` (the GPU by default, precision auto), end to end."""
    import json

    from typer.testing import CliRunner

    from neobert_embed.cli import app
    from neobert_embed.inference.runtime import AUTO_TOLERANCE, cosine_to, load_inference_model

    model_dir = request.getfixturevalue(model_fixture)
    texts = sample_texts(48)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["encode", "--model", str(model_dir), "--input", str(tmp_path / "in.txt"),
                                      "--output", str(tmp_path / "v.npy")])
    assert result.exit_code == 0, result.output
    compute = json.loads((tmp_path / "v.npy.json").read_text(encoding="utf-8"))["compute"]
    print(model_fixture, compute["precision"], "|", compute["reason"], "|", compute["machine"])
    assert compute["requested"] == "auto" and compute["machine"].startswith("cuda")
    assert "bf16, fp16" in compute["machine"]
    assert [trial["precision"] for trial in compute["trials"]] == ["fp32", "bf16", "fp16"]
    reference = load_inference_model(model_dir, "fp32", device="cpu").model.encode(texts, convert_to_numpy=True)
    cosine = cosine_to(reference, np.load(tmp_path / "v.npy"))
    assert AUTO_TOLERANCE.admits(float(cosine.mean()), float(cosine.min())), (cosine.mean(), cosine.min())
