"""Compile the package's C sources into shared libraries, cached on disk by source hash.

Libraries go to $MEMPLAN_CACHE_DIR or ~/.cache/memplan, never into the package tree. A build
happens once per source version and machine (about a second); later processes only load it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import MemplanError

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where built libraries go."""
    return Path(os.environ.get("MEMPLAN_CACHE_DIR") or Path.home() / ".cache" / "memplan")


def build_library(source: Path, name: str, flags: tuple[str, ...] = (), libs: tuple[str, ...] = ()) -> Path:
    """Compile `source` into lib<name>_<hash>.so unless that exists; returns its path.

    Raises:
        MemplanError: no C compiler, or compilation failed.
    """
    text = source.read_bytes()
    digest = hashlib.sha256(text + " ".join(flags).encode()).hexdigest()[:12]
    out = cache_dir() / f"lib{name}_{digest}.so"
    if out.exists():
        return out
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise MemplanError(f"{source.name} needs a C compiler (cc or gcc, or set CC)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_out = Path(tmp) / out.name
        cmd = [compiler, "-O3", "-shared", "-fPIC", *flags, "-o", str(tmp_out), str(source), *libs]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise MemplanError(f"building {source.name} failed: {proc.stderr.strip().splitlines()[-1:]}")
        os.replace(tmp_out, out)  # atomic: concurrent builders never see a half-written library
    log.info("built %s", out)
    return out
