"""Bytecodes per task, per trioexec function: where an instruction count moved.

    python benchmarks/bytecodes.py CASE [--n N] [--json PATH] [--top K]
    python benchmarks/bytecodes.py --diff BEFORE.json AFTER.json [--top K]

Callgrind (`benchmarks/instructions.py`) counts machine instructions, and sees
the interpreter's C functions only. This counts the Python bytecodes each
function executes (``sys.settrace`` with opcode events), at N and 2N units of
work: (count(2N) - count(N)) / N per function, start-up subtracted as there.
Trio's scheduler is seeded, ``noop`` and ``defer`` run on a clock that stands
still (run with ``PYTHONHASHSEED=0``, as instructions.py does); Trio's own
functions still vary a little between runs, trioexec's do not. When a change
moves the instruction count but no trioexec function's bytecodes, the move is
the interpreter's (its caches, the GC), not work the change added.

Cases: ``noop`` (a no-op task through ``await ex.submit``, limit 4), ``defer``
(a task that parks once in ``handle.defer_until(event)`` and is woken),
``floor`` and ``defer-floor`` (issue 32's floor, ``noop``'s and ``defer``'s
workloads by hand), ``keyed`` (suite.py's ``keyed``: 4 keys, limit 8), ``workflow`` (a step of 50
four-step chain workflows, suite.py's ``chain_steps``), ``store`` (``noop`` with a
SQLiteStore in a temporary directory; the store's writer thread is counted too).
A case runs once, small, before counting, so that what is done once per process
(a regex compiled, a thread started) is not counted against N. ``PYTHONPATH``
selects the checkout counted; ``--diff`` compares two ``--json`` outputs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from collections.abc import Callable
from types import FrameType
from typing import Any

import trio
import trio.testing

import trioexec

sys.path.insert(0, os.path.dirname(__file__))
import suite  # (beside this file)


async def _noop() -> None:
    pass


def _executor(n: int) -> None:
    async def main() -> None:
        async with trioexec.open_executor(max_concurrent_tasks=4) as ex:
            for _ in range(n):
                await ex.submit(_noop)

    trio.run(main, clock=trio.testing.MockClock())  # (a clock that stands still)


def _stored(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = trioexec.SQLiteStore(os.path.join(tmp, "tasks.db"))
        write = store.write

        def traced(changes: Any) -> Any:  # (the writer's thread: trace it as well)
            sys.settrace(_tracer[0])
            try:
                return write(changes)
            finally:
                sys.settrace(None)

        store.write = traced  # type: ignore[method-assign]

        async def main() -> None:
            async with trioexec.open_executor(max_concurrent_tasks=4, store=store) as ex:
                for _ in range(n):
                    await ex.submit(_noop)

        trio.run(main, clock=trio.testing.MockClock())


def _defer(n: int) -> None:
    async def main() -> None:
        event = trio.Event()

        async def parked(handle: trioexec.TaskHandle) -> None:
            await handle.defer_until(event)

        async with trioexec.open_executor(max_concurrent_tasks=4) as ex:
            refs = [await ex.submit(parked) for _ in range(n)]
            await trio.testing.wait_all_tasks_blocked()
            event.set()
            for ref in refs:
                await ref.wait()

    trio.run(main, clock=trio.testing.MockClock())


#: case -> (run N units, units per N)
CASES: dict[str, tuple[Callable[[int], Any], int]] = {
    "noop": (_executor, 1),
    "defer": (_defer, 1),
    "keyed": (lambda n: suite.CASES["keyed"](n=n, limit=8, keys=4), 1),
    "workflow": (lambda n: suite.CASES["chain_steps"](runs=50, rounds=n, mode="workflow"), 200),
    "store": (_stored, 1),
    "floor": (lambda n: suite.CASES["floor_pool"](n=n, limit=4), 1),
    "defer-floor": (lambda n: suite.CASES["floor_defer"](n=n), 1),
    "channel": (lambda n: suite.CASES["channel_pool"](n=n, limit=4), 1),
}
_tracer: list[Any] = [None]  # (the running count's, for other threads)


def count(case: str, n: int) -> collections.Counter[str]:
    run, _ = CASES[case]
    counts: collections.Counter[str] = collections.Counter()

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[f"{os.path.basename(code.co_filename)}:{code.co_qualname}"] += 1
        return tracer

    _tracer[0] = tracer
    trio._core._run._r.seed(0)  # type: ignore[attr-defined]
    sys.settrace(tracer)
    try:
        run(n)
    finally:
        sys.settrace(None)
    return counts


def per_unit(case: str, n: int) -> dict[str, float]:
    CASES[case][0](max(1, n // 10))  # (once-per-process work: not counted)
    once, twice = count(case, n), count(case, 2 * n)
    units = n * CASES[case][1]
    return {name: (twice[name] - once[name]) / units for name in set(once) | set(twice)}


def _ours(name: str) -> bool:
    return not name.startswith(("_run.py:", "_io_", "_traps.py:", "_sync.py:", "<attrs"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", nargs="?", choices=sorted(CASES))
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--json")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.diff:
        with open(args.diff[0]) as f:
            before = json.load(f)
        with open(args.diff[1]) as f:
            after = json.load(f)
        print(f"total: {sum(before.values()):,.1f} -> {sum(after.values()):,.1f} bytecodes")
        moved = sorted(
            ((after.get(k, 0.0) - before.get(k, 0.0), k) for k in set(before) | set(after)),
            key=lambda item: -abs(item[0]),
        )
        for delta, name in moved[: args.top]:
            if abs(delta) >= 0.05:
                print(f"  {delta:+9.2f}  {name}")
        return
    if args.case is None:
        parser.error("a case, or --diff")
    found = per_unit(args.case, args.n)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(found, f, indent=0, sort_keys=True)
    print(f"trioexec: {os.path.dirname(trioexec.__file__)}")
    total = sum(found.values())
    mine = sum(v for k, v in found.items() if _ours(k))
    print(f"{args.case}: {total:,.2f} bytecodes per unit ({mine:,.2f} outside Trio's core)")
    for name, value in sorted(found.items(), key=lambda item: -item[1])[: args.top]:
        print(f"  {value:9.2f}  {name}")


if __name__ == "__main__":
    main()
