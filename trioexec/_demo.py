"""The demo's workload (``trioexec demo``): tasks that wait on the outside world, run
on a few slots, with and without giving their slot back while they wait."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import trio
import trio.testing

import trioexec
from trioexec import Store, TaskHandle

KINDS = ("webhook", "file", "approval", "api")


def demo_workload(n_tasks: int, slots: int, seed: int = 7) -> tuple[list[float], list[float]]:
    """(waits, works): twice as many waiters as slots wait on the outside world for
    3-8 s, then do a little work; the rest only work."""
    rng = random.Random(seed)
    n_waiters = min(n_tasks, 2 * slots)
    waits = [round(rng.uniform(3.0, 8.0), 2) for _ in range(n_waiters)]
    works = [round(rng.uniform(0.3, 0.7), 2) for _ in range(n_tasks)]
    return waits, works


async def run_workload(
    slots: int,
    waits: list[float],
    works: list[float],
    *,
    defer: bool,
    store: Store | None = None,
    on_start: Callable[[trioexec.Executor, dict[str, Any]], None] | None = None,
) -> float:
    """Run the demo workload; return its makespan (seconds on Trio's clock)."""
    t0 = trio.current_time()
    events = [trio.Event() for _ in waits]
    state: dict[str, Any] = {"t0": t0, "deferred": {}, "done": 0, "kinds": {}}

    async def outside_world() -> None:
        for i, at in sorted(enumerate(waits), key=lambda e: e[1]):
            await trio.sleep_until(t0 + at)
            events[i].set()

    async def waiter(i: int, handle: TaskHandle) -> None:
        local_state = {"request": i}  # what the task keeps across the wait
        state["kinds"][handle.task_id] = KINDS[i % 4]
        if defer:
            state["deferred"][handle.task_id] = trio.current_time()
            try:
                await handle.defer_until(events[i])
            finally:
                state["deferred"].pop(handle.task_id, None)
        else:
            await events[i].wait()  # holding the slot all along
        await trio.sleep(works[i])
        assert local_state == {"request": i}
        state["done"] += 1

    async def compute(seconds: float) -> None:
        await trio.sleep(seconds)
        state["done"] += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(outside_world)
        async with trioexec.open_executor(max_concurrent_tasks=slots, store=store) as ex:
            if on_start is not None:
                on_start(ex, state)
            for i in range(len(waits)):
                await ex.submit(waiter, i, name=f"{KINDS[i % 4]}-{i}")
            for seconds in works[len(waits) :]:
                await ex.submit(compute, seconds, name="compute")
    return trio.current_time() - t0


def simulate(slots: int, waits: list[float], works: list[float], defer: bool) -> float:
    """The same workload under Trio's mock clock: an exact makespan, instantly."""
    result: list[float] = []

    async def go() -> None:
        result.append(await run_workload(slots, waits, works, defer=defer))

    trio.run(go, clock=trio.testing.MockClock(autojump_threshold=0))
    return result[0]
