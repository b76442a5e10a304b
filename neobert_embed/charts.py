"""Figures as PNG bytes, drawn off-screen: the one place matplotlib is set up.

Why: summaries (MTEB categories, GLUE tasks, the demo) write charts from servers and CI machines
with no display; each needs the Agg backend, a figure, and its PNG bytes for an atomic write, and
the figure must be closed so long runs do not leak memory.

Example:
    >>> figure, axis = subplots(figsize=(4, 3))
    >>> axis.bar(["a", "b"], [1, 2])
    >>> png_bytes(figure)[:4]
    b'\\x89PNG'
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def subplots(*args: Any, **kwargs: Any) -> tuple[Figure, Any]:
    """``matplotlib.pyplot.subplots`` on the off-screen Agg backend.

    Example:
        >>> figure, (left, right) = subplots(1, 2, figsize=(8, 3))
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def png_bytes(figure: Figure, dpi: int = 120) -> bytes:
    """Lay out ``figure``, return it as PNG bytes, and close it.

    Example:
        >>> atomic_write_bytes("chart.png", png_bytes(figure))
    """
    import matplotlib.pyplot as plt

    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    plt.close(figure)
    return buffer.getvalue()
