"""A worker process that stops cleanly on SIGTERM (systemd, Kubernetes, ``docker stop``).

The worker records its work in a SQLite store, starts it, then waits in
`trioexec.serve_until_signal`. The first SIGTERM (or SIGINT: Ctrl+C) drains the
executor: nothing new is accepted, what was accepted runs to its end, for at most
``GRACE`` seconds; then what is left is cancelled. A second signal cancels at once.

Run it with ``python examples/howto_deploy.py`` (about 1.5 seconds): it serves a
temporary database and, to show the shutdown without a service manager, sends
itself SIGTERM once its work has started. Eight resize tasks drain and complete;
one stuck task is cancelled when the grace runs out. It asserts what it shows and
exits 0.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time

import trio

import trioexec
from trioexec import HealthEventKind, TaskStatus

GRACE = 1.0  # seconds of drain before what is left is cancelled


@trioexec.task(id="howto_deploy.resize")
async def resize(image: str) -> str:
    await trio.sleep(0.1)  # the real work: an HTTP call, a subprocess...
    return f"{image} resized"


@trioexec.task(id="howto_deploy.stuck")
async def stuck() -> None:
    await trio.sleep(3600)  # a call that hangs: the grace bounds how long we wait


async def serve(db: str, *, demo: bool = False) -> trioexec.Executor:
    store = trioexec.open_store(db)
    try:
        async with trioexec.open_executor(
            store=store,
            tasks=[resize, stuck],
            max_concurrent_tasks=4,
            shutdown_grace=GRACE,
        ) as ex:
            for i in range(8):
                await ex.submit(resize, f"img-{i}.png", task_id=f"resize-{i}")
            await ex.submit(stuck, task_id="stuck-0")
            async with trio.open_nursery() as nursery:
                if demo:
                    nursery.start_soon(send_myself_sigterm)
                signum = await trioexec.serve_until_signal(ex)
            print(f"{signum.name}: shut down (drained; cancelled what outlived the grace)")
    finally:
        store.close()
    return ex


async def send_myself_sigterm() -> None:
    """What systemd or the kubelet would do: SIGTERM to the worker's pid."""
    await trio.sleep(0.05)  # the work has started (serve_until_signal's handlers already have)
    print(f"sending SIGTERM to {os.getpid()}")
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "runs.db")
        started = time.monotonic()
        ex = trio.run(lambda: serve(db, demo=True))
        elapsed = time.monotonic() - started

        events = []
        while (event := ex.events.get_nowait()) is not None:
            if event.kind is HealthEventKind.SHUTDOWN_GRACE_EXPIRED:
                events.append(event)
        [expired] = events
        print(f"grace of {GRACE}s ran out with {expired.attributes['active_count']} task running")

        store = trioexec.open_store(db, read_only=True)
        try:
            statuses = {r.task_id: r.status for r in store.executions()}
        finally:
            store.close()
        for task_id, status in statuses.items():
            print(f"  {task_id:10} {status.value}")
        assert statuses.pop("stuck-0") is TaskStatus.CANCELLED
        assert set(statuses.values()) == {TaskStatus.COMPLETED}, statuses
        assert GRACE <= elapsed < GRACE + 30, elapsed  # (generous: a loaded machine)


if __name__ == "__main__":
    main()
