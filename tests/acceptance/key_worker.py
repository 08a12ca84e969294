"""Subprocess side of ``test_shared_keys.py`` (not a test module: never collected).

Usage::

    python key_worker.py run DB LOG KEY N CONCURRENCY RATE LEASE SECONDS
    python key_worker.py hold DB KEY CONCURRENCY LEASE

Both open an executor on ``open_store(DB)`` with ``key_limits={KEY:
KeyLimit(...)}`` (a CONCURRENCY or RATE of 0: none) and print ``READY <owner>
<pid>``.

``run`` then waits for a line on stdin (so that two workers start together),
submits N tasks of KEY, each appending ``start`` and ``end`` lines (``<event>
<task> <pid> <time.monotonic()>``) to LOG around a sleep of SECONDS, waits for
them all, leaves the executor cleanly and prints ``DONE <completed>``.

``hold`` submits one task of KEY that prints ``HOLDING <time.monotonic()>`` once
it runs and then never ends; the worker waits for its SIGKILL.
"""

from __future__ import annotations

import os
import sys
import time

import trio
from worklog import append_line

import trioexec
from trioexec import KeyLimit


def _limit(concurrency: str, rate: str) -> KeyLimit:
    return KeyLimit(concurrency=int(concurrency) or None, rate=float(rate) or None)


async def run(
    db: str, log: str, key: str, n: str, conc: str, rate: str, lease: str, s: str
) -> None:
    async def work(i: int) -> None:
        task = f"{os.getpid()}-{i}"
        append_line(log, "start", task, os.getpid(), f"{time.monotonic():.6f}")
        await trio.sleep(float(s))
        append_line(log, "end", task, os.getpid(), f"{time.monotonic():.6f}")

    with trioexec.open_store(db) as store:
        async with trioexec.open_executor(
            store=store, key_limits={key: _limit(conc, rate)}, lease=float(lease)
        ) as ex:
            print("READY", ex.owner, os.getpid(), flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)
            refs = [await ex.submit(work, i, key=key) for i in range(int(n))]
            for ref in refs:
                await ref.wait()
        print("DONE", ex.statistics().completed_count, flush=True)


async def hold(db: str, key: str, conc: str, lease: str) -> None:
    async def forever() -> None:
        print("HOLDING", f"{time.monotonic():.6f}", flush=True)
        await trio.sleep_forever()

    with trioexec.open_store(db) as store:
        async with trioexec.open_executor(
            store=store, key_limits={key: _limit(conc, "0")}, lease=float(lease)
        ) as ex:
            print("READY", ex.owner, os.getpid(), flush=True)
            await ex.submit(forever, key=key)
            await trio.sleep_forever()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    trio.run({"run": run, "hold": hold}[command], *args)
