"""Keeping a long CPU encoding job's native memory flat: bounded kernel caches, freed memory handed back.

Why: the Python objects of an ``encode`` job are small (the texts, one tokenized chunk, the output
matrix), but its resident memory grew with the input: all-MiniLM-L6-v2 in bf16 on a 2-core AMX
Xeon held 2.35 GB after 20,000 AG-News texts and more than 3.7 GB after 200,000. Two native causes,
both outside this toolkit's objects:

1. **Kernel caches.** The un-padded forward multiplies ``(tokens in the batch) × hidden`` matrices,
   and the token count differs from batch to batch. oneDNN (through PyTorch's ``mkldnn`` ops)
   builds and keeps one JIT-compiled kernel per new shape, in two caches of 1,024 entries each
   (oneDNN's primitive cache and ideep's LRU cache). Measured: 283 MB of executable JIT code after
   6,144 texts, growing until both caches are full. Capped at :data:`KERNEL_CACHE_ENTRIES` (more on
   a machine with many cores: :func:`kernel_cache_entries`), the JIT code stays at ~24 MB and
   throughput is unchanged (20,000 texts, bf16, 2 threads: 305 docs/s
   capped at 64, 293 at 1,024, 299 at 256): a batch of fresh texts rarely repeats a shape an
   older entry was kept for.
2. **Freed memory kept by the C allocator.** Activations are freed after every batch, but glibc
   keeps freed blocks in each thread's arena (the tokenizing thread and one per side-by-side
   batch) and returns only the top of a heap. ``malloc_trim`` hands them back: −150 to −260 MB
   after each chunk, for ~1 ms.

Both are process-wide settings of native libraries, so they are set at the two places a job
starts (the CLI's entry point and :func:`~neobert_embed.inference.runtime.load_inference_model`),
and never over a value the user set: ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024`` in the environment
keeps the library's default.

Example:
    >>> bound_kernel_caches()          # before the first oneDNN kernel is built
    >>> release_freed_memory()         # after a chunk of batches
    True
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable

#: Kernels each native cache keeps at least (oneDNN's and ideep's default is 1,024; see the module docstring).
KERNEL_CACHE_ENTRIES = 64
#: Kernels one side-by-side batch needs at once: a forward multiplies its token count by 4 weight shapes
#: (attention in, attention out, MLP up, MLP down), doubled for headroom. A cache smaller than the
#: batches running together need thrashes: at 8 entries, 2 threads ran 2.6–4.8× slower than at 16 or 64.
KERNELS_PER_THREAD = 8
#: The environment variables oneDNN and ideep (PyTorch's wrapper of it) read their cache sizes from,
#: once, when the first kernel is built.
KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_kernel_caches() -> dict[str, str]:
    """Cap the native kernel caches at :func:`kernel_cache_entries` unless the environment already
    says otherwise; return the values in force. Effective only before the process builds its first
    oneDNN kernel (the libraries read the variables once).

    Example:
        >>> bound_kernel_caches()
        {'ONEDNN_PRIMITIVE_CACHE_CAPACITY': '64', 'LRU_CACHE_CAPACITY': '64'}
    """
    entries = str(kernel_cache_entries())
    return {name: os.environ.setdefault(name, entries) for name in KERNEL_CACHE_VARIABLES}


def kernel_cache_entries(cpus: int | None = None) -> int:
    """Kernels each cache keeps: :data:`KERNEL_CACHE_ENTRIES`, or :data:`KERNELS_PER_THREAD` for each CPU
    this process may run on (one side-by-side batch each) where that is more.

    Example:
        >>> kernel_cache_entries(2), kernel_cache_entries(16)
        (64, 128)
    """
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(KERNEL_CACHE_ENTRIES, KERNELS_PER_THREAD * cpus)


def release_freed_memory() -> bool:
    """Hand the memory the C allocator holds freed back to the operating system (glibc's
    ``malloc_trim``); False where the C library has no such call (macOS, musl, Windows).

    Example:
        >>> release_freed_memory()
        True
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` from the process's own C library, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the symbols already loaded into this process, the C library's among them
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
    return trim
