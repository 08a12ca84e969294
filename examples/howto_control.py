"""How-to: pause, cancel and retry tasks.

One executor on a SQLite store, with its task specs registered and
``recover=True``. A partner's API is down, so the tasks named ``sync`` are
paused: they wait (``waiting_on`` ``"paused"``) while other work runs, and start
once resumed. A task hangs; a cancel sent through the store stops it. An export
fails: the store keeps its error, traceback and arguments, and a requeue (what
``trioexec retry DB --failed`` does) runs it again at once, with the same task
id, as its next attempt. A task submitted as a plain function fails too: it
cannot be re-created, and the requeue refuses it, saying why.

The waits are virtual (Trio's ``MockClock`` with autojump, and the store inline,
without its thread), so the script finishes at once. In production:
``trio.run(main)`` and ``trioexec.SQLiteStore("runs.db")``.

Run it with ``python examples/howto_control.py``. Give it the path of a new file
(``python examples/howto_control.py runs.db``) to keep the database and look at
it with the ``trioexec`` commands it prints.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import trio
import trio.testing

import trioexec
from trioexec import TaskStatus
from trioexec.testing import FakeWallClock

export_started: list[float] = []  # when each run of the export began (Trio's clock)
exported = trio.Event()


@trioexec.task
async def sync(shop: str) -> str:
    return f"{shop}: orders synced"


@trioexec.task
async def report(day: str) -> str:
    return f"report {day}"


@trioexec.task
async def stuck() -> None:
    await trio.sleep_forever()  # a connection that hangs


@trioexec.task
async def export(day: str) -> str:
    export_started.append(trio.current_time())
    if len(export_started) == 1:
        raise ConnectionError(f"export {day}: the warehouse refused the upload")
    exported.set()
    return f"exported {day}"


async def cleanup(folder: str) -> None:  # a plain function: no spec to re-create it from
    raise PermissionError(f"cannot remove {folder}")


async def main(db: Path) -> None:
    with trioexec.SQLiteStore(db, inline=True, clock=FakeWallClock(start=time.time())) as store:

        def show(step: str, task_id: str) -> None:
            record = store.execution(task_id)
            if record.waiting_on is not None:
                detail = f"waiting on {record.waiting_on}"
            elif record.traceback is not None:
                detail = record.traceback.splitlines()[-1]
            else:
                detail = f"attempt {record.attempt}"
            print(f"{step:13} {task_id:19} {record.status.value:10} {detail}")

        async with trioexec.open_executor(
            store=store, recover=True, tasks=[sync, report, stuck, export]
        ) as ex:
            print(f"{'step':13} {'task':19} {'status':10} detail")

            # The partner's API is down: pause that work (trioexec pause DB --name sync).
            ex.pause(name="sync")
            syncs = [await ex.submit(sync, s, task_id=f"sync-{s}") for s in ("lyon", "oslo")]
            daily = await ex.submit(report, "2026-11-25", task_id="report-2026-11-25")
            assert (await daily.wait()).ok  # other work goes on
            await ex.flush()  # what the store shows is what has been flushed
            for ref in [*syncs, daily]:
                show("sync paused", ref.task_id)
            assert [ref.waiting_on for ref in syncs] == ["paused", "paused"]
            assert ex.paused() == (frozenset({"sync"}), frozenset())

            # It is back (trioexec resume DB --name sync): they start, in their order.
            ex.resume(name="sync")
            for ref in syncs:
                assert (await ref.wait()).ok
            await ex.flush()
            for ref in syncs:
                show("sync resumed", ref.task_id)

            # A task hangs: cancel it (trioexec cancel DB stuck-1).
            hung = await ex.submit(stuck, task_id="stuck-1")
            await trio.testing.wait_all_tasks_blocked()
            await ex.flush()
            sent = store.command("cancel", task_id="stuck-1", who="howto_control.py")
            assert sent.detail == f"sent to its owner {store.execution('stuck-1').owner}"
            sent_at = trio.current_time()
            assert (await hung.wait()).status is TaskStatus.CANCELLED
            assert trio.current_time() - sent_at <= 0.5  # its executor reads commands every 0.5 s
            await ex.flush()
            show("cancel sent", "stuck-1")

            # Two fail overnight; the store keeps each one's error, traceback and arguments.
            for fn, arg, task_id in [
                (export, "2026-11-25", "export-2026-11-25"),
                (cleanup, "/srv/tmp", "cleanup-2026-11-25"),
            ]:
                ref = await ex.submit(fn, arg, task_id=task_id)
                assert (await ref.wait()).status is TaskStatus.FAILED
            await ex.flush()
            show("overnight", "export-2026-11-25")
            show("overnight", "cleanup-2026-11-25")
            dead = store.execution("export-2026-11-25")
            assert (dead.spec_id, dead.args) == ("export", '["2026-11-25"]')
            assert store.execution("cleanup-2026-11-25").spec_id is None  # not re-creatable

            # Retry every failed task (trioexec retry DB --failed): the export runs
            # again on this executor (recover=True, its spec registered) within
            # 0.5 s, since the retry command wakes recovery; the cleanup is refused.
            requeued_at = trio.current_time()
            result = store.requeue(None, who="howto_control.py")
            assert [r.task_id for r in result.requeued] == ["export-2026-11-25"]
            await exported.wait()
            await ex.wait_for_idle()
            await ex.flush()
            assert export_started[1] - requeued_at <= 0.5
            show("requeued", "export-2026-11-25")
            for task_id, why in result.refused:
                print(f"{'refused':13} {task_id:19} {'failed':10} {why}")
            assert store.execution("export-2026-11-25").attempt == dead.attempt + 1

        log = [(c.kind, c.detail) for c in store.commands()]
        assert [kind for kind, _ in log] == ["pause", "resume", "cancel", "retry"]
        assert log[-1] == ("retry", "requeued 1, refused 1")


if __name__ == "__main__":
    clock = trio.testing.MockClock(autojump_threshold=0)
    if len(sys.argv) > 1:
        path = sys.argv[1]
        trio.run(main, Path(path), clock=clock)
        print(f"\n{path} kept; look at it with:")
        for command in ("status", "commands"):
            print(f"  trioexec {command} {path}")
        print(f"  trioexec status {path} --status failed --json")
    else:
        with tempfile.TemporaryDirectory() as tmp:
            trio.run(main, Path(tmp) / "runs.db", clock=clock)
