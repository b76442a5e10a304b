"""How a benchmark's figures were obtained, as one ``"conditions"`` block of its JSON report.

Why: a number without its conditions cannot be compared or checked. Every summary this toolkit
writes, benchmarks included, says which data (and which split or sample of it) the figure comes
from, whether anything was selected on that same data, which protocol produced it, which compute
precision, how timings were aggregated, and on which machine. The benchmarks used to record
different subsets of these under different names (``machine``, ``cpus``, ``torch_threads``,
``load_average_1min`` …); :func:`conditions` gives them one vocabulary. The keys it always
returns are :data:`KEYS`; a script adds its own facts (model, device, library versions) as
keyword arguments.

The machine comes from :func:`neobert_embed.machine.describe_machine` (CPU model,
PyTorch's dispatch level, the bf16/int8 matrix units ``auto`` would use) when this process has
imported torch or ``probe_torch=True`` says the measured child processes use it; otherwise from
``/proc/cpuinfo`` alone, so a benchmark that never touches torch does not pay seconds to import it
just to describe itself. Importing this module imports nothing heavy.

Example:
    >>> report["conditions"] = conditions(
    ...     data="STS-B dev (../shared/data/stsb/dev.jsonl), all 1,500 pairs",
    ...     precision="fp32", protocol="encode both sentences, cosine, Spearman against the gold scores",
    ...     selection="nothing selected", timing="best of 3 passes after a 32-text warm-up",
    ...     threads=1, model="all-MiniLM-L6-v2")
    >>> report["conditions"]["machine"]["summary"]
    'cpu AMD EPYC 9B14 (AVX512; avx512_bf16, avx512_vnni)'
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: Every key :func:`conditions` returns (a script's own keyword arguments come after them).
KEYS = ("data", "selection", "protocol", "precision", "timing", "threads", "device", "machine", "python",
        "torch", "load_average", "command", "git_commit", "recorded_at")

#: Keys that describe the machine, in ``conditions(...)["machine"]``.
MACHINE_KEYS = ("summary", "name", "cpus", "torch_capability", "matrix_unit_flags", "bf16_units", "int8_units",
                "platform", "notes")


def conditions(*, data: str, precision: str | Mapping[str, Any], protocol: str, selection: str, timing: str,
               threads: int | Sequence[int] | str | None = None, device: str = "cpu",
               probe_torch: bool = False, **extra: Any) -> dict[str, Any]:
    """The conditions of one benchmark run, JSON-ready: put them under the report's ``"conditions"`` key.

    Args:
        data: the data the figures come from and which part of it: file, split, the first N rows,
            the sampling seed, or "synthetic …" and how it is generated.
        precision: the compute precision (``fp32``, ``bf16 autocast`` …), or one per variant
            (``{"toolkit int8": "int8", "onnx": "fp32"}``) when the run compares several.
        protocol: what is run to obtain each figure (forward only, a training step, a whole CLI
            process …) and what is compared with what.
        selection: whether anything reported was chosen on this same data, e.g. "nothing selected",
            "best batch size of the sweep", "constants grid-searched on these same cases (in-sample)".
        timing: how each timing is aggregated, e.g. "best of 5 runs after 1 warm-up, variants
            interleaved"; "not timed" for a correctness check.
        threads: the intra-op threads of the timed processes when the caller knows them (a list for
            several settings, a sentence for child processes); default: ``torch.get_num_threads()``
            when this process imported torch, else None (torch not used here).
        device: the device the figures were measured on (``cpu``, ``cuda``, ``cuda:1``).
        probe_torch: describe the machine through torch even though this process has not imported it
            (for a benchmark whose child processes run the model): adds PyTorch's dispatch level.
        **extra: the script's own facts (model, library versions, notes); JSON-able or turned into
            strings. They may not reuse a name of :data:`KEYS`.

    Raises:
        TypeError: an ``extra`` keyword named like one of :data:`KEYS`.

    Example:
        >>> conditions(data="synthetic: 1,000 random 384-d vectors (seed 0)", precision="fp32",
        ...            protocol="flat search of 200 held-out queries", selection="nothing selected",
        ...            timing="one timed pass after an 8-query warm-up")["precision"]
        'fp32'
    """
    clash = sorted(set(extra) & set(KEYS))
    if clash:
        raise TypeError(f"conditions(): {', '.join(clash)} is one of its own keys; pass it by its parameter")
    torch_used = "torch" in sys.modules  # before describing the machine, which may import it
    if threads is None and torch_used:
        threads = sys.modules["torch"].get_num_threads()
    record: dict[str, Any] = {
        "data": data, "selection": selection, "protocol": protocol, "precision": _jsonable(precision),
        "timing": timing, "threads": _jsonable(threads), "device": device,
        "machine": _machine(device, describe_with_torch=torch_used or probe_torch or device != "cpu"),
        "python": platform.python_version(), "torch": _torch_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "command": _command(), "git_commit": _git_commit(),
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return record | {key: _jsonable(value) for key, value in extra.items()}


def _machine(device: str, describe_with_torch: bool) -> dict[str, Any]:
    """The machine as :data:`MACHINE_KEYS`; an error is recorded, never raised (the run is done by now)."""
    try:
        from neobert_embed import machine as machines

        if describe_with_torch:
            found = machines.describe_machine(device)
            notes = list(found.notes)
        else:  # the same reading of /proc/cpuinfo as describe_machine, without importing torch
            name, flags = machines.cpu_info()
            forced = machines.forced_flags()
            notes = ["torch not imported by this process: no dispatch level"]
            if forced is not None:
                flags = forced
                notes.insert(0, f"flags set by {machines.FEATURES_VARIABLE}")
            wanted = tuple(flag for flag in (*machines.BF16_FLAGS, *machines.INT8_FLAGS) if flag in flags)
            found = machines.Machine("cpu", name, wanted, "")
    except Exception as exc:  # a report without its machine beats no report at the end of a long run
        return {"summary": f"unknown ({type(exc).__name__}: {exc})", "cpus": os.cpu_count(),
                "platform": platform.platform()}
    units = ", ".join(found.flags) or "no bf16/int8 matrix units"
    if not found.is_cpu:
        units = "bf16" if found.gpu_bf16 else "no bf16"
    return {"summary": f"{found.device} {found.name} ({found.torch_capability or 'dispatch level not read'}; "
                       f"{units})",
            "name": found.name, "cpus": os.cpu_count(), "torch_capability": found.torch_capability or None,
            "matrix_unit_flags": list(found.flags), "bf16_units": found.bf16_units, "int8_units": found.int8_units,
            "platform": platform.platform(), "notes": notes}


def _torch_version() -> str | None:
    """The torch this process imported, else the installed one (read without importing it)."""
    if "torch" in sys.modules:
        return str(sys.modules["torch"].__version__)
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def _command() -> str:
    """The command line that produced the report, the script relative to the repository when inside it."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).is_file():
        script = Path(argv[0]).resolve()
        argv[0] = str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else argv[0]
    return shlex.join(["python", *argv])


def _git_commit() -> str | None:
    """``HEAD``'s short hash, ``+dirty`` when tracked files differ from it; None outside a checkout."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def _jsonable(value: Any) -> Any:
    """``value`` as JSON would read it back: tuples become lists, paths and other objects strings."""
    return json.loads(json.dumps(value, default=str))
