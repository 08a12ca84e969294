"""How-to: find out why a task is waiting.

Four tasks on an executor with two slots and a SQLite store: a report that
waits for an upload (a `trio.Event`), two fetches from a host that allows one
connection at a time (a key limit), a flaky job between two attempts (a retry
backoff), and a task that only computes. Each `TaskRef` says why it is not
running (`TaskRef.waiting_on`), and the store records the same thing for other
processes (`ExecutionRecord.waiting_on`, ``trioexec status DB``).

The waits are virtual (Trio's ``MockClock`` with autojump), so the script
finishes at once. In production: ``trio.run(main)`` and a real file.

Run it with ``python examples/howto_why_waiting.py``; give it the path of a new
file (``python examples/howto_why_waiting.py runs.db``) to keep the database.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import trio
import trio.testing

import trioexec
from trioexec import Backoff, KeyLimit, TaskHandle
from trioexec.testing import FakeWallClock

upload_done = trio.Event()
host_free = trio.Event()
attempts: list[float] = []


async def report(handle: TaskHandle) -> str:
    await handle.defer_until(upload_done)  # gives its slot back meanwhile
    return "report sent"


async def fetch(url: str) -> str:
    await host_free.wait()
    return f"<page {url}>"


@trioexec.task(retries=1, backoff=Backoff(initial=30))
async def flaky() -> str:
    attempts.append(trio.current_time())
    if len(attempts) == 1:
        raise OSError("connection reset")
    return "done"


async def main(db: Path) -> None:
    with trioexec.SQLiteStore(db, inline=True, clock=FakeWallClock()) as store:
        async with trioexec.open_executor(
            store=store,
            max_concurrent_tasks=2,
            key_limits={"slow.example": KeyLimit(concurrency=1)},
        ) as ex:
            refs = {
                "report": await ex.submit(report),
                "fetch 1": await ex.submit(fetch, "/a", key="slow.example"),
                "fetch 2": await ex.submit(fetch, "/b", key="slow.example"),
                "flaky": await ex.submit(flaky),
            }
            await trio.testing.wait_all_tasks_blocked()
            await ex.flush()  # what the store shows is what has been flushed
            print(f"{'task':8} {'TaskRef.waiting_on':30} store")
            for name, ref in refs.items():
                recorded = store.execution(ref.task_id).waiting_on
                assert recorded == ref.waiting_on
                print(f"{name:8} {ref.waiting_on!s:30} {recorded}")
            # The same question from another process: trioexec status DB --waiting-on 'key*'
            held = [
                r.task_id
                for r in store.executions(status="pending")
                if (r.waiting_on or "").startswith("key concurrency")
            ]
            assert held == [refs["fetch 2"].task_id]
            upload_done.set()
            host_free.set()
        assert all(store.execution(r.task_id).waiting_on is None for r in refs.values())
    print("all done; nothing waits on anything")


if __name__ == "__main__":
    clock = trio.testing.MockClock(autojump_threshold=0)
    if len(sys.argv) > 1:
        trio.run(main, Path(sys.argv[1]), clock=clock)  # the database stays there
    else:
        with tempfile.TemporaryDirectory() as tmp:
            trio.run(main, Path(tmp) / "runs.db", clock=clock)
