"""Developer tasks: ``nox -s tests``, ``lint``, ``typecheck``, ``examples``, ``demo``."""

from __future__ import annotations

import pathlib

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "lint", "typecheck", "examples"]
nox.options.reuse_existing_virtualenvs = True

HERE = pathlib.Path(__file__).parent
PYTHON = "3.11"


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the test suite (no wall-clock sleeps; a few minutes at most)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the package."""
    session.install("-e", ".[cli]", "mypy")
    session.run("mypy", "--strict", "trioexec")


@nox.session(python=PYTHON)
def examples(session: nox.Session) -> None:
    """Run every example under examples/ (each must exit 0)."""
    session.install("-e", ".")
    for path in sorted((HERE / "examples").glob("*.py")):
        session.log(f"example: {path.name}")
        session.run("python", str(path))


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The four-slot deferral story: tasks waiting on the outside world give their slot back."""
    session.install("-e", ".[cli]")
    session.run("trioexec", "demo", *session.posargs)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the Sphinx docs with warnings as errors."""
    session.install("-e", ".[docs]")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """The performance suite: every figure a ratio against a baseline measured in
    the same run (never a pass/fail gate). ``nox -s bench -- --quick`` for a smoke
    run; other arguments (``--only 1,3``, ``--repeat 2``, ``--json PATH``) pass on."""
    session.install("-e", ".")
    session.run("python", str(HERE / "benchmarks" / "suite.py"), *session.posargs)
