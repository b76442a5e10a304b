"""NeoBERT (neobert_embed.modeling): exactness vs the original math, attention paths, loading."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
import torch.nn.functional as F
from official_checkpoint import (
    HEADS,
    HIDDEN,
    LAYERS,
    MAX_LENGTH,
    VOCAB,
    official_config,
    official_weights,
    swiglu_width,
    write_official_checkpoint,
)
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
)

from neobert_embed.errors import UserInputError
from neobert_embed.modeling import (
    NeoBERTConfig,
    NeoBERTForMaskedLM,
    NeoBERTForSequenceClassification,
    NeoBERTModel,
)

CLEAN = {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set(), "error_msgs": []}


def reference_forward(w: dict, ids: torch.Tensor, mask: torch.Tensor, eps: float = 1e-5):
    """The original NeoBERT computation, written out: per-head qkv split, complex (adjacent-pair)
    RoPE, masked softmax attention, gate-first SwiGLU, RMSNorm; returns (hidden, logits)."""
    batch, length = ids.shape
    d = HIDDEN // HEADS
    freqs = 1.0 / (10000 ** (torch.arange(0, d, 2)[: d // 2].float() / d))
    angles = torch.outer(torch.arange(length), freqs).float()
    rotation = torch.polar(torch.ones_like(angles), angles)

    def rope(t):
        pairs = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * rotation[None, :, None, :]).flatten(3)

    def rms(t, gain):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * gain

    x = w["model.encoder.weight"][ids]
    for i in range(LAYERS):
        p = f"model.transformer_encoder.{i}."
        qkv = (rms(x, w[p + "attention_norm.weight"]) @ w[p + "qkv.weight"].T).view(batch, length, HEADS, 3 * d)
        q, k, v = rope(qkv[..., :d]), rope(qkv[..., d:2 * d]), qkv[..., 2 * d:]
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
        scores = scores.masked_fill(~mask.bool()[:, None, None, :], float("-inf"))
        attended = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(batch, length, HIDDEN)
        x = x + attended @ w[p + "wo.weight"].T
        gate_value = rms(x, w[p + "ffn_norm.weight"]) @ w[p + "ffn.w12.weight"].T
        f = swiglu_width(official_config()["intermediate_size"])
        assert gate_value.shape[-1] == 2 * f
        x = x + (F.silu(gate_value[..., :f]) * gate_value[..., f:]) @ w[p + "ffn.w3.weight"].T
    hidden = rms(x, w["model.layer_norm.weight"])
    return hidden, hidden @ w["decoder.weight"].T + w["decoder.bias"]


def mixed_batch(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded random ids with real tokens never equal to pad (0)."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(1, VOCAB, (len(lengths), width), generator=g)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


def tiny_model(**config) -> NeoBERTModel:
    torch.manual_seed(0)
    defaults = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=96,
                    vocab_size=VOCAB, max_length=MAX_LENGTH)
    return NeoBERTModel(NeoBERTConfig(**{**defaults, **config})).eval()


def real_tokens(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return hidden[mask.bool()]


@pytest.fixture(scope="module")
def official_dir(tmp_path_factory):
    return write_official_checkpoint(tmp_path_factory.mktemp("official"))


@pytest.mark.parametrize("backend", ["auto", "padded"])
def test_official_checkpoint_matches_reference_math(official_dir, backend):
    ids, mask = mixed_batch([MAX_LENGTH, 1, 23, 40])
    hidden_ref, logits_ref = reference_forward(official_weights(), ids, mask)
    base, base_info = AutoModel.from_pretrained(official_dir, output_loading_info=True,
                                                attention_backend=backend)
    mlm, mlm_info = AutoModelForMaskedLM.from_pretrained(official_dir, output_loading_info=True,
                                                         attention_backend=backend)
    assert isinstance(base, NeoBERTModel) and isinstance(mlm, NeoBERTForMaskedLM)
    assert base_info == CLEAN and mlm_info == CLEAN
    with torch.no_grad():
        hidden = base(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state
        logits = mlm(input_ids=ids, attention_mask=mask).logits
    assert (real_tokens(hidden, mask) - real_tokens(hidden_ref, mask)).abs().max() <= 1e-4
    assert (real_tokens(logits, mask) - real_tokens(logits_ref, mask)).abs().max() <= 1e-4


def test_inputs_embeds_and_eager_request_use_the_same_math(official_dir):
    model = AutoModel.from_pretrained(official_dir).eval()
    eager = AutoModel.from_pretrained(official_dir, attn_implementation="eager").eval()
    ids, mask = mixed_batch([7, 2, 12])
    assert model.attention_kernel(mask, None) == "sdpa_varlen" and eager.attention_kernel(mask, None) == "padded"
    with torch.no_grad():
        expected = model(ids, mask).last_hidden_state
        from_embeds = model(inputs_embeds=model.encoder(ids), attention_mask=mask).last_hidden_state
        from_eager = eager(ids, mask).last_hidden_state
    assert torch.equal(expected, from_embeds)
    assert (real_tokens(from_eager, mask) - real_tokens(expected, mask)).abs().max() <= 1e-5
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        model(attention_mask=mask)


def test_official_config_loads_natively_despite_auto_map(official_dir):
    config = AutoConfig.from_pretrained(official_dir)  # trust_remote_code not given: never prompts
    assert type(config) is NeoBERTConfig
    assert config.max_position_embeddings == MAX_LENGTH and config.dim_head == HIDDEN // HEADS
    assert config.auto_map["AutoModel"] == "model.NeoBERT"
    assert type(AutoModel.from_pretrained(official_dir, trust_remote_code=False)) is NeoBERTModel


def test_save_pretrained_round_trips_under_transformers_5(official_dir, tmp_path):
    model = AutoModelForMaskedLM.from_pretrained(official_dir).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["max_position_embeddings"] == MAX_LENGTH and "max_length" not in saved
    reloaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    ids, mask = mixed_batch([5, 9])
    with torch.no_grad():
        assert torch.equal(model(ids, mask).logits, reloaded(ids, mask).logits)


def test_unpadded_padded_and_one_at_a_time_agree():
    model = tiny_model()
    lengths = [1, MAX_LENGTH, 17, 40, 17]  # a length-1, a full-length and an equal-length pair
    ids, mask = mixed_batch(lengths)
    with torch.no_grad():
        unpadded = model(ids, mask, output_hidden_states=True)
        model.config.attention_backend = "padded"
        padded = model(ids, mask, output_hidden_states=True)
        model.config.attention_backend = "auto"
        singles = [model(ids[i:i + 1, :n]).last_hidden_state[0] for i, n in enumerate(lengths)]
    assert model.attention_kernel(mask, None) == "sdpa_varlen"
    assert (real_tokens(unpadded.last_hidden_state, mask) - real_tokens(padded.last_hidden_state, mask)).abs().max() <= 1e-5
    for i, n in enumerate(lengths):
        assert (unpadded.last_hidden_state[i, :n] - singles[i]).abs().max() <= 1e-5
        assert not unpadded.last_hidden_state[i, n:].any()  # re-padded with zeros
    assert len(unpadded.hidden_states) == len(padded.hidden_states) == 3
    for a, b in zip(unpadded.hidden_states, padded.hidden_states, strict=True):
        assert (real_tokens(a, mask) - real_tokens(b, mask)).abs().max() <= 1e-5


def test_unpadded_gradients_match_padded():
    lengths = [1, 30, 12]
    ids, mask = mixed_batch(lengths)
    grads = {}
    for backend in ("varlen", "padded"):
        model = tiny_model(attention_backend=backend).train()
        hidden = model(ids, mask).last_hidden_state
        weights = torch.linspace(-1, 1, hidden.shape[-1])
        (real_tokens(hidden, mask) * weights).sum().backward()
        grads[backend] = {n: p.grad for n, p in model.named_parameters()}
    for name, grad in grads["varlen"].items():
        assert (grad - grads["padded"][name]).abs().max() <= 1e-5 * max(1.0, grad.abs().max()), name


def test_bf16_unpadded_path_runs_and_tracks_fp32():
    model = tiny_model()
    ids, mask = mixed_batch([3, 20, 9])
    with torch.no_grad():
        reference = model(ids, mask).last_hidden_state
        low = model.to(torch.bfloat16)(ids, mask).last_hidden_state
    assert low.dtype == torch.bfloat16
    assert (real_tokens(low.float(), mask) - real_tokens(reference, mask)).abs().max() < 0.1


def test_packed_documents_do_not_attend_across_boundaries():
    model = tiny_model()
    docs = [5, 1, 10, 7, 9]  # two packed rows of 16 tokens: [5, 1, 10] and [7, 9]
    ids, _ = mixed_batch([32])
    ids = ids.view(2, 16)
    cu_seqlens = torch.tensor([0, 5, 6, 16, 23, 32], dtype=torch.int32)
    with torch.no_grad():
        packed = model(ids, cu_seqlens=cu_seqlens).last_hidden_state.reshape(32, -1)
        flat = ids.reshape(-1)
        starts = cu_seqlens.tolist()
        for start, n in zip(starts, docs, strict=False):
            alone = model(flat[start:start + n][None]).last_hidden_state[0]
            assert (packed[start:start + n] - alone).abs().max() <= 1e-5


def test_packed_rows_with_padding_mask_and_mlm_loss():
    model = NeoBERTForMaskedLM(tiny_model().config).eval()
    ids, _ = mixed_batch([12])
    row = ids.view(1, 12)
    mask = torch.tensor([[1] * 9 + [0] * 3])  # docs [4, 5] then 3 pad tokens
    cu_seqlens = torch.tensor([0, 4, 12], dtype=torch.int32)
    labels = torch.full_like(row, -100)
    labels[0, [1, 6]] = row[0, [1, 6]]
    with torch.no_grad():
        packed = model(row, mask, cu_seqlens=cu_seqlens, labels=labels)
        first = model(row[:, :4]).logits[0, 1]
        second = model(row[:, 4:9]).logits[0, 2]
    assert (packed.logits[0, 1] - first).abs().max() <= 1e-5
    assert (packed.logits[0, 6] - second).abs().max() <= 1e-5
    expected = (F.cross_entropy(first[None], row[0, [1]]) + F.cross_entropy(second[None], row[0, [6]])) / 2
    assert abs(packed.loss.item() - expected.item()) <= 1e-5


def test_bad_cu_seqlens_is_a_clear_error():
    model = tiny_model()
    ids, _ = mixed_batch([8])
    with pytest.raises(ValueError, match="cu_seqlens must start at 0 and end at batch"):
        model(ids, cu_seqlens=torch.tensor([0, 5], dtype=torch.int32))
    model.config.attention_backend = "padded"
    with pytest.raises(ValueError, match="need the varlen attention path"):
        model(ids, cu_seqlens=torch.tensor([0, 8], dtype=torch.int32))


def test_default_config_parameter_count():
    config = NeoBERTConfig()
    assert (config.num_hidden_layers, config.hidden_size, config.max_position_embeddings) == (28, 768, 4096)
    with torch.device("meta"):
        mlm = NeoBERTForMaskedLM(config)
    with_head = sum(p.numel() for p in mlm.parameters())
    without_head = sum(p.numel() for p in mlm.model.parameters())
    h, v, f = 768, 30522, swiglu_width(3072)
    assert f == 2048
    per_layer = 3 * h * h + h * h + 2 * f * h + f * h + 2 * h
    assert without_head == v * h + 28 * per_layer + h == 221_665_536
    assert with_head == without_head + v * h + v == 245_136_954
    assert abs(with_head / 250e6 - 1) < 0.02  # the paper's "250M" (see README for the exact figure)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"hidden_size": 770, "num_attention_heads": 12}, "hidden_size \\(770\\) must be divisible by num_attention_heads"),
    ({"hidden_size": 96, "num_attention_heads": 32}, "must be even"),
    ({"dim_head": 32}, "dim_head \\(32\\) disagrees"),
    ({"max_length": 512, "max_position_embeddings": 1024}, "max_length \\(512\\) and max_position_embeddings"),
    ({"attention_backend": "fast"}, "attention_backend 'fast'"),
    ({"rope_scaling": {"rope_type": "llama4", "factor": 2.0}}, "rope_type 'llama4'"),
    ({"rope_scaling": {"rope_type": "yarn"}}, "needs a 'factor'"),
])
def test_invalid_config_fails_at_construction(kwargs, message):
    with pytest.raises(UserInputError, match=message):
        NeoBERTConfig(**kwargs)


def test_wrong_shaped_checkpoint_error_names_the_key(tmp_path):
    weights = official_weights()
    weights["model.transformer_encoder.1.wo.weight"] = torch.zeros(HIDDEN, HIDDEN // 2)
    directory = write_official_checkpoint(tmp_path, weights)
    for auto_class in (AutoModel, AutoModelForMaskedLM):
        with pytest.raises(UserInputError, match=r"transformer_encoder\.1\.wo\.weight: checkpoint \(64, 32\)"):
            auto_class.from_pretrained(directory)


def test_rope_scaling_dynamic_and_yarn(tmp_path, monkeypatch):
    from neobert_embed.modeling import model as model_module

    warnings = []
    monkeypatch.setattr(model_module.logger, "warning_once", warnings.append)
    ids, _ = mixed_batch([2 * MAX_LENGTH])
    plain = tiny_model()
    dynamic = tiny_model(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    yarn = tiny_model(rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with torch.no_grad():
        plain(ids)  # beyond the trained length without scaling: works, warns once
        assert len(warnings) == 1 and "set rope_scaling" in warnings[0]
        short = ids[:, :MAX_LENGTH]
        assert torch.equal(plain(short).last_hidden_state, dynamic(short).last_hidden_state)
        long_plain, long_dynamic = plain(ids).last_hidden_state, dynamic(ids).last_hidden_state
        assert not torch.equal(long_plain, long_dynamic)  # θ grew beyond the trained length
        positions = torch.arange(2 * MAX_LENGTH)
        assert (plain.rotary(positions) - dynamic.rotary(positions)).abs().max() > 0.1
        long_yarn = yarn(ids).last_hidden_state
        assert torch.isfinite(long_yarn).all() and not torch.equal(long_yarn, long_plain)
        assert yarn.rotary.attention_scaling > 1.0  # YaRN's attention temperature
    yarn.save_pretrained(tmp_path)
    reloaded = AutoModel.from_pretrained(tmp_path).eval()
    assert reloaded.config.rope_parameters["rope_type"] == "yarn"
    assert reloaded.config.rope_parameters["original_max_position_embeddings"] == MAX_LENGTH
    with torch.no_grad():
        assert torch.equal(reloaded(ids).last_hidden_state, long_yarn)


def test_sequence_classification_from_official_checkpoint(official_dir):
    model, info = AutoModelForSequenceClassification.from_pretrained(official_dir, num_labels=3,
                                                                     output_loading_info=True)
    assert isinstance(model, NeoBERTForSequenceClassification)
    assert info["missing_keys"] == {"dense.weight", "dense.bias", "classifier.weight", "classifier.bias"}
    assert info["unexpected_keys"] == set() and info["mismatched_keys"] == set()
    ids, mask = mixed_batch([4, 9])
    out = model(ids, mask, labels=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3) and torch.isfinite(out.loss)
    out.loss.backward()
    assert model.classifier.weight.grad is not None


def test_gradient_checkpointing_trains_on_unpadded_batches():
    model = NeoBERTForMaskedLM(tiny_model().config).train()
    model.activation_checkpointing_enable()
    ids, mask = mixed_batch([3, 11])
    labels = ids.masked_fill(mask == 0, -100)
    model(ids, mask, labels=labels).loss.backward()
    assert model.model.transformer_encoder[0].qkv.weight.grad.abs().sum() > 0


def test_sentence_transformers_pipeline_batch_equals_single(tmp_path):
    from tiny_models import build_tiny_model

    from neobert_embed import load_sentence_model

    model = load_sentence_model(str(build_tiny_model("neobert", tmp_path / "neo")))
    texts = ["", "a short one", "a considerably longer sentence that needs many more word pieces"]
    batch = model.encode(texts, convert_to_tensor=True)
    singles = torch.stack([model.encode([t], convert_to_tensor=True)[0] for t in texts])
    assert (batch - singles).abs().max() <= 1e-5


def test_no_optional_kernels_imported_on_cpu():
    model = tiny_model()
    ids, mask = mixed_batch([2, 5])
    model(ids, mask)
    assert "flash_attn" not in sys.modules and "xformers" not in sys.modules
