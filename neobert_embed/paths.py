"""Where the project's own data files (YAML recipes) live, in a checkout or an installed copy.

Why: recipes are user-facing files kept at the repository root (``recipes/``); a wheel install
carries them under ``<prefix>/share/neobert-embed/recipes``. Code asks here instead of guessing.

Example:
    >>> recipe_path("pretrain-tiny.yaml").name
    'pretrain-tiny.yaml'
"""

from __future__ import annotations

import sys
from pathlib import Path

from neobert_embed.errors import UserInputError

RECIPE_DIRS = (Path(__file__).resolve().parents[1] / "recipes",
               Path(sys.prefix) / "share" / "neobert-embed" / "recipes")


def recipe_path(name: str) -> Path:
    """Path of a bundled recipe such as ``contrastive.yaml``.

    Example:
        >>> recipe_path("contrastive.yaml").is_file()
        True
    """
    for directory in RECIPE_DIRS:
        candidate = directory / name
        if candidate.is_file():
            return candidate
    raise UserInputError(f"bundled recipe {name!r} not found in {', '.join(map(str, RECIPE_DIRS))}; "
                         "pass the recipe's path explicitly")
