"""Subprocess side of the signal tests in ``tests/test_shutdown_grace.py`` (not a
test module: never collected). An application as the deployment how-to has it: an
executor with a store, work started, then `trioexec.serve_until_signal`.

Usage::

    python signal_app.py DB GRACE N_FINISH N_FOREVER N_QUICK

GRACE is seconds, or ``none`` for no limit. It submits N_FINISH ``finish`` tasks
(they hold their slot until the shutdown begins, then work 0.2 s more and
complete), N_FOREVER ``forever`` tasks (they hold their slot until cancelled) and
then N_QUICK ``quick`` tasks (0.02 s each) that queue behind them: one slot more
than the holders, so some are still pending when the signal comes. It prints
``READY <pid>`` once the holders run and every submission is durable (the signal
handlers are installed by then), ``DRAINING`` when the first holder sees the
shutdown begin, and ``STOPPED <signal name>`` after the executor has closed.
"""

from __future__ import annotations

import os
import sys

import trio

import trioexec
from trioexec import open_executor, open_store

QUICK_SECONDS = 0.02
FINISH_SECONDS = 0.2
POLL = 0.01  # how often a holder looks whether the shutdown has begun


def task_ids(n_finish: int, n_forever: int, n_quick: int) -> dict[str, list[str]]:
    return {
        "finish": [f"finish-{i}" for i in range(n_finish)],
        "forever": [f"forever-{i}" for i in range(n_forever)],
        "quick": [f"quick-{i}" for i in range(n_quick)],
    }


class App:
    def __init__(self, holders: int) -> None:
        self.ex: trioexec.Executor | None = None
        self.holders = holders
        self.running = 0
        self.all_running = trio.Event()
        self.draining_said = False

    async def hold_until_closed(self) -> None:
        self.running += 1
        if self.running == self.holders:
            self.all_running.set()
        assert self.ex is not None
        while not self.ex.closed:
            await trio.sleep(POLL)
        if not self.draining_said:
            self.draining_said = True
            print("DRAINING", flush=True)


APP = App(0)


@trioexec.task(id="signal_app.work")
async def WORK(kind: str) -> str:
    if kind == "quick":
        await trio.sleep(QUICK_SECONDS)
    elif kind == "finish":
        await APP.hold_until_closed()
        await trio.sleep(FINISH_SECONDS)
    elif kind == "forever":
        await APP.hold_until_closed()
        await trio.sleep_forever()
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return kind


async def announce(ex: trioexec.Executor) -> None:
    if APP.holders:
        await APP.all_running.wait()
    await ex.flush()
    print(f"READY {os.getpid()}", flush=True)


async def main(db: str, grace: float | None, n_finish: int, n_forever: int, n_quick: int) -> None:
    APP.holders = n_finish + n_forever
    store = open_store(db)
    try:
        async with open_executor(
            store=store,
            tasks=[WORK],
            max_concurrent_tasks=APP.holders + 1,
            shutdown_grace=grace,
        ) as ex:
            APP.ex = ex
            for kind, ids in task_ids(n_finish, n_forever, n_quick).items():
                for task_id in ids:
                    await ex.submit(WORK, kind, task_id=task_id)
            async with trio.open_nursery() as nursery:
                # Runs once serve_until_signal has installed its handlers and waits.
                nursery.start_soon(announce, ex)
                signum = await trioexec.serve_until_signal(ex)
        print(f"STOPPED {signum.name}", flush=True)
    finally:
        store.close()


if __name__ == "__main__":
    _, db, grace, n_finish, n_forever, n_quick = sys.argv
    trio.run(
        main,
        db,
        None if grace == "none" else float(grace),
        int(n_finish),
        int(n_forever),
        int(n_quick),
    )
