"""Command-line options shared by several areas' commands: one declaration, one meaning, one parser.

Why: the same flag declared in five commands drifts (``--max-length`` here, ``--max-seq-length``
there; ``--precision`` meaning the weight dtype in ``mteb`` but the vector format in ``encode``).
Commands annotate their parameters with these types, a renamed flag keeps its old spelling as a
hidden alias resolved by :func:`renamed` (one deprecation line), and ``--data NAME=PATH``, read by
``train-contrastive`` and ``compare``, has one parser, so no area imports another's helpers.

Example:
    >>> def encode(max_length: MaxLength = None, verbose: Verbose = False): ...
    >>> parse_data_option(["snli=triplets.jsonl"])
    {'snli': 'triplets.jsonl'}
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Annotated, TypeVar

import click
import typer

from neobert_embed.errors import UserInputError

T = TypeVar("T")
logger = logging.getLogger(__name__)

MAX_BATCH = 1 << 20  # texts per forward pass: more than any machine's memory holds at once
MAX_STEPS = 10**9
MAX_LEARNING_RATE = 1.0  # --lr and every recipe's learning rate: (0, 1]
MAX_TEMPERATURE = 10.0
MAX_SEED = 2**32 - 1  # numpy's seed range
MAX_LENGTH = 1 << 20  # tokens


def finite_float(low: float, high: float | None = None, *, low_open: bool = False) -> Callable[[str], float]:
    """Parser of a float option in ``[low, high]`` (``(low, high]`` with ``low_open``) that refuses
    NaN and ±Inf; ``typer.Option(..., parser=finite_float(0.0))``.

    Why: click's float ranges compare with ``<``, so ``nan`` passes every bound, and a NaN
    learning rate or margin then trains or filters silently to garbage.

    Example:
        >>> finite_float(0.0, 1.0, low_open=True)("nan")
        Traceback (most recent call last):
        ValueError: 'nan' is not a finite number
    """
    def parse(text: str | float) -> float:
        number = float(text)
        if not math.isfinite(number):
            raise ValueError(f"{text!r} is not a finite number")
        if number < low or (low_open and number == low) or (high is not None and number > high):
            bounds = f"{'(' if low_open else '['}{low:g}, {'∞)' if high is None else f'{high:g}]'}"
            raise ValueError(f"{number:g} is not in {bounds}")
        return number
    parse.__name__ = "float"  # what --help shows as the value's type
    return parse


def positive_float(high: float) -> Callable[[str], float]:
    """Parser of a float in (0, high]: learning rates, temperatures, epochs.

    Example:
        >>> positive_float(1.0)("0")
        Traceback (most recent call last):
        ValueError: 0 is not in (0, 1]
    """
    return finite_float(0.0, high, low_open=True)


def check_precision_option(value: str | None) -> str | None:
    """``--precision``: an unknown compute precision is refused while the command line is read.

    Example:
        >>> check_precision_option("float16")
        Traceback (most recent call last):
        UserInputError: --precision 'float16' is not one of auto, fp32, bf16, fp16, int8: ...
    """
    if value is None:
        return None
    from neobert_embed.machine import check_compute_precision

    return check_compute_precision(value)


def check_device_option(value: str | None) -> str | None:
    """``--device``: refused at once, as a device error, when this machine has no such device.

    Example:
        >>> check_device_option("tpu7")
        Traceback (most recent call last):
        click.BadParameter: --device 'tpu7': ...
    """
    if value is None:
        return None
    from neobert_embed.devices import check_device

    try:
        return check_device(value)
    except UserInputError as exc:
        raise click.BadParameter(str(exc)) from None


Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Show third-party warnings and progress bars on "
                                       "screen instead of writing them to the run's log (OUTPUT.log).")]
MaxLength = Annotated[int | None, typer.Option("--max-length", min=1, max=MAX_LENGTH, help="Truncate inputs to this many tokens "
                                               "(default: the model's own max_seq_length, or the recipe's).")]
OldMaxLength = Annotated[int | None, typer.Option("--max-seq-length", min=1, hidden=True,
                                                  help="Deprecated spelling of --max-length.")]
StorePrecision = Annotated[str | None, typer.Option("--store-precision", help="How vectors are stored: float32 "
                                                    "(default), float16, int8 or binary (packed bits).")]
ComputePrecision = Annotated[str, typer.Option(
    "--precision", callback=check_precision_option, help="Compute precision of the model's forward: auto (the fastest of fp32/bf16/int8 whose vectors "
    "stay within cosine 0.9999 of fp32 on this machine, measured on a few of the inputs), fp32, bf16, fp16 or int8. "
    "Not the stored vector format (--store-precision).")]
Backend = Annotated[str, typer.Option("--backend", help="torch (default), or onnx / openvino to run the files "
                                      "written by `neobert-embed export` (MODEL is then the export's directory).")]
BatchSize = Annotated[int, typer.Option("--batch-size", min=1, max=MAX_BATCH, help="Texts per forward pass.")]
Device = Annotated[str | None, typer.Option("--device", callback=check_device_option,
                                            help="cpu, cuda, mps… (default: automatic).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
NoWait = Annotated[bool, typer.Option("--no-wait", help="Fail at once if another process writes the same output.")]


def renamed(new_flag: str, new: T | None, old_flag: str, old: T | None) -> T | None:
    """The value of a renamed option: the new spelling's, or the old one's with one deprecation line.

    Example:
        >>> renamed("--max-length", None, "--max-seq-length", 128)   # logs: --max-seq-length is deprecated…
        128
    """
    if old is None:
        return new
    if new is not None and new != old:
        raise UserInputError(f"{old_flag} is the old spelling of {new_flag}; give {new_flag} only")
    logger.warning("%s is deprecated; use %s (same meaning)", old_flag, new_flag)
    return old


def comma_list(value: str | None) -> list[str] | None:
    """``--tasks a, b,c`` as ``['a', 'b', 'c']``; None when nothing is given.

    Example:
        >>> comma_list("cola, sst2,")
        ['cola', 'sst2']
    """
    return [item.strip() for item in value.split(",") if item.strip()] or None if value else None


def parse_data_option(entries: list[str]) -> dict[str, str]:
    """``--data NAME=PATH`` entries as a name → path mapping; a malformed or repeated name is refused.

    Example:
        >>> parse_data_option(["a=x.jsonl", "b=y.csv"])
        {'a': 'x.jsonl', 'b': 'y.csv'}
    """
    data: dict[str, str] = {}
    for entry in entries:
        name, sep, path = entry.partition("=")
        if not sep or not name or not path:
            raise UserInputError(f"--data {entry!r}: expected NAME=PATH, e.g. --data snli=triplets.jsonl")
        if name in data:
            raise UserInputError(f"--data: dataset name {name!r} is given twice; names must be unique")
        data[name] = path
    return data
