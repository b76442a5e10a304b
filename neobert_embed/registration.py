"""Register NeoBERT with transformers' Auto classes the moment transformers is imported.

Why: ``import neobert_embed`` must make ``AutoModel.from_pretrained("chandar-lab/NeoBERT")`` work
without ``trust_remote_code``, but importing torch and transformers up front costs seconds, and
the command line (``neobert-embed --help``) must answer at once. So the package installs a
one-shot import hook: if transformers is already loaded, NeoBERT is registered now; otherwise it is
registered right after ``transformers`` itself finishes importing, before user code can touch an
Auto class. Importing :mod:`neobert_embed.modeling` directly always registers too.

When one of our own modeling modules is what first imports transformers, registering at that
moment would be circular (the registering module needs classes still being defined), so the hook
skips, and each modeling module that imports transformers calls :func:`register_unless_circular`
as its last statement instead; whichever finishes last with nothing half-imported registers.

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
            register_unless_circular()

        spec.loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


def _own_modeling_module_is_initializing() -> bool:
    return any(
        name.startswith("neobert_embed.modeling.") and getattr(getattr(module, "__spec__", None), "_initializing", False)
        for name, module in list(sys.modules.items())
    )


def register_unless_circular() -> None:
    """Import the registering module, unless one of our modeling modules is still mid-import.

    Why: ``neobert_embed.modeling.configuration`` may be the first module to import transformers;
    the hook then fires while ``NeoBERTConfig`` is not defined yet. That attempt is skipped, and
    the modeling modules call this again once their classes exist.

    Example:
        >>> register_unless_circular()   # after transformers is loaded: NeoBERT is registered
    """
    try:
        importlib.import_module(REGISTERING_MODULE)
    except ImportError:
        if not _own_modeling_module_is_initializing():
            raise


def register_when_transformers_loads() -> None:
    """Register NeoBERT now if transformers is loaded, else as soon as it is (idempotent).

    Example:
        >>> register_when_transformers_loads()
    """
    if TRIGGER in sys.modules:
        register_unless_circular()
    elif not any(isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
