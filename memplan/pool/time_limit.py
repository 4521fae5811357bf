"""Wall-clock accounting for `--time-limit`: what a call has already spent, and what to keep
for the work that follows the allocator (validation and the result's slots)."""

from __future__ import annotations

import os
import time

CHECK_S_PER_BUFFER = 20e-6  # validation (check.py) plus the result's slots, per buffer, measured on a loaded host
CHECK_S_FIXED = 0.02  # the same, per call
EXIT_S = 0.25  # printing the result and interpreter shutdown after it, measured on a loaded host


def process_age_s() -> float:
    """Seconds since this process started (interpreter start-up and imports included); 0.0
    where /proc is not available."""
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime: clock ticks since boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def command_limit_s(time_limit_s: float) -> float:
    """What is left of a command's wall-clock `time_limit_s` for solving, once this process's
    start-up and loading so far and its exit after the result are taken off."""
    return max(time_limit_s - process_age_s() - EXIT_S, 0.0)


def reserve_s(buffers: int) -> float:
    """Seconds to keep after the allocator for validating `buffers` offsets and building slots."""
    return CHECK_S_FIXED + CHECK_S_PER_BUFFER * buffers
