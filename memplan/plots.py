"""Shared plotting helpers (matplotlib, Agg backend, files written atomically in the format their name says)."""

from __future__ import annotations

import os

import numpy as np

from .fileio import atomic_output, check_output_path

GIB = 2**30
DPI = 120  # pixels per inch of every PNG


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend."""
    import matplotlib  # half a second to import: only a command that draws pays for it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is chosen

    return plt


def subplots(*args, **kwargs):
    """`matplotlib.pyplot.subplots` on the Agg backend: (figure, axes)."""
    return pyplot().subplots(*args, **kwargs)


def new_figure(width: float = 9.0, height: float = 4.5):
    """A (figure, axes) pair on the non-interactive Agg backend."""
    return subplots(figsize=(width, height))


def save_figure(fig, path: str | os.PathLike) -> None:
    """Save `fig` at `path` in the format its name says (.png, .pdf or .svg) through a
    temporary file, then close it.

    Raises:
        MemplanError: `path` is a folder, cannot be written, or names another format (nothing
            is left behind).
    """
    try:
        suffix = check_output_path(path, "plot").suffix.lower()
        with atomic_output(path, suffix=suffix) as tmp:
            fig.savefig(tmp, format=suffix[1:], dpi=DPI, bbox_inches="tight")
    finally:
        pyplot().close(fig)


def plot_load_curves(title: str, trace, cost, results: dict, path: str | os.PathLike) -> None:
    """Memory load over simulated time: the unconstrained run and each plan's timeline.

    Args:
        title: figure title.
        trace: the Trace (its load curve is drawn against unconstrained op start times).
        cost: the Cost whose durations place the unconstrained ops in time.
        results: planner name -> SimResult simulated with timeline=True.
        path: PNG file to write.
    """
    fig, ax = new_figure()
    starts = np.concatenate([[0.0], np.cumsum(cost.durations)])[:-1]
    ax.step(starts * 1e3, trace.load / GIB, where="post", color="black", lw=1.5, label="no plan")
    for name, sim in results.items():
        if sim.timeline_t is None or name == "none":
            continue
        ax.step(np.asarray(sim.timeline_t) * 1e3, np.asarray(sim.timeline_load) / GIB, where="post", lw=1, label=name)
    ax.set_xlabel("simulated time (ms)")
    ax.set_ylabel("memory load (GiB)")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, path)


def plot_history(title: str, history: dict, path: str | os.PathLike) -> None:
    """A search's convergence (`Plan.history`): every series against the search step, in percent.

    Args:
        title: figure title.
        history: {"xlabel", "ylabel", "series": {name: values (None where undefined)}, "converged_at"}.
        path: PNG file to write.
    """
    fig, ax = new_figure(7.0, 4.0)
    for name, values in history["series"].items():
        y = np.array([np.nan if v is None else 100.0 * v for v in values])
        ax.plot(np.arange(1, len(y) + 1), y, lw=1.2, label=name)
    if history.get("converged_at"):
        ax.axvline(history["converged_at"], color="grey", ls=":", lw=1, label="no particle moves from here")
    ax.set_xlabel(history.get("xlabel", "step"))
    ax.set_ylabel(f"{history.get('ylabel', 'score')} (%)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    save_figure(fig, path)
