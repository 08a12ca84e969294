"""Developer tasks: ``nox -s tests``, ``lint``, ``typecheck``, ``examples``, ``demo``, ``soak``,
``docs``, ``changelog``, ``bench`` (``-- --instructions``: valgrind counts), ``bench_peers``,
``bench_profile``.

nox itself goes in a virtualenv of its own (a system Python may refuse ``pip install``,
PEP 668): ``python3 -m venv .venv && .venv/bin/pip install nox``, then ``.venv/bin/nox``.
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import subprocess
import sys
import time

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "lint", "typecheck", "examples"]
nox.options.reuse_existing_virtualenvs = True
# `tests` runs on every supported Python installed here (_installed_pythons), the
# other sessions on the oldest of them. An interpreter nox cannot find is an error,
# never a skip that exits 0 (with none found, every session fails: see PYTHONS), and
# none is ever downloaded.
nox.options.error_on_missing_interpreters = True
if hasattr(nox.options, "download_python"):
    nox.options.download_python = "never"

HERE = pathlib.Path(__file__).parent
SUPPORTED = ("3.11", "3.12", "3.13", "3.14")


def _runs(python: str) -> bool:
    """True if ``python`` on PATH starts (a pyenv shim for a version that is not
    selected exists on PATH but exits with an error)."""
    exe = shutil.which(python)
    if exe is None:
        return False
    try:
        done = subprocess.run([exe, "-c", ""], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _installed_pythons() -> list[str]:
    """The supported versions that run here: nox's own, and those on PATH. pyenv
    exposes only its selected versions through its shims, so the other installed
    ones are put on PATH (ahead of the shims) for nox to find."""
    root = pathlib.Path(os.environ.get("PYENV_ROOT") or pathlib.Path.home() / ".pyenv")
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = []
    for version in SUPPORTED:
        if version == running:  # nox uses the interpreter it runs on for its own version
            found.append(version)
            continue
        if not _runs(f"python{version}"):
            for prefix in sorted((root / "versions").glob(f"{version}.*"), reverse=True):
                if (prefix / "bin" / f"python{version}").exists():
                    os.environ["PATH"] = f"{prefix / 'bin'}{os.pathsep}{os.environ['PATH']}"
                    break
        if _runs(f"python{version}"):
            found.append(version)
    return found


PYTHONS = _installed_pythons()
if not PYTHONS:
    # Each session then asks for 3.11, which nox fails as missing (exit 1).
    print(
        f"noxfile: no supported Python ({', '.join(SUPPORTED)}) runs here: looked for"
        f" python3.X on PATH and under {os.environ.get('PYENV_ROOT') or '~/.pyenv'}/versions",
        file=sys.stderr,
    )
    PYTHONS = [SUPPORTED[0]]
PYTHON = PYTHONS[0]  # the oldest one present, for the single-interpreter sessions


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """Run the test suite on every supported Python installed here (no wall-clock
    sleeps but the random-kill test's; a few minutes at most). The ``slow`` tests
    are left to ``soak``.

    On the oldest Python it prints the coverage of ``trioexec/``, child processes
    included (the CLI tests' ``trioexec`` commands, the acceptance tests' workers:
    ``[tool.coverage.run] patch = subprocess`` in pyproject.toml), and fails a full
    run under 90%; a run of selected tests (arguments after ``--``) only reports it.
    The newer Pythons run without coverage (it costs a third more time each).
    """
    session.install("-e", ".[test]")
    cov = []
    if session.python == PYTHON:
        cov = ["--cov", "--cov-report=term-missing:skip-covered"]
        if not session.posargs:
            cov.append("--cov-fail-under=90")
    # A file's tests run in one process (``loadfile``: their module-level servers
    # and fixtures are shared as in a serial run), the files on every core, at
    # most 4 (more would only load the machine the timing tests run on).
    # ``-- -n 0`` runs serially.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = min(4, cores or 1)
    session.run("pytest", "-n", str(workers), "--dist", "loadfile", *cov, *session.posargs)


@nox.session(python=PYTHON)
def soak(session: nox.Session) -> None:
    """The long runs, bounded: ~10 minutes on two cores (``TRIOEXEC_SOAK_MINUTES``).

    Three fifths of the budget go to random-kill campaigns (``pytest -m slow``:
    ``TRIOEXEC_KILL_ROUNDS`` rounds each, seeds from ``TRIOEXEC_KILL_SEED``); the rest
    to the hypothesis tests: the durable model with ``TRIOEXEC_DURABLE_EXAMPLES``
    (default 2,000) examples, the executor-under-faults state machine with
    ``TRIOEXEC_FAULT_EXAMPLES`` (default 500), then passes of every hypothesis test under new seeds
    (``--hypothesis-seed``: each pass is another full set of examples; the tests
    fix their own ``max_examples``, which no settings profile overrides) until the
    budget is spent. Arguments after ``--`` go to every pytest call.
    """
    session.install("-e", ".[test]")
    budget = float(os.environ.get("TRIOEXEC_SOAK_MINUTES") or "10") * 60
    end = time.monotonic() + budget
    kill_env = {
        "TRIOEXEC_SOAK_MINUTES": f"{budget * 0.6 / 60:.2f}",
        "TRIOEXEC_KILL_ROUNDS": os.environ.get("TRIOEXEC_KILL_ROUNDS") or "30",
    }
    session.run(
        "pytest",
        "-m",
        "slow",
        "-s",
        "-p",
        "no:cacheprovider",
        "-o",
        "faulthandler_timeout=0",  # a campaign runs for minutes by design
        *session.posargs,
        env=kill_env,
    )

    examples = os.environ.get("TRIOEXEC_DURABLE_EXAMPLES") or "2000"
    # (its examples take about five minutes here: past pytest's 300 s faulthandler
    # timeout, whose dump of the running threads can crash the process)
    long_run = ("-o", "faulthandler_timeout=1800")
    session.run(
        "pytest",
        "-p",
        "no:cacheprovider",
        *long_run,
        "tests/test_durable_model.py",
        *session.posargs,
        env={"TRIOEXEC_DURABLE_EXAMPLES": examples},
    )
    faults = os.environ.get("TRIOEXEC_FAULT_EXAMPLES") or "500"
    session.run(
        "pytest",
        "-p",
        "no:cacheprovider",
        *long_run,
        "tests/test_executor_faults.py",
        *session.posargs,
        env={"TRIOEXEC_FAULT_EXAMPLES": faults},
    )
    seed = int(os.environ.get("TRIOEXEC_HYPOTHESIS_SEED") or random.randrange(2**32))
    longest = 0.0
    for n in range(1000):
        if time.monotonic() + longest > end:
            break
        began = time.monotonic()
        session.log(f"hypothesis pass {n + 1}: --hypothesis-seed={seed + n}")
        session.run(
            "pytest",
            "-m",
            "hypothesis",
            "-p",
            "no:cacheprovider",
            f"--hypothesis-seed={seed + n}",
            *session.posargs,
        )
        longest = max(longest, time.monotonic() - began)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the package (trioexec.contrib against its extras)."""
    session.install("-e", ".[cli,postgres,prometheus,otel,web]", "mypy")
    session.run("mypy", "--strict", "trioexec")


@nox.session(python=PYTHON)
def examples(session: nox.Session) -> None:
    """Run every example under examples/ (each must exit 0). The PostgreSQL ones
    get a throwaway server (tests/pg_server.py) in ``TRIOEXEC_POSTGRES_URL``."""
    # (contrib's examples: the extras, and OpenTelemetry's SDK to export spans)
    session.install("-e", ".[postgres,prometheus,otel]", "opentelemetry-sdk")
    sys.path.insert(0, str(HERE / "tests"))
    from pg_server import postgres_server

    with postgres_server() as url:
        for path in sorted((HERE / "examples").glob("*.py")):
            session.log(f"example: {path.name}")
            session.run("python", str(path), env={"TRIOEXEC_POSTGRES_URL": url})


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """The four-slot deferral story: tasks waiting on the outside world give their slot back."""
    session.install("-e", ".[cli]")
    session.run("trioexec", "demo", *session.posargs)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the Sphinx docs with warnings as errors, then run every Python block and
    every ``trioexec`` command of the docs and the README (tests/test_docs_code.py:
    each runs, the commands page by page on what their examples leave, or carries a
    ``.. not-run: <why>`` marker; ``nox -s tests`` runs it too)."""
    session.install("-e", ".[docs,test]")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")
    session.run("pytest", "-p", "no:cacheprovider", "tests/test_docs_code.py")


@nox.session(python=PYTHON)
def changelog(session: nox.Session) -> None:
    """The next release's notes as towncrier would write them from newsfragments/
    into docs/changelog.rst (a draft: nothing changes). ``nox -s changelog -- 1.0.0``
    names the version (default ``next``)."""
    session.install("towncrier>=24.7")
    version = session.posargs[0] if session.posargs else "next"
    session.run("towncrier", "build", "--draft", "--version", version)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """The performance suite: every figure a ratio against a baseline measured in
    the same run (never a pass/fail gate). ``nox -s bench -- --quick`` for a smoke
    run; other arguments (``--only 1,3``, ``--repeat 2``, ``--json PATH``) pass on.
    ``--write-docs``: also write the run into docs/benchmarks.md (benchmarks/render.py).
    Scenario 12 starts a throwaway PostgreSQL server and runs procrastinate beside.

    ``nox -s bench -- --instructions``: instead, instructions per task under valgrind's
    callgrind, start-up subtracted, for issue 32's rows (benchmarks/instructions.py;
    ``--n``, ``--only``, ``--repeat``, ``--jobs``, ``--json PATH`` pass on). Counts do
    not move with the machine's load; a few minutes."""
    args = list(session.posargs)
    if "--instructions" in args:
        args.remove("--instructions")
        session.install("-e", ".")
        session.run("python", str(HERE / "benchmarks" / "instructions.py"), *args)
        return
    session.install("-e", ".[postgres]", "procrastinate>=3.0")
    write_docs = "--write-docs" in args
    if write_docs:
        args.remove("--write-docs")
        if "--json" not in args:
            args += ["--json", str(pathlib.Path(session.create_tmp()) / "bench.json")]
    session.run("python", str(HERE / "benchmarks" / "suite.py"), *args)
    if write_docs:
        results = args[args.index("--json") + 1]
        session.run("python", str(HERE / "benchmarks" / "render.py"), results)


@nox.session(python=PYTHON)
def bench_peers(session: nox.Session) -> None:
    """trioexec beside its peers (aiometer, anyio, asyncio, Huey, DBOS) on the same
    machine in the same run, for context (never a pass/fail gate): installs the
    ``bench`` extra and runs benchmarks/peers.py. ``nox -s bench_peers -- --quick``
    for a smoke run; ``--repeat R``, ``--json PATH`` pass on; ``--write-docs`` also
    writes the run into docs/benchmarks.md (the ``peers:`` block)."""
    session.install("-e", ".[bench]")
    session.run("python", str(HERE / "benchmarks" / "peers.py"), *session.posargs)


@nox.session(python=PYTHON)
def bench_profile(session: nox.Session) -> None:
    """Flame graphs (py-spy) of benchmark cases, and where their time goes:
    ``nox -s bench_profile -- executor executor_store`` writes profiles/CASE.svg
    and prints the busiest functions (benchmarks/profile.py; ``--out DIR``)."""
    session.install("-e", ".", "py-spy")
    session.run("python", str(HERE / "benchmarks" / "profile.py"), *session.posargs)
