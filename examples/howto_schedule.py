"""How-to: run on a schedule.

Two executors share one store, as two worker processes would share a SQLite file
or a PostgreSQL database. Both schedule the same report every 15 minutes (Berlin
time); each occurrence runs once, on one of them, with the task id
``"report@<time of the occurrence, UTC>"``. Then both stop for an hour and a
half; a restart with ``catch_up=True`` runs the latest occurrence it missed, once,
and goes on.

The script runs on Trio's ``MockClock`` with autojump, and the store's wall clock
follows it (``FakeWallClock``): two hours of schedule in milliseconds. In
production: ``trio.run(main)`` and a real store, e.g. ``trioexec.SQLiteStore("runs.db")``.

Run it with ``python examples/howto_schedule.py``. Give it the path of a new
file (``python examples/howto_schedule.py runs.db``) to keep the store there, in
SQLite, and list its schedule with ``trioexec schedules runs.db``.
"""

from __future__ import annotations

import datetime
import sys

import trio
import trio.testing

import trioexec
from trioexec.testing import FakeWallClock

ran: list[tuple[str, str]] = []  # (task id, the executor that ran it)


@trioexec.task(id="report")
async def report(where: str, handle: trioexec.TaskHandle) -> None:
    ran.append((handle.task_id, where))


async def main(path: str | None = None) -> None:
    start = datetime.datetime(2026, 3, 29, 9, 55, tzinfo=datetime.UTC).timestamp()
    clock = FakeWallClock(start=start)
    store: trioexec.Store
    if path is None:
        store = trioexec.MemoryStore(clock=clock)
    else:  # (inline: without the store's thread, which autojump does not mix with)
        store = trioexec.SQLiteStore(path, inline=True, clock=clock)
    with store:
        await story(store)


async def story(store: trioexec.Store) -> None:
    async with (
        trioexec.open_executor(store=store) as a,
        trioexec.open_executor(store=store) as b,
    ):
        for ex, where in ((a, "a"), (b, "b")):
            schedule = ex.schedule(
                report,
                cron="*/15 * * * *",
                schedule_id="report",
                tz="Europe/Berlin",
                args=(where,),
            )
        print("next run:", datetime.datetime.fromtimestamp(schedule.next_run, datetime.UTC))
        await trio.sleep(3600)  # 09:55 to 10:55 UTC: four occurrences

    await trio.sleep(5400)  # nobody runs it from 10:55 to 12:25: six occurrences missed

    async with trioexec.open_executor(store=store) as ex:
        ex.schedule(
            report,
            cron="*/15 * * * *",
            schedule_id="report",
            tz="Europe/Berlin",
            catch_up=True,  # run the latest missed occurrence (12:15) once, now
            args=("restarted",),
        )
        await trio.sleep(600)  # to 12:35: 12:15 (caught up) and 12:30

    for task_id, where in ran:  # (which of a and b won an occurrence varies)
        print(task_id, "restarted" if where == "restarted" else "a or b")
    [record] = store.schedules()  # what `trioexec schedules DB` lists
    print(f"{record.schedule_id}: {record.cron} ({record.tz}), task {record.name!r}")

    ids = [task_id for task_id, _ in ran]
    assert ids == [
        "report@2026-03-29T10:00:00Z",
        "report@2026-03-29T10:15:00Z",
        "report@2026-03-29T10:30:00Z",
        "report@2026-03-29T10:45:00Z",
        "report@2026-03-29T12:15:00Z",  # caught up, once
        "report@2026-03-29T12:30:00Z",
    ]
    assert len(set(ids)) == len(ids)  # never twice, though two executors scheduled it


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else None  # the SQLite file to keep, if any
    trio.run(main, path, clock=trio.testing.MockClock(autojump_threshold=0))
