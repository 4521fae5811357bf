"""Every example in the README and in docs/ works as written (issue 11, defect 1; issue 28).

- ```python blocks run as written, each in a fresh namespace in a scratch folder; the README's
  first one twice in a row in one process (`memplan.plan` once stopped being callable after the
  first call, when a subpackage of the same name was imported).
- A page's ```sh blocks run line by line through the CLI, in order, in one scratch folder per
  page; `make` lines name Makefile targets. A block whose first line is `# not run by the tests:`
  followed by why (hours of benchmark) is only checked: its `memplan` lines use options the CLI
  has, its `python` lines name scripts that exist.
- ```text synopsis lines and every inline `memplan ...` command only use options the CLI has.
- Every `memplan.a.b` named in the prose exists, as does every repository path it names, and
  the README's links lead to files.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

from memplan.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md"] + sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))
TEXT = {page: (ROOT / page).read_text() for page in PAGES}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
BLOCKS = {page: FENCE.findall(text) for page, text in TEXT.items()}
NOT_RUN = "# not run by the tests:"
OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")
INLINE_COMMAND = re.compile(r"`(memplan [a-z|]+[^`]*)`")
CODE_SPAN = re.compile(r"`([^`]+)`")
API_NAME = re.compile(r"memplan(?:\.[A-Za-z_]\w*)+(?![\w-])")
REPO_PATH = re.compile(r"(?:memplan|benchmarks|tests|docs)/[\w./-]*")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _blocks(lang: str) -> list[tuple[str, int, str]]:
    """(page, index among the page's blocks of `lang`, body) of every such block."""
    return [(page, i, body) for page in PAGES
            for i, body in enumerate(b for language, b in BLOCKS[page] if language == lang)]


def _runnable(body: str) -> bool:
    return not body.startswith(NOT_RUN)


def _commands(block: str) -> list[list[str]]:
    """Each non-empty line as argv, comments dropped."""
    return [argv for line in block.splitlines() if (argv := shlex.split(line, comments=True))]


def _run_python(body: str, page: str) -> None:
    exec(compile(body, page, "exec"), {"__name__": "docs_example"})


def _prose(page: str) -> str:
    return FENCE.sub("", TEXT[page])


def test_every_block_is_checked():
    languages = {lang for page in PAGES for lang, _ in BLOCKS[page]}
    assert languages <= {"python", "sh", "text"}, "a block in a language no test checks"
    readme = {lang for lang, _ in BLOCKS["README.md"]}
    assert {"python", "sh"} <= readme
    for page, _, body in _blocks("sh"):
        if not _runnable(body):
            assert body.splitlines()[0].removeprefix(NOT_RUN).strip(), f"{page}: say why it is not run"


@pytest.mark.slow
def test_readme_python_example_runs_twice(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = next(body for _, _, body in _blocks("python"))
    _run_python(first, "README.md")
    _run_python(first, "README.md")


@pytest.mark.slow
@pytest.mark.parametrize("page,index", [(page, i) for page, i, _ in _blocks("python")
                                        if (page, i) != ("README.md", 0)])
def test_python_examples_run(tmp_path, monkeypatch, page, index):
    monkeypatch.chdir(tmp_path)
    body = next(b for p, i, b in _blocks("python") if (p, i) == (page, index))
    _run_python(body, page)


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted({page for page, _, body in _blocks("sh") if _runnable(body)}))
def test_shell_examples_run(tmp_path, monkeypatch, capsys, page):
    monkeypatch.chdir(tmp_path)
    for block in (body for p, _, body in _blocks("sh") if p == page and _runnable(body)):
        for argv in _commands(block):
            if argv[0] == "make":
                assert set(argv[1:]) <= _make_targets(), argv
                continue
            assert argv[0] == "memplan", f"{page}: {shlex.join(argv)} (mark the block `{NOT_RUN} ...`?)"
            rc = main(argv[1:])
            err = capsys.readouterr().err
            assert rc == 0, f"{page}: {shlex.join(argv)}: {err}"


@pytest.mark.parametrize("page,argv", [(page, argv) for page, _, body in _blocks("sh") if not _runnable(body)
                                       for argv in _commands(body)])
def test_commands_not_run_still_exist(page, argv):
    if argv[0] == "python":
        assert (ROOT / argv[1]).is_file(), f"{page}: no script {argv[1]}"
    elif argv[0] == "make":
        assert set(argv[1:]) <= _make_targets(), argv
    else:
        assert argv[0] == "memplan", f"{page}: {shlex.join(argv)}"
        _check_options(shlex.join(argv))


def _synopsis_lines() -> list[tuple[str, str]]:
    return [(page, line) for page, _, body in _blocks("text") if body.startswith("memplan ")
            for line in body.splitlines() if line.startswith("memplan ")]


def _inline_commands() -> list[tuple[str, str]]:
    return [(page, " ".join(span.split())) for page in PAGES for span in INLINE_COMMAND.findall(_prose(page))]


def _check_options(command: str) -> None:
    sub = build_parser()._subparsers._group_actions[0].choices
    words = command.split("#")[0].split()
    for name in words[1].split("|"):
        assert name in sub, f"{command}: no command {name!r}"
        parser, rest = sub[name], words[2:]
        verbs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if verbs and rest and rest[0] in verbs[0].choices:  # `memplan dqn train ...`
            parser, rest = verbs[0].choices[rest[0]], rest[1:]
        options = parser._option_string_actions
        for option in OPTION.findall(" ".join(rest)):
            assert option in options, f"{command}: `memplan {name}` has no option {option}"


@pytest.mark.parametrize("page,command", _synopsis_lines() + _inline_commands())
def test_documented_options_exist(page, command):
    _check_options(command)


def _resolve(dotted: str):
    """The object `dotted` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("page,name", sorted({(page, name) for page in PAGES
                                              for span in CODE_SPAN.findall(_prose(page))
                                              for name in API_NAME.findall(span)}))
def test_named_api_exists(page, name):
    try:
        _resolve(name)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{page} names `{name}`, which does not exist ({exc})")


@pytest.mark.parametrize("page,path", sorted({(page, span.strip()) for page in PAGES
                                              for span in CODE_SPAN.findall(_prose(page))
                                              if REPO_PATH.fullmatch(span.strip())}))
def test_named_paths_exist(page, path):
    assert (ROOT / path).exists(), f"{page} names {path}, which does not exist"


@pytest.mark.parametrize("target", sorted(set(LINK.findall(TEXT["README.md"])) - {""}))
def test_readme_links_lead_to_files(target):
    assert target.startswith("https://") or (ROOT / target).exists(), target
