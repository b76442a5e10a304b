"""GLUE fine-tuning with the NeoBERT paper's protocol, for any backbone (``neobert-embed glue``).

Modules: :mod:`.tasks` (the eight tasks, metrics), :mod:`.data` (hub or local task directories),
:mod:`.presets` (validated grids, trial expansion and MNLI→target ordering), :mod:`.trial` (one
fine-tuning run with ``transformers.Trainer``), :mod:`.journal` (per-trial results on disk),
:mod:`.selection` (best configuration on validation), :mod:`.summary` (table and chart),
:mod:`.server` (GLUE-server TSVs) and :mod:`.run` (the whole protocol).

Nothing heavy is imported here, so the CLI stays light.

Example:
    >>> from neobert_embed.glue import run_glue
    >>> run_glue(["neobert"], "runs/glue", tasks=["rte", "mnli"], preset="paper")
"""

from __future__ import annotations

from neobert_embed.lazy import lazy_exports

_HOMES = {"GluePreset": ".presets", "load_glue_preset": ".presets", "run_glue": ".run"}

__all__ = sorted(_HOMES)

__getattr__ = lazy_exports(__name__, _HOMES)
