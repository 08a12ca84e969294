"""Instructions per task under valgrind's callgrind, start-up subtracted (issue 32's rows).

    python benchmarks/instructions.py [--n N] [--repeat R] [--jobs J] [--json PATH] [--keep DIR]
                                      [--only noop,noop-floor,defer,defer-floor,store,workflow]
    nox -s bench -- --instructions [the same arguments]

Wall-clock ratios swing by 30% on a shared 2-core machine; instruction counts do
not. Each side of each scenario is one of ``benchmarks/suite.py``'s cases, run in
a fresh process under ``valgrind --tool=callgrind`` twice: with N units of work
and with 2N. The figure is the marginal cost, (I(2N) - I(N)) / N: the interpreter's
start-up, the imports and the setting up of the executor or pool are the same in
both runs and cancel out. Every count is taken R times (default 2) and the
marginal figures of the repeats are compared: they should agree within 0.5%
(the output says whether they do).

Scenarios (baselines and targets from issue 32):

- ``noop``: a no-op task through ``await ex.submit``, limit 4, vs. the channel
  pool (a memory channel read by 4 worker tasks; suite.py's ``channel_pool``).
- ``noop-floor`` and ``defer-floor``: the same two workloads vs. issue 32's floor,
  suite.py's ``FloorPool`` (``floor_pool``, ``floor_defer``): `shaped_pool` plus,
  written by hand, only the work the API contract asks of each task and each
  deferral (a ref with its id, name, status, times and causation; the admission
  bound; the counters `statistics()` reads; a handle; a cancel scope per worker
  kept across jobs). Target: the floor + 10%.
- ``defer``: a task that parks once in ``handle.defer_until(event)`` and is woken
  (a whole task: submit, start, defer, resume, finish) vs. a nursery task doing the
  hand-written CapacityLimiter acquire, release, ``Event.wait``, acquire, release
  (suite.py's ``park_defer`` and ``park_hand``, scenario 3).
- ``store``: the ``noop`` workload with a SQLiteStore (a file in a temporary
  directory) vs. the same without a store, both with Trio's clock stopped
  (`stop_trio_clock`: no timer fires, so the journal writes one transaction, at
  the close, and the command poller never reads): the per-task cost of the store,
  without the transactions' own, which natively are ~5 per 4,000 such tasks.
- ``workflow``: a step of 50 four-step chain workflows run at once
  (``ex.run_workflow``) vs. the same specs awaited one by one with ``ex.run``
  (suite.py's ``chain_steps``, scenario 9); per step, N counted in steps.

Deterministic: the children run with ``PYTHONHASHSEED=0``, Trio's scheduler seeded
(it reverses each batch of runnable tasks at random), as ``python -S`` with only
the standard library, site-packages and a link to the trioexec counted on their
path (`child_path`: no coverage hook, no checkout whose files come and go); the
workloads read no clock but the stopwatch around them (a constant). All rows use
one interpreter (this script's own, ``--python`` to change it) and the
``trioexec`` it imports here (``PYTHONPATH`` selects a checkout): both are printed.
Before counting, every case runs once without valgrind, which also compiles the
``.pyc`` files the counted runs then load (a first import would count compiling).
``--keep DIR`` keeps the callgrind output files (``callgrind_annotate FILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
SUITE = HERE.parent / "suite.py"
TIMEOUT = 1800.0  # seconds for one counted run
AGREE = 0.005  # repeats whose marginal counts differ by more than this are flagged
CHAIN_RUNS, CHAIN_STEPS = 50, 4  # the workflow scenario: chains at once, steps each

Result = dict[str, Any]


@dataclass(frozen=True, eq=False)  # (hashed by identity: two scenarios share a side)
class Side:
    """One side of a scenario: suite.py's ``case`` with ``fixed`` arguments and its
    size in ``scaled``; one unit of ``scaled`` is ``per`` units of work (tasks).
    ``stopped``: Trio's clock stands still (see `stop_trio_clock`)."""

    label: str
    case: str
    scaled: str
    fixed: dict[str, Any] = field(default_factory=dict)
    per: int = 1
    stopped: bool = False

    def count(self, n: int) -> int:
        """The value of ``scaled`` for about ``n`` units of work."""
        return max(1, n // self.per)

    def kwargs(self, count: int) -> dict[str, Any]:
        return {**self.fixed, self.scaled: count}


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    ours: Side
    base: Side
    target: float  # issue 32's bound on ours / base
    unit: str = "task"


_NOOP = Side("executor", "executor", "n", {"limit": 4})
_DEFER = Side("defer_until(event)", "park_defer", "n")
_FLOOR = "floor pool (the contract's work by hand)"
_STORED = Side("with SQLiteStore", "executor", "n", {"limit": 4, "store": True}, stopped=True)

SCENARIOS = {
    s.name: s
    for s in [
        Scenario(
            "noop",
            "no-op task, limit 4",
            _NOOP,
            Side("channel pool (4 workers)", "channel_pool", "n", {"limit": 4}),
            1.15,
        ),
        Scenario(
            "noop-floor",
            "no-op task, limit 4, vs issue 32's floor",
            _NOOP,
            Side(_FLOOR, "floor_pool", "n", {"limit": 4}),
            1.10,
        ),
        Scenario(
            "defer",
            "defer/resume cycle on one Event",
            _DEFER,
            Side("CapacityLimiter acq/rel, wait, acq/rel", "park_hand", "n"),
            1.30,
        ),
        Scenario(
            "defer-floor",
            "defer/resume cycle on one Event, vs issue 32's floor",
            _DEFER,
            Side(_FLOOR, "floor_defer", "n"),
            1.10,
        ),
        Scenario(
            "store",
            "SQLiteStore vs none, limit 4, clock stopped",
            _STORED,
            Side("executor", "executor", "n", {"limit": 4}, stopped=True),
            2.0,
        ),
        Scenario(
            "store-floor",
            "SQLiteStore, limit 4, clock stopped, vs issue 32's stored floor",
            _STORED,
            Side(
                f"{_FLOOR}, rows by executemany",
                "floor_pool",
                "n",
                {"limit": 4, "store": True},
                stopped=True,
            ),
            1.10,
        ),
        Scenario(
            "workflow",
            f"workflow step ({CHAIN_RUNS} {CHAIN_STEPS}-step chains)",
            Side(
                "ex.run_workflow",
                "chain_steps",
                "rounds",
                {"runs": CHAIN_RUNS, "steps": CHAIN_STEPS, "mode": "workflow"},
                CHAIN_RUNS * CHAIN_STEPS,
            ),
            Side(
                "ex.run of each spec",
                "chain_steps",
                "rounds",
                {"runs": CHAIN_RUNS, "steps": CHAIN_STEPS, "mode": "direct"},
                CHAIN_RUNS * CHAIN_STEPS,
            ),
            1.5,
            unit="step",
        ),
    ]
}


# ====================================================================== in the child


def seed_trio(seed: int = 0) -> None:
    """Seed the random source of Trio's scheduler (private: each pass over the
    runnable tasks is reversed or not at random), so runs take one path."""
    import trio

    rng = getattr(getattr(trio._core, "_run", None), "_r", None)
    if not isinstance(rng, random.Random):
        raise RuntimeError("trio._core._run._r is gone: cannot seed Trio's scheduler")
    rng.seed(seed)


def stop_trio_clock() -> None:
    """Make every ``trio.run`` of this process use a stopped clock
    (`trio.testing.MockClock` at rate 0, no autojump): no timer ever fires.

    What a timer does per task depends on how much work fits in its period: the
    journal gathers rows for 5 ms of Trio time before a transaction, the command
    poller reads the store every 0.5 s. Under valgrind the same work takes ~50
    times longer, so with the real clock a run wrote ~10 times more transactions
    and polled ~50 times more often per task than natively, and how many moved
    with the machine's load (repeats 1-12% apart; with the clock slowed 50 times,
    still 0.1-3.4%). Stopped, the writer batches by count alone."""
    import trio
    import trio.testing

    run = trio.run

    def stopped(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("clock", trio.testing.MockClock(rate=0))
        return run(*args, **kwargs)

    trio.run = stopped


def child(case: str, raw_args: list[str], stopped: bool = False) -> None:
    """Run suite.py's ``case`` here, Trio seeded (its clock stopped if ``stopped``);
    print which trioexec it used, then the case's own JSON line."""
    seed_trio()
    if stopped:
        stop_trio_clock()
    sys.path.insert(0, str(HERE.parent))
    import suite

    import trioexec

    print(json.dumps({"trioexec": trioexec.__file__}), flush=True)
    suite.child(case, raw_args)


# ====================================================================== in the parent


class CountFailed(RuntimeError):
    pass


def plain_env(pythonpath: str | None) -> dict[str, str]:
    """This environment without coverage's start-up hook or PYTHON* settings, with a
    fixed hash seed and ``pythonpath`` as PYTHONPATH (none if None)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVERAGE_", "PYTHON"))}
    env["PYTHONHASHSEED"] = "0"
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


@dataclass(frozen=True)
class Interpreter:
    """How a child starts: ``python -S`` (no site hooks, no .pth files) with
    ``path`` as its PYTHONPATH (see `child_path`)."""

    python: str
    path: str

    def argv(self, side: Side, size: int) -> list[str]:
        args = [f"--arg={k}={json.dumps(v)}" for k, v in side.kwargs(size).items()]
        if side.stopped:
            args.append("--stopped-clock")
        return [self.python, "-S", str(HERE), "--child", side.case, *args]


def child_path(python: str, folder: Path) -> str:
    """The children's PYTHONPATH: ``folder``, holding only a link to the trioexec
    package that ``python`` imports here (this PYTHONPATH's, else the installed
    one), then the standard library and site-packages; nothing else.

    A lookup that misses (an optional import) lists every directory on the path,
    at a cost that grows with its entries. An editable install puts the checkout's
    root on the path, where test runs come and go (hundreds of ``.coverage.*``
    files): counts taken minutes apart moved by up to 1.8M instructions."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}
    where = (
        "import importlib.util, json, site, sys; sys.path.remove(''); "
        "spec = importlib.util.find_spec('trioexec'); "
        "print(json.dumps([spec and spec.origin, site.getsitepackages()]))"
    )
    origin, sites = json.loads(subprocess.run(
        [python, "-c", where], capture_output=True, text=True, check=True, timeout=60, env=env
    ).stdout)  # fmt: skip
    if origin is None:
        raise CountFailed(f"{python} cannot import trioexec (set PYTHONPATH to a checkout)")
    stdlib = json.loads(subprocess.run(
        [python, "-S", "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
        capture_output=True, text=True, check=True, timeout=60, env=plain_env(None),
    ).stdout)  # fmt: skip
    (folder / "trioexec").symlink_to(Path(origin).parent, target_is_directory=True)
    return os.pathsep.join([str(folder), *stdlib, *sites])


def describe_run(side: Side, size: int) -> str:
    words = [side.case, *(f"{k}={v}" for k, v in side.kwargs(size).items())]
    if side.stopped:
        words.append("clock=stopped")
    return " ".join(words)


def run_child(argv: list[str], pythonpath: str, label: str) -> str:
    """Run ``argv`` (in `plain_env`); its stdout. A failure raises `CountFailed`."""
    try:
        env = plain_env(pythonpath)
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=TIMEOUT, env=env, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise CountFailed(f"{label}: timed out after {TIMEOUT:.0f} s") from exc
    if proc.returncode:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise CountFailed(f"{label}: exit status {proc.returncode}\n{tail}")
    return proc.stdout


def read_total(path: Path) -> int:
    """The total of the first event (Ir, instructions) of a callgrind output file:
    its ``totals:`` line, else its ``summary:`` line."""
    found: dict[str, int] = {}
    for line in path.read_text().splitlines():
        match = re.match(r"(totals|summary):\s*(\d+)", line)
        if match:
            found[match[1]] = int(match[2])
    if not found:
        raise CountFailed(f"{path}: no totals: or summary: line")
    return found.get("totals", found.get("summary", 0))


def count(interpreter: Interpreter, side: Side, size: int, out: Path) -> Result:
    """One fresh process running ``side`` at ``size`` under callgrind: its
    ``instructions``, and the case's own figures (``store_writes``: transactions)."""
    label = describe_run(side, size)
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    t0 = time.perf_counter()
    stdout = run_child(argv + interpreter.argv(side, size), interpreter.path, label)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    result: Result = json.loads(lines[-1]) if lines else {}
    result["instructions"] = total = read_total(out)
    log(f"  {label}: {total:,} instructions ({time.perf_counter() - t0:.0f} s)")
    return result


def warm(interpreter: Interpreter, side: Side, size: int) -> str:
    """Run ``side`` once without valgrind (it works; its .pyc files are written);
    the path of the trioexec it imported."""
    label = describe_run(side, size)
    stdout = run_child(interpreter.argv(side, size), interpreter.path, label)
    for line in stdout.splitlines():
        if line.startswith('{"trioexec"'):
            return os.path.realpath(json.loads(line)["trioexec"])
    raise CountFailed(f"{label}: did not say which trioexec it imported")


@dataclass(frozen=True)
class Job:
    scenario: str
    side: str  # "ours" or "base"
    size: int  # the value of the side's ``scaled`` argument
    repeat: int


def plan(scenarios: list[Scenario], n: int, repeat: int) -> Iterator[tuple[Job, Side]]:
    """Every counted run: per repeat, each side at its size and at twice that (a
    side two scenarios share, e.g. the plain executor, counted once)."""
    seen = set()
    for r in range(repeat):
        for sc in scenarios:
            for which, side in (("ours", sc.ours), ("base", sc.base)):
                for size in (side.count(n), 2 * side.count(n)):
                    key = (side, size, r)
                    if key not in seen:
                        seen.add(key)
                        yield Job(sc.name, which, size, r), side


Counter = Callable[[Side, int, int], Result]  # side, size, repeat -> {"instructions": ...}


def measure(
    scenarios: list[Scenario], n: int, repeat: int, jobs: int, counter: Counter
) -> list[Result]:
    """Count every run of ``plan`` (``jobs`` at a time; instruction counts do not
    depend on the machine's load) and make one result per scenario."""
    todo = list(plan(scenarios, n, repeat))
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        totals = dict(
            zip(
                [(side, job.size, job.repeat) for job, side in todo],
                pool.map(lambda item: counter(item[1], item[0].size, item[0].repeat), todo),
                strict=True,
            )
        )

    def side_result(side: Side) -> Result:
        c = side.count(n)
        runs_n = [totals[side, c, r] for r in range(repeat)]
        runs_2n = [totals[side, 2 * c, r] for r in range(repeat)]
        one = [run["instructions"] for run in runs_n]
        two = [run["instructions"] for run in runs_2n]
        marginal = [(b - a) / (c * side.per) for a, b in zip(one, two, strict=True)]
        low, high = min(marginal), max(marginal)
        extra = {}
        if "store_writes" in runs_n[0]:
            extra["transactions_n"] = [run["store_writes"] for run in runs_n]
            extra["transactions_2n"] = [run["store_writes"] for run in runs_2n]
        return {
            "label": side.label,
            "case": side.case,
            "clock": "stopped" if side.stopped else "real",
            "args": side.kwargs(c),
            "units": c * side.per,
            "per_unit": sum(marginal) / len(marginal),
            "per_unit_repeats": marginal,
            "spread": (high - low) / abs(low) if low else 0.0,
            "totals_n": one,
            "totals_2n": two,
            **extra,
        }

    results = []
    for sc in scenarios:
        ours, base = side_result(sc.ours), side_result(sc.base)
        value = ours["per_unit"] / base["per_unit"]
        results.append(
            {
                "scenario": sc.name,
                "what": sc.what,
                "unit": sc.unit,
                "trioexec": ours,
                "baseline": base,
                "ratio": value,
                "target": sc.target,
                "met": value <= sc.target,
                "agree": max(ours["spread"], base["spread"]) <= AGREE,
            }
        )
    return results


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def kilo(x: float) -> str:
    return f"{x / 1000:,.1f}k"


def table(results: list[Result]) -> str:
    head = ("scenario", "per", "trioexec", "baseline", "ratio", "target", "repeats differ by")
    rows = [head]
    for res in results:
        ours, base = res["trioexec"], res["baseline"]
        spread = f"{ours['spread']:.3%} / {base['spread']:.3%}"
        rows.append(
            (
                res["what"],
                res["unit"],
                kilo(ours["per_unit"]),
                kilo(base["per_unit"]) + f" ({base['label']})",
                f"{res['ratio']:.2f}x",
                f"<= {res['target']:.2f}x" + ("" if res["met"] else " NO"),
                spread,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for i, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [row[2].rjust(widths[2]), row[3].ljust(widths[3]), row[4].rjust(widths[4])]
        cells += [row[5].ljust(widths[5]), row[6]]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def trioexec_commit(path: str) -> str:
    """The git commit of the checkout holding the trioexec package at ``path``
    (``+dirty`` if its trioexec/ has changes), or "unknown"."""
    package = Path(path).parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(package), "log", "-1", "--format=%h %s"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(package), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    if not commit:
        return "unknown"
    sha, _, subject = commit.partition(" ")
    return sha + ("+dirty" if dirty else "") + f" ({subject[:60]})"


def describe(python: str) -> Result:
    """The interpreter, valgrind and the machine the counts come from."""
    version = subprocess.run(
        [python, "-c", "import platform, sys; print(platform.python_implementation(), "
         "platform.python_version(), sys.executable)"],
        capture_output=True, text=True, check=True, timeout=60, env=plain_env(None),
    ).stdout.split()  # fmt: skip
    valgrind = subprocess.run(
        ["valgrind", "--version"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.partition(":")[2].strip()
                    break
    except OSError:
        pass
    return {
        "python": f"{version[0]} {version[1]}",
        "python_path": version[2],
        "python_real_path": os.path.realpath(version[2]),
        "valgrind": valgrind,
        "cpus": os.cpu_count(),
        "cpu_model": model or platform.processor() or None,
        "os": f"{platform.system()} {platform.release()}",
    }


def parse_only(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        raise argparse.ArgumentTypeError(f"no scenario {unknown}; choose from {list(SCENARIOS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--n",
        type=int,
        default=2000,
        help="units of work (default 2,000; above 1,024, where the channel pool's buffer fills)",
    )
    parser.add_argument("--only", type=parse_only, help="scenarios, e.g. noop,defer")
    parser.add_argument("--repeat", type=int, default=2, help="count each run R times (2)")
    parser.add_argument("--jobs", type=int, default=1, help="counted runs at a time (1)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to count")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="keep callgrind's files here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--stopped-clock", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--arg", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        child(args.child, args.arg, args.stopped_clock)
        return 0
    if shutil.which("valgrind") is None:
        log("valgrind is not installed (apt-get install valgrind)")
        return 2

    scenarios = [SCENARIOS[name] for name in args.only or SCENARIOS]
    repeat = max(1, args.repeat)
    info = describe(args.python)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "path").mkdir()
        interpreter = Interpreter(args.python, child_path(args.python, Path(tmp) / "path"))
        sides = {side for sc in scenarios for side in (sc.ours, sc.base)}
        log("each case once without valgrind (it works; .pyc files written)")
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            paths = set(pool.map(lambda side: warm(interpreter, side, side.count(args.n)), sides))
        if len(paths) != 1:
            raise CountFailed(f"the cases imported different trioexec packages: {sorted(paths)}")
        (path,) = paths
        info.update(trioexec=str(Path(path).parent), commit=trioexec_commit(path))

        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)

        def counter(side: Side, size: int, r: int) -> Result:
            name = describe_run(side, size).replace(" ", ".")
            out = folder / f"callgrind.{name}.r{r + 1}.out"
            return count(interpreter, side, size, out)

        log(f"counting: N={args.n}, each count {repeat} times, {args.jobs} at a time")
        results = measure(scenarios, args.n, repeat, args.jobs, counter)
    seconds = time.perf_counter() - t0

    agree = all(res["agree"] for res in results)
    print()
    print("instructions per task (valgrind --tool=callgrind), start-up subtracted:")
    print("(I(2N) - I(N)) / N, each run a fresh process; PYTHONHASHSEED=0, Trio's scheduler seeded")
    print(f"python:   {info['python']}, {info['python_path']} -> {info['python_real_path']}")
    print(f"trioexec: {info['trioexec']} at {info['commit']}")
    print(f"machine:  {info['cpus']} CPUs, {info['cpu_model']}, {info['os']}, {info['valgrind']}")
    print(f"N:        {args.n:,} tasks (workflow: steps) and twice that; each count {repeat}x")
    print()
    print(table(results))
    print()
    for res in results:
        for side in (res["trioexec"], res["baseline"]):
            if "transactions_n" in side:
                runs = ", ".join(
                    f"{a} and {b}"
                    for a, b in zip(side["transactions_n"], side["transactions_2n"], strict=True)
                )
                clock = " (Trio's clock stopped)" if side["clock"] == "stopped" else ""
                print(
                    f"{res['scenario']}: {side['label']}: transactions at N and 2N, each"
                    f" repeat: {runs}{clock}"
                )
    if repeat < 2:
        print("each count taken once (--repeat 1): no repeat to compare")
    elif agree:
        print(f"the {repeat} repeats of every count agree within {AGREE:.1%} (column above)")
    else:
        apart = ", ".join(res["scenario"] for res in results if not res["agree"])
        print(f"WARNING: repeats differ by more than {AGREE:.1%} in: {apart} (column above)")
    print(f"{len(results)} scenarios in {seconds:.0f} s", flush=True)
    if args.json:
        document = {**info, "n": args.n, "repeat": repeat, "seconds": round(seconds)}
        document.update(agree=agree, results=results)
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
