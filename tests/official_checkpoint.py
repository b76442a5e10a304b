"""A tiny checkpoint in the OFFICIAL ``chandar-lab/NeoBERT`` format, written without our classes.

Key names (LM-head layout ``model.*`` + ``decoder.*``), config fields and file names are the
official ones, so loading it exercises exactly what users do with the released model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, HEADS, LAYERS, INTERMEDIATE, VOCAB, MAX_LENGTH = 64, 2, 2, 100, 30522, 64  # bert-base-uncased's vocabulary


def swiglu_width(intermediate_size: int) -> int:
    """f = 8·ceil(int(2·intermediate_size/3)/8), as the issue states (72 for 100, 2048 for 3072)."""
    return 8 * math.ceil(int(2 * intermediate_size / 3) / 8)


def official_config(**overrides) -> dict:
    config = {
        "architectures": ["NeoBERTLMHead"],
        "auto_map": {
            "AutoConfig": "model.NeoBERTConfig",
            "AutoModel": "model.NeoBERT",
            "AutoModelForMaskedLM": "model.NeoBERTLMHead",
            "AutoModelForSequenceClassification": "model.NeoBERTForSequenceClassification",
        },
        "classifier_init_range": 0.02,
        "decoder_init_range": 0.02,
        "dim_head": HIDDEN // HEADS,
        "embedding_init_range": 0.02,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "kwargs": {"classifier_init_range": 0.02,
                   "pretrained_model_name_or_path": "google-bert/bert-base-uncased",
                   "trust_remote_code": True},
        "max_length": MAX_LENGTH,
        "model_type": "neobert",
        "norm_eps": 1e-05,
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "pad_token_id": 0,
        "pretrained_model_name_or_path": "google-bert/bert-base-uncased",
        "torch_dtype": "float32",
        "transformers_version": "4.48.2",
        "trust_remote_code": True,
        "vocab_size": VOCAB,
    }
    config.update(overrides)
    return config


def official_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under the official names, scaled so every layer changes the signal."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    f = swiglu_width(INTERMEDIATE)
    weights = {"model.encoder.weight": rand(VOCAB, HIDDEN, scale=1.0)}
    for i in range(LAYERS):
        p = f"model.transformer_encoder.{i}."
        weights[p + "qkv.weight"] = rand(3 * HIDDEN, HIDDEN)
        weights[p + "wo.weight"] = rand(HIDDEN, HIDDEN)
        weights[p + "ffn.w12.weight"] = rand(2 * f, HIDDEN)
        weights[p + "ffn.w3.weight"] = rand(HIDDEN, f)
        weights[p + "attention_norm.weight"] = 1 + rand(HIDDEN, scale=0.1)
        weights[p + "ffn_norm.weight"] = 1 + rand(HIDDEN, scale=0.1)
    weights["model.layer_norm.weight"] = 1 + rand(HIDDEN, scale=0.1)
    weights["decoder.weight"] = rand(VOCAB, HIDDEN)
    weights["decoder.bias"] = rand(VOCAB)
    return weights


def write_official_checkpoint(directory: Path, weights: dict | None = None, config: dict | None = None,
                              tokenizer: bool = False) -> Path:
    """Write config.json + model.safetensors (+ bert-uncased tokenizer files) like the hub repo."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or official_config(), indent=2))
    save_file(weights if weights is not None else official_weights(), str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    if tokenizer:
        from tiny_models import bert_tokenizer

        bert_tokenizer().save_pretrained(directory)
    return directory
