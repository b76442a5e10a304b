"""RoPE stays float32 whatever the model's dtype: casts, from_pretrained(dtype=...), DeepSpeed bf16."""

from __future__ import annotations

import pytest
import torch
from official_checkpoint import official_config, write_official_checkpoint
from transformers import AutoModelForMaskedLM

import neobert_embed.modeling  # noqa: F401  (registers model_type "neobert")

LONG = 4096
TOKENS = 2048


@pytest.fixture(scope="module")
def long_checkpoint(tmp_path_factory):
    """The official-format tiny checkpoint, trained length 4096 like the released model."""
    return write_official_checkpoint(tmp_path_factory.mktemp("long"), config=official_config(max_length=LONG))


def rotations(model) -> torch.Tensor:
    return model.model.rotary(torch.arange(LONG))


def test_cast_models_keep_fp32_rope_and_match_a_model_loaded_in_bf16(long_checkpoint):
    fp32 = AutoModelForMaskedLM.from_pretrained(long_checkpoint).eval()
    reference = rotations(fp32)
    loaded_bf16 = AutoModelForMaskedLM.from_pretrained(long_checkpoint, dtype=torch.bfloat16).eval()
    assert loaded_bf16.model.encoder.weight.dtype == torch.bfloat16
    assert torch.equal(rotations(loaded_bf16), reference)

    to_bf16 = AutoModelForMaskedLM.from_pretrained(long_checkpoint).eval().to(torch.bfloat16)
    halved = AutoModelForMaskedLM.from_pretrained(long_checkpoint).eval().half()
    also_bf16 = AutoModelForMaskedLM.from_pretrained(long_checkpoint).eval().bfloat16()
    for model in (to_bf16, halved, also_bf16):
        assert model.model.encoder.weight.dtype in (torch.bfloat16, torch.float16)
        assert model.model.rotary.inv_freq.dtype == torch.float32
        assert torch.equal(rotations(model), reference)  # so the angles are the fp32 ones, exactly
        assert torch.equal(rotations(model).angle(), reference.angle())

    ids = torch.randint(1, 1000, (1, TOKENS), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = loaded_bf16(ids).logits
        assert torch.equal(to_bf16(ids).logits, expected)
        assert torch.equal(also_bf16(ids).logits, expected)


def test_low_precision_buffer_data_is_recomputed_in_fp32(long_checkpoint):
    """Something that swaps ``inv_freq.data`` behind the module's back (DeepSpeed's
    ``data_types.buffer_dtype``) cannot lower the rotation precision either."""
    model = AutoModelForMaskedLM.from_pretrained(long_checkpoint).eval()
    reference = rotations(model)
    model.model.rotary.inv_freq.data = model.model.rotary.inv_freq.data.to(torch.bfloat16)
    assert torch.equal(rotations(model), reference)


def test_deepspeed_bf16_engine_keeps_fp32_rope(long_checkpoint, monkeypatch):
    deepspeed = pytest.importorskip("deepspeed")
    from neobert_embed.pretraining.engine import fill_rendezvous_env, join_process_group

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "")  # recorded, so the world-of-one variables are removed after the test
        monkeypatch.delenv(key)
    fill_rendezvous_env()
    if not deepspeed.comm.is_initialized():
        join_process_group()  # as pretraining does: a world of one builds no shared-memory op
    model = AutoModelForMaskedLM.from_pretrained(long_checkpoint)
    reference = rotations(model)
    config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "data_types": {"buffer_dtype": "bf16"}, "steps_per_print": 2**62}
    engine, *_ = deepspeed.initialize(model=model, config=config,
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.0))
    assert engine.module.model.encoder.weight.dtype == torch.bfloat16
    assert torch.equal(rotations(engine.module), reference)
    ids = torch.randint(1, 1000, (1, 256), generator=torch.Generator().manual_seed(1))
    loaded_bf16 = AutoModelForMaskedLM.from_pretrained(long_checkpoint, dtype=torch.bfloat16).eval()
    engine.eval()
    with torch.no_grad():
        assert torch.equal(engine(input_ids=ids).logits, loaded_bf16(ids).logits)
