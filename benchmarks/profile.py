"""Where the time of a benchmark case goes: py-spy flame graphs and a top list.

    python benchmarks/profile.py [--out DIR] [--rate HZ] [CASE ...]

Runs each named case of ``benchmarks/suite.py`` (the same workload, in a child
process) under ``py-spy record`` (``pip install py-spy``; extra ``bench``), and
writes ``DIR/CASE.svg`` (a flame graph: open it in a browser) and
``DIR/CASE.txt`` (the collapsed stacks). Then prints, per case and thread, the
functions with the most samples: inclusive (the function and what it calls) and
self (the function's own lines). ``--gil`` samples only the thread that holds
the GIL (with a store: how much of it the writer thread takes from the Trio
thread). Cases (default: the first two):

- ``executor``: 100k no-op tasks through ``await ex.submit``, limit 4 (scenario 1);
- ``executor_store``: the same with a ``SQLiteStore``, limit 64 (scenario 6);
- ``chain_workflow``: 500 four-step chain workflows x 4 rounds (scenario 9);
- ``park_defer``: 10k tasks parked in ``defer_until(event)``, then woken (scenario 3).

Sampled shares are approximate: py-spy stops the program for each sample, which
over-counts time in system calls (Trio's ``epoll``), so compare the functions
with each other rather than reading a share as exact. py-spy needs permission
to trace the child (root, or ``ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITE = HERE / "suite.py"

CASES: dict[str, list[str]] = {
    "executor": ["executor", "n=100000", "limit=4"],
    "executor_store": ["executor", "n=100000", "limit=64", "store=true"],
    "chain_workflow": ["chain_steps", "runs=500", "rounds=4", 'mode="workflow"', "steps=4"],
    "park_defer": ["park_defer", "n=10000"],
}


def command(case: str) -> list[str]:
    name, *args = CASES[case]
    return [sys.executable, str(SUITE), "--case", name, *(f"--arg={a}" for a in args)]


def record(pyspy: str, case: str, out: Path, rate: int, gil: bool) -> Path:
    """Record ``case`` twice (a flame graph, and raw stacks for the top list);
    returns the raw stacks' path."""
    base = [pyspy, "record", "--rate", str(rate), "--threads"]
    if gil:
        base.append("--gil")
    svg, raw = out / f"{case}.svg", out / f"{case}.txt"
    for fmt, path in (("flamegraph", svg), ("raw", raw)):
        subprocess.run(
            [*base, "--format", fmt, "--output", str(path), "--", *command(case)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return raw


# Frames every sample passes through (the case runner, imports, thread plumbing).
_WRAPPER = re.compile(r"\(suite\.py\)|<frozen |\(threading\.py\)|_thread_cache|outcome/")


def top(raw: Path, count: int) -> str:
    """The functions with the most samples per thread, from collapsed stacks
    (imports left out)."""
    threads: dict[str, tuple[Counter[str], Counter[str], list[int]]] = {}
    names: dict[str, str] = {}
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if "<frozen importlib._bootstrap>" in stack:
            continue  # the imports before the case starts (slow under sampling)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        # "thread (ID)" or "thread (ID): NAME" (py-spy names a thread when it can)
        thread, _, name = frames[0].partition(": ")
        if name:
            names[thread] = name
        inclusive, own, total = threads.setdefault(thread, (Counter(), Counter(), [0]))
        total[0] += int(n)
        own[frames[-1]] += int(n)
        for frame in set(frames[1:]):
            inclusive[frame] += int(n)
    lines = []
    for thread, (inclusive, own, total) in threads.items():
        lines.append(f"  {names.get(thread, thread)}: {total[0]:,} samples")
        busiest = [(f, n) for f, n in inclusive.most_common() if not _WRAPPER.search(f)]
        for frame, n in busiest[:count]:
            share, self_share = 100 * n / total[0], 100 * own[frame] / total[0]
            lines.append(f"    {share:5.1f}% incl {self_share:5.1f}% self  {frame}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cases", nargs="*", metavar="CASE", help=f"of {', '.join(CASES)}")
    parser.add_argument("--out", type=Path, default=Path("profiles"), help="default ./profiles")
    parser.add_argument("--rate", type=int, default=200, help="samples per second (200)")
    parser.add_argument("--top", type=int, default=25, help="functions listed per thread (25)")
    parser.add_argument(
        "--gil",
        action="store_true",
        help="sample only the thread holding the GIL (who keeps the others waiting)",
    )
    args = parser.parse_args(argv)
    unknown = set(args.cases) - set(CASES)
    if unknown:
        parser.error(f"no case {', '.join(sorted(unknown))}; choose from {', '.join(CASES)}")
    pyspy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if pyspy is None:
        sys.exit("py-spy is not installed: pip install py-spy (or the bench extra)")
    args.out.mkdir(parents=True, exist_ok=True)
    for case in args.cases or list(CASES)[:2]:
        print(f"{case}: {' '.join(command(case)[1:])}", flush=True)
        raw = record(pyspy, case, args.out, args.rate, args.gil)
        print(f"  flame graph: {args.out / (case + '.svg')}")
        print(top(raw, args.top), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
