"""Devices: which ones this machine has, checked before any model or data is loaded.

Why: a mistyped ``--device`` used to surface deep inside the model loader as a problem with the
model's files, after seconds of loading. Every command checks its device here first, and the
answer is a device error: what was asked, what this machine has.

Example:
    >>> check_device("cpu")
    'cpu'
    >>> check_device("cuda:3")
    Traceback (most recent call last):
    UserInputError: --device 'cuda:3': this machine has no CUDA device ...
"""

from __future__ import annotations

from neobert_embed.errors import UserInputError


def available_devices() -> list[str]:
    """The devices torch can use here, in the form ``--device`` takes.

    Example:
        >>> available_devices()
        ['cpu']
    """
    import torch

    found = ["cpu"]
    found += [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        found.append("mps")
    return found


def default_device() -> str:
    """Where work goes when no ``--device`` is given: ``cuda`` when torch sees a GPU, else ``cpu``.

    Why one function: training, GLUE workers and index ranks must agree on the default, or a
    torchrun job would put one rank on the GPU and another on the CPU.

    Example:
        >>> default_device()   # on a machine without a GPU
        'cpu'
    """
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device: str, flag: str = "--device") -> str:
    """Return ``device`` when this machine has it; otherwise one line naming what it has.

    Example:
        >>> check_device("cuda")   # on a machine without a GPU
        Traceback (most recent call last):
        UserInputError: --device 'cuda': this machine has no CUDA device; available: cpu
    """
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise UserInputError(f"{flag} {device!r} is not a device name; available here: "
                             f"{', '.join(available_devices())}") from None
    have = available_devices()
    if parsed.type == "cpu":
        return device
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (parsed.index or 0) >= count:
            raise UserInputError(f"{flag} {device!r}: this machine has no such CUDA device "
                                 f"({count} found); available: {', '.join(have)}")
        return device
    if parsed.type == "mps" and "mps" in have:
        return device
    raise UserInputError(f"{flag} {device!r}: no such device on this machine; available: {', '.join(have)}")
