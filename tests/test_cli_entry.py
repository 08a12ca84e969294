"""The console-script entry, ``trioexec.cli:run`` (issue 19 items 3 and 4):
``trioexec --version`` prints the installed distribution's version, with or without
the ``cli`` extra, and without the extra every other command is one line saying how
to get it (exit 2), never a traceback.

The missing extra is simulated in a child process by an import hook that finds no
``rich`` (as a plain ``pip install trioexec`` leaves it: click stays, sqlite-utils
brings it). tests/test_cli_extra.py checks the same in a real fresh virtualenv.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trioexec
import trioexec.cli

VERSION = importlib.metadata.version("trioexec")
MISSING = (
    "trioexec: the command line needs the 'cli' extra (no module named 'rich'):"
    " pip install 'trioexec[cli]'\n"
)

# Run the entry as the console script does, with `rich` and its submodules not found.
WITHOUT_RICH = """
import importlib.abc, runpy, sys

class NoRich(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "rich" or name.startswith("rich."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoRich())
mode = sys.argv[1]
sys.argv = ["trioexec", *sys.argv[2:]]
if mode == "module":
    runpy.run_module("trioexec", run_name="__main__", alter_sys=True)
else:
    from trioexec.cli import run
    sys.exit(run())
"""


def child(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def without_rich(mode: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return child("-c", WITHOUT_RICH, mode, *args, cwd=cwd)


def test_version_is_the_installed_distributions(tmp_path: Path) -> None:
    proc = child("-m", "trioexec", "--version", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == f"trioexec, version {VERSION}\n"


def test_version_agrees_with_the_package() -> None:
    """pyproject.toml reads its version from trioexec/__init__.py: they cannot drift
    (an editable install shows a new one once reinstalled)."""
    assert trioexec.cli.version() == VERSION == trioexec.__version__


def test_help_lists_version(tmp_path: Path) -> None:
    proc = child("-m", "trioexec", "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "--version" in proc.stdout


@pytest.mark.parametrize("mode", ["entry", "module"])
def test_version_without_the_cli_extra(tmp_path: Path, mode: str) -> None:
    proc = without_rich(mode, "--version", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == f"trioexec, version {VERSION}\n"


@pytest.mark.parametrize(
    "args",
    [[], ["--help"], ["status", "app.db"], ["demo"], ["--version", "status"]],
    ids=lambda args: " ".join(args) or "no-args",
)
@pytest.mark.parametrize("mode", ["entry", "module"])
def test_without_the_cli_extra_one_line_and_exit_2(
    tmp_path: Path, mode: str, args: list[str]
) -> None:
    proc = without_rich(mode, *args, cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", MISSING)
    assert list(tmp_path.iterdir()) == []  # nothing was opened, let alone created


def test_the_console_script_is_the_entry() -> None:
    (entry,) = [
        e
        for e in importlib.metadata.distribution("trioexec").entry_points
        if e.group == "console_scripts"
    ]
    assert (entry.name, entry.value) == ("trioexec", "trioexec.cli:run")
