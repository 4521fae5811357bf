"""The documentation site builds strictly and shows what the code and benchmarks/results/ hold.

The pages generated at build time (docs/gen/) are checked in the built HTML against their
sources: the planner registry, the command-line parser and the committed results. A stray
results file and a broken link must fail the build.
"""

from __future__ import annotations

import argparse
import csv
import html
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memplan.cli import build_parser
from memplan.planners.base import known_planners

# Asked, not imported: mkdocs_gen_files's module __getattr__ raises when no build is under way, and
# Inductor's cache key pickler probes every module in sys.modules, so a test process that imported it
# could not torch.compile (docs/compile.md's example, in test_readme.py's worker).
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("mkdocs_gen_files") is None,
                                 reason="the docs extra is not installed")]

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", DISABLE_MKDOCS_2_WARNING="true")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def _text(page: Path) -> str:
    """The visible text of a built page."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    built = _build(ROOT, site)
    assert built.returncode == 0, built.stderr
    return site


def test_every_planner_is_on_a_family_page_with_its_parameters(site):
    pages = {p: _text(p) for p in (site / "planners").glob("*/index.html")}
    for name, spec in known_planners().items():
        holding = [text for text in pages.values() if f" {name} " in text]
        assert holding, f"planner {name} is on no planner page"
        # other pages may name it too (auto's names the planners it runs): one holds its parameters
        assert any(all(p.name in text for p in spec.params) for text in holding), name


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_cli_reference_lists_every_command_and_option(site):
    text = " ".join(_text(site / "cli" / "index.html").split())
    for parser in _parsers(build_parser()):
        assert parser.prog in text
        for option in parser._option_string_actions:
            assert option in text, f"{parser.prog} {option}"


def test_every_committed_result_is_shown(site):
    pages = " ".join(" ".join(_text(p).split()) for p in (site / "results").glob("*/index.html"))
    for path in (p for p in RESULTS.rglob("*") if p.is_file()):
        rel = path.relative_to(RESULTS)
        if path.suffix == ".csv":
            *_, last = csv.reader(path.read_text().splitlines())
        elif path.suffix == ".md":  # the last row of its last table, Markdown marks dropped
            last = [line for line in path.read_text().splitlines() if line.startswith("|")][-1].split("|")
            last = [re.sub(r"[`*]", "", cell) for cell in last]
        if path.suffix in (".csv", ".md"):
            assert all(" ".join(cell.split()) in pages for cell in last), rel
        else:
            assert (site / "results" / "files" / rel).read_bytes() == path.read_bytes(), rel


def _copy_docs(tmp_path: Path) -> Path:
    """The site's sources in a scratch folder (the package is found where it is installed)."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    shutil.copy(ROOT / "README.md", tmp_path)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "memplan").symlink_to(ROOT / "memplan")
    return tmp_path


def test_a_results_file_on_no_page_fails_the_build(tmp_path):
    root = _copy_docs(tmp_path)
    (root / "benchmarks" / "results" / "orphan.json").write_text("{}")
    built = _build(root, tmp_path / "site")
    assert built.returncode != 0
    assert "orphan.json" in built.stderr


def test_a_broken_link_fails_the_build(tmp_path):
    root = _copy_docs(tmp_path)
    with (root / "docs" / "tests.md").open("a") as page:
        page.write("\nSee [the missing page](missing.md).\n")
    built = _build(root, tmp_path / "site")
    assert built.returncode != 0
    assert "missing.md" in built.stderr
