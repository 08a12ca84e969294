"""Bytes per parked task, and where they are allocated (tracemalloc).

    python benchmarks/parked_memory.py [--n N] [--top K]

``defer``: N executor tasks each parked in ``handle.defer_until(event)`` (limit 4);
``bare``: N nursery tasks parked in ``event.wait()``; ``floor``: ``defer``'s workload
on issue 32's floor (suite.py's ``FloorPool``: only the work the API asks). Counted
from a snapshot taken after 50 such tasks to one after N more, with the garbage
collected at both, so start-up and the executor's own objects are left out. Exact
and repeatable (allocations, not RSS): the ratio is issue 32's "memory per parked task" row;
suite.py's ``park_defer``/``park_bare`` give the same workloads' RSS.
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio.testing

import trioexec

Snapshots = tuple[tracemalloc.Snapshot, tracemalloc.Snapshot]


async def _measured(park: Callable[[int], Awaitable[None]], n: int) -> Snapshots:
    await park(50)
    await trio.testing.wait_all_tasks_blocked()
    gc.collect()
    tracemalloc.start(1)
    before = tracemalloc.take_snapshot()
    await park(n)
    await trio.testing.wait_all_tasks_blocked()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    return before, after


async def defer(n: int) -> Snapshots:
    event = trio.Event()

    async def one(handle: trioexec.TaskHandle) -> None:
        await handle.defer_until(event)

    async with trioexec.open_executor(max_concurrent_tasks=4, queue_capacity=n + 100) as ex:

        async def park(k: int) -> None:
            for _ in range(k):
                await ex.submit(one)

        found = await _measured(park, n)
        event.set()
    return found


async def floor(n: int) -> Snapshots:
    """`defer`'s workload on issue 32's floor (suite.py's `FloorPool`)."""
    import suite  # (beside this file)

    event = trio.Event()

    async def one(handle: Any) -> None:
        await handle.defer_until(event)

    async with trio.open_nursery() as nursery:
        pool = suite.FloorPool(nursery, 4, queue_capacity=n + 100)

        async def park(k: int) -> None:
            for _ in range(k):
                await pool.submit(one)

        found = await _measured(park, n)
        event.set()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return found


async def bare(n: int) -> Snapshots:
    event = trio.Event()

    async def one() -> None:  # (the shape of defer's task, as suite.py's park_bare)
        await event.wait()

    async with trio.open_nursery() as nursery:

        async def park(k: int) -> None:
            for _ in range(k):
                nursery.start_soon(one)

        found = await _measured(park, n)
        event.set()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    per_task: dict[str, float] = {}
    for name, case in (("bare", bare), ("floor", floor), ("defer", defer)):
        before, after = trio.run(case, args.n, clock=trio.testing.MockClock())
        stats: list[Any] = after.compare_to(before, "lineno")
        per_task[name] = sum(s.size_diff for s in stats) / args.n
        print(f"{name}: {per_task[name]:,.0f} bytes per parked task")
        for s in stats[: args.top]:
            where = s.traceback[0]
            path = "/".join(where.filename.split("/")[-2:])
            print(f"  {s.size_diff / args.n:7.1f} B  {path}:{where.lineno}")
    print(f"defer / bare: {per_task['defer'] / per_task['bare']:.2f}x (issue 32: <= 1.5x)")
    print(f"defer / floor: {per_task['defer'] / per_task['floor']:.2f}x (the floor + 10%: <= 1.1x)")


if __name__ == "__main__":
    main()
