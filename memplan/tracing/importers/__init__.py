"""Importers: other tools' memory traces as memplan Traces.

- `read_snapshot` / `snapshot_to_trace`: PyTorch CUDA memory snapshots (pickle or JSON);
  `snapshot_records` feeds a multi-iteration snapshot to `memplan.tracing.iteration.cut_iteration`.
- `read_dtr_log` / `parse_dtr_log`: DTR (simrd) operator logs.
- `read_minimalloc` / `write_minimalloc_csv`: minimalloc CSV pool problems.

Each sets `trace.meta["source"]` to the format's name.
"""

from .dtr import parse_dtr_log, read_dtr_log
from .minimalloc import parse_minimalloc, read_minimalloc, write_minimalloc_csv
from .snapshot import read_snapshot, read_snapshot_data, snapshot_records, snapshot_to_trace

__all__ = ["parse_dtr_log", "parse_minimalloc", "read_dtr_log", "read_minimalloc", "read_snapshot",
           "read_snapshot_data", "snapshot_records", "snapshot_to_trace", "write_minimalloc_csv"]
