"""Append to each planner-family page its registered planners and their parameters (from the registry).

A page under docs/planners/ claims its planners in its front matter by the modules that register
them (`planners: [memplan.planners.autoswap, ...]`), or by a planning function where one module
registers planners of two pages (`memplan.planners.superneurons.superneurons`). The build fails
when a registered planner is on no page, so a new planner cannot go undocumented.
"""

from __future__ import annotations

import json
from pathlib import Path

import mkdocs_gen_files
from mkdocs.utils.meta import get_data

from memplan.planners.base import PlannerSpec, known_planners

PAGES = Path(mkdocs_gen_files.config.docs_dir) / "planners"


def _claims(spec: PlannerSpec, prefixes: list[str]) -> bool:
    where = f"{spec.fn.__module__}.{spec.fn.__qualname__}"  # the planning function's full name
    return any(where.startswith(p + ".") or where == p for p in prefixes)


def _default(value) -> str:
    return f"`{json.dumps(value) if isinstance(value, str) else value}`"  # "" stays visible


def _table(specs: list[PlannerSpec]) -> str:
    """The planners (what each decides), then one parameter table per distinct parameter set."""
    lines = ["| planner | decides | summary |", "| --- | --- | --- |"]
    lines += [f"| `{s.name}` | {', '.join(sorted(s.decides)) or 'nothing'} | {s.summary.replace('|', '/')} |"
              for s in specs]
    by_params: dict[tuple, list[str]] = {}
    for spec in specs:
        params = tuple((p.name, p.type.__name__, _default(p.default)) for p in spec.params)
        by_params.setdefault(params, []).append(spec.name)
    for params, names in by_params.items():
        which = "every planner above" if len(names) == len(specs) else ", ".join(f"`{n}`" for n in names)
        if not params:
            lines += ["", f"No parameters: {which}."]
            continue
        lines += ["", f"Parameters of {which} (`--param NAME=VALUE` on the command line, keywords in Python):",
                  "", "| parameter | type | default |", "| --- | --- | --- |"]
        lines += [f"| `{name}` | {typ} | {default} |" for name, typ, default in params]
    return "\n".join(lines) + "\n"


def main() -> None:
    specs = list(known_planners().values())
    claimed: set[str] = set()
    for path in sorted(PAGES.glob("*.md")):
        _, meta = get_data(path.read_text())
        prefixes = meta.get("planners") or []
        mine = [s for s in specs if _claims(s, prefixes)]
        if prefixes and not mine:
            raise SystemExit(f"docs/planners/{path.name}: no registered planner comes from {prefixes}")
        if mine:
            claimed.update(s.name for s in mine)
            with mkdocs_gen_files.open(f"planners/{path.name}", "a") as page:
                page.write("\n## Registered planners and parameters\n\n" + _table(mine))
    missing = sorted(s.name for s in specs if s.name not in claimed)
    if missing:
        raise SystemExit(f"planners on no page of docs/planners/ (add their module to a page's `planners:`): "
                         f"{', '.join(missing)}")


main()
