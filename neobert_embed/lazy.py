"""Public names of a package, imported from their modules on first use.

Why: every area's package re-exports its API (``from neobert_embed.index import build_index``),
but the command line imports those packages for ``--help`` and must not pay for torch,
transformers, faiss or mteb there. PEP 562's module ``__getattr__`` defers each import until the
name is used; this is the one implementation the packages share.

Example:
    >>> __getattr__ = lazy_exports(__name__, {"build_index": "neobert_embed.index.build"})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, homes: Mapping[str, str],
                 before: Callable[[], None] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``homes[name]`` and returns its ``name``.

    A home is a module path, absolute or relative to ``package`` (``".build"``).

    ``before`` runs ahead of the first import (NeoBERT's Auto registration, for instance).

    Example:
        >>> getter = lazy_exports("pkg", {"sqrt": "math"})
        >>> getter("sqrt")(9.0)
        3.0
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if before is not None:
            before()
        value = getattr(importlib.import_module(home, package), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    return __getattr__
