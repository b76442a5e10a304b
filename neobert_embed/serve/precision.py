"""Serving precision: fp32/fp16/bf16 weights, or dynamic int8 quantization of the Linear layers.

Why: on CPU the encoder's time goes into its Linear layers (QKV, output projection, FFN). Dynamic
int8 quantization stores their weights as int8 and quantizes activations per batch, so the
matrix products run on int8 kernels; everything else (embeddings, norms, attention) stays fp32.

Which library: ``torch.ao.quantization.quantize_dynamic`` (fbgemm/onednn int8 GEMM kernels).
torchao's ``Int8DynamicActivationInt8WeightConfig`` installs against torch 2.13 CPU but, without
``torch.compile``, runs its int8 matmul ~17x *slower* than fp32 on CPU (measured on a
384→1536→384 MLP, 2048 tokens), and ``torch.compile`` of NeoBERT's un-padded path with a new
shape per batch is not something a server should depend on. torch's eager dynamic quantization
is ~1.8x faster than fp32 there. Its accuracy cost is measured by ``benchmarks/serve_load.py``
(STS-B dev Spearman, int8 vs fp32).

Example:
    >>> from neobert_embed.serve.precision import load_for_serving
    >>> load_for_serving("sentence-transformers/all-MiniLM-L6-v2", "int8").method
    'torch.ao.quantization.quantize_dynamic (int8 Linear weights, dynamic int8 activations)'
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from neobert_embed.errors import UserInputError

SERVING_PRECISIONS = ("fp32", "fp16", "bf16", "int8")
INT8_METHOD = "torch.ao.quantization.quantize_dynamic (int8 Linear weights, dynamic int8 activations)"


def quantize_linear_int8(model: Any) -> Any:
    """Replace every ``nn.Linear`` of ``model`` (in place) by a dynamically quantized int8 Linear.

    Example:
        >>> model = quantize_linear_int8(load_sentence_model("bert"))
    """
    import torch

    with warnings.catch_warnings():
        # torch 2.13 marks the quantized-tensor constructors deprecated (in favour of torchao);
        # they are the fast eager CPU path today, see the module docstring.
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*", category=UserWarning)
        warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated", category=DeprecationWarning)
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8,
                                                      inplace=True)


@dataclass
class ServedModel:
    """A loaded SentenceTransformer, how its precision was obtained, and its weights' fingerprint."""

    model: Any
    precision: str
    method: str
    fingerprint: str | None = None


def load_for_serving(name_or_path: str, precision: str = "fp32", *, device: str | None = None,
                     max_seq_length: int | None = None, fingerprint: bool = False) -> ServedModel:
    """Load a SentenceTransformer the way ``encode`` does, at ``precision``.

    The model keeps its own prompts, max_seq_length, pooling and normalization modules.
    int8 needs the CPU (its kernels are CPU kernels). ``fingerprint`` hashes the weights before
    quantization (what ``index build`` recorded), so an index built by this model is recognised.

    Example:
        >>> served = load_for_serving("runs/my-embedder", "bf16")
        >>> served.method
        'bf16 weights'
    """
    from neobert_embed.index.encoder import model_fingerprint
    from neobert_embed.sentence import load_sentence_model

    if precision not in SERVING_PRECISIONS:
        raise UserInputError(f"--precision {precision!r} is not one of {', '.join(SERVING_PRECISIONS)}")
    int8 = precision == "int8"
    if int8 and device not in (None, "cpu"):
        raise UserInputError(f"--precision int8 runs on the CPU only; drop --device {device} or pick fp16/bf16")
    model = load_sentence_model(name_or_path, max_seq_length, device="cpu" if int8 else device,
                                precision="fp32" if int8 else precision)
    model.eval()
    digest = model_fingerprint(model) if fingerprint else None  # of the weights before quantization
    if int8:
        quantize_linear_int8(model)
    return ServedModel(model, precision, INT8_METHOD if int8 else f"{precision} weights", digest)
