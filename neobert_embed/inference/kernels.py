"""Compute-precision kernels: int8 Linear layers that keep accuracy (:func:`quantize_linears_int8`) and
oneDNN-packed bf16 Linear layers (:func:`pack_linears_bf16`); docs/performance.md has their measurements.

Why bf16 by autocast, not by casting the weights: ``model.to(torch.bfloat16)`` also rounds the residual
stream, norms and softmax, which costs more accuracy than the matrix products do. Why this int8:
``torch.ao.quantization.quantize_dynamic`` quantizes each activation matrix with ONE scale, so a few outlier
features flatten every other token (cosine 0.90 of fp32); :class:`Int8Linear` scales per token.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

if TYPE_CHECKING:
    from neobert_embed.modeling.model import SwiGLU

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
INT8_MAX = 127.0


class Int8Linear(nn.Module):
    """A Linear layer computing ``x @ W.T + b`` with int8 weights (per output channel) and int8
    activations (per token, dynamic), accumulated in int32.

    Example:
        >>> layer = Int8Linear.from_linear(nn.Linear(384, 1536))
        >>> layer(torch.randn(4, 7, 384)).shape
        torch.Size([4, 7, 1536])
    """

    def __init__(self, weight_codes: torch.Tensor, weight_scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight_codes.shape
        self.register_buffer("weight_codes", weight_codes)    # (in, out) int8, the layout _int_mm takes
        self.register_buffer("weight_scales", weight_scales)  # (out,) fp32
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        """Quantize ``linear``'s weight symmetrically, one scale per output channel."""
        weight = linear.weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / INT8_MAX
        codes = torch.round(weight / scales[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        return cls(codes.t().contiguous(), scales, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        peaks = torch.maximum(rows.amax(dim=1, keepdim=True), rows.amin(dim=1, keepdim=True).neg_())  # max |x|
        peaks = peaks.float().clamp_(min=torch.finfo(torch.float32).tiny)
        codes = torch.mul(rows, INT8_MAX / peaks).round_().to(torch.int8)  # |codes| <= 127 by construction
        out = int8_matmul(codes, self.weight_codes).mul_(peaks / INT8_MAX)
        out.mul_(self.weight_scales)
        if self.bias is not None:
            out.add_(self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)  # fp32: the residual stream's dtype

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel/per-token"


def int8_matmul(codes: torch.Tensor, weight_codes: torch.Tensor) -> torch.Tensor:
    """The int32 product of two int8 code matrices, as fp32: ``torch._int_mm`` on int8 units (VNNI, AMX);
    elsewhere its scalar fallback is far slower, so the codes are multiplied as fp32 numbers, exact while
    every dot product stays below 2**24 (127 * 127 * 1040 terms).

    Example:
        >>> int8_matmul(torch.ones(2, 3, dtype=torch.int8), torch.ones(3, 4, dtype=torch.int8))[0, 0]
        tensor(3.)
    """
    if codes.device.type != "cpu" or _cpu_has_int8_units():
        return torch._int_mm(codes, weight_codes).float()
    return codes.float() @ weight_codes.float()


@functools.cache
def _cpu_has_int8_units() -> bool:
    from neobert_embed.machine import describe_machine

    return bool(describe_machine("cpu").int8_units)


def quantize_linears_int8(model: nn.Module, keep: Callable[[str], bool] = lambda name: False) -> int:
    """Replace (in place) every ``nn.Linear`` of ``model`` whose qualified name ``keep`` rejects by an
    :class:`Int8Linear`; returns how many were replaced.

    Example:
        >>> quantize_linears_int8(model, keep=lambda name: name.endswith("classifier"))
        36
    """
    replaced = 0
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            qualified = f"{parent_name}.{name}" if parent_name else name
            if type(child) is nn.Linear and not keep(qualified):
                setattr(parent, name, Int8Linear.from_linear(child))
                replaced += 1
    return replaced


#: oneDNN's name and algorithm for each activation a packed product can apply to its output
_ONEDNN_ACTIVATIONS = {"none": ("none", ""), "gelu": ("gelu", "none"), "silu": ("swish", "")}


class PackedBf16Linear(nn.Module):
    """A Linear layer computing ``x @ W.T + b`` in bf16 on oneDNN, its weight packed once into oneDNN's
    blocked layout, optionally with the activation that follows fused in; bf16 in and out, as autocast's.

    Why: under autocast every call casts the fp32 weight to bf16 and hands matmul a row-major weight, and
    the GELU reads and writes the activation once more. These are the kernels ``torch.compile`` emits for a
    frozen bf16 CPU model, without its compile time.

    Example:
        >>> layer = PackedBf16Linear.from_linear(nn.Linear(384, 1536), activation="gelu")
        >>> layer(torch.randn(4, 7, 384)).dtype
        torch.bfloat16
    """

    def __init__(self, packed_weight: torch.Tensor, bias: torch.Tensor | None, in_features: int,
                 out_features: int, activation: str = "none") -> None:
        super().__init__()
        if activation not in _ONEDNN_ACTIVATIONS:
            raise ValueError(f"activation {activation!r}: expected one of {sorted(_ONEDNN_ACTIVATIONS)}")
        self.in_features, self.out_features, self.activation = in_features, out_features, activation
        # attributes, not buffers: an opaque oneDNN tensor has no place in a state dict
        self.packed_weight, self.bias = packed_weight, bias

    @classmethod
    def from_linear(cls, linear: nn.Linear, activation: str = "none") -> PackedBf16Linear:
        """Pack ``linear``'s weight (rounded to bf16, as autocast rounds it) for any number of rows."""
        return cls.from_weight(linear.weight, linear.bias, activation)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None,
                    activation: str = "none") -> PackedBf16Linear:
        """Pack a Linear weight ``(out_features, in_features)`` and its bias (or None)."""
        weight = weight.detach().to(torch.bfloat16).contiguous()
        bias = None if bias is None else bias.detach().to(torch.bfloat16).clone()
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        return cls(packed, bias, weight.shape[1], weight.shape[0], activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        attribute, algorithm = _ONEDNN_ACTIVATIONS[self.activation]
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, attribute, [], algorithm)
        return out.reshape(*x.shape[:-1], self.out_features)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``x @ W.T + b + residual`` in one oneDNN call, as bf16: BERT's output blocks."""
        return self.forward_binary(x, residual, "add")

    def forward_binary(self, x: torch.Tensor, other: torch.Tensor, operation: str) -> torch.Tensor:
        """``(x @ W.T + b) <operation> other`` (``add``, ``mul``) in one oneDNN call (its binary post-op), as bf16.

        Example:
            >>> layer = PackedBf16Linear.from_linear(nn.Linear(768, 2048, bias=False))
            >>> layer.forward_binary(torch.randn(7, 768), torch.randn(7, 2048), "mul").shape
            torch.Size([7, 2048])
        """
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        other = other.reshape(-1, self.out_features).to(torch.bfloat16)
        out = torch.ops.mkldnn._linear_pointwise.binary(rows, other, self.packed_weight, self.bias, operation)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        fused = f", {self.activation} fused" if self.activation != "none" else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16 oneDNN-packed{fused}"


class PackedSwiGLU(nn.Module):
    """NeoBERT's feed-forward block ``w3(silu(gate) * value)`` as three packed bf16 products, the SiLU and
    the halves' product inside oneDNN's: the SwiGLU's own forward reads and writes the intermediate
    activation three more times, rounding to bf16 each time.

    Example:
        >>> block = PackedSwiGLU.from_swiglu(SwiGLU(768, 2048))
        >>> block(torch.randn(5, 768)).dtype
        torch.bfloat16
    """

    def __init__(self, gate: PackedBf16Linear, value: PackedBf16Linear, w3: PackedBf16Linear) -> None:
        super().__init__()
        self.gate, self.value, self.w3 = gate, value, w3

    @classmethod
    def from_swiglu(cls, swiglu: SwiGLU) -> PackedSwiGLU:
        """Pack a SwiGLU holding ``w12`` (gate rows first, then value rows) and ``w3``."""
        gate_weight, value_weight = swiglu.w12.weight.chunk(2, dim=0)
        gate_bias, value_bias = (None, None) if swiglu.w12.bias is None else swiglu.w12.bias.chunk(2)
        return cls(PackedBf16Linear.from_weight(gate_weight, gate_bias, activation="silu"),
                   PackedBf16Linear.from_weight(value_weight, value_bias),
                   PackedBf16Linear.from_linear(swiglu.w3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.to(torch.bfloat16)  # cast once for both halves
        return self.w3(self.value.forward_binary(rows, self.gate(rows), "mul"))


class RMSNormToBf16(nn.Module):
    """An RMSNorm computed in fp32 whose output is rounded to bf16, for a norm read only by a packed bf16
    product (NeoBERT's ``attention_norm``, ``ffn_norm``): one reduction (``torch.linalg.vector_norm``)
    instead of the square, mean and two products of PyTorch's CPU ``rms_norm``.

    Example:
        >>> RMSNormToBf16.from_norm(nn.RMSNorm(768, eps=1e-5))(torch.randn(3, 768)).dtype
        torch.bfloat16
    """

    def __init__(self, weight: torch.Tensor | None, eps: float | None) -> None:
        super().__init__()
        self.weight, self.eps = weight, eps  # attributes: the module exists only at inference

    @classmethod
    def from_norm(cls, norm: nn.RMSNorm) -> RMSNormToBf16:
        weight = None if norm.weight is None else norm.weight.detach().float().clone()
        return cls(weight, norm.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps  # nn.RMSNorm's default
        inverse_rms = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
        inverse_rms = inverse_rms.mul_(x.shape[-1] ** -0.5).square_().add_(eps).rsqrt_()
        normed = torch.mul(x, inverse_rms)
        if self.weight is not None:
            normed.mul_(self.weight)
        return normed.to(torch.bfloat16)


@functools.cache
def packed_bf16_available() -> bool:
    """Whether this PyTorch build and CPU run oneDNN's packed bf16 Linear (a tiny product, tried once).

    Example:
        >>> packed_bf16_available()
        True
    """
    ops = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(ops, "_linear_pointwise")
            and hasattr(ops, "_reorder_linear_weight")):
        return False
    try:
        probe = PackedBf16Linear.from_linear(nn.Linear(16, 16), activation="gelu")
        silu = PackedBf16Linear.from_linear(nn.Linear(16, 16), activation="silu")
        outputs = (probe(torch.ones(2, 16)), probe.forward_add(torch.ones(2, 16), torch.ones(2, 16)),
                   probe.forward_binary(torch.ones(2, 16), silu(torch.ones(2, 16)), "mul"))
        return all(bool(torch.isfinite(out.float()).all()) for out in outputs)
    except RuntimeError:  # oneDNN: "bf16 path needs the cpu support avx512bw, avx512vl and avx512dq"
        return False


def _is_exact_gelu(module: object) -> bool:
    """``nn.GELU()`` or transformers' ``GELUActivation`` (BERT's ``hidden_act: gelu``): erf, not tanh."""
    if isinstance(module, nn.GELU):
        return module.approximate == "none"
    return type(module).__name__ == "GELUActivation" and getattr(module, "act", None) is F.gelu


def pack_linears_bf16(model: nn.Module) -> int:
    """Replace (in place) every ``nn.Linear`` of ``model`` by a :class:`PackedBf16Linear`; returns how many.
    BERT's exact GELU after ``dense`` is fused into it (the block's own activation becomes identity);
    NeoBERT's SwiGLU becomes a :class:`PackedSwiGLU` and its product-feeding norms :class:`RMSNormToBf16`.

    Example:
        >>> pack_linears_bf16(model)
        36
    """
    replaced = _pack_neobert_layers(model)
    for parent in list(model.modules()):
        gelu_follows_dense = _is_exact_gelu(getattr(parent, "intermediate_act_fn", None))
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                fused = gelu_follows_dense and name == "dense"
                setattr(parent, name, PackedBf16Linear.from_linear(child, activation="gelu" if fused else "none"))
                replaced += 1
                if fused:
                    parent.intermediate_act_fn = nn.Identity()
    return replaced


def _pack_neobert_layers(model: nn.Module) -> int:
    """NeoBERT's feed-forward blocks and product-feeding norms (see :func:`pack_linears_bf16`); returns
    how many Linear layers the packed SwiGLUs replaced."""
    from neobert_embed.modeling.model import NeoBERTLayer, SwiGLU

    replaced = 0
    for layer in list(model.modules()):
        if not isinstance(layer, NeoBERTLayer):
            continue
        if isinstance(layer.ffn, SwiGLU):
            layer.ffn = PackedSwiGLU.from_swiglu(layer.ffn)
            replaced += 2
        for name in ("attention_norm", "ffn_norm"):  # read by qkv and by the SwiGLU only
            norm = getattr(layer, name)
            if isinstance(norm, nn.RMSNorm):
                setattr(layer, name, RMSNormToBf16.from_norm(norm))
    return replaced


def hold_linears_in(model: nn.Module, precision: str) -> int:
    """Keep every ``nn.Linear``'s weight and bias in ``precision``'s dtype (bf16 / fp16), in place; returns how
    many. Why: under autocast a GPU casts each fp32 weight inside every forward; held in that dtype, there is
    nothing to cast, and the products see the same rounded weights.

    Example:
        >>> hold_linears_in(model, "bf16")
        36
    """
    dtype = AUTOCAST_DTYPES[precision]
    linears = [module for module in model.modules() if type(module) is nn.Linear]
    for module in linears:
        module.to(dtype)
    return len(linears)
