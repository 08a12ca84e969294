"""Where the memory of a parked task goes, by allocation site (tracemalloc).

    python benchmarks/memory_breakdown.py [N]

Parks N (default 10,000) tasks three times, in fresh Trio runs: bare nursery tasks
on ``Event.wait()``, executor tasks in ``handle.defer_until(event)``, and the same
on issue 32's floor (suite.py's ``FloorPool``: only the work the API asks, written
by hand). Prints the bytes per task each way and the largest allocation sites per
task: the profile behind scenario 4 of ``benchmarks/suite.py``.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc

import trio
import trio.testing

import trioexec

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000


async def bare(ev: trio.Event) -> float:
    async def one() -> None:
        await ev.wait()

    async with trio.open_nursery() as nursery:
        gc.collect()  # (what an earlier run left is not this one's)
        before = tracemalloc.take_snapshot()
        for _ in range(N):
            nursery.start_soon(one)
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        after = tracemalloc.take_snapshot()
        ev.set()
    return _report("bare Event.wait()", before, after)


async def deferred(ev: trio.Event) -> float:
    async def one(handle: trioexec.TaskHandle) -> None:
        await handle.defer_until(ev)

    async with trioexec.open_executor(max_concurrent_tasks=4, queue_capacity=N) as ex:
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()  # (what an earlier run left is not this one's)
        before = tracemalloc.take_snapshot()
        for _ in range(N):
            await ex.submit(one)
        while ex.statistics().deferred_count < N:
            await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        after = tracemalloc.take_snapshot()
        ev.set()
    return _report("trioexec defer_until(event)", before, after)


async def floor(ev: trio.Event) -> float:
    """`deferred`'s workload on issue 32's floor (suite.py's `FloorPool`)."""
    import suite  # (beside this file)

    async def one(handle: suite.FloorHandle) -> None:
        await handle.defer_until(ev)

    async with trio.open_nursery() as nursery:
        pool = suite.FloorPool(nursery, 4, queue_capacity=N)
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()  # (what an earlier run left is not this one's)
        before = tracemalloc.take_snapshot()
        for _ in range(N):
            await pool.submit(one)
        while pool.counts.deferred < N:
            await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        after = tracemalloc.take_snapshot()
        ev.set()
        while pool.counts.completed < N:
            await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return _report("issue 32's floor (FloorPool) defer_until(event)", before, after)


def _report(title: str, before: tracemalloc.Snapshot, after: tracemalloc.Snapshot) -> float:
    stats = after.compare_to(before, "lineno")
    total = sum(s.size_diff for s in stats)
    print(f"\n{title}: {total / N:,.0f} bytes per task")
    for s in stats[:14]:
        frame = s.traceback[0]
        where = f"{frame.filename.split('site-packages/')[-1]}:{frame.lineno}"
        print(f"  {s.size_diff / N:7.0f} B  {s.count_diff / N:5.2f} objects  {where}")
    return total / N


def main() -> None:
    tracemalloc.start(1)
    per_bare = trio.run(bare, trio.Event())
    per_ours = trio.run(deferred, trio.Event())
    per_floor = trio.run(floor, trio.Event())
    print(f"\ntrioexec / bare: {per_ours / per_bare:.2f}x (issue 32: <= 1.5x)")
    print(f"trioexec / floor: {per_ours / per_floor:.2f}x (the floor + 10%: <= 1.1x)")


if __name__ == "__main__":
    main()
