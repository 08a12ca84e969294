"""How-to: the worker process of the pause, cancel and retry how-to.

One executor on a database, with ``recover=True`` and the four task specs of
``howto_control.py`` in ``tasks=``: it follows ``trioexec pause``, ``resume`` and
``cancel`` within a second, and runs what ``trioexec retry`` requeues. It submits
the day's work (unless the database has it already), says so in one line, then
serves until SIGTERM or SIGINT (Ctrl+C): `trioexec.serve_until_signal` drains the
executor for at most ``GRACE`` seconds (``shutdown_grace``), cancels what is
left, and the worker prints how each of the day's tasks ended and exits 0.

    python examples/howto_control_worker.py runs.db    # serve runs.db until SIGTERM

Without an argument (as ``nox -s examples`` runs it) it serves a temporary
database with ``sync`` paused, as ``trioexec pause`` leaves it, and sends itself
SIGTERM once its work has settled; it asserts what it shows and exits 0 (in
about ``GRACE`` seconds: the stuck task outlives the drain).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time

import trio
from howto_control import export, report, stuck, sync  # the specs (examples/ is on sys.path)

import trioexec
from trioexec import TaskStatus

GRACE = 2.0  # seconds of drain after SIGTERM before what is left is cancelled

# The day's work: (spec, argument or None, task id).
WORK = [
    (sync, "bergen", "sync-bergen"),
    (sync, "porto", "sync-porto"),
    (stuck, None, "stuck-2"),
    (export, "2026-11-26", "export-2026-11-26"),
    (report, "2026-11-26", "report-2026-11-26"),
]


async def serve(db: str, *, stop_myself: bool = False) -> signal.Signals | None:
    store = trioexec.open_store(db)
    try:
        async with trioexec.open_executor(
            store=store,
            recover=True,  # runs what `trioexec retry` requeues
            tasks=[sync, report, stuck, export],
            shutdown_grace=GRACE,
        ) as ex:
            submitted, settle = [], []
            for spec, arg, task_id in WORK:
                if store.execution(task_id) is None:  # not submitted by an earlier run
                    args = () if arg is None else (arg,)
                    ref = await ex.submit(spec, *args, task_id=task_id)
                    submitted.append(task_id)
                    if spec in (export, report):  # (the others wait: paused, or stuck)
                        settle.append(ref)
            for ref in settle:
                await ref.wait()
            await ex.flush()  # what the trioexec commands read is in the database
            what = f"submitted {', '.join(submitted)}" if submitted else "nothing new to submit"
            me = f"worker {ex.owner[:8]} (pid {os.getpid()})"

            async def announce() -> None:
                # Started before serve_until_signal: it runs once the handlers are in place.
                print(f"{me} on {db}: {what}; serving until SIGTERM", flush=True)
                if stop_myself:  # what systemd or `kill` would do
                    os.kill(os.getpid(), signal.SIGTERM)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(announce)
                signum = await trioexec.serve_until_signal(ex)
        name = signum.name if signum is not None else "shut down"
        print(f"worker {ex.owner[:8]}: {name}: stopped; the day's tasks:", flush=True)
        for _, _, task_id in WORK:
            record = store.execution(task_id)
            assert record is not None
            print(f"  {task_id:18} {record.status.value:10} attempt {record.attempt}", flush=True)
    finally:
        store.close()
    return signum


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "runs.db")
        with trioexec.SQLiteStore(db) as store:  # what `trioexec pause DB --name sync` does
            store.command("pause", name="sync", who="howto_control_worker.py")
        started = time.monotonic()
        signum = trio.run(lambda: serve(db, stop_myself=True))
        elapsed = time.monotonic() - started
        assert signum is signal.SIGTERM
        with trioexec.open_store(db, read_only=True) as store:
            ended = {task_id: store.execution(task_id) for _, _, task_id in WORK}
        statuses = {task_id: r.status for task_id, r in ended.items() if r is not None}
        assert statuses == {
            "sync-bergen": TaskStatus.CANCELLED,  # paused: a shutdown cancels them
            "sync-porto": TaskStatus.CANCELLED,
            "stuck-2": TaskStatus.CANCELLED,  # outlived the grace
            "export-2026-11-26": TaskStatus.FAILED,  # its first attempt always fails
            "report-2026-11-26": TaskStatus.COMPLETED,
        }, statuses
        assert GRACE <= elapsed < GRACE + 30, elapsed  # (generous: a loaded machine)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        trio.run(serve, sys.argv[1])
    else:
        main()
