"""Subprocess side of ``test_durable_workers.py`` (not a test module: never collected).

Usage::

    python durable_worker.py DB LOG LEASE HOLD PROGRESS_EVERY HANG_AFTER

Opens ``DurableStore(DB)`` and runs ``open_worker(ds, "work", work, lease=LEASE,
max_concurrent_tasks=4)``. It prints ``READY <worker pid> <os pid>`` once the
worker is claiming, ``PROGRESS <n>`` each time its count of successful fulfils
reaches a multiple of PROGRESS_EVERY, and, once its stdin reaches end of file,
leaves the worker block cleanly (releasing whatever it holds) and prints ``DONE
<claimed> <fulfilled> <suspended>`` (the `Worker`'s counters).

With HANG_AFTER > 0, every handler that starts once this process has fulfilled
HANG_AFTER tasks prints ``HUNG <task id> <version>`` and then never returns (its
slot and its lease stay held, the heartbeat goes on): the process is waiting
for its SIGKILL, its slots full of started tasks and its queue of claimed ones.

The handler ``work`` takes ``{"n": n}``, holds its slot HOLD seconds and returns
`expected` of it plus the run's ``pid`` and ``version`` (so the resolved value
tells which run won). Each event is one ``O_APPEND`` write to LOG, shared by all
the processes (times are ``time.monotonic()``, one clock for every process)::

    start <task id> <version> <pid> <start>
    end <task id> <version> <pid> <start> <end>
    fulfilled <task id> <version> <pid> <at>

``fulfilled`` is written after ``ds.tasks.fulfill`` returned (the promise is
resolved by this call): the instance's method is wrapped here to observe it, the
worker itself is untouched. A process killed between the commit and that write
leaves its last fulfil unlogged.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import trio
from worklog import append_line

from trioexec.durable import DurableHandle, DurableStore, open_worker

TARGET = "work"
MAX_CONCURRENT = 4


def expected(n: int) -> dict[str, int]:
    """The part of a task's value derived from its param ``{"n": n}``."""
    return {"n": n, "square": n * n}


log_line = append_line


async def stdin_closed() -> None:
    stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    async with stream:
        while await stream.receive_some():
            pass


async def main(
    db: str, log: str, lease: float, hold: float, progress_every: int, hang_after: int
) -> None:
    pid = os.getpid()
    fulfilled = 0

    async def work(param: dict[str, int], handle: DurableHandle) -> dict[str, int]:
        start = time.monotonic()
        log_line(log, "start", handle.task_id, handle.version, pid, f"{start:.6f}")
        if hang_after and fulfilled >= hang_after:
            print(f"HUNG {handle.task_id} {handle.version}", flush=True)
            await trio.sleep_forever()
        await trio.sleep(hold)
        end = time.monotonic()
        log_line(log, "end", handle.task_id, handle.version, pid, f"{start:.6f}", f"{end:.6f}")
        return {**expected(param["n"]), "pid": pid, "version": handle.version}

    with DurableStore(db) as ds:
        fulfill = ds.tasks.fulfill

        async def logged_fulfill(id: str, version: int, **kwargs: Any) -> Any:
            nonlocal fulfilled
            record = await fulfill(id, version, **kwargs)
            log_line(log, "fulfilled", id, version, pid, f"{time.monotonic():.6f}")
            fulfilled += 1
            if fulfilled % progress_every == 0:
                print(f"PROGRESS {fulfilled}", flush=True)
            return record

        ds.tasks.fulfill = logged_fulfill  # type: ignore[method-assign]
        async with open_worker(
            ds, TARGET, work, lease=lease, max_concurrent_tasks=MAX_CONCURRENT
        ) as worker:
            print(f"READY {worker.pid} {pid}", flush=True)
            await stdin_closed()
        print(f"DONE {worker.claimed} {worker.fulfilled} {worker.suspended}", flush=True)


if __name__ == "__main__":
    db, log, lease, hold, every, hang_after = sys.argv[1:]
    trio.run(main, db, log, float(lease), float(hold), int(every), int(hang_after))
