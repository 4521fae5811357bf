"""`memplan report` / `memplan.write_report`: the HTML page of a plan (issue 40).

The page's numbers are checked against what they stand for (the trace's own peak, the plan's
budget and decisions, the simulator's load curve against the storages' drawn residencies), and
the page itself in real headless Chromium (Debian's `chromium`): a screenshot must show every
chart's colours, the DOM must hold the drawn SVG, and Chromium's network log must show no
request made by the page (a control page with one remote image shows the log would).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import memplan
from memplan.cli import main
from memplan.reports import plan_report
from memplan.reports.plan_report import report_data

MAX_PAGE_BYTES = 2 * 2**20
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
BROWSER_INITIATOR = "not an origin"  # Chromium's own requests (updates, accounts) in its network log
# Colours the page draws with (memplan/reports/plan_report.js), each for one thing, and the fewest
# pixels each must cover (a legend's swatch is 180; this small model's step is host-bound on the h100
# profile, so its compute stream is busy a fraction of the step: memplan.sim.simulate, "host").
COLOURS = {"memory chart: without the plan": ("#8c564b", 1500), "memory chart: under the plan": ("#1f77b4", 1500),
           "memory chart: budget": ("#d62728", 800), "streams: compute": ("#4c72b0", 500),
           "streams and fates: to the host": ("#ff7f0e", 300), "streams and fates: back": ("#2ca02c", 300),
           "fates: resident": ("#6baed6", 1000)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """resnet18-cifar at batch 8, its autoswap:doa plan at 70%, and the report's path."""
    folder = tmp_path_factory.mktemp("report")
    trace = memplan.trace_workload("resnet18-cifar", 8, fake=True)
    plan = memplan.plan(trace, "70%", planner="autoswap:doa")
    memplan.write_trace(trace, folder / "r18.jsonl")
    memplan.write_plan(plan, folder / "plan.json")
    return folder, trace, plan


def test_the_page_shows_the_plan_on_its_trace(files):
    _, trace, plan = files
    data = report_data(trace, plan)
    assert max(v for _, v in data["load"]["plain"]) == trace.peak_load_bytes  # the trace's own count
    assert data["load"]["budget"] == plan.budget_bytes
    assert max(v for _, v in data["load"]["plan"]) == data["summary"]["peak_bytes"] <= plan.budget_bytes
    assert data["summary"]["overhead"] == pytest.approx(data["summary"]["time_s"] / data["summary"]["baseline_time_s"] - 1)
    rows = {r["id"]: r for r in data["storages"]["rows"]}
    for d in plan.decisions:
        kinds = [e[0] for e in rows[d.storage]["x"]]
        assert rows[d.storage]["fate"] == "swap" and kinds.count("d2h") >= 1 and kinds.count("h2d") >= 1


def test_the_drawn_residencies_add_up_to_the_simulated_load(files, monkeypatch):
    """While each op runs, the storages the page draws as resident (all of them shown) hold the load
    of the simulator's timeline then. The rows put an allocation where the work before its op begins
    and a swap-out's release where its copy ends; the simulator may put one a wait later (at the next
    hook site of a hooked plan: inside the optimizer's step, the next parameter's update), so a few
    ops may differ, by one storage."""
    _, trace, plan = files
    monkeypatch.setattr(plan_report, "MAX_ROWS", len(trace.storages))
    data = report_data(trace, plan)
    assert data["storages"]["hidden"] == 0
    times, loads = np.array(data["load"]["plan"]).T
    starts, ends = np.array(data["ops"]["start_s"]), np.array(data["ops"]["end_s"])
    running = [(a + b) / 2 for a, b in zip(starts, ends) if b > a]
    differ = []
    for t in running:
        drawn = sum(r["bytes"] for r in data["storages"]["rows"] if any(a <= t < b for a, b in r["t"]))
        differ += [abs(drawn - loads[np.searchsorted(times, t, side="right") - 1])]
    assert sum(d > 0 for d in differ) <= 0.03 * len(running)
    assert max(differ) <= max(s.nbytes for s in trace.storages)


def test_recomputations_are_drawn_with_the_ops_they_replay():
    trace = memplan.trace_workload("resnet18-cifar", 64, fake=True)
    plan = memplan.plan(trace, "85%", planner="sqrt-n")
    data = report_data(trace, plan)
    recomputed = {d.storage for d in plan.decisions if d.action == "recompute"}
    rows = {r["id"]: r for r in data["storages"]["rows"]}
    assert recomputed and all(rows[sid]["fate"] == "recompute" for sid in recomputed)
    for sid in recomputed:
        events = rows[sid]["x"]
        assert events and {e[0] for e in events} == {"recompute"}, sid
        for _, start, end, first, last in events:  # the region replayed writes the storage again
            assert start < end and any(sid in trace.ops[j].writes for j in range(first, last + 1))


def test_memplan_report_writes_one_small_page(files, capsys):
    folder, _, plan = files
    out = folder / "report.html"
    assert main(["report", folder / "plan.json", folder / "r18.jsonl", "-o", out, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["report"] == str(out) and summary["bytes"] == out.stat().st_size < MAX_PAGE_BYTES
    assert summary["planner"] == "autoswap:doa" and summary["budget_bytes"] == plan.budget_bytes
    text = out.read_text()
    assert "Content-Security-Policy" in text
    for loader in ("src=", "href=", "url(", "@import", "fetch(", "XMLHttpRequest", "import("):
        assert loader not in text, loader


@pytest.mark.parametrize("argv, needle", [
    (["{plan}", "{trace}", "-o", "{folder}/r.png"], "ends in .html"),
    (["{plan}", "{trace}", "-o", "{folder}/nowhere/r.html"], "does not exist"),
    (["{trace}", "{plan}", "-o", "{folder}/r.html"], "plan.json"),  # swapped arguments
    (["{plan}", "{other}", "-o", "{folder}/r.html"], "trace"),  # a plan of another trace
    (["{plan}", "{trace}", "-o", "{folder}/r.html", "--profile", "bogus"], "bogus"),
])
def test_bad_input_is_one_line_and_no_page(files, capsys, argv, needle):
    folder, _, _ = files
    other = folder / "other.jsonl"
    if not other.exists():
        memplan.write_trace(memplan.trace_workload("resnet18-cifar", 2, fake=True), other)
    names = dict(plan=folder / "plan.json", trace=folder / "r18.jsonl", other=other, folder=folder)
    assert main(["report", *(a.format(**names) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err
    assert not (folder / "r.html").exists() and not list(folder.glob(".r.html*"))


def test_the_report_module_needs_no_torch():
    code = "import sys, memplan.reports.plan_report; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --- in a real browser ------------------------------------------------------------------------------


def _chromium(page: Path, folder: Path, *extra: str) -> subprocess.CompletedProcess:
    """Chromium, headless, on `page` with a fresh profile."""
    profile = folder / f"profile-{len(list(folder.glob('profile-*')))}"
    argv = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180)


def _page_requests(netlog: Path) -> list[str]:
    """URLs the page asked for (Chromium's own requests left out), from Chromium's network log."""
    log = json.loads(netlog.read_text())
    return sorted({e["params"]["url"] for e in log["events"]
                   if "url" in e.get("params", {}) and "initiator" in e["params"]
                   and e["params"]["initiator"] != BROWSER_INITIATOR})


def _pixels(png: Path, colour: str) -> int:
    import matplotlib.image

    rgb = matplotlib.image.imread(png)[..., :3]
    want = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(rgb - want).max(axis=-1) < 0.04).sum())


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_the_page_renders_in_chromium_and_loads_nothing(files, tmp_path):
    folder, trace, plan = files
    page = tmp_path / "report.html"
    memplan.write_report(trace, plan, page)
    shot, netlog = tmp_path / "shot.png", tmp_path / "net.json"
    run = _chromium(page, tmp_path, "--window-size=1200,2200", f"--screenshot={shot}", f"--log-net-log={netlog}")
    assert shot.exists(), run.stderr[-2000:]
    assert _page_requests(netlog) == []
    for what, (colour, least) in COLOURS.items():
        assert _pixels(shot, colour) >= least, what
    dom = _chromium(page, tmp_path, "--dump-dom").stdout
    assert 'data-rendered="' in dom and dom.count("<rect") > 100 and dom.count("<path") >= 2
    # the control: a page that loads one remote image is seen doing it in the same log
    control, control_log = tmp_path / "control.html", tmp_path / "control-net.json"
    control.write_text('<html><body><img src="http://127.0.0.1:9/x.png"></body></html>')
    _chromium(control, tmp_path, f"--screenshot={tmp_path / 'control.png'}", f"--log-net-log={control_log}")
    assert _page_requests(control_log) == ["http://127.0.0.1:9/x.png"]
