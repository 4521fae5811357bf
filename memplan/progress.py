"""Progress bars for searches: on stderr, only on a terminal, only once a search passes a second.

Every search that can take longer than a second (AutoSwap's Bayesian optimisation,
SmartPool's pool search, `maxbatch`, `sweep`) shows one of these, so a user never waits on
a silent prompt; short work and redirected stderr (scripts, `--json` pipelines, tests)
see nothing.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

SHOW_AFTER_S = 1.0  # a search shorter than this shows no bar at all
TICK_S = 0.25  # how often a time-limited bar advances
REDRAW_S = 0.1  # shortest time between two redraws (tqdm's default)


class _NoBar:
    """What a hidden bar is: the calls a search makes on a tqdm bar, doing nothing (tqdm itself
    takes a tenth of a second to import, which a time-limited command would pay for nothing)."""

    n = 0

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def update(self, n=1) -> None:
        self.n += n

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        return None


def progress_bar(desc: str, total: int | None = None, unit: str = "it", enabled: bool = True,
                 bar_format: str | None = None):
    """A tqdm bar (use as a context manager; `update`, `set_postfix_str`); `enabled=False`, or
    stderr not being a terminal, hides it."""
    if not enabled or not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm  # here: a command whose bar stays hidden does not pay for its import

    return tqdm(desc=desc, total=total, unit=unit, file=sys.stderr, delay=SHOW_AFTER_S, mininterval=REDRAW_S,
                disable=None if enabled else True, leave=False, dynamic_ncols=True, bar_format=bar_format)


@contextlib.contextmanager
def time_limit_bar(desc: str, limit_s: float):
    """A bar over a search's time limit, advanced by a background thread until the block ends."""
    done = threading.Event()
    with progress_bar(desc, unit="s", bar_format="{desc}: {elapsed} of " + f"{limit_s:g} s") as bar:

        def tick():
            started = time.monotonic()
            while not done.wait(TICK_S):
                bar.update(round(time.monotonic() - started - bar.n, 2))

        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield bar
        finally:
            done.set()
            thread.join()
