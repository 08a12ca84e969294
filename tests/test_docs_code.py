"""Every Python code block in the docs runs, or says why it does not.

The blocks are found in ``docs/**/*.rst`` (``docs/changelog.rst`` included; the
generated ``docs/benchmarks.md`` is not) and in README.md's fenced ``python``
blocks:

* ``.. code-block::``, ``.. code::``, ``.. sourcecode::`` with the language
  ``python``, ``python3``, ``py``, ``pycon`` or none (Sphinx highlights those as
  Python), and ``.. doctest::`` and ``.. testcode::``;
* ``::`` literal blocks whose text is Python (``ast.parse`` accepts it, or it
  starts as Python does: ``import``, ``def``, ``async def``, ``@``, ``>>>``...):
  the others are console commands and program output;
* ``.. literalinclude::`` is left out: those include ``examples/``, which
  ``nox -s examples`` runs.

They are found with a line-based scanner rather than docutils: docutils comes
with Sphinx, which ``nox -s tests`` does not install, and a scanner gives each
block's line for the failure message. The scanner follows the reST rules that
matter here: a directive's options, then an indented body that ends at the
first non-blank line indented no deeper than the directive (or, for ``::``,
than the paragraph).

A block that holds ``>>>`` prompts runs through doctest; any other block runs as
a program (``__name__ == "__main__"``) in a child process of its own, with a
temporary directory as its working directory (for the databases it writes), no
network (connecting a socket or resolving a name raises), and a time limit.

A block that cannot run as it stands (a fragment, a signature sketch, code for
another library, one that needs a PostgreSQL server) carries a marker right
before it, an reST comment that Sphinx does not render::

    .. not-run: <why>

before the directive, or before the paragraph that ends in ``::``; in README.md,
``<!-- not-run: <why> -->`` before the fence. An unmarked block that fails,
and a marker that precedes no Python block, fail the tests with file:line.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"

# Seconds a block may take (a block should take well under one; the margin is for
# a loaded CI machine and the child's coverage start-up).
TIME_LIMIT = 60.0

PYTHON_LANGUAGES = {"", "python", "python3", "py", "pycon"}
DIRECTIVE = re.compile(
    r"^(?P<indent>[ \t]*)\.\. (?P<kind>code-block|code|sourcecode|doctest|testcode)::"
    r"[ \t]*(?P<lang>\S*)[ \t]*$"
)
RST_MARKER = re.compile(r"^[ \t]*\.\. not-run:(?P<reason>.*)$")
MD_MARKER = re.compile(r"^<!--[ \t]*not-run:(?P<reason>.*?)-->[ \t]*$")
FENCE = re.compile(r"^```(?P<lang>[\w+-]*)[ \t]*$")
OPTION = re.compile(r"^[ \t]+:[\w-]+:")
LIST_ITEM = re.compile(r"^[ \t]*(?:[*+-]|#\.|\d+\.)[ \t]+")


@dataclasses.dataclass(frozen=True)
class Block:
    path: pathlib.Path
    line: int  # 1-based: the directive, the ``::`` line, or the opening fence
    code: str
    marker_line: int | None  # the line of the `not-run` marker before it, if any
    reason: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def is_doctest(self) -> bool:
        return any(line.lstrip().startswith(">>>") for line in self.code.splitlines())


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _marker_before(
    lines: list[str], index: int, pattern: re.Pattern[str]
) -> tuple[int, str] | None:
    """The marker on the nearest non-blank line above ``lines[index]``, if any."""
    i = index - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    if i >= 0 and (m := pattern.match(lines[i])):
        return i + 1, m["reason"].strip()
    return None


# How a Python block starts (so that one with a syntax error still counts as Python).
PYTHON_START = re.compile(
    r"^(?:>>>|import |from \S+ import |async (?:def|with|for) |await |def |class |@)"
)


def _is_python(code: str) -> bool:
    """True for the text of a ``::`` block that is Python, not a command or output."""
    if PYTHON_START.match(code.lstrip()):
        return True
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def rst_blocks(path: pathlib.Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = DIRECTIVE.match(line)
        literal = (
            directive is None
            and line.rstrip().endswith("::")
            and not line.lstrip().startswith(".. ")
        )
        if not (directive or literal):
            i += 1
            continue
        if directive:
            indent = len(directive["indent"])
            anchor = i  # a marker goes right before the directive
        else:
            # The paragraph that ends in `::`: a marker goes right before it.
            anchor = i
            while (
                anchor > 0
                and lines[anchor - 1].strip()
                and not lines[anchor - 1].lstrip().startswith(".. ")
            ):
                anchor -= 1
            # The paragraph's own indentation: its last line's, past a list item's bullet.
            indent = _indent(line)
            if bullet := LIST_ITEM.match(line):
                indent = len(bullet[0])
        start = i + 1
        j = i + 1
        if directive:
            while j < len(lines) and OPTION.match(lines[j]):
                j += 1
        body = []
        while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > indent):
            body.append(lines[j])
            j += 1
        code = textwrap.dedent("\n".join(body)).strip("\n") + "\n"
        i = j
        if not code.strip():
            continue
        if directive:
            if directive["lang"] not in PYTHON_LANGUAGES:
                continue
        elif not _is_python(code):
            continue  # a console command or a program's output
        marker = _marker_before(lines, anchor, RST_MARKER)
        found.append(
            Block(
                path,
                start,
                code,
                marker[0] if marker else None,
                marker[1] if marker else None,
            )
        )
    return found


def readme_blocks(path: pathlib.Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if fence["lang"] in ("python", "py", "python3", "pycon"):
            marker = _marker_before(lines, i, MD_MARKER)
            found.append(
                Block(
                    path,
                    i + 1,
                    "\n".join(lines[i + 1 : j]) + "\n",
                    marker[0] if marker else None,
                    marker[1] if marker else None,
                )
            )
        i = j + 1
    return found


def rst_files() -> list[pathlib.Path]:
    return [path for path in sorted(DOCS.rglob("*.rst")) if "_build" not in path.parts]


def all_blocks() -> list[Block]:
    blocks = []
    for path in rst_files():
        blocks.extend(rst_blocks(path))
    blocks.extend(readme_blocks(README))
    return blocks


BLOCKS = all_blocks()
RUNNABLE = [block for block in BLOCKS if block.marker_line is None]
MARKED = [block for block in BLOCKS if block.marker_line is not None]

# Runs the block in the child: no network, then the block as __main__ or its doctests.
_RUNNER = """
import doctest, runpy, socket, sys

def _no_network(*args, **kwargs):
    raise OSError("a docs code block must not use the network")

_connect = socket.socket.connect
def _connect_local(self, address, *args):
    if self.family != socket.AF_UNIX:
        _no_network()
    return _connect(self, address, *args)

socket.socket.connect = _connect_local
socket.socket.connect_ex = _connect_local
socket.getaddrinfo = _no_network
socket.create_connection = _no_network

path, mode = sys.argv[1], sys.argv[2]
sys.argv = [path]
if mode == "doctest":
    failed, _ = doctest.testfile(
        path, module_relative=False, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    sys.exit(1 if failed else 0)
runpy.run_path(path, run_name="__main__")
"""


def test_blocks_found() -> None:
    # The scanner still finds the docs' blocks (a broken scanner would find none
    # and pass): the python code-blocks of the API contract alone are nine.
    assert len(BLOCKS) >= 15, [block.where for block in BLOCKS]
    assert RUNNABLE


def test_markers_give_a_reason() -> None:
    vague = [block.where for block in MARKED if len(block.reason or "") < 10]
    assert not vague, f"not-run markers without a reason: {vague}"


def test_every_marker_precedes_a_block() -> None:
    used = {(block.path, block.marker_line) for block in MARKED}
    stray = []
    for path in [*rst_files(), README]:
        pattern = MD_MARKER if path.suffix == ".md" else RST_MARKER
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.match(line) and (path, number) not in used:
                stray.append(f"{path.relative_to(ROOT)}:{number}")
    assert not stray, f"not-run markers that precede no Python code block: {stray}"


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.where for block in RUNNABLE])
def test_block_runs(block: Block, tmp_path: pathlib.Path) -> None:
    source = tmp_path / ("block.txt" if block.is_doctest else "block.py")
    source.write_text(block.code, encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    try:
        done = subprocess.run(
            [sys.executable, "-c", _RUNNER, str(source), "doctest" if block.is_doctest else "run"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIME_LIMIT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}: still running after {TIME_LIMIT:.0f} s")
    assert done.returncode == 0, (
        f"{block.where}: the code block fails (exit {done.returncode}). Fix it, or, if it"
        " is not meant to run as it stands, put `.. not-run: <why>` right before it.\n"
        f"--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    )
