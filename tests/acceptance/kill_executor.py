"""Executor side of ``test_random_kill.py`` (not a test module: never collected).

Usage::

    python kill_executor.py run DB LOG GATES PLAN LEASE ROUND CHILD
    python kill_executor.py final DB LOG GATES PLAN LEASE DEADLINE

Both open an executor on ``SQLiteStore(DB)`` with ``recover=True``, ``tasks=[WORK]``,
a short LEASE and recovery attempts without practical limit, and print ``OPEN
<owner> <pid>`` once inside the block (recovery's first pass has run by then).

PLAN is a JSON object ``{"<round>.<child>": [[task id, kind, param], ...]}``.
``run`` submits its own batch (key ``ROUND.CHILD``); child 0 of a round first
submits every execution of an earlier round that never reached the store (its
submitter was killed before the submission was durable). It prints ``ACK <n>``
once all of it is durable (``ex.flush()``), then runs until its SIGKILL.

``final`` submits every planned execution still missing, prints ``ACK``, waits
(bounded by DEADLINE seconds) until the store holds no pending or running
execution of any owner, leaves the block cleanly and prints ``DONE <owner>
<completed>``.

Each run of `WORK` appends ``<event> <task id> <pid> <time.monotonic()>`` lines
to LOG with single ``O_APPEND`` writes: ``start``, then ``done`` (returning),
``fail`` (a planned failure, retried) or ``unwound`` (cancelled, or any other
exception); a SIGKILL leaves a ``start`` without its end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import trio
from worklog import any_live, append_line

import trioexec
from trioexec import Backoff, SQLiteStore, TaskHandle, open_executor

MAX_CONCURRENT = 4
# Kills use up attempts (a recovered execution goes on counting them) and recovery
# attempts: neither limit may end an execution here, only its success.
RETRIES = 1_000_000
MAX_RECOVERY_ATTEMPTS = 1_000_000
POLL = 0.05


def log_line(log: str, event: str, task_id: str) -> None:
    append_line(log, event, task_id, os.getpid(), f"{time.monotonic():.6f}")


def _bump(path: str) -> int:
    """Append one byte to ``path``; return its size before."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        before = os.fstat(fd).st_size
        os.write(fd, b"x")
    finally:
        os.close(fd)
    return before


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


@trioexec.task(
    id="kill.work",
    retries=RETRIES,
    backoff=Backoff(initial=0.02, factor=1.0, max=0.02, jitter=0.0),
)
async def WORK(kind: str, param: Any, log: str, gates: str, handle: TaskHandle) -> list[object]:
    """``quick``: hold the slot ``param`` seconds; ``until``: defer until the wall
    clock reaches ``param``; ``gate``: defer until the file ``gates/param`` exists;
    ``flaky``: fail (and be retried) until ``param`` planned failures of this
    execution have been counted, over every process that ran it."""
    tid = handle.task_id
    log_line(log, "start", tid)
    try:
        if kind == "quick":
            await trio.sleep(float(param))
        elif kind == "until":
            deadline = float(param)
            await handle.defer_until(lambda: time.time() >= deadline, poll_interval=POLL)
        elif kind == "gate":
            path = os.path.join(gates, str(param))
            await handle.defer_until(lambda: os.path.exists(path), poll_interval=POLL)
        elif kind == "flaky":
            failures = int(param)
            counter = os.path.join(gates, f"fails-{tid}")
            if _size(counter) < failures:
                n = _bump(counter) + 1
                log_line(log, "fail", tid)
                raise _PlannedFailure(f"{tid}: planned failure {n} of {failures}")
            await trio.sleep(0.005)
        else:
            raise ValueError(f"unknown kind {kind!r}")
    except _PlannedFailure:
        raise
    except BaseException:
        log_line(log, "unwound", tid)
        raise
    log_line(log, "done", tid)
    return [kind, param]


class _PlannedFailure(RuntimeError):
    pass


def _batches(plan_path: str) -> dict[str, list[list[object]]]:
    with open(plan_path) as f:
        plan: dict[str, list[list[object]]] = json.load(f)
    return plan


async def _submit(
    ex: trioexec.Executor,
    store: SQLiteStore,
    batch: list[list[object]],
    log: str,
    gates: str,
) -> int:
    """Submit the executions of ``batch`` that the store does not have yet."""
    n = 0
    for tid, kind, param in batch:
        assert isinstance(tid, str)
        if store.execution(tid) is not None:
            continue
        await ex.submit(WORK, kind, param, log, gates, task_id=tid)
        n += 1
    return n


def _round_of(key: str) -> int:
    return int(key.split(".")[0])


async def run(
    db: str, log: str, gates: str, plan_path: str, lease: float, round_: int, child: int
) -> None:
    plan = _batches(plan_path)
    store = SQLiteStore(db)
    async with open_executor(
        store=store,
        recover=True,
        tasks=[WORK],
        lease=lease,
        max_concurrent_tasks=MAX_CONCURRENT,
        max_recovery_attempts=MAX_RECOVERY_ATTEMPTS,
    ) as ex:
        print(f"OPEN {ex.owner} {os.getpid()}", flush=True)
        n = 0
        if child == 0:
            for key, batch in plan.items():
                if _round_of(key) < round_:
                    n += await _submit(ex, store, batch, log, gates)
        n += await _submit(ex, store, plan[f"{round_}.{child}"], log, gates)
        await ex.flush()
        print(f"ACK {n}", flush=True)
        await trio.sleep_forever()  # until SIGKILL


async def final(
    db: str, log: str, gates: str, plan_path: str, lease: float, deadline: float
) -> None:
    plan = _batches(plan_path)
    store = SQLiteStore(db)
    try:
        async with open_executor(
            store=store,
            recover=True,
            tasks=[WORK],
            lease=lease,
            max_concurrent_tasks=MAX_CONCURRENT,
            max_recovery_attempts=MAX_RECOVERY_ATTEMPTS,
        ) as ex:
            print(f"OPEN {ex.owner} {os.getpid()}", flush=True)
            n = 0
            for batch in plan.values():
                n += await _submit(ex, store, batch, log, gates)
            await ex.flush()
            print(f"ACK {n}", flush=True)
            with trio.move_on_after(deadline) as waiting:
                # The dead owners' leases lapse <= LEASE after their kill; the
                # recovery pass every LEASE seconds then claims their executions.
                while any_live(store):
                    await trio.sleep(0.05)
                await ex.wait_for_idle()
            if waiting.cancelled_caught:
                stuck = store.executions(status="pending") + store.executions(status="running")
                print(f"STUCK {len(stuck)} after {deadline}s: {stuck!r}", file=sys.stderr)
                print(f"executor: {ex.statistics()!r}", file=sys.stderr, flush=True)
                os._exit(3)  # leaving the block would wait for what is stuck
        print(f"DONE {ex.owner} {ex.statistics().completed_count}", flush=True)
    finally:
        store.close()


def main(argv: list[str]) -> None:
    mode, *rest = argv
    if mode == "run":
        db, log, gates, plan, lease, round_, child = rest
        trio.run(run, db, log, gates, plan, float(lease), int(round_), int(child))
    elif mode == "final":
        db, log, gates, plan, lease, deadline = rest
        trio.run(final, db, log, gates, plan, float(lease), float(deadline))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
