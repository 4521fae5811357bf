"""Append the reference of every name `import memplan` exports to api.md, from `memplan.__all__`.

mkdocstrings renders each from its docstring; a name that no longer exists fails the build.
"""

from __future__ import annotations

import mkdocs_gen_files

import memplan

PAGE = "api.md"

lines = ["", "## Reference: `memplan.NAME`", "",
         "Every name `import memplan` exports (`memplan.__all__`), documented where it is defined.", ""]
for name in memplan.__all__:
    # "module" or "module:attribute" where the name differs there (memplan.lazy)
    module, _, attribute = memplan._EXPORTS[name].partition(":")
    if attribute:
        lines += [f"`memplan.{name}` is `{module}.{attribute}`:", ""]
    lines += [f"::: {module}.{attribute or name}", "    options:", "      show_root_full_path: false", ""]

with mkdocs_gen_files.open(PAGE, "a") as page:
    page.write("\n".join(lines))
