"""The precision a training run uses, and why: one rule for ``train-contrastive``, ``glue`` and ``pretrain``.

Why: mixed precision with bf16 autocast (fp32 master weights and optimizer state, matrix products
in bf16, the loss in fp32) is the fast choice wherever the hardware has bf16 matrix units: a GPU
that supports bf16, and a CPU with ``amx_bf16`` or ``avx512_bf16``. On an AMD EPYC with
``avx512_bf16`` (one thread), bf16 autocast ran all-MiniLM-L6-v2's contrastive steps 1.3-1.8× as
fast as fp32 and a 384-wide NeoBERT's MLM steps 1.58× (the 128-wide ``pretrain-tiny`` 1.13×), with
losses within 0.005 and 0.054 of fp32's over the same steps. On a CPU without such units bf16 is
emulated and slower than fp32, so ``auto`` keeps fp32 there. fp16 autocast needs a loss scaler and fp16 matrix units, which CPUs do not have: it is
refused on the CPU with one line instead of failing inside the trainer.

On a CPU, ``auto``'s bf16 is then confirmed by measurement on the run's own model and texts
(:func:`measured_cpu_precision`): a bf16 unit that does not pay off (seen on an AMX Xeon's backward)
leaves the run in fp32, so ``auto`` never trains slower than fp32.

The hardware comes from :func:`neobert_embed.machine.describe_machine` (so
``NEOBERT_EMBED_CPU_FEATURES=none`` makes ``auto`` pick fp32, as for inference). MPS keeps fp32
under ``auto``, as before.

Example:
    >>> resolve_training_precision("auto", "cpu").label
    'bf16 autocast: avx512_bf16'
    >>> resolve_training_precision("auto", "cpu").label   # NEOBERT_EMBED_CPU_FEATURES=none
    'fp32: this CPU has no bf16 matrix units'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from neobert_embed.errors import UserInputError

PRECISIONS = ("auto", "bf16", "fp16", "fp32")


@dataclass(frozen=True)
class TrainingPrecision:
    """What a run trains in (``dtype``: bf16, fp16 or fp32) and why (``reason``: the unit, or "asked for").

    ``label`` is the one-line form commands print and record, e.g. ``bf16 autocast: avx512_bf16``.
    """

    dtype: str
    reason: str

    @property
    def label(self) -> str:
        """``bf16 autocast: avx512_bf16``, ``fp32: this CPU has no bf16 matrix units`` …"""
        mode = "fp32" if self.dtype == "fp32" else f"{self.dtype} autocast"
        return f"{mode}: {self.reason}"

    @property
    def announcement(self) -> str:
        """The console line a run starts with, e.g.
        ``training in bf16 autocast: avx512_bf16 (fp32 master weights)``."""
        return f"training in {self.label}" + ("" if self.dtype == "fp32" else " (fp32 master weights)")

    @property
    def bf16(self) -> bool:
        """True when the run computes in bf16."""
        return self.dtype == "bf16"


def device_kind(device: str) -> str:
    """``cpu``, ``cuda`` or ``mps`` for a torch device string (``cuda:1`` → ``cuda``)."""
    return device.split(":", 1)[0]


def resolve_training_precision(precision: str, device: str) -> TrainingPrecision:
    """The precision a run asked for as ``precision`` (auto | bf16 | fp16 | fp32) trains in on ``device``.

    ``auto``: bf16 where :func:`describe_machine` names a bf16 unit (a CPU with ``amx_bf16`` or
    ``avx512_bf16``, a CUDA GPU that supports bf16), else fp32 (MPS included).

    Raises:
        UserInputError: fp16 on the CPU (no fp16 matrix units; bf16 or fp32 are the choices there),
            or an unknown name.

    Example:
        >>> resolve_training_precision("fp32", "cuda").label
        'fp32: asked for'
    """
    from neobert_embed.machine import describe_machine

    kind = device_kind(device)
    if precision not in PRECISIONS:
        raise UserInputError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and kind == "cpu":
        raise UserInputError("precision fp16 cannot train on the CPU (CPUs have no fp16 matrix units); "
                             "use auto, bf16 or fp32")
    if precision != "auto":
        slow = precision == "bf16" and kind == "cpu" and not describe_machine("cpu").bf16_units
        return TrainingPrecision(precision, "asked for (this CPU has no bf16 matrix units: slower than fp32)"
                                 if slow else "asked for")
    if kind == "cpu":
        unit = describe_machine("cpu").bf16_units
        return TrainingPrecision("bf16", unit) if unit else TrainingPrecision(
            "fp32", "this CPU has no bf16 matrix units")
    if kind == "cuda":
        unit = describe_machine(device).bf16_units
        return TrainingPrecision("bf16", unit) if unit else TrainingPrecision(
            "fp32", "this GPU does not support bf16")
    return TrainingPrecision("fp32", f"auto keeps fp32 on {kind}")


def measured_cpu_precision(chosen: TrainingPrecision, time_step: Callable[[bool], float],
                           repeats: int = 2) -> TrainingPrecision:
    """``auto``'s bf16 choice on a CPU, kept only where bf16 autocast runs this run's own step faster than fp32.

    Why: a bf16 unit is no promise. On an AMX Xeon, bf16 autocast took 0.99 s for a small NeoBERT's
    backward against 0.23 s in fp32 (a small model and new shapes every step: the bf16 kernels' set-up
    per shape is the suspect, which a machine without AMX cannot show), and on a busy shared CPU the
    gain can vanish; ``auto`` must never train slower than fp32. So the choice is measured on the
    machine, on the model and texts of the run: ``time_step(bf16)`` runs one forward and backward and
    returns its seconds (the caller gives each bf16/fp32 pair of calls inputs of new shapes, as
    training steps have); after one warm-up call of each, ``repeats`` calls of each are interleaved and
    the fastest of each compared. ``chosen`` other than bf16 is returned as is.

    Example:
        >>> measured_cpu_precision(TrainingPrecision("bf16", "avx512_bf16"), lambda bf16: 2.0 if bf16 else 1.0).label
        'fp32: bf16 autocast measured slower than fp32 on this CPU (2.00 s vs 1.00 s per probe step)'
    """
    if chosen.dtype != "bf16":
        return chosen
    time_step(True), time_step(False)  # first calls pay one-time costs (kernels, weight casts)
    timings: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repeats):
        for bf16 in (True, False):
            timings[bf16].append(time_step(bf16))
    bf16_s, fp32_s = min(timings[True]), min(timings[False])
    if bf16_s < fp32_s:
        return TrainingPrecision("bf16", f"{chosen.reason}, measured {fp32_s / bf16_s:.2f}x fp32's speed")
    return TrainingPrecision("fp32", f"bf16 autocast measured slower than fp32 on this CPU ({bf16_s:.2f} s vs "
                                     f"{fp32_s:.2f} s per probe step)")


def training_device(device: str | None = None) -> str:
    """The kind of device training on ``device`` runs on (None: :func:`~neobert_embed.devices.default_device`):
    ``cuda`` when asked and present (``cuda:1`` counts as ``cuda``), else ``cpu``.

    Why not MPS: the Hugging Face trainer would pick it on a Mac by itself, while encoding, the
    precision choice and the records go by ``default_device``; :func:`~neobert_embed.contrastive.trainer.device_flags`
    pins the trainer to the device this returns, so training runs where everything else does.

    Example:
        >>> training_device()   # on a machine without a GPU (a Mac with MPS included)
        'cpu'
    """
    import torch

    from neobert_embed.devices import default_device

    wanted = device or default_device()
    return "cuda" if wanted.startswith("cuda") and torch.cuda.is_available() else "cpu"


def chosen_precision(precision: str, device: str | None = None) -> TrainingPrecision:
    """What ``precision`` (auto | bf16 | fp16 | fp32) trains in on the trainer's ``device`` (None: the
    GPU, else the CPU; see :func:`training_device`).

    Example:
        >>> chosen_precision("auto", "cpu").label   # on a CPU with avx512_bf16
        'bf16 autocast: avx512_bf16'
    """
    return resolve_training_precision(precision, training_device(device))
