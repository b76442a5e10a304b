"""Whether the Hugging Face hub may be reached, as the hub libraries themselves decide it.

Why: error messages differ when ``HF_HUB_OFFLINE`` is set (only local directories and cached
files can load); the model loader and the mteb runner both need the same answer.

Example:
    >>> import os; os.environ["HF_HUB_OFFLINE"] = "1"
    >>> hub_offline()
    True
"""

from __future__ import annotations

import os

TRUE_VALUES = frozenset({"1", "true", "yes", "on"})


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set to a true value (huggingface_hub's spelling rules).

    Example:
        >>> hub_offline()
        False
    """
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in TRUE_VALUES
