"""Subprocess side of ``test_crash_recovery.py`` (not a test module: never collected).

Usage::

    python crash_worker.py crash DB MARKER LOG N_DEFER N_FIRST N_HOLD N_REST LEASE
    python crash_worker.py recover DB LEASE DEADLINE

``crash`` submits, in this order, N_DEFER ``defer`` tasks (they defer until MARKER
exists), N_FIRST ``quick`` tasks, N_HOLD ``hold`` tasks (they keep their slot,
polling for MARKER) and N_REST ``quick`` tasks; with ``N_HOLD ==
max_concurrent_tasks`` the last ones can never start here. It prints
``READY <total> <owner> <pid>`` once every submission is durable, then
``HALFWAY <completed>`` once the first quick tasks' completions are durable, the
hold tasks are running and the defer tasks deferred (all of it flushed), and then
waits for its SIGKILL.

``recover`` opens an executor with ``recover=True`` on DB, prints
``OPEN <owner> <pid>``, keeps running until the store has no live execution left
(every owner's), then leaves the executor cleanly and prints ``DONE <owner>
<completed>``.

Each run of `WORK` appends ``start``/``end`` lines (``<event> <task id> <pid>
<time.monotonic()>``) to its log file with single ``O_APPEND`` writes, so several
processes can share one log.
"""

from __future__ import annotations

import os
import sys
import time

import trio
from worklog import any_live, append_line

import trioexec
from trioexec import SubStatus, TaskHandle, TaskStatus, open_executor, open_store

MAX_CONCURRENT = 4


def log_line(log: str, event: str, task_id: str) -> None:
    append_line(log, event, task_id, os.getpid(), f"{time.monotonic():.6f}")


@trioexec.task(id="crash_worker.work")
async def WORK(kind: str, marker: str, log: str, handle: TaskHandle) -> str:
    """``quick``: sleep 10 ms; ``defer``: defer until ``marker`` exists; ``hold``:
    keep the slot until ``marker`` exists."""
    log_line(log, "start", handle.task_id)
    if kind == "quick":
        await trio.sleep(0.01)
    elif kind == "defer":
        await handle.defer_until(lambda: os.path.exists(marker), poll_interval=0.02)
    elif kind == "hold":
        while not await trio.Path(marker).exists():
            await trio.sleep(0.02)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    log_line(log, "end", handle.task_id)
    return kind


def task_ids(n_defer: int, n_first: int, n_hold: int, n_rest: int) -> dict[str, list[str]]:
    """The execution ids ``crash`` uses, by group, in submission order."""
    return {
        "defer": [f"defer-{i:03d}" for i in range(n_defer)],
        "first": [f"first-{i:03d}" for i in range(n_first)],
        "hold": [f"hold-{i:03d}" for i in range(n_hold)],
        "rest": [f"rest-{i:03d}" for i in range(n_rest)],
    }


async def crash(
    db: str,
    marker: str,
    log: str,
    n_defer: int,
    n_first: int,
    n_hold: int,
    n_rest: int,
    lease: float,
) -> None:
    ids = task_ids(n_defer, n_first, n_hold, n_rest)
    kinds = {"defer": "defer", "first": "quick", "hold": "hold", "rest": "quick"}
    store = open_store(db)
    async with open_executor(
        store=store, tasks=[WORK], lease=lease, max_concurrent_tasks=MAX_CONCURRENT
    ) as ex:
        refs: dict[str, list[trioexec.TaskRef]] = {}
        for group, group_ids in ids.items():
            refs[group] = [
                await ex.submit(WORK, kinds[group], marker, log, task_id=tid) for tid in group_ids
            ]
        await ex.flush()
        total = sum(len(v) for v in ids.values())
        print(f"READY {total} {ex.owner} {os.getpid()}", flush=True)

        for ref in refs["first"]:
            completion = await ref.wait()  # returns once the completion is durable
            if not completion.ok:
                raise RuntimeError(f"{ref.task_id} did not complete: {completion!r}")
        with trio.fail_after(10):
            while any(r.status is not TaskStatus.RUNNING for r in refs["hold"]) or any(
                r.sub_status is not SubStatus.DEFERRED for r in refs["defer"]
            ):
                await trio.sleep(0.005)
        await ex.flush()
        print(f"HALFWAY {ex.statistics().completed_count}", flush=True)
        await trio.sleep_forever()  # until SIGKILL


async def recover(db: str, lease: float, deadline: float) -> None:
    store = open_store(db)
    try:
        async with open_executor(
            store=store,
            recover=True,
            tasks=[WORK],
            lease=lease,
            max_concurrent_tasks=MAX_CONCURRENT,
        ) as ex:
            print(f"OPEN {ex.owner} {os.getpid()}", flush=True)
            with trio.fail_after(deadline):
                while any_live(store):
                    await trio.sleep(0.02)
            await ex.wait_for_idle()
        print(f"DONE {ex.owner} {ex.statistics().completed_count}", flush=True)
    finally:
        store.close()


def main(argv: list[str]) -> None:
    mode, *rest = argv
    if mode == "crash":
        db, marker, log, *counts, lease = rest
        n_defer, n_first, n_hold, n_rest = map(int, counts)
        trio.run(crash, db, marker, log, n_defer, n_first, n_hold, n_rest, float(lease))
    elif mode == "recover":
        db, lease, deadline = rest
        trio.run(recover, db, float(lease), float(deadline))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
