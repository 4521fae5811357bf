"""The convolution benchmark database: SQLite, one row per (kernel, micro-batch size, algorithm, source).

mu-cuDNN keeps its benchmarks in a file so that layers of equal shape, later runs and
other machines of the same kind reuse them; memplan does the same. A row keys on the
kernel's shape (every Kernel field but the batch), the micro-batch size, the algorithm
and the source (`model:v100`, `cpu:<this CPU>`, `cudnn:<GPU name>`, `deepbench:v100`)
and holds the time in seconds and the workspace in bytes, NULL where the source cannot
know it (PyTorch's CPU convolutions keep their temporaries to themselves). The `meta`
table names the schema and its version; a file that is not such a database is refused
in one line. Writes happen in transactions, and a new file is created complete (an
empty schema renamed into place), so an interrupted fill leaves a valid database, and a
file made for work that then failed (a bad import, an interrupted first fill) is removed.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..errors import MemplanError
from ..fileio import atomic_output, check_output_path
from .kernels import SHAPE_FIELDS, Kernel

SCHEMA = "memplan.conv-db"
VERSION = 1
_SHAPE_COLUMNS = ", ".join(SHAPE_FIELDS)
_CREATE = f"""
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE benchmarks (
  {", ".join(f"{name} {'TEXT' if name in ('kind', 'dtype') else 'INTEGER'} NOT NULL" for name in SHAPE_FIELDS)},
  batch INTEGER NOT NULL, algo TEXT NOT NULL, source TEXT NOT NULL,
  time_s REAL NOT NULL, workspace_bytes INTEGER,
  PRIMARY KEY ({_SHAPE_COLUMNS}, batch, algo, source));
INSERT INTO meta VALUES ('schema', '{SCHEMA}'), ('version', '{VERSION}');
"""


@dataclass(frozen=True, kw_only=True)
class Row:
    """One benchmark: an algorithm on a kernel (its batch is the micro-batch size)."""

    kernel: Kernel  # what was run, at the micro-batch size
    algo: str  # algorithm (a family for `model`, cuDNN's engine for `cudnn`, "pytorch" for `cpu`)
    source: str  # who measured or modelled it
    time_s: float  # seconds of one run
    workspace_bytes: int | None  # its workspace; None when unknown


class ConvDB:
    """A benchmark database file (or an in-memory one for `path=None`); use as a context manager.

    Raises (on opening):
        MemplanError: the file is not a memplan convolution database, or cannot be opened.
    """

    def __init__(self, path: str | os.PathLike | None = None, create: bool = True):
        self.path = None if path is None else Path(path)
        self.created = False  # made by this object: removed again if the work on it fails
        if self.path is not None and not self.path.exists():
            if not create:
                raise MemplanError(f"{self.path}: no such benchmark database")
            _create_file(self.path)
            self.created = True
        try:
            self.conn = sqlite3.connect(":memory:" if self.path is None else str(self.path))
            if self.path is None:
                self.conn.executescript(_CREATE)
            self._check_schema()
        except sqlite3.Error as exc:
            raise MemplanError(f"{self.path}: not a memplan convolution database ({exc})") from None

    def __enter__(self) -> ConvDB:
        return self

    def __exit__(self, *exc) -> None:
        self.close(commit=exc[0] is None)
        if exc[0] is not None and self.created:
            self.path.unlink(missing_ok=True)  # a failed or interrupted first fill leaves no empty database

    def close(self, commit: bool = True) -> None:
        """Commit (unless told not to) and close."""
        if commit:
            self.conn.commit()
        self.conn.close()

    def _check_schema(self) -> None:
        meta = dict(self.conn.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("schema") != SCHEMA or meta.get("version") != str(VERSION):
            raise MemplanError(f"{self.path}: not a version {VERSION} memplan convolution database "
                               f"(schema {meta.get('schema')!r}, version {meta.get('version')!r})")

    # --- rows ---------------------------------------------------------------------------------

    def get(self, kernel: Kernel, source: str) -> list[Row]:
        """The rows of `kernel` (at its batch) from `source`, by algorithm name."""
        where = " AND ".join(f"{name} = ?" for name in SHAPE_FIELDS)
        found = self._query(f"SELECT algo, time_s, workspace_bytes FROM benchmarks WHERE {where} AND batch = ? "
                            f"AND source = ? ORDER BY algo", (*kernel.shape, kernel.n, source))
        return [Row(kernel=kernel, algo=a, source=source, time_s=t, workspace_bytes=w) for a, t, w in found]

    def put(self, rows: list[Row]) -> None:
        """Insert or replace rows (committed on close)."""
        self._execute_many(f"INSERT OR REPLACE INTO benchmarks ({_SHAPE_COLUMNS}, batch, algo, source, time_s, "
                           f"workspace_bytes) VALUES ({', '.join('?' * (len(SHAPE_FIELDS) + 5))})",
                           [(*r.kernel.shape, r.kernel.n, r.algo, r.source, r.time_s, r.workspace_bytes) for r in rows])

    def rows(self, source: str | None = None) -> list[Row]:
        """Every row (of one source), in key order."""
        where, args = ("WHERE source = ?", (source,)) if source else ("", ())
        found = self._query(f"SELECT {_SHAPE_COLUMNS}, batch, algo, source, time_s, workspace_bytes FROM benchmarks "
                            f"{where} ORDER BY source, {_SHAPE_COLUMNS}, batch, algo", args)
        n_shape = len(SHAPE_FIELDS)
        return [Row(kernel=Kernel(n=r[n_shape], **dict(zip(SHAPE_FIELDS, r[:n_shape]))), algo=r[n_shape + 1],
                    source=r[n_shape + 2], time_s=r[n_shape + 3], workspace_bytes=r[n_shape + 4]) for r in found]

    def summary(self) -> list[dict]:
        """Per source: rows, distinct kernel shapes, micro-batch sizes, rows whose workspace is unknown."""
        out: dict[str, dict] = {}
        for r in self.rows():
            entry = out.setdefault(r.source, {"source": r.source, "rows": 0, "kernels": set(), "batches": set(),
                                              "workspace_unknown": 0})
            entry["rows"] += 1
            entry["kernels"].add(r.kernel.shape)
            entry["batches"].add(r.kernel.n)
            entry["workspace_unknown"] += r.workspace_bytes is None
        return [{**e, "kernels": len(e["kernels"]), "batches": len(e["batches"])} for e in out.values()]

    def merge(self, other: ConvDB) -> int:
        """Copy every row of `other` into this database (its rows win); returns how many."""
        rows = other.rows()
        self.put(rows)
        return len(rows)

    def _query(self, sql: str, args: tuple) -> list[tuple]:
        try:
            return self.conn.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise MemplanError(f"{self.path}: damaged convolution database ({exc})") from None

    def _execute_many(self, sql: str, rows: list[tuple]) -> None:
        try:
            self.conn.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise MemplanError(f"{self.path}: cannot write the convolution database ({exc})") from None


def _create_file(path: Path) -> None:
    """A new, empty database at `path`, created complete or not at all."""
    check_output_path(path, "SQLite")
    with atomic_output(path, suffix=".sqlite-tmp") as tmp:
        conn = sqlite3.connect(tmp)
        try:
            conn.executescript(_CREATE)
            conn.commit()
        finally:
            conn.close()
