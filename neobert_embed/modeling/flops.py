"""Work of an encoder forward and what the device can do: the two halves of an MFU figure.

Why: throughput alone does not say whether a kernel is good; model FLOPs utilisation (useful
FLOPs per second over the device's peak) does, and it compares across devices. The benchmarks
(``benchmarks/encode_throughput.py``, ``benchmarks/encoder_table10.py``) share these
definitions so their figures agree.

Useful FLOPs of a forward = 2 × (linear weights) per real token + 4 × hidden × (attended keys)
per real token per layer (scores and mixing; ModernBERT's local layers attend a window).
Embedding lookups, norms and softmax are not counted (the usual MFU convention).

Example:
    >>> tflops = forward_flops(model, [512] * 8) / 1e12        # work of 8 sequences of 512
    >>> mfu = tflops / seconds_taken / gpu_peak_tflops(torch.device("cuda"))[0]
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

#: Dense (no sparsity) peak TFLOP/s of common GPUs in bf16/fp16 tensor-core math, from the
#: vendors' datasheets; matched against ``torch.cuda.get_device_name()`` (first hit wins).
GPU_PEAK_TFLOPS = (
    ("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("GH200", 989.0), ("B200", 2250.0),
    ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("A10G", 70.0),
    ("A10", 125.0), ("A6000", 155.0), ("RTX 4090", 165.0), ("RTX 3090", 71.0), ("V100", 125.0),
    ("T4", 65.0),
)


def forward_flops(model: torch.nn.Module, lengths: list[int]) -> float:
    """Useful FLOPs of one forward over sequences of ``lengths`` real tokens (module docstring).

    ``forward_flops(model, [max(lengths)] * len(lengths))`` is what a padded forward computes.

    Example:
        >>> forward_flops(model, [3, 5]) == forward_flops(model, [3]) + forward_flops(model, [5])
        True
    """
    config = model.config
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    layer_types = getattr(config, "layer_types", None)
    windows = []
    for i in range(config.num_hidden_layers):
        local = layer_types is not None and layer_types[i] == "sliding_attention"
        windows.append(config.local_attention + 1 if local else None)
    attention = sum(4 * config.hidden_size * n * min(n, w or n) for n in lengths for w in windows)
    return float(2 * linear * sum(lengths) + attention)


def gpu_peak_tflops(device: torch.device) -> tuple[float | None, str]:
    """(datasheet bf16 dense peak TFLOP/s or None if unknown, device name) of a CUDA device."""
    name = torch.cuda.get_device_name(device)
    for key, peak in GPU_PEAK_TFLOPS:
        if key in name:
            return peak, name
    return None, name


def measured_matmul_tflops(dtype: torch.dtype, device: torch.device | str = "cpu", size: int = 2048,
                           repeats: int = 5) -> float:
    """Best TFLOP/s of a square matmul on ``device``: a practical peak where no datasheet applies (CPUs).

    ``torch.int8`` measures ``torch._int_mm`` (int8 × int8 → int32: VNNI / AMX on CPUs), the
    product :class:`~neobert_embed.inference.kernels.Int8Linear` runs on.

    Example:
        >>> measured_matmul_tflops(torch.float32, size=256, repeats=1) > 0
        True
    """
    if dtype == torch.int8:
        a = torch.randint(-127, 127, (size, size), dtype=dtype, device=device)
        b = torch.randint(-127, 127, (size, size), dtype=dtype, device=device)
        product: Callable[[], object] = lambda: torch._int_mm(a, b)  # noqa: E731
    else:
        a = torch.randn(size, size, dtype=dtype, device=device)
        b = torch.randn(size, size, dtype=dtype, device=device)
        product = lambda: a @ b  # noqa: E731
    product()
    best = min(seconds(product, device) for _ in range(repeats))
    return 2 * size**3 / best / 1e12


def seconds(fn: Callable[[], object], device: torch.device | str = "cpu") -> float:
    """Wall time of ``fn()``, synchronising CUDA before and after."""
    synchronize = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    synchronize()
    start = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - start
