"""The path of one plain stored task through trioexec, from ``submit()`` to its
row in SQLite (issue 31): the modules and functions of the package it passes,
in the order it first meets them.

    python benchmarks/task_path.py [--calls]

One executor with a `SQLiteStore` (``inline=True``: the write runs in the Trio
thread, so one tracer sees it) runs a warm-up task, then one no-op task is
traced from ``ex.submit`` until ``ref.wait()`` returns (its completion durable).
Deterministic: Trio's scheduler is seeded and its clock is a `MockClock` that
jumps ahead when everything waits (the journal's writer gathers by the clock).
Counts only trioexec's own Python functions (Trio's and sqlite3's are not
counted). ``PYTHONPATH`` selects the checkout traced.
"""

from __future__ import annotations

import os
import sys
import tempfile
from types import FrameType
from typing import Any

import trio
import trio.testing

import trioexec


async def noop() -> None:
    pass


def trace() -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            path = code.co_filename.replace("\\", "/")
            if "/trioexec/" in path and "<" not in code.co_qualname:
                calls.append((path.split("/trioexec/", 1)[1], code.co_qualname))

    async def main(path: str) -> None:
        store = trioexec.SQLiteStore(path, inline=True)
        async with trioexec.open_executor(max_concurrent_tasks=4, store=store) as ex:
            await ex.submit(noop)  # (warm: the first task opens what every task then finds)
            await ex.flush()
            sys.settrace(tracer)  # type: ignore[arg-type]
            try:
                ref = await ex.submit(noop)
                await ref.wait()
            finally:
                sys.settrace(None)

    rng = getattr(getattr(trio._core, "_run", None), "_r", None)
    if rng is not None:
        rng.seed(0)  # (Trio reverses each batch of runnable tasks at random)
    with tempfile.TemporaryDirectory() as tmp:
        clock = trio.testing.MockClock(autojump_threshold=0)
        trio.run(main, os.path.join(tmp, "path.db"), clock=clock)
    return calls


def main() -> None:
    calls = trace()
    modules = list(dict.fromkeys(module for module, _ in calls))
    functions = list(dict.fromkeys(calls))
    print(f"trioexec: {os.path.dirname(trioexec.__file__)}")
    print(f"{len(modules)} modules, {len(functions)} functions, {len(calls)} calls")
    for module in modules:
        print(f"  {module}: {sum(1 for m, _ in functions if m == module)} functions")
    if "--calls" in sys.argv[1:]:
        for module, name in calls:
            print(f"    {module} {name}")


if __name__ == "__main__":
    main()
