"""Subprocess side of ``test_control_cli.py`` (not a test module: never collected).

Usage::

    python control_worker.py DB MARKER

Opens an executor on ``open_store(DB)`` (two slots, ``recover=True``, the specs
below registered, a lease of 3 s), prints ``READY <pid>``, then follows lines
on stdin: ``submit SPEC TASK_ID`` submits ``SPEC(TASK_ID)`` with that task id
and prints ``QUEUED <task id> <waiting_on>`` once it is queued (and flushed to
the store), later ``END <task id> <status> <time.time()>``. A task prints ``START <spec>
<task id>`` when it runs. Whenever what is paused here changes it prints
``PAUSED <time.time()> <names,...> <keys,...>`` (``-`` for none). ``quit``
leaves the executor (shutdown drains) and prints ``BYE``.

``flaky`` fails while the file MARKER does not exist (and creates it), then
succeeds, printing ``OK <task id>``.
"""

from __future__ import annotations

import os
import sys
import time

import trio

import trioexec

MARKER = sys.argv[2] if len(sys.argv) > 2 else ""


def say(*words: object) -> None:
    print(*words, flush=True)


@trioexec.task
async def alpha(tag: str) -> None:
    say("START", "alpha", tag)


@trioexec.task
async def beta(tag: str) -> None:
    say("START", "beta", tag)


@trioexec.task
async def slow(tag: str) -> None:
    say("START", "slow", tag)
    await trio.sleep_forever()


@trioexec.task
async def flaky(tag: str) -> None:
    say("START", "flaky", tag)
    marker = trio.Path(MARKER)
    if not await marker.exists():
        await marker.touch()
        raise ValueError(f"flaky {tag} fails its first run")
    say("OK", tag)


SPECS = {"alpha": alpha, "beta": beta, "slow": slow, "flaky": flaky}


def _show(values: frozenset[str]) -> str:
    return ",".join(sorted(values)) or "-"


async def watch_pauses(ex: trioexec.Executor) -> None:
    seen = ex.paused()
    while True:
        await trio.sleep(0.01)
        now = ex.paused()
        if now != seen:
            seen = now
            say("PAUSED", f"{time.time():.6f}", _show(now[0]), _show(now[1]))


async def report(ref: trioexec.TaskRef) -> None:
    completion = await ref.wait()
    say("END", ref.task_id, completion.status.value, f"{time.time():.6f}")


async def main(db: str) -> None:
    with trioexec.open_store(db) as store:
        async with (
            trioexec.open_executor(
                store=store, max_concurrent_tasks=2, recover=True, tasks=SPECS.values(), lease=3.0
            ) as ex,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(watch_pauses, ex)
            say("READY", os.getpid())
            while True:
                line = await trio.to_thread.run_sync(sys.stdin.readline)
                words = line.split()
                if not words or words[0] == "quit":
                    break
                _, spec, task_id = words
                ref = await ex.submit(SPECS[spec], task_id, task_id=task_id)
                await ex.flush()
                say("QUEUED", task_id, ref.waiting_on)
                nursery.start_soon(report, ref)
            nursery.cancel_scope.cancel()
    say("BYE")


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
