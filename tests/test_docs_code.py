"""Every Python code block and every ``trioexec`` command in the docs runs, or
says why it does not.

Python blocks
-------------

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

Console blocks
--------------

The commands are found in ``.. code-block:: console`` (or ``shell-session``,
``bash``, ``sh``, ``shell``) blocks, in ``::`` blocks that are not Python, and in
README.md's ``console`` fences: the lines after a ``$`` prompt, or, in a block
without prompts, the lines that start with ``trioexec <command>`` or ``python
examples/`` (so a program's output, ``trioexec worker: ...``, is not one).

A page's commands form one session, run in the order the page shows them, in one
temporary directory with the repository's ``examples/`` in it, as a reader
following the page in a shell on a checkout would run them:

* ``trioexec ...`` runs the real command (the ``trioexec`` console script next to
  this Python, as a subprocess); ``python examples/<name>.py ...`` runs the
  example. Each must exit 0, or the status a ``# exits N`` comment on its line
  says. A ``trioexec`` command that names a database file (``*.db``) that no
  command before it on the page left fails, before it runs: what the docs inspect
  is what their example leaves.
* A command that ends in ``&`` runs in the background, as in a shell, and is
  waited for until it prints its first line (an example meant for the
  background prints one once it is ready); ``kill %N`` signals job ``N``
  (SIGTERM, or ``-INT``...), ``wait`` waits for every job. What the page leaves
  running gets SIGTERM at its end. A job must exit 0.
* Other commands (``pip install``, ``nox``...) are not run; a line that names
  ``trioexec`` or an example any other way (``cd x && trioexec ...``) fails.
  ``trioexec dashboard`` and ``trioexec worker`` without ``&`` serve until
  stopped, so they are left to their own tests.
* What a page runs without showing it (a database its reference examples read)
  is an reST comment where it is run: ``.. console-setup: <command>``; in
  README.md, ``<!-- console-setup: <command> -->``.

The output the pages show is not compared (it holds ids, process ids and
ages): ``python tests/test_docs_code.py docs/<page>.rst`` runs a page's session
and prints its transcript, to paste into the page.

Blocks that do not run
----------------------

A block that cannot run as it stands (a fragment, a signature sketch, code for
another library, one that needs a PostgreSQL server, a command on your own
module) carries a marker right before it, an reST comment that Sphinx does not
render::

    .. not-run: <why>

before the directive, or before the paragraph that ends in ``::``; in README.md,
``<!-- not-run: <why> -->`` before the fence. An unmarked block that fails,
and a marker that precedes no Python or console block, fail the tests with
file:line.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import pathlib
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

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


@dataclasses.dataclass(frozen=True)
class Literal:
    """A literal block of an reST file, Python or not."""

    line: int  # 1-based: the directive, or the ``::`` line
    lang: str | None  # the directive's language; None for a ``::`` block
    code: str
    anchor: int  # 0-based index of the line a marker goes right before
    first: int  # 1-based: the line of the code's first line


def rst_literals(lines: list[str]) -> list[Literal]:
    """Every ``.. code-block::`` (and its aliases) and ``::`` block, in order."""
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
        body_start = j
        body = []
        while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > indent):
            body.append(lines[j])
            j += 1
        code = textwrap.dedent("\n".join(body)).strip("\n") + "\n"
        first = body_start + next((n for n, text in enumerate(body) if text.strip()), 0) + 1
        i = j
        if code.strip():
            lang = directive["lang"] if directive else None
            found.append(Literal(start, lang, code, anchor, first))
    return found


def _is_python_literal(literal: Literal) -> bool:
    if literal.lang is not None:
        return literal.lang in PYTHON_LANGUAGES
    return _is_python(literal.code)


def rst_blocks(path: pathlib.Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for literal in rst_literals(lines):
        if not _is_python_literal(literal):
            continue  # a console command, a program's output, a config file
        marker = _marker_before(lines, literal.anchor, RST_MARKER)
        found.append(
            Block(
                path,
                literal.line,
                literal.code,
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
    used |= {(block.path, block.marker_line) for block in CONSOLE_BLOCKS}
    stray = []
    for path in [*rst_files(), README]:
        pattern = MD_MARKER if path.suffix == ".md" else RST_MARKER
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.match(line) and (path, number) not in used:
                stray.append(f"{path.relative_to(ROOT)}:{number}")
    assert not stray, f"not-run markers that precede no Python code or console block: {stray}"


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


# --- Console blocks: the commands the docs show, run against what their example leaves.

CONSOLE_LANGUAGES = {"console", "shell-session", "sh-session", "bash", "sh", "shell"}
RST_SETUP = re.compile(r"^\.\. console-setup:[ \t]*(?P<command>\S.*?)[ \t]*$")
MD_SETUP = re.compile(r"^<!--[ \t]*console-setup:[ \t]*(?P<command>\S.*?)[ \t]*-->[ \t]*$")
PROMPT = re.compile(r"^\$ (?P<command>.*\S)[ \t]*$")
# In a block without prompts, the lines that start as a command does (never the
# output lines that start with a command's name and a colon: "trioexec worker: ...").
BARE_COMMAND = re.compile(
    r"^(?:trioexec [a-z][a-z-]*(?:[ \t]|$)|python3? examples/)"
    r"|(?:&&|\|\||;|\|)[ \t]*(?:trioexec [a-z]|python3? examples/)"  # (cd x && trioexec ...)
)
EXPECTED_EXIT = re.compile(r"#.*?\bexits (?P<status>\d+)\b")
DATABASE = re.compile(r"\.(?:db|sqlite3?)$")
# `trioexec` commands that serve until they are stopped, on a port of their own:
# shown without `&`, they are left to their own tests.
SERVERS = {"dashboard": "tests/test_web_cli.py", "worker": "tests/test_durable_worker.py"}
_script = shutil.which("trioexec", path=os.path.dirname(sys.executable))
TRIOEXEC = [_script] if _script else [sys.executable, "-m", "trioexec"]


@dataclasses.dataclass(frozen=True)
class Command:
    path: pathlib.Path
    line: int  # 1-based
    text: str  # as shown, without its prompt

    @property
    def where(self) -> str:
        return f"{_shown(self.path)}:{self.line}"


def _shown(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


@dataclasses.dataclass(frozen=True)
class ConsoleBlock:
    path: pathlib.Path
    line: int
    commands: tuple[Command, ...]
    marker_line: int | None
    reason: str | None


def _commands(path: pathlib.Path, first: int, code: str) -> tuple[Command, ...]:
    """The command lines of a console block whose first line is line ``first``."""
    lines = code.splitlines()
    shown = [(n, m["command"]) for n, line in enumerate(lines) if (m := PROMPT.match(line))]
    if not shown:
        shown = [(n, line.strip()) for n, line in enumerate(lines) if BARE_COMMAND.search(line)]
    return tuple(Command(path, first + n, text) for n, text in shown)


def rst_console_blocks(path: pathlib.Path) -> list[ConsoleBlock]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for literal in rst_literals(lines):
        if literal.lang is not None and literal.lang not in CONSOLE_LANGUAGES:
            continue  # Python, a program's output (``text``), a config file
        if literal.lang is None and _is_python(literal.code):
            continue
        commands = _commands(path, literal.first, literal.code)
        if not commands:
            continue  # a program's output
        marker = _marker_before(lines, literal.anchor, RST_MARKER)
        found.append(
            ConsoleBlock(
                path,
                literal.line,
                commands,
                marker[0] if marker else None,
                marker[1] if marker else None,
            )
        )
    return found


def readme_console_blocks(path: pathlib.Path) -> list[ConsoleBlock]:
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
        if fence["lang"] in CONSOLE_LANGUAGES:
            commands = _commands(path, i + 2, "\n".join(lines[i + 1 : j]))
            marker = _marker_before(lines, i, MD_MARKER)
            if commands:
                found.append(
                    ConsoleBlock(
                        path,
                        i + 1,
                        commands,
                        marker[0] if marker else None,
                        marker[1] if marker else None,
                    )
                )
        i = j + 1
    return found


def setup_commands(path: pathlib.Path) -> list[Command]:
    """The ``.. console-setup: <command>`` comments (README: ``<!-- console-setup:
    <command> -->``): commands run where they stand, that the page does not show."""
    pattern = MD_SETUP if path.suffix == ".md" else RST_SETUP
    return [
        Command(path, number, m["command"])
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if (m := pattern.match(line))
    ]


@dataclasses.dataclass(frozen=True)
class Action:
    """What the docs test does for one command line."""

    kind: str  # "run", "kill", "wait", "skip" (not the docs test's to run), "error"
    argv: tuple[str, ...] = ()
    background: bool = False  # ends in `&`
    status: int = 0  # the exit status expected (a comment ``# exits N`` says another)
    databases: tuple[str, ...] = ()  # the files it names, which must exist
    job: int = 0  # kill: the job number (``%N``)
    signum: signal.Signals = signal.SIGTERM  # kill: the signal it sends
    why: str = ""


def plan(command: Command) -> Action:
    """How to run ``command`` as shown: a real ``trioexec`` (the console script),
    an example as ``python examples/...``, and a shell's job control for the ones
    started in the background (``&``, ``kill %N``, ``wait``). Anything else that
    names trioexec or an example is an error: the block gets a ``not-run`` marker."""
    try:
        words = shlex.split(command.text, comments=True)
    except ValueError as exc:
        return Action("error", why=f"not a shell command line ({exc})")
    expected = EXPECTED_EXIT.search(command.text)
    status = int(expected["status"]) if expected else 0
    background = bool(words) and words[-1] == "&"
    if background:
        words = words[:-1]
    if not words:
        return Action("skip", why="no command")
    program, args = words[0], words[1:]
    if any(word.startswith(("postgresql://", "postgres://")) for word in words):
        return Action(
            "error", why="it needs a PostgreSQL server, which the docs test does not start"
        )
    if program == "trioexec":
        if args and args[0] in SERVERS and not background:
            return Action("skip", why=f"it serves until stopped ({SERVERS[args[0]]} runs it)")
        creates = bool(args) and args[0] == "demo"  # (`--db FILE`: the demo writes it)
        databases = () if creates else tuple(a for a in args if DATABASE.search(a))
        return Action("run", (*TRIOEXEC, *args), background, status, databases)
    if program in ("python", "python3") and args and args[0].startswith("examples/"):
        return Action("run", (sys.executable, *args), background, status)
    if program == "kill" and args and args[-1].startswith("%") and args[-1][1:].isdigit():
        options = args[:-1]
        name = "TERM"
        if options[:1] == ["-s"] and len(options) == 2:
            name = options[1]
        elif len(options) == 1 and options[0].startswith("-"):
            name = options[0][1:]
        elif options:
            return Action("error", why="kill takes `%N`, `-SIGNAL %N` or `-s SIGNAL %N` here")
        try:
            signum = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
        except KeyError:
            return Action("error", why=f"no signal {name!r}")
        return Action("kill", job=int(args[-1][1:]), signum=signum)
    if program == "wait" and not args:
        return Action("wait")
    if "trioexec" in words or any("examples/" in word for word in words):
        return Action(
            "error",
            why="the docs test runs `trioexec ...`, `python examples/...`, `kill %N` and"
            " `wait` as a shell would, not this",
        )
    return Action("skip", why="not a trioexec command or an example (an install, a build...)")


@dataclasses.dataclass(frozen=True)
class Session:
    """A page's commands, in the order it shows them, run in one directory."""

    path: pathlib.Path
    commands: tuple[Command, ...]

    @property
    def where(self) -> str:
        return str(self.path.relative_to(ROOT))


def all_console_blocks() -> list[ConsoleBlock]:
    blocks = []
    for path in rst_files():
        blocks.extend(rst_console_blocks(path))
    blocks.extend(readme_console_blocks(README))
    return blocks


CONSOLE_BLOCKS = all_console_blocks()


def console_sessions() -> list[Session]:
    by_path: dict[pathlib.Path, list[Command]] = {}
    for block in CONSOLE_BLOCKS:
        if block.marker_line is None:
            by_path.setdefault(block.path, []).extend(block.commands)
    for path in [*rst_files(), README]:
        if setups := setup_commands(path):
            by_path.setdefault(path, []).extend(setups)
    sessions = []
    for path, commands in by_path.items():
        commands.sort(key=lambda command: command.line)
        if any(plan(command).kind != "skip" for command in commands):
            sessions.append(Session(path, tuple(commands)))
    return sessions


SESSIONS = console_sessions()


class ConsoleFailure(AssertionError):
    pass


@dataclasses.dataclass
class _Job:
    number: int
    command: Command
    process: subprocess.Popen[bytes]
    output: bytes = b""


class Shell:
    """Runs a page's commands one after the other in ``cwd``, as a shell does,
    with ``examples/`` there (a link to the repository's). A command in the
    background (``&``) is waited for until it prints its first line (an example
    meant for the background prints one once it is ready); ``kill %N`` signals
    job ``N`` and ``wait`` waits for every job, each of which must exit 0.
    ``echo`` gets each command and what it printed (a transcript)."""

    def __init__(self, cwd: pathlib.Path, echo: Callable[[str], None] | None = None) -> None:
        self.cwd = cwd
        self.echo = echo
        self.jobs: dict[int, _Job] = {}
        self.log: list[str] = []  # the commands so far and their output
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        examples = cwd / "examples"
        if not examples.exists():
            examples.symlink_to(ROOT / "examples", target_is_directory=True)

    def _say(self, text: str) -> None:
        self.log.append(text)
        if self.echo is not None:
            self.echo(text)

    def _fail(self, command: Command, message: str, output: str = "") -> None:
        before = "\n".join(self.log[-40:])
        raise ConsoleFailure(
            f"{command.where}: `{command.text}` {message}\n--- its output\n{output}"
            f"--- the commands before it, and what they printed\n{before}"
        )

    def run(self, command: Command) -> None:
        action = plan(command)
        if action.kind == "skip":
            return
        if action.kind == "error":
            self._fail(
                command,
                f"cannot run as shown: {action.why}. If it is not meant to, put"
                " `.. not-run: <why>` right before its block.",
            )
        self._say(f"$ {command.text}")
        if action.kind == "kill":
            job = self.jobs.get(action.job)
            if job is None:
                self._fail(command, f"names job %{action.job}; the jobs are {sorted(self.jobs)}")
            job.process.send_signal(action.signum)
            return
        if action.kind == "wait":
            for number in sorted(self.jobs):
                self._reap(self.jobs.pop(number))
            return
        missing = [name for name in action.databases if not (self.cwd / name).exists()]
        if missing:
            self._fail(
                command,
                f"names {', '.join(missing)}, which no command before it on the page left."
                " Run the example that writes it first, with that path (in a console block,"
                " or `.. console-setup: python examples/<name>.py <path>` before the block).",
            )
        if action.background:
            self._start(command, action)
            return
        try:
            done = subprocess.run(
                action.argv,
                cwd=self.cwd,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=TIME_LIMIT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            self._fail(
                command,
                f"is still running after {TIME_LIMIT:.0f} s",
                (exc.output or b"").decode(errors="replace"),
            )
        output = done.stdout.decode(errors="replace")
        if output:
            self._say(output.rstrip("\n"))
        if done.returncode != action.status:
            self._fail(command, f"exits {done.returncode}, not {action.status}", output)

    def _start(self, command: Command, action: Action) -> None:
        number = max(self.jobs, default=0) + 1  # bash's next job number
        process = subprocess.Popen(
            action.argv,
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        job = self.jobs[number] = _Job(number, command, process)
        assert process.stdout is not None
        fd = process.stdout.fileno()
        deadline = time.monotonic() + TIME_LIMIT
        while b"\n" not in job.output:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(command, f"printed no line in {TIME_LIMIT:.0f} s", self._text(job))
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    process.wait()
                    self._fail(
                        command,
                        f"ended (exit {process.returncode}) before it printed a line",
                        self._text(job),
                    )
                job.output += chunk
        self._say(self._text(job).rstrip("\n"))

    @staticmethod
    def _text(job: _Job) -> str:
        return job.output.decode(errors="replace")

    def _reap(self, job: _Job) -> None:
        """Wait for ``job`` to end; it must exit 0."""
        seen = len(job.output)
        try:
            rest, _ = job.process.communicate(timeout=TIME_LIMIT)
        except subprocess.TimeoutExpired:
            job.process.kill()
            rest, _ = job.process.communicate()
            job.output += rest
            self._fail(job.command, f"is still running {TIME_LIMIT:.0f} s later", self._text(job))
        job.output += rest
        if job.output[seen:]:
            self._say(job.output[seen:].decode(errors="replace").rstrip("\n"))
        if job.process.returncode != 0:
            self._fail(
                job.command, f"(job %{job.number}) exits {job.process.returncode}", self._text(job)
            )

    def stop(self) -> None:
        """What the page left running: SIGTERM, then each must exit 0."""
        for number in sorted(self.jobs):
            job = self.jobs.pop(number)
            if job.process.poll() is None:
                job.process.send_signal(signal.SIGTERM)
            self._reap(job)

    def kill(self) -> None:
        """After a failure: nothing outlives the test."""
        for job in self.jobs.values():
            if job.process.poll() is None:
                job.process.kill()
            job.process.communicate()
        self.jobs.clear()


def run_session(
    session: Session, cwd: pathlib.Path, echo: Callable[[str], None] | None = None
) -> None:
    shell = Shell(cwd, echo)
    try:
        for command in session.commands:
            shell.run(command)
        shell.stop()
    finally:
        shell.kill()


def test_console_sessions_found() -> None:
    # The scanner still finds the pages' commands (a broken one would find none and pass).
    pages = {session.where for session in SESSIONS}
    for page in ("README.md", "docs/tutorial.rst", "docs/howto/control.rst"):
        assert page in pages, sorted(pages)
    assert sum(len(session.commands) for session in SESSIONS) >= 20


def test_console_markers_give_a_reason() -> None:
    vague = [
        f"{block.path.relative_to(ROOT)}:{block.line}"
        for block in CONSOLE_BLOCKS
        if block.marker_line is not None and len(block.reason or "") < 10
    ]
    assert not vague, f"not-run markers without a reason: {vague}"


@pytest.mark.parametrize("session", SESSIONS, ids=[session.where for session in SESSIONS])
def test_console_session(session: Session, tmp_path: pathlib.Path) -> None:
    """The page's commands, in order, in one directory: each exits as shown (0,
    or the ``# exits N`` of its comment), and names only files that a command
    before it left."""
    try:
        run_session(session, tmp_path)
    except ConsoleFailure as exc:
        pytest.fail(str(exc), pytrace=False)


def _page(tmp_path: pathlib.Path, text: str) -> Session:
    path = tmp_path / "page.rst"
    path.write_text(text, encoding="utf-8")
    blocks = rst_console_blocks(path)
    return Session(path, tuple(command for block in blocks for command in block.commands))


def test_console_session_fails_on_a_file_nothing_left(tmp_path: pathlib.Path) -> None:
    session = _page(tmp_path, ".. code-block:: console\n\n   $ trioexec status runs.db\n")
    with pytest.raises(
        ConsoleFailure, match=r"page.rst:3: `trioexec status runs.db` names runs.db"
    ):
        run_session(session, tmp_path)


def test_console_session_fails_on_an_exit_status(tmp_path: pathlib.Path) -> None:
    session = _page(tmp_path, "Look::\n\n   trioexec no-such-command\n")
    with pytest.raises(ConsoleFailure, match=r"exits 2, not 0"):
        run_session(session, tmp_path)


if __name__ == "__main__":
    # A page's transcript, to paste into it: python tests/test_docs_code.py docs/howto/control.rst
    import tempfile

    [wanted] = [s for s in SESSIONS if s.path == pathlib.Path(sys.argv[1]).resolve()]
    with tempfile.TemporaryDirectory() as tmp:
        run_session(wanted, pathlib.Path(tmp), echo=print)
