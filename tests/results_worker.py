"""One process of the results tests (not a test module): ``python
results_worker.py TARGET``: an executor on the store TARGET (a SQLite file or a
PostgreSQL URL) with ``keep_results=True`` submits a charge that waits for a
line "go" on stdin and one that fails, prints ``SUBMITTED <charge id> <failing
id>`` once both are in the store, then ends them on "go"."""

from __future__ import annotations

import sys

import trio

import trioexec
from trioexec._journal import Journal


async def charge(order: int, go: trio.Event) -> dict[str, object]:
    await go.wait()
    return {"order": order, "charged": True, "note": "ünïcode ['x']"}


async def refuse(go: trio.Event) -> None:
    await go.wait()
    raise ValueError("card declined")


async def main(target: str) -> None:
    store = trioexec.open_store(target)
    go = trio.Event()
    async with trioexec.open_executor(
        store=store, keep_results=True, report_unread_failures=False
    ) as ex:
        charged = await ex.submit(charge, 7, go)
        refused = await ex.submit(refuse, go)
        await Journal.flush_all(store)  # (both rows are in the store now)
        print("SUBMITTED", charged.task_id, refused.task_id, flush=True)
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        assert line.strip() == "go", line
        go.set()
    store.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
