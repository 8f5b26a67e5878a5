"""How the project writes a figure: matplotlib's file-only backend and one way to finish a PNG.

Every command that plots (``demo``, ``ablate``, ``fidelity``, ``segments``, ``eval``) draws on `pyplot()` and ends
with `save`; the Agg backend needs no display (servers, CI) and a closed figure frees its memory (a grid plots
after every run).
"""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (imported on first use: the trainer's processes never plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path, title: str | None = None, dpi: int = 100) -> Path:
    """Give ``fig`` its ``title`` (if any), lay it out tight, write it to ``path`` and close it."""
    if title is not None:
        fig.suptitle(title)
    top = 1 - (0.4 / fig.get_figheight() if title is not None else 0)  # 0.4 inch for the title on tall figures too
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
