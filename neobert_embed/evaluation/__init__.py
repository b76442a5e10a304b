"""MTEB evaluation under two protocols (``model``: as configured, ``uniform``: one recipe), local
tasks, honest summaries, comparison.

The public names are imported on first use (mteb and torch are heavy), so importing the package
— as the CLI does for ``--help`` — stays instant.

Example:
    >>> from neobert_embed.evaluation import run_mteb
    >>> report = run_mteb("runs/model", task_dirs=["../shared/data/tasks"], output="runs/mteb")
    >>> report.protocol, report.scores, report.failures
"""

from __future__ import annotations

from neobert_embed.lazy import lazy_exports

_EXPORTS = {
    "EvaluationRecipe": "recipe", "load_evaluation_recipe": "recipe",
    "load_task_dir": "local_tasks", "load_task_dirs": "local_tasks",
    "run_mteb": "run", "select_tasks": "run", "EvaluationReport": "run", "TaskOutcome": "run",
    "list_benchmarks": "run", "PROTOCOLS": "protocol", "load_model_encoder": "protocol",
    "prompts_used": "protocol",
    "write_summary": "summary", "summarize": "summary",
    "UniformEncoder": "encoder", "model_identity": "encoder",
    "compare_models": "compare", "CompareResult": "compare",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, {name: f".{module}" for name, module in _EXPORTS.items()})
