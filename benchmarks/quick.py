"""Quick same-run comparisons (the full suite is the performance issue's work).

    python benchmarks/quick.py [N]

Prints one JSON line per measurement, then a table:
- 100k no-op tasks through `await ex.submit` (limit 4 and 64) vs. a raw nursery +
  CapacityLimiter (every task spawned up front) and a fixed pool of worker tasks
  on a memory channel; and the same through an executor with a SQLiteStore;
- per-step cost of a 4-step workflow chain vs. running the steps directly.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import trio

import trioexec
from trioexec import Workflow, task

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000


async def noop() -> None:
    pass


async def raw(limit: int) -> None:
    lim = trio.CapacityLimiter(limit)

    async def one() -> None:
        async with lim:
            await noop()

    async with trio.open_nursery() as n:
        for _ in range(N):
            n.start_soon(one)


async def pool(limit: int) -> None:
    send, recv = trio.open_memory_channel[object](1024)

    async def worker() -> None:
        async for fn in recv:
            await fn()  # type: ignore[operator]

    async with trio.open_nursery() as n:
        for _ in range(limit):
            n.start_soon(worker)
        async with send:
            for _ in range(N):
                await send.send(noop)


async def executor(limit: int) -> None:
    async with trioexec.open_executor(max_concurrent_tasks=limit) as ex:
        for _ in range(N):
            await ex.submit(noop)


async def executor_sqlite(limit: int) -> None:
    with (
        tempfile.TemporaryDirectory() as d,
        trioexec.SQLiteStore(os.path.join(d, "bench.db")) as store,
    ):
        async with trioexec.open_executor(max_concurrent_tasks=limit, store=store) as ex:
            for _ in range(N):
                await ex.submit(noop)


RUNS, STEPS = 500, 4
_specs = []
for _i in range(STEPS):

    @task(id=f"s{_i}", dependencies=[f"s{_i - 1}"] if _i else [])
    async def _step(ctx: trioexec.Context, _i: int = _i) -> None:
        ctx[f"k{_i}"] = _i

    _specs.append(_step)
CHAIN = Workflow("chain", _specs)


async def steps_direct(limit: int) -> None:
    async with trioexec.open_executor(max_concurrent_tasks=limit) as ex:

        async def chain() -> None:
            ctx = trioexec.Context()
            for spec in _specs:
                await ex.run(spec, ctx)

        async with trio.open_nursery() as n:
            for _ in range(RUNS):
                n.start_soon(chain)


async def steps_workflow(limit: int) -> None:
    async with (
        trioexec.open_executor(max_concurrent_tasks=limit) as ex,
        trio.open_nursery() as n,
    ):
        for _ in range(RUNS):
            n.start_soon(ex.run_workflow, CHAIN, {})


def measure(fn: object, limit: int, count: int) -> float:
    t0 = time.perf_counter()
    trio.run(fn, limit)  # type: ignore[arg-type]
    return count / (time.perf_counter() - t0)


def main() -> None:
    rows = []
    for limit in (4, 64):
        rates = {f.__name__: measure(f, limit, N) for f in (raw, pool, executor, executor_sqlite)}
        rows.append(("tasks/s", limit, rates))
    step_rates = {f.__name__: measure(f, 4, RUNS * STEPS) for f in (steps_direct, steps_workflow)}
    rows.append(("steps/s", 4, step_rates))
    for unit, limit, rates in rows:
        print(json.dumps({"unit": unit, "limit": limit, **{k: round(v) for k, v in rates.items()}}))
    print()
    for unit, limit, rates in rows:
        cells = "  ".join(f"{k} {v:9.0f}" for k, v in rates.items())
        print(f"{unit} limit={limit:<3d} {cells}")
    ex4 = rows[0][2]
    print(
        f"\nlimit 4: executor/raw {ex4['executor'] / ex4['raw']:.2f}x, "
        f"executor/pool {ex4['executor'] / ex4['pool']:.2f}x, "
        f"sqlite/memory {ex4['executor_sqlite'] / ex4['executor']:.2f}x; "
        f"workflow step overhead "
        f"{1e6 / step_rates['steps_workflow'] - 1e6 / step_rates['steps_direct']:.0f} us/step"
    )


if __name__ == "__main__":
    main()
