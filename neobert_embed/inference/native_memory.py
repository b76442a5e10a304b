"""Keeping a long CPU encoding job's native memory flat: bounded kernel caches, freed memory handed back,
large blocks mapped on their own.

Why: the Python objects of an ``encode`` job are small (the texts, one tokenized chunk, the output
matrix), but its resident memory grew with the input (docs/performance.md, "Native memory of a long
encode", has the measurements behind each bound). Three native causes, all outside this toolkit's objects:

1. **Kernel caches.** The un-padded forward multiplies ``(tokens in the batch) × hidden`` matrices,
   and the token count differs from batch to batch. oneDNN (through PyTorch's ``mkldnn`` ops)
   builds and keeps one JIT-compiled kernel per new shape, in two caches of 1,024 entries each
   (oneDNN's primitive cache and ideep's LRU cache): the JIT code grows until both caches are full.
   Capped at :data:`KERNEL_CACHE_ENTRIES` (more on a machine with many cores:
   :func:`kernel_cache_entries`), it stays small at the same throughput: a batch of fresh texts
   rarely repeats a shape an older entry was kept for.
2. **Freed memory kept by the C allocator.** Activations are freed after every batch, but glibc
   keeps freed blocks in each thread's arena (the tokenizing thread and one per side-by-side
   batch) and returns only the top of a heap. ``malloc_trim`` hands them back after each chunk.
3. **Large blocks kept for reuse.** glibc serves a block of 128 KiB or more from ``mmap`` and
   returns it on ``free``, but after the first such free it raises that threshold (up to 32 MiB),
   so a forward's activations then come from the arenas and fragment them. A fixed threshold of
   :data:`MMAP_THRESHOLD_BYTES` keeps them on ``mmap`` at the same speed; a lower one costs page faults.

All three are process-wide settings of native libraries, so they are set where a job starts (the
CLI's entry point), never by a library call such as
:func:`~neobert_embed.inference.runtime.load_inference_model` (a program that embeds the toolkit calls
:func:`bound_native_memory` itself if it wants them), and never over a value the user set: ``ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024`` or
``MALLOC_MMAP_THRESHOLD_`` in the environment keeps the user's choice.

Example:
    >>> bound_native_memory()          # before the first oneDNN kernel is built
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
#: batches running together need thrashes (docs/performance.md: 8 entries ran several times slower).
KERNELS_PER_THREAD = 8
#: The environment variables oneDNN and ideep (PyTorch's wrapper of it) read their cache sizes from,
#: once, when the first kernel is built.
KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
#: Blocks at least this large are mapped on their own and returned to the system when freed.
MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024
#: glibc's ``mallopt`` parameter number for the threshold, and the variable that sets it at start-up.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_VARIABLE = "MALLOC_MMAP_THRESHOLD_"


def bound_native_memory() -> None:
    """Everything this module bounds, where the user has not chosen otherwise: the kernel caches
    (:func:`bound_kernel_caches`) and the allocator's mmap threshold (:func:`fix_mmap_threshold`).

    Example:
        >>> bound_native_memory()
    """
    bound_kernel_caches()
    if MMAP_THRESHOLD_VARIABLE not in os.environ:
        fix_mmap_threshold(MMAP_THRESHOLD_BYTES)


def fix_mmap_threshold(size: int) -> bool:
    """Serve blocks of ``size`` bytes or more from their own ``mmap`` from now on, with no dynamic
    raise (glibc's ``mallopt(M_MMAP_THRESHOLD)``); False where the C library has no such call.

    Example:
        >>> fix_mmap_threshold(4 * 1024 * 1024)
        True
    """
    mallopt = _libc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, size))


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
    trim = _libc_function("malloc_trim", (ctypes.c_size_t,))
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _libc_function(name: str, argtypes: tuple[type, ...]) -> Callable[..., int] | None:
    """glibc's ``name`` from the process's own C library, or None where there is none (not Linux, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the symbols already loaded into this process, the C library's among them
    except OSError:
        return None
    function = getattr(libc, name, None)
    if function is not None:
        function.argtypes = list(argtypes)
        function.restype = ctypes.c_int
    return function
