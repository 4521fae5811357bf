"""Pool layout picture: buffers as rectangles in time x address (like paper 000 Fig. 3)."""

from __future__ import annotations

import os

import numpy as np

from ..plots import pyplot, save_figure
from .api import PoolResult

MIB = 2**20
FIG_SIZE = (10, 5)  # inches


def plot_layout(result: PoolResult, path: str | os.PathLike, title: str | None = None) -> None:
    """Write a PNG of `result`'s layout (needs offsets), atomically.

    Args:
        result: a PoolResult with offsets.
        path: output PNG file.
        title: figure title (default: allocator, ratio and buffer count).
    """
    plt = pyplot()
    from matplotlib.collections import PolyCollection  # loaded with pyplot (see memplan.plots.pyplot)

    p = result.problem
    scale = MIB if result.footprint_bytes >= 16 * MIB else 1
    x0, x1 = p.starts, p.ends
    y0 = result.offsets / scale
    y1 = (result.offsets + p.sizes) / scale
    boxes = np.stack([np.stack([x0, y0], 1), np.stack([x1, y0], 1), np.stack([x1, y1], 1),
                      np.stack([x0, y1], 1)], 1)
    fig, ax = plt.subplots(figsize=FIG_SIZE)
    colors = plt.cm.tab20(np.arange(p.n) % 20)
    ax.add_collection(PolyCollection(boxes, facecolors=colors, edgecolors="black", linewidths=0.2))
    ax.axhline(result.peak_load_bytes / scale, color="red", linestyle="--", linewidth=1, label="peak load")
    ax.set_xlim(0, max(p.horizon, 1))
    ax.set_ylim(0, result.footprint_bytes / scale * 1.02 or 1)
    ax.set_xlabel("time (op index)")
    ax.set_ylabel("address (MiB)" if scale == MIB else "address (bytes)")
    ax.set_title(title or f"{result.allocator}: ratio {result.ratio:.4f}, {p.n} buffers")
    ax.legend(loc="upper right")
    save_figure(fig, path)
