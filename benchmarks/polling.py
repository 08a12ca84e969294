"""Scenario 5: CPU of many deferred tasks polling sync predicates.

    python benchmarks/polling.py [N] [SECONDS]

N tasks (default 10,000) wait on a sync predicate checked every second, for SECONDS
(default 5) of real time. Compared, in the same run, against N plain Trio tasks
looping on ``trio.sleep(1)`` + the predicate. Prints CPU seconds per wall second for
each, as one JSON line per case and a ratio.
"""

from __future__ import annotations

import json
import sys
import time

import trio

import trioexec

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0


def measure(main: object) -> float:
    """CPU seconds used per wall second while the waiters wait (setup excluded)."""
    box: dict[str, float] = {}

    async def run() -> None:
        stop = trio.Event()

        def ready() -> bool:
            return stop.is_set()

        await main(ready, stop, box)  # type: ignore[operator]

    trio.run(run)
    return box["cpu"] / box["wall"]


async def loops(ready: object, stop: trio.Event, box: dict[str, float]) -> None:
    async def waiter() -> None:
        while not ready():  # type: ignore[operator]  # noqa: ASYNC110 - the baseline
            await trio.sleep(1)

    async with trio.open_nursery() as n:
        for _ in range(N):
            n.start_soon(waiter)
        await trio.sleep(1.5)  # everyone started and polling
        c0, w0 = time.process_time(), time.perf_counter()
        await trio.sleep(SECONDS)
        box["cpu"], box["wall"] = time.process_time() - c0, time.perf_counter() - w0
        stop.set()


async def deferred(ready: object, stop: trio.Event, box: dict[str, float]) -> None:
    async def waiter(handle: trioexec.TaskHandle) -> None:
        await handle.defer_until(ready, poll_interval=1)

    async with trioexec.open_executor(max_concurrent_tasks=4, queue_capacity=N) as ex:
        for _ in range(N):
            await ex.submit(waiter)
        await trio.sleep(1.5)
        c0, w0 = time.process_time(), time.perf_counter()
        await trio.sleep(SECONDS)
        box["cpu"], box["wall"] = time.process_time() - c0, time.perf_counter() - w0
        stop.set()


if __name__ == "__main__":
    base = measure(loops)
    ours = measure(deferred)
    for name, value in (("sleep_loops", base), ("defer_until", ours)):
        print(json.dumps({"scenario": "polling", "case": name, "n": N, "cpu_per_wall_s": value}))
    print(
        f"\n{N} waiters polling every 1 s: trio.sleep loops {base:.3f} CPU-s/s, "
        f"defer_until {ours:.3f} CPU-s/s -> ratio {ours / base:.2f} (target <= 0.25)"
    )
