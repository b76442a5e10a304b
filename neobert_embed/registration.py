"""Register NeoBERT with transformers' Auto classes the moment transformers is imported.

Why: ``import neobert_embed`` must make ``AutoModel.from_pretrained("chandar-lab/NeoBERT")`` work
without ``trust_remote_code``, but importing torch and transformers up front costs seconds, and
the command line (``neobert-embed --help``) must answer at once. So the package installs a
one-shot import hook: if transformers is already loaded, NeoBERT is registered now; otherwise it is
registered right after ``transformers`` itself finishes importing, before user code can touch an
Auto class. Importing :mod:`neobert_embed.modeling` directly always registers too.

Example:
    >>> import neobert_embed                 # light: neither torch nor transformers is imported
    >>> import transformers                  # NeoBERT is registered as this import completes
    >>> transformers.AutoConfig.for_model("neobert").model_type
    'neobert'
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

TRIGGER = "transformers"
REGISTERING_MODULE = "neobert_embed.modeling.auto"


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of ``transformers`` so registration follows it."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TRIGGER:
            return None
        sys.meta_path.remove(self)  # one shot, and no recursion into ourselves below
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        load = spec.loader.exec_module

        def exec_then_register(module: ModuleType) -> None:
            load(module)
            importlib.import_module(REGISTERING_MODULE)

        spec.loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


def register_when_transformers_loads() -> None:
    """Register NeoBERT now if transformers is loaded, else as soon as it is (idempotent).

    Example:
        >>> register_when_transformers_loads()
    """
    if TRIGGER in sys.modules:
        importlib.import_module(REGISTERING_MODULE)
    elif not any(isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
