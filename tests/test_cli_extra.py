"""``pip install trioexec`` without the ``cli`` extra (issue 13, defect 20): the
console script says in one line how to get the command line, and exits 2, instead of
``ModuleNotFoundError: rich``.

The environment is a real fresh virtualenv holding exactly what a plain install
brings: the runtime dependencies of pyproject.toml and theirs (read from the
installed distributions' metadata), linked in from this environment without pip
(so it works offline, in well under a second), this checkout's package, and the
console script written from the entry point as pip writes it.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import trioexec

ROOT = Path(trioexec.__file__).resolve().parent.parent
LINE = "trioexec: the command line needs the 'cli' extra (no module named 'rich'):"
CONSOLE_SCRIPT = """#!{python}
import re
import sys
from {module} import {function}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({function}())
"""


def runtime_closure() -> dict[str, importlib.metadata.Distribution]:
    """The distributions `pip install trioexec` brings, by canonical name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    found: dict[str, importlib.metadata.Distribution] = {}
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in found:
            continue
        found[name] = dist = importlib.metadata.distribution(req.name)
        todo += [Requirement(r) for r in dist.requires or []]
    return found


def top_level(dist: importlib.metadata.Distribution) -> set[Path]:
    """The top-level files and directories a distribution installed."""
    site = Path(str(dist.locate_file("")))
    names = {Path(str(f)).parts[0] for f in dist.files or []}
    return {site / n for n in names if not n.endswith(".pth") and n not in ("..", "__pycache__")}


@pytest.fixture(scope="session")
def plain_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv with trioexec and its runtime dependencies only; its bin dir."""
    venv = tmp_path_factory.mktemp("plain") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    bin_dir = venv / "bin"
    (site,) = (venv / "lib").glob("python3.*/site-packages")
    closure = runtime_closure()
    assert "rich" not in closure  # what this test is about
    for dist in closure.values():
        for path in top_level(dist):
            (site / path.name).symlink_to(path)
    (site / "trioexec").symlink_to(ROOT / "trioexec")
    (entry,) = [
        e
        for e in importlib.metadata.distribution("trioexec").entry_points
        if e.group == "console_scripts" and e.name == "trioexec"
    ]
    module, function = entry.value.split(":")
    script = bin_dir / "trioexec"
    script.write_text(
        CONSOLE_SCRIPT.format(python=bin_dir / "python", module=module, function=function)
    )
    script.chmod(0o755)
    return bin_dir


def run_plain(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run(
        [*args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(
    "command",
    [["trioexec", "status", "app.db"], ["trioexec", "--help"], ["python", "-m", "trioexec"]],
    ids=" ".join,
)
def test_without_the_cli_extra_the_command_says_how_to_get_it(
    plain_install: Path, tmp_path: Path, command: list[str]
) -> None:
    """Before the fix: a traceback ending in ModuleNotFoundError: No module named 'rich'."""
    proc = run_plain(plain_install, str(plain_install / command[0]), *command[1:], cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"{LINE} pip install 'trioexec[cli]'\n"
    assert list(tmp_path.iterdir()) == []  # nothing was opened, let alone created


def test_without_the_cli_extra_the_library_works(plain_install: Path, tmp_path: Path) -> None:
    program = """
import trio, trioexec
async def double(x):
    await trio.sleep(0)
    return 2 * x
async def main():
    with trioexec.SQLiteStore("runs.db") as store:
        async with trioexec.open_executor(store=store) as ex:
            print(await ex.run(double, 21))
try:
    import rich
except ModuleNotFoundError:
    trio.run(main)
"""
    proc = run_plain(plain_install, str(plain_install / "python"), "-c", program, cwd=tmp_path)
    assert (proc.returncode, proc.stderr, proc.stdout) == (0, "", "42\n")
