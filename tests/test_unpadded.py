"""Un-padded inference for BERT-family encoders (:mod:`neobert_embed.inference.unpadded`): the same
hidden states as the library's padded forward, at every compute precision, through the commands'
own loader; and the library's forward wherever the un-padded one does not apply."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel, RobertaConfig, RobertaModel, XLMRobertaConfig, XLMRobertaModel

from neobert_embed.inference.pipeline import SIDE_BY_SIDE, engine_of
from neobert_embed.inference.runtime import cosine_to, load_inference_model
from neobert_embed.inference.unpadded import restore_padded, supports_unpadded, unpad_encoders, unpadded_class
from neobert_embed.machine import describe_machine

SMALL = {"vocab_size": 120, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 64, "max_position_embeddings": 64}


def _batch(lengths: list[int], pad_id: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids 5..100 padded with ``pad_id`` to the longest of ``lengths``, and their mask."""
    generator = torch.Generator().manual_seed(0)
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(5, 100, mask.shape, generator=generator).masked_fill(mask == 0, pad_id)
    return ids, mask


@pytest.mark.parametrize("encoder", [
    BertModel(BertConfig(**SMALL)), RobertaModel(RobertaConfig(**SMALL, pad_token_id=1)),
    XLMRobertaModel(XLMRobertaConfig(**SMALL, pad_token_id=1)),
], ids=["bert", "roberta", "xlm-roberta"])
def test_unpadded_layers_give_the_library_s_hidden_states_for_every_real_token(encoder):
    torch.manual_seed(0)
    encoder.eval()
    ids, mask = _batch([3, 17, 9, 17, 1])
    types = (torch.arange(ids.shape[1])[None, :] >= 2).long() * mask  # a second segment, as pairs have
    with torch.inference_mode():
        expected = encoder(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        library_class = type(encoder)
        assert unpad_encoders(encoder) == [library_class.__name__] and type(encoder) is unpadded_class(library_class)
        got = encoder(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    real = mask.bool()
    assert got.shape == expected.shape
    torch.testing.assert_close(got[real], expected[real], atol=2e-5, rtol=1e-4)
    assert not got[~real].any()  # padding positions hold zeros; pooling masks them either way
    restore_padded(encoder)
    assert type(encoder) is library_class and "forward" not in vars(encoder)


def test_a_batch_without_padding_or_asking_for_every_layer_runs_the_library_forward():
    torch.manual_seed(0)
    encoder = BertModel(BertConfig(**SMALL)).eval()
    unpad_encoders(encoder)
    ids, mask = _batch([6, 6])
    with torch.inference_mode():
        plain = encoder(input_ids=ids, attention_mask=mask)
        padded_ids, padded_mask = _batch([6, 2])
        layers = encoder(input_ids=padded_ids, attention_mask=padded_mask, output_hidden_states=True)
    assert plain.pooler_output is not None  # the library's own output: the un-padded one has no pooler
    assert layers.hidden_states is not None and len(layers.hidden_states) == SMALL["num_hidden_layers"] + 1


@pytest.fixture
def simulated_gpu(monkeypatch):
    """Dispatch as on a CUDA sm80+ GPU in bf16 (the real choice function decides), with the reference
    kernel of tests/test_attention_dispatch.py in place of PyTorch's CUDA ``varlen_attn``."""
    from test_attention_dispatch import ReferenceVarlen

    from neobert_embed.modeling import attention

    kernel = ReferenceVarlen()
    real_choice = attention.choose_attention_backend
    monkeypatch.setattr(attention, "choose_attention_backend", lambda requested, device_type, dtype, **options:
                        real_choice(requested, "cuda", torch.bfloat16,
                                    **{**options, "flash_capable_gpu": True, "native_available": True}))
    monkeypatch.setattr(attention, "load_native_varlen", lambda: kernel)
    return kernel


def test_on_a_gpu_bert_layers_attend_through_one_varlen_call_per_layer(simulated_gpu):
    """Never a call per group of equal-length texts on CUDA (6-18x slower there than plain sdpa)."""
    torch.manual_seed(0)
    encoder = BertModel(BertConfig(**SMALL)).eval()
    ids, mask = _batch([3, 17, 9, 17, 1, 5])
    with torch.inference_mode():
        expected = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        unpad_encoders(encoder)
        got = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    assert len(simulated_gpu.calls) == SMALL["num_hidden_layers"]
    call = simulated_gpu.calls[0].arguments
    assert call["cu_seq_q"].tolist() == [0, 17, 34, 43, 48, 51, 52] and call["max_q"] == 17  # longest first
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=2e-5, rtol=1e-4)


def test_on_a_gpu_in_fp32_bert_runs_the_library_forward(monkeypatch):
    """No flash kernel for fp32: one masked SDPA call (the library's forward), not a call per length."""
    from neobert_embed.modeling import attention

    real_choice = attention.choose_attention_backend
    monkeypatch.setattr(attention, "choose_attention_backend", lambda requested, device_type, dtype, **options:
                        real_choice(requested, "cuda", dtype, **options))
    monkeypatch.setattr(attention, "_sdpa_varlen", lambda *a, **k: pytest.fail("per-length SDPA on a GPU"))
    encoder = BertModel(BertConfig(**SMALL)).eval()
    unpad_encoders(encoder)
    ids, mask = _batch([3, 17, 9])
    with torch.inference_mode():
        output = encoder(input_ids=ids, attention_mask=mask)
    assert output.pooler_output is not None  # the library's own output


def test_only_encoders_with_bert_layers_are_changed():
    from neobert_embed.modeling import NeoBERTConfig, NeoBERTModel

    neobert = NeoBERTModel(NeoBERTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=64, vocab_size=64))
    assert unpad_encoders(neobert) == []  # un-padded already, by its own design
    assert not supports_unpadded(BertModel(BertConfig(**SMALL, output_hidden_states=True)))
    assert not supports_unpadded(BertModel(BertConfig(**SMALL, is_decoder=True)))


def test_a_deep_copy_runs_its_own_layers():
    """``auto``'s int8 trial quantizes a deep copy: the copy's forward must use the copy's layers."""
    encoder = BertModel(BertConfig(**SMALL)).eval()
    unpad_encoders(encoder)
    clone = copy.deepcopy(encoder)
    assert clone.forward.__self__ is clone
    ids, mask = _batch([4, 9])
    with torch.no_grad():
        clone.encoder.layer[0].output.dense.weight.zero_()
        assert not torch.allclose(encoder(input_ids=ids, attention_mask=mask).last_hidden_state,
                                  clone(input_ids=ids, attention_mask=mask).last_hidden_state)


@pytest.fixture(scope="module")
def mixed_texts(shared_data) -> list[str]:
    """64 STS-B sentences and 64 AG News articles: batches with real padding."""
    rows = [json.loads(line) for line in (shared_data / "stsb" / "dev.jsonl").open(encoding="utf-8")]
    news = [json.loads(line)["text"] for line in (shared_data / "ag_news" / "test.jsonl").open(encoding="utf-8")]
    return [row["sentence1"] for row in rows[:64]] + news[:64]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_the_commands_loader_runs_minilm_unpadded_with_the_padded_vectors(minilm_path, mixed_texts, precision):
    padded = load_inference_model(str(minilm_path), precision, unpadded=False)
    loaded = load_inference_model(str(minilm_path), precision)
    spread = f"; {SIDE_BY_SIDE}" if engine_of(loaded.model).side_by_side else ""  # more than one thread here
    assert padded.choice.description == f"{precision} (asked for){spread}"
    assert loaded.choice.description == f"{precision} (asked for); un-padded BertModel layers{spread}"
    assert loaded.choice.to_json()["layout"] == f"un-padded BertModel layers{spread}"
    # bf16 products are rounded after blocks whose size follows the row count, and attention runs per
    # text instead of over a masked padded batch, so a bf16 vector moves within bf16's own rounding
    # (CPUs without bf16 units emulate it slowly: 32 of the texts there)
    texts, bar = (mixed_texts[::4], 0.9999) if precision == "bf16" else (mixed_texts, 0.999999)
    padded_vectors = padded.model.encode(texts, batch_size=32)
    cosine = cosine_to(padded_vectors, loaded.model.encode(texts, batch_size=32))
    if precision == "int8" and padded.model.device.type == "cpu" and describe_machine("cpu").bf16_units:
        # int8 attends in bf16 there, and one bf16 rounding of an attention output can move a token's
        # int8 codes by one step: the un-padded vectors are then another int8 approximation of fp32,
        # held to the same int8 bar as the padded ones, not equal to them
        fp32 = load_inference_model(str(minilm_path), "fp32").model.encode(texts, batch_size=32)
        for vectors in (padded_vectors, loaded.model.encode(texts, batch_size=32)):
            to_fp32 = cosine_to(fp32, vectors)
            assert to_fp32.mean() >= 0.995 and to_fp32.min() >= 0.98, (to_fp32.mean(), to_fp32.min())
        bar = 0.99
    assert cosine.min() > bar, cosine.min()
    encoder = next(module for module in loaded.model.modules() if type(module).__name__ == "BertModel")
    assert type(encoder) is unpadded_class(BertModel) and "forward" not in vars(encoder)  # a class, not a patch
    assert np.isfinite(cosine).all()
