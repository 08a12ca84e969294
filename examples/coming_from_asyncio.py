"""Coming from asyncio: the same small job written both ways.

Four jobs, at most two at a time; job 0 first waits for a webhook (an event set
0.2 s in), and one extra call is cut off by a timeout. With asyncio, a
``Semaphore`` bounds the jobs and job 0 holds its permit while it waits for the
event, so only one permit is left for the others. With trioexec, job 0 waits
with ``handle.defer_until(event)``, which gives its slot back, so jobs 1-3 use
both slots meanwhile. Both versions run and return the same results.

Run it with ``python examples/coming_from_asyncio.py`` (about 0.5 s).
"""

from __future__ import annotations

import asyncio

import trio
import trio.testing

import trioexec
from trioexec import SubStatus, TaskHandle, TaskStatus

# ------------------------------------------------------------------ asyncio


async def asyncio_version() -> tuple[list[int], bool]:
    permits = asyncio.Semaphore(2)
    webhook = asyncio.Event()

    async def job(n: int) -> int:
        async with permits:
            if n == 0:
                await webhook.wait()  # holds its permit while it waits
            await asyncio.sleep(0.05)
            return n * 10

    async with asyncio.TaskGroup() as tg:
        jobs = [tg.create_task(job(n)) for n in range(4)]
        asyncio.get_running_loop().call_later(0.2, webhook.set)
    try:
        await asyncio.wait_for(asyncio.sleep(10), timeout=0.05)
        timed_out = False
    except TimeoutError:
        timed_out = True
    return [j.result() for j in jobs], timed_out


# ------------------------------------------------------------------ trioexec


async def job(n: int, webhook: trio.Event, handle: TaskHandle) -> int:
    if n == 0:
        await handle.defer_until(webhook)  # gives its slot back while it waits
    await trio.sleep(0.05)
    return n * 10


async def trioexec_version() -> tuple[list[int], bool]:
    webhook = trio.Event()
    async with trioexec.open_executor(max_concurrent_tasks=2) as ex:
        jobs = [await ex.submit(job, n, webhook) for n in range(4)]
        slow = await ex.submit(trio.sleep, 10, timeout=0.05)  # wait_for's timeout
        await trio.testing.wait_all_tasks_blocked()
        assert jobs[0].sub_status is SubStatus.DEFERRED  # waiting, holding no slot,
        assert ex.slots.in_use == 2  # so jobs 1 and 2 run side by side meanwhile
        await trio.sleep(0.2)
        webhook.set()
        results = [(await ref.wait()).unwrap() for ref in jobs]
        timed_out = (await slow.wait()).status is TaskStatus.TIMED_OUT
    return results, timed_out


def main() -> None:
    got = trio.run(trioexec_version)
    print(f"trioexec: {got}")
    expected = asyncio.run(asyncio_version())
    print(f"asyncio:  {expected}")
    assert got == expected == ([0, 10, 20, 30], True)


if __name__ == "__main__":
    main()
