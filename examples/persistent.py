"""Deferred tasks with a store: what an operator sees while tasks wait.

Six "report" tasks each wait (deferred, holding no slot) for an upstream system
to publish their input; the executor records every transition in a SQLite file.
While they wait, this script queries the store the way a dashboard or another
process would, with ``store.executions(sub_status=DEFERRED)`` and
``deferred_longer_than``. At the end every row is COMPLETED with its sub-status
cleared.

Run it with ``python examples/persistent.py`` (about 1.5 seconds). Give it the
path of a new file (``python examples/persistent.py runs.db``) to keep the
database and look at it with ``trioexec status runs.db`` afterwards.
"""

from __future__ import annotations

import os
import sys
import tempfile

import trio

import trioexec
from trioexec import SubStatus, TaskHandle, TaskStatus

published = {f"region-{i}": trio.Event() for i in range(6)}


@trioexec.task(id="build_report")
async def build_report(region: str, handle: TaskHandle) -> str:
    rows = [f"{region}:{n}" for n in range(3)]  # state kept across the wait
    await handle.defer_until(published[region])
    return f"{region}: {len(rows)} rows"


def show(store: trioexec.SQLiteStore, title: str) -> None:
    print(f"\n{title}")
    now = store.clock()
    for rec in store.executions(sub_status=SubStatus.DEFERRED):
        waited = now - (rec.deferred_since or now)
        print(f"  {rec.task_id[-6:]}  {rec.name:13s} deferred for {waited:4.2f}s")
    old = store.executions(deferred_longer_than=0.5)
    print(f"  -> deferred longer than 0.5s: {len(old)}")


async def main(path: str) -> None:
    with trioexec.SQLiteStore(path) as store:
        async with trioexec.open_executor(max_concurrent_tasks=2, store=store) as ex:
            refs = [await ex.submit(build_report, region) for region in published]
            await trio.sleep(0.3)
            await ex.flush()  # make everything so far visible to readers
            show(store, "after 0.3s, all six wait without a slot:")
            deferred = store.executions(sub_status="deferred")
            assert len(deferred) == 6
            assert ex.slots.in_use == 0

            for region in list(published)[:3]:
                published[region].set()
            await trio.sleep(0.4)
            await ex.flush()
            show(store, "after 0.7s, three published; the rest still wait:")
            assert len(store.executions(sub_status="deferred")) == 3
            assert len(store.executions(deferred_longer_than=0.5)) == 3

            for region in list(published)[3:]:
                published[region].set()
            results = [(await ref.wait()).result for ref in refs]

        print("\nresults:", *results, sep="\n  ")
        rows = store.executions()
        statuses = sorted({r.status.value for r in rows})
        print(f"\nstore: {len(rows)} executions, statuses {statuses}")
        assert all(r.status is TaskStatus.COMPLETED and r.sub_status is None for r in rows)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        trio.run(main, sys.argv[1])  # the database stays there
    else:
        with tempfile.TemporaryDirectory() as tmp:
            trio.run(main, os.path.join(tmp, "runs.db"))
