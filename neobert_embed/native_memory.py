"""Keeping a long CPU encoding job's native memory flat: bounded kernel caches, freed memory handed back,
large blocks mapped on their own.

Why: a job's Python objects are small, but its resident memory grew with the input, for three native
reasons (docs/performance.md, "Native memory of a long encode"): oneDNN and ideep keep one JIT kernel per
new matrix shape (the un-padded forward makes many) in caches of 1,024 entries, capped here at
:func:`kernel_cache_entries`; glibc keeps freed blocks in each thread's arena (``malloc_trim`` hands them
back after each chunk); and glibc raises its mmap threshold after the first large free, so activations
fragment the arenas (fixed at :data:`MMAP_THRESHOLD_BYTES`).

These are process-wide settings, so the CLI sets them where a job starts, never a library call (a program
embedding the toolkit calls :func:`bound_native_memory` itself), and never over a value in the environment.

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

#: Kernels each native cache keeps at least (oneDNN's and ideep's default is 1,024).
KERNEL_CACHE_ENTRIES = 64
#: Kernels one side-by-side batch needs at once: 4 weight shapes per token count, doubled (fewer thrash).
KERNELS_PER_THREAD = 8
#: The variables oneDNN and ideep read their cache sizes from, once, when the first kernel is built.
KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
#: Blocks at least this large are mapped on their own and returned to the system when freed.
MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024
#: glibc's ``mallopt`` parameter number for the threshold, and the variable that sets it at start-up.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_VARIABLE = "MALLOC_MMAP_THRESHOLD_"


def bound_native_memory() -> None:
    """Bound the kernel caches and fix the allocator's mmap threshold, where the user has not chosen otherwise."""
    bound_kernel_caches()
    if MMAP_THRESHOLD_VARIABLE not in os.environ:
        fix_mmap_threshold(MMAP_THRESHOLD_BYTES)


def fix_mmap_threshold(size: int) -> bool:
    """Serve blocks of ``size`` bytes or more from their own ``mmap``, with no dynamic raise (glibc's
    ``mallopt(M_MMAP_THRESHOLD)``); False where the C library has no such call.

    Example:
        >>> fix_mmap_threshold(4 * 1024 * 1024)
        True
    """
    mallopt = _libc_function("mallopt", (ctypes.c_int, ctypes.c_int))
    return mallopt is not None and bool(mallopt(_M_MMAP_THRESHOLD, size))


def bound_kernel_caches() -> dict[str, str]:
    """Cap the native kernel caches at :func:`kernel_cache_entries` unless the environment says otherwise;
    return the values in force (effective before the first oneDNN kernel is built).

    Example:
        >>> bound_kernel_caches()
        {'ONEDNN_PRIMITIVE_CACHE_CAPACITY': '64', 'LRU_CACHE_CAPACITY': '64'}
    """
    entries = str(kernel_cache_entries())
    return {name: os.environ.setdefault(name, entries) for name in KERNEL_CACHE_VARIABLES}


def kernel_cache_entries(cpus: int | None = None) -> int:
    """Kernels each cache keeps: :data:`KERNEL_CACHE_ENTRIES`, or :data:`KERNELS_PER_THREAD` per CPU if more.

    Example:
        >>> kernel_cache_entries(2), kernel_cache_entries(16)
        (64, 128)
    """
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(KERNEL_CACHE_ENTRIES, KERNELS_PER_THREAD * cpus)


def release_freed_memory() -> bool:
    """Hand freed memory back to the operating system (glibc's ``malloc_trim``); False without glibc.

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
