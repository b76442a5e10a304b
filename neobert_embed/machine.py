"""What the machine's matrix units can do: bf16 and int8 on this CPU (or GPU), read once per process;
and which compute precisions exist and which of them a device runs (checked before any model loads).

Why: the fastest exact-enough precision depends on the machine. An Intel Xeon with AMX runs bf16
matrix products ~7× faster than fp32 and int8 ~4×; an AMD EPYC with avx512_bf16 and VNNI but no
AMX runs bf16 ~2.4× and int8 ~4.6× faster; an older AVX2 CPU has neither unit, and there fp32 is
the right answer. ``auto`` (:mod:`neobert_embed.inference.runtime`) only tries the precisions this
module says the hardware has, then measures them on the model's own inputs.

The CPU's flags come from ``/proc/cpuinfo`` (Linux) and PyTorch's own dispatch level
(``torch.backends.cpu.get_cpu_capability()``). Setting ``NEOBERT_EMBED_CPU_FEATURES`` overrides the
flags (a comma list such as ``avx512_bf16,avx512_vnni``, or ``none``): that is how tests force a CPU
without bf16 or int8 units, and how a user can keep ``auto`` off a unit they distrust.

Example:
    >>> machine = describe_machine()
    >>> machine.bf16_units, machine.int8_units
    ('avx512_bf16', 'avx512_vnni')
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from neobert_embed.errors import UserInputError

FEATURES_VARIABLE = "NEOBERT_EMBED_CPU_FEATURES"
#: What ``--precision`` accepts (:mod:`neobert_embed.inference.runtime` applies them).
COMPUTE_PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # best first: the unit named in the `used:` line
INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")


@dataclass(frozen=True)
class Machine:
    """The device a model will run on and the matrix units it has.

    Attributes:
        device: ``cpu`` or a torch device string (``cuda``, ``cuda:1``, ``mps``).
        name: the CPU model name or the GPU's name.
        flags: the CPU's matrix-unit flags this toolkit looks at (a subset of ``/proc/cpuinfo``).
        torch_capability: PyTorch's CPU dispatch level (``AVX512``, ``AVX2`` …), or the GPU's
            compute capability.
        threads: intra-op threads torch uses.
    """

    device: str
    name: str
    flags: tuple[str, ...] = ()
    torch_capability: str = ""
    threads: int = 1
    gpu_bf16: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def is_cpu(self) -> bool:
        """True when the model runs on the CPU."""
        return self.device == "cpu"

    @property
    def bf16_units(self) -> str | None:
        """The unit that makes bf16 fast here (``amx_bf16``, ``avx512_bf16``, or the GPU), or None."""
        if not self.is_cpu:
            return self.name if self.gpu_bf16 else None
        return next((flag for flag in BF16_FLAGS if flag in self.flags), None)

    @property
    def int8_units(self) -> str | None:
        """The unit that makes int8 matrix products fast on this CPU (AMX, VNNI), or None."""
        return next((flag for flag in INT8_FLAGS if flag in self.flags), None) if self.is_cpu else None

    def summary(self) -> str:
        """One line for logs and records, e.g. ``cpu AMD EPYC (AVX512; avx512_bf16, avx512_vnni), 2 threads``
        or ``cuda:0 NVIDIA H200 (sm_90; bf16, fp16), 16 threads``."""
        if self.is_cpu:
            units = ", ".join(self.flags) or "no bf16/int8 matrix units"
        else:  # a GPU has no CPU flags: name the half precisions it runs
            units = "bf16, fp16" if self.gpu_bf16 else "fp16"
        return f"{self.device} {self.name} ({self.torch_capability}; {units}), {self.threads} threads"


def cpu_info() -> tuple[str, set[str]]:
    """The CPU's model name and flags from ``/proc/cpuinfo`` (empty on systems without it), read
    without importing torch (benchmarks describe the machine this way when they never load a model).

    Example:
        >>> name, flags = cpu_info()
        >>> "avx2" in flags
        True
    """
    path = Path("/proc/cpuinfo")
    name, flags = platform.processor() or platform.machine(), set()
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    return name, flags


def forced_flags() -> set[str] | None:
    """The matrix-unit flags ``NEOBERT_EMBED_CPU_FEATURES`` imposes (tests of other CPUs), else None.

    Example:
        >>> forced_flags()   # the variable is not set
    """
    value = os.environ.get(FEATURES_VARIABLE)
    if value is None:
        return None
    return {word.strip() for word in value.split(",") if word.strip() and word.strip() != "none"}


def describe_machine(device: str | None = None) -> Machine:
    """The machine a model on ``device`` runs on; cached per process, device and thread count.

    No ``device`` means where models go when none is given (:func:`~neobert_embed.devices.default_device`:
    the GPU when torch sees one), so a command run without ``--device`` measures and records the device
    its model really runs on.

    Example:
        >>> describe_machine().summary()
        'cpu AMD EPYC (AVX512; avx512_bf16, avx512_vnni), 2 threads'
    """
    if device is None:
        from neobert_embed.devices import default_device

        device = default_device()
    import torch

    return _describe(device, os.environ.get(FEATURES_VARIABLE), torch.get_num_threads())


@functools.lru_cache(maxsize=8)
def _describe(device: str, _forced: str | None, threads: int) -> Machine:
    """The cached description; ``threads`` is part of the key, so a record names the thread count in
    effect when the model was loaded, not the one of the first call in the process."""
    import torch

    if device != "cpu":
        kind = torch.device(device).type
        if kind == "cuda" and torch.cuda.is_available():
            index = torch.device(device).index or 0
            major, minor = torch.cuda.get_device_capability(index)
            return Machine(device, torch.cuda.get_device_name(index), (), f"sm_{major}{minor}", threads,
                           gpu_bf16=torch.cuda.is_bf16_supported())
        return Machine(device, kind, (), "", threads, gpu_bf16=kind == "mps")
    return _cpu(_forced, threads, torch.backends.cpu.get_cpu_capability())


def describe_cpu(threads: int, capability: str) -> Machine:
    """The CPU a runtime other than torch computes on, with ``threads`` and that runtime's ``capability``
    (its name and version): the light path's, which must not import torch to describe it.

    Example:
        >>> describe_cpu(2, "onnxruntime 1.20").summary()
        'cpu AMD EPYC (onnxruntime 1.20; avx512_bf16, avx512_vnni), 2 threads'
    """
    return _cpu(os.environ.get(FEATURES_VARIABLE), threads, capability)


@functools.lru_cache(maxsize=8)
def _cpu(_forced: str | None, threads: int, capability: str) -> Machine:
    name, flags = cpu_info()
    forced = forced_flags()
    notes: tuple[str, ...] = ()
    if forced is not None:
        flags, notes = forced, (f"flags set by {FEATURES_VARIABLE}",)
    wanted = tuple(flag for flag in (*BF16_FLAGS, *INT8_FLAGS) if flag in flags)
    return Machine("cpu", name, wanted, capability, threads, notes=notes)


def check_compute_precision(precision: str, flag: str = "--precision") -> str:
    """``precision`` if it is one of :data:`COMPUTE_PRECISIONS`, else a one-line error naming ``flag``.

    Example:
        >>> check_compute_precision("int4")
        Traceback (most recent call last):
        UserInputError: --precision 'int4' is not one of auto, fp32, bf16, fp16, int8
    """
    if precision not in COMPUTE_PRECISIONS:
        from neobert_embed.quantization import STORAGE_PRECISIONS

        stored = " (the stored vector format is --store-precision)" if precision in STORAGE_PRECISIONS else ""
        raise UserInputError(f"{flag} {precision!r} is not one of {', '.join(COMPUTE_PRECISIONS)}: it is the "
                             f"precision the model computes in{stored}")
    return precision


def check_precision_fits(precision: str, machine: Machine, flag: str = "--precision") -> None:
    """Refuse a precision the device cannot run, before any model is loaded.

    Example:
        >>> check_precision_fits("int8", describe_machine("cuda"))
        Traceback (most recent call last):
        UserInputError: --precision int8 runs on the CPU only (its kernels are CPU int8 kernels); …
    """
    if precision == "int8" and not machine.is_cpu:
        raise UserInputError(f"{flag} int8 runs on the CPU only (its kernels are CPU int8 kernels); "
                             f"drop --device {machine.device} or pick bf16/fp16")


LIBRARIES_ADDRESS_SPACE = 2_200_000_000
"""Virtual memory that loading any model takes before its weights (torch, transformers and
sentence-transformers mapped, their thread pools started): 2.5 GB measured with all-MiniLM-L6-v2 on
2 cores; the check uses a little less, so that it never refuses a load that would have worked."""
WEIGHT_COPIES = 2  # a model's weights are read into memory about twice while it loads (file, then tensors)
CGROUP_MEMORY = Path("/sys/fs/cgroup")


def memory_limits() -> list[tuple[str, int]]:
    """The memory limits this process runs under that are known before any work: the address-space
    limit (``ulimit -v``) and what the container's memory limit still leaves (cgroup v2); each as
    ``(how to name it, bytes)``.

    Example:
        >>> memory_limits()
        [('the address-space limit (ulimit -v)', 2147483648)]
    """
    import resource

    limits = []
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append(("the address-space limit (ulimit -v)", soft - _address_space_used()))
    try:
        ceiling = (CGROUP_MEMORY / "memory.max").read_text().strip()
        used = _cgroup_memory_used()
    except (OSError, ValueError):
        return limits
    if ceiling.isdigit():
        limits.append(("the container's memory limit (cgroup memory.max)", int(ceiling) - used))
    return limits


def _cgroup_memory_used() -> int:
    """Memory the container's processes hold (``anon`` of ``memory.stat``): its page cache is left
    out, since the kernel gives that back when a process needs it."""
    for line in (CGROUP_MEMORY / "memory.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "anon":
            return int(value)
    return int((CGROUP_MEMORY / "memory.current").read_text().strip())


def _address_space_used() -> int:
    """Virtual memory this process already holds (VmSize; 0 when it cannot be read)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def check_memory_for(model: str, weights_bytes: int) -> None:
    """Refuse to load ``model`` (``weights_bytes`` of weights) under a memory limit it cannot fit
    in, before it loads: one line naming the limit and what to do, not a traceback or an abort of
    a native library halfway through the load.

    Example:
        >>> check_memory_for("runs/big", 6_000_000_000)
        Traceback (most recent call last):
        UserInputError: loading runs/big needs about 14.2 GB, but the address-space limit (ulimit -v) leaves 4.0 GB; ...
    """
    from neobert_embed.errors import human_bytes

    for name, available in memory_limits():
        address_space = "ulimit -v" in name
        needed = (LIBRARIES_ADDRESS_SPACE if address_space else 0) + WEIGHT_COPIES * weights_bytes
        if needed > available:
            fix = "raise it (ulimit -v unlimited)" if address_space else "give the container more memory"
            raise UserInputError(f"loading {model} needs about {human_bytes(needed)}, but {name} leaves "
                                 f"{human_bytes(max(available, 0))}; {fix}, or use a smaller model")
