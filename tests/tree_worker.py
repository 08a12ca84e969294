"""One process of the task tree tests (not a test module): ``python
tree_worker.py TARGET MODE``: an executor on the store TARGET (a SQLite file or a
PostgreSQL URL), one slot, runs a parent that submits a deferred child (which
submits a deferred grandchild), a pending child (paused: it never starts) and a
detached deferred task; the parent then defers forever (MODE "waits") or
returns (MODE "returns"). Prints ``READY <parent> <child> <grandchild>
<pending> <detached>`` once all are in the store; on a line "stop" on stdin it
cancels what is left and exits, printing ``DONE``."""

from __future__ import annotations

import sys

import trio
import trio.testing

import trioexec
from trioexec._journal import Journal

ids: dict[str, str] = {}
refs: list[trioexec.TaskRef[object]] = []


async def submit(ex: trioexec.Executor, name: str, *args: object, **options: object) -> None:
    ref = await ex.submit(*args, **options)  # type: ignore[call-overload]
    refs.append(ref)
    ids[name] = ref.task_id


async def deferred(handle: trioexec.TaskHandle) -> None:
    await handle.defer_until(trio.Event())


async def child(ex: trioexec.Executor, ready: trio.Event, handle: trioexec.TaskHandle) -> None:
    await submit(ex, "grandchild", deferred)
    ready.set()
    await handle.defer_until(trio.Event())


async def pending() -> None:
    print("PENDING RAN", flush=True)  # (it never should)


async def parent(
    ex: trioexec.Executor, mode: str, ready: trio.Event, handle: trioexec.TaskHandle
) -> str:
    await submit(ex, "child", child, ex, ready)
    await submit(ex, "pending", pending)  # (paused: it stays pending)
    await submit(ex, "detached", deferred, detached=True)
    if mode == "waits":
        await handle.defer_until(trio.Event())  # (running, its slot given back)
    return "done"


async def main(target: str, mode: str) -> None:
    store = trioexec.open_store(target)
    ready = trio.Event()
    async with trioexec.open_executor(store=store, max_concurrent_tasks=1) as ex:
        ex.pause(name="pending")
        await submit(ex, "parent", parent, ex, mode, ready)
        await ready.wait()
        await trio.testing.wait_all_tasks_blocked()
        await Journal.flush_all(store)
        names = ("parent", "child", "grandchild", "pending", "detached")
        print("READY", *(ids[n] for n in names), flush=True)
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        assert line.strip() == "stop", line
        for ref in refs:
            ref.cancel()
    store.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
