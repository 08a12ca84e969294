"""Durable-worker side of ``test_random_kill.py`` (not a test module: never collected).

Usage::

    python kill_durable.py DB LOG LEASE

Opens ``DurableStore(DB)`` and runs ``open_worker(ds, TARGET, work, lease=LEASE,
max_concurrent_tasks=4)``. Prints ``READY <worker pid> <os pid>`` once claiming;
once its stdin reaches end of file it leaves the worker block cleanly and prints
``DONE <claimed> <fulfilled> <suspended>``. The random-kill rounds SIGKILL it
instead; only the final worker is stopped through its stdin.

The handler takes ``{"n": n, "kind": kind, "hold": seconds, ...}``: it holds its
slot ``hold`` seconds, then by kind: ``plain`` returns; ``defer`` defers
in-process (``handle.defer_until``) until the wall clock reaches ``until``;
``gate`` awaits the durable promise ``gate`` (suspending the task while it is
pending: the task is re-delivered, from the top, once it is resolved); ``fail``
raises, which rejects the task's promise. Its value is `expected` of the param
plus the run's ``pid`` and ``version`` and the gate's value, so the resolved
promise tells which run won.

Each event is one ``O_APPEND`` write to LOG: ``<event> <task id> <version> <pid>
<time.monotonic()>`` with event ``start``, ``await`` (just before
``await_promise``), then ``done`` (returning), ``fail`` (the planned raise) or
``unwound`` (suspended, cancelled, or any other exception); a SIGKILL leaves a
``start`` without its end.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import trio
from worklog import append_line

from trioexec.durable import DurableHandle, DurableStore, open_worker

TARGET = "kill"
MAX_CONCURRENT = 4
POLL = 0.05


def expected(n: int) -> dict[str, int]:
    """The part of a task's value derived from its param's ``n``."""
    return {"n": n, "square": n * n}


def log_line(log: str, event: str, task_id: str, version: int) -> None:
    append_line(log, event, task_id, version, os.getpid(), f"{time.monotonic():.6f}")


class _PlannedFailure(RuntimeError):
    pass


async def stdin_closed() -> None:
    stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    async with stream:
        while await stream.receive_some():
            pass


async def main(db: str, log: str, lease: float) -> None:
    pid = os.getpid()

    async def work(param: dict[str, Any], handle: DurableHandle) -> dict[str, Any]:
        tid, version = handle.task_id, handle.version
        log_line(log, "start", tid, version)
        gate = None
        try:
            await trio.sleep(param["hold"])
            kind = param["kind"]
            if kind == "defer":
                until = float(param["until"])
                await handle.defer_until(lambda: time.time() >= until, poll_interval=POLL)
            elif kind == "gate":
                log_line(log, "await", tid, version)
                gate = await handle.await_promise(param["gate"])
            elif kind == "fail":
                log_line(log, "fail", tid, version)
                raise _PlannedFailure(f"planned rejection of {tid}")
            elif kind != "plain":
                raise ValueError(f"unknown kind {kind!r}")
        except _PlannedFailure:
            raise
        except BaseException:
            log_line(log, "unwound", tid, version)
            raise
        log_line(log, "done", tid, version)
        return {**expected(param["n"]), "gate": gate, "pid": pid, "version": version}

    with DurableStore(db) as ds:
        async with open_worker(
            ds, TARGET, work, lease=lease, max_concurrent_tasks=MAX_CONCURRENT, poll_interval=POLL
        ) as worker:
            print(f"READY {worker.pid} {pid}", flush=True)
            await stdin_closed()
        print(f"DONE {worker.claimed} {worker.fulfilled} {worker.suspended}", flush=True)


if __name__ == "__main__":
    db, log, lease = sys.argv[1:]
    trio.run(main, db, log, float(lease))
