"""Fill the results pages with the files in benchmarks/results/, at build time.

Each page docs/results/NAME.md says what produced its figures (the command, the hardware,
simulated or measured) and names its files in its front matter, as globs under
benchmarks/results/:

    ---
    benchmark: benchmarks/milp.py
    results: [milp.*]
    ---

Files are grouped by name without suffix (milp.md and milp.json are the group `milp`). A line
`<!-- results: milp -->` puts a group where it stands; the other groups follow under
"Committed results". A group shows its Markdown and CSV tables and its PNG figures as the
benchmark wrote them, and links its JSON (shown inline where nothing else renders it).

The build fails when a results file is on no page or on two, a glob or a placed group matches
nothing, or a benchmark script has no page: no figure goes without its command.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import mkdocs_gen_files
from mkdocs.utils.meta import get_data

ROOT = Path(mkdocs_gen_files.config.config_file_path).parent  # the repository
RESULTS = ROOT / "benchmarks" / "results"
PAGES = Path(mkdocs_gen_files.config.docs_dir) / "results"
FILES = "files"  # the copies' folder, beside the pages in the site
PLACEHOLDER = re.compile(r"^<!-- results: (\S+) -->$", re.M)
HEADING = re.compile(r"^(#{1,6}) ", re.M)
LINK_TARGET = re.compile(r"\]\((?!https?:|#)([^)\s]+)\)")
INLINE_JSON_MAX_BYTES = 20_000  # a larger JSON file is linked, not shown


def _stem(path: Path) -> str:
    return path.relative_to(RESULTS).with_suffix("").as_posix()


def _shift_headings(text: str, top: int) -> str:
    """Re-level the headings of `text` so that its highest one is at level `top`."""
    levels = [len(m) for m in HEADING.findall(text)]
    if not levels:
        return text
    shift = top - min(levels)
    return HEADING.sub(lambda m: "#" * min(6, len(m.group(1)) + shift) + " ", text)


def _markdown(path: Path, top: int) -> tuple[str, set[Path]]:
    """The file's text, headings re-levelled, links pointing at the copies; and what it links."""
    linked: set[Path] = set()

    def relink(match: re.Match) -> str:
        target = path.parent / match.group(1)
        linked.add(target)
        return f"]({FILES}/{target.relative_to(RESULTS).as_posix()})"

    return LINK_TARGET.sub(relink, _shift_headings(path.read_text(), top)), linked


def _csv_table(path: Path) -> str:
    header, *rows = csv.reader(path.read_text().splitlines())
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _json_block(path: Path, show: bool) -> str:
    rel = path.relative_to(RESULTS).as_posix()
    link = f"Data: [`{rel}`]({FILES}/{rel})"
    if not show or path.stat().st_size > INLINE_JSON_MAX_BYTES:
        return link
    pretty = json.dumps(json.loads(path.read_text()), indent=1)
    body = "\n".join("    " + line for line in ["```json", *pretty.splitlines(), "```"])
    return f'{link}\n\n??? note "{rel}"\n{body}'


def _render(paths: list[Path], top: int, linked: set[Path]) -> str:
    """One group: Markdown and CSV tables, figures not linked from a table, then the data."""
    parts = []
    for path in paths:
        if path.suffix == ".md":
            parts.append(_markdown(path, top)[0])
        elif path.suffix == ".csv":
            parts.append(f"`{path.relative_to(RESULTS).as_posix()}`:\n\n{_csv_table(path)}")
        elif path.suffix == ".png" and path not in linked:
            parts.append(f"![{_stem(path)}]({FILES}/{path.relative_to(RESULTS).as_posix()})")
    rendered = any(p.suffix in (".md", ".csv") for p in paths)
    parts += [_json_block(p, show=not rendered) for p in paths if p.suffix == ".json"]
    return "\n\n".join(parts)


def _level_before(text: str, pos: int) -> int:
    levels = [len(m) for m in HEADING.findall(text[:pos])]
    return levels[-1] if levels else 1


def _fill(text: str, groups: dict[str, list[Path]], page: str) -> str:
    linked = {t for paths in groups.values() for p in paths if p.suffix == ".md" for t in _markdown(p, 1)[1]}
    placed = PLACEHOLDER.findall(text)
    for stem in placed:
        if stem not in groups:
            raise SystemExit(f"{page}: `<!-- results: {stem} -->` names no file of this page")
    text = PLACEHOLDER.sub(lambda m: _render(groups[m.group(1)], _level_before(text, m.start()) + 1, linked), text)
    rest = [stem for stem in groups if stem not in placed]
    if rest:
        text += ("\n## Committed results\n\nThe files in `benchmarks/results/` as the benchmark wrote them "
                 "(rendered when this site was built).\n")
        for stem in rest:
            text += f"\n### `{stem}`\n\n{_render(groups[stem], 4, linked)}\n"
    return text


def main() -> None:
    owner: dict[Path, str] = {}
    scripts = set()
    for page in sorted(PAGES.glob("*.md")):
        text = page.read_text()
        _, meta = get_data(text)
        if "results" not in meta:
            continue
        name = f"docs/results/{page.name}"
        benchmarks = meta.get("benchmark") or []  # a script, or a list: one and the modules it runs
        for script in [benchmarks] if isinstance(benchmarks, str) else benchmarks:
            if not (ROOT / script).is_file():
                raise SystemExit(f"{name}: benchmark {script} does not exist")
            scripts.add(ROOT / script)
        groups: dict[str, list[Path]] = {}
        for pattern in meta["results"]:
            matched = sorted(p for p in RESULTS.glob(pattern) if p.is_file())
            if not matched:
                raise SystemExit(f"{name}: no file in benchmarks/results/ matches {pattern!r}")
            for path in matched:
                if owner.setdefault(path, name) != name:
                    raise SystemExit(f"{path.relative_to(ROOT)} is claimed by both {owner[path]} and {name}")
                groups.setdefault(_stem(path), []).append(path)
                if path.suffix != ".md":
                    with mkdocs_gen_files.open(f"results/{FILES}/{path.relative_to(RESULTS).as_posix()}", "wb") as f:
                        f.write(path.read_bytes())
        with mkdocs_gen_files.open(f"results/{page.name}", "w") as out:
            out.write(_fill(text, groups, name))
    unclaimed = sorted(str(p.relative_to(ROOT)) for p in RESULTS.rglob("*") if p.is_file() and p not in owner)
    if unclaimed:
        raise SystemExit(f"results on no page of docs/results/ (name them in a page's `results:`): {unclaimed}")
    pageless = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").glob("*.py") if p not in scripts)
    if pageless:
        raise SystemExit(f"benchmarks with no page in docs/results/ (`benchmark:` in its front matter): {pageless}")


main()
