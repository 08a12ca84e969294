"""How-to: wait for a file another system writes, without holding a slot.

Three tasks wait for files that a producer writes a little later:

- ``wait_sync_predicate``: a sync predicate, ``path.exists`` (a quick ``stat``
  on a local disk, called in the Trio thread every ``poll_interval``);
- ``wait_async_predicate``: an async predicate, ``trio.Path(...).exists``, whose
  ``stat`` runs in a worker thread (better for network filesystems, where a
  ``stat`` can take a while);
- ``wait_in_thread``: a plain ``def`` task (it runs in a worker thread) that
  calls ``handle.defer_until_sync(...)``: only its thread blocks, and its slot
  is released as with ``defer_until``.

The executor has one slot, and the producer is a task in the same executor: it
can only run because the three waiters gave the slot back. The producer writes
each file under a temporary name and renames it, so a waiter never sees half a
file.

Run it with ``python examples/howto_file_watching.py`` (about 0.5 s). It asserts
what it shows, so a regression makes it fail.
"""

from __future__ import annotations

import json
import pathlib
import tempfile

import trio

import trioexec
from trioexec import SubStatus, TaskHandle

POLL = 0.05  # seconds; 1-5 s is typical for real uploads


async def wait_sync_predicate(path: pathlib.Path, handle: TaskHandle) -> int:
    await handle.defer_until(path.exists, poll_interval=POLL)
    return len(json.loads(await trio.Path(path).read_text()))


async def wait_async_predicate(path: pathlib.Path, handle: TaskHandle) -> int:
    await handle.defer_until(trio.Path(path).exists, poll_interval=POLL)
    return len(json.loads(await trio.Path(path).read_text()))


def wait_in_thread(path: pathlib.Path, handle: TaskHandle) -> int:
    handle.defer_until_sync(path.exists, poll_interval=POLL)
    return len(json.loads(path.read_text()))  # a worker thread: blocking I/O is fine here


async def produce(paths: list[pathlib.Path], rows: int, started: trio.Event) -> None:
    started.set()
    await trio.sleep(0.2)  # the other system takes its time
    for path in paths:
        tmp = trio.Path(path.with_suffix(".tmp"))
        await tmp.write_text(json.dumps(list(range(rows))))
        await tmp.rename(path)  # appears at once, complete


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        paths = [pathlib.Path(tmp) / f"upload-{i}.json" for i in range(3)]
        async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
            waiters = [
                await ex.submit(wait_sync_predicate, paths[0]),
                await ex.submit(wait_async_predicate, paths[1]),
                await ex.submit(wait_in_thread, paths[2]),
            ]
            started = trio.Event()
            producer = await ex.submit(produce, paths, 5, started)
            # One slot, taken in FIFO order: the producer can only start once all
            # three waiters have deferred.
            await started.wait()
            states = [str(w.sub_status) for w in waiters]
            print(f"producer started; waiters: {states}, slots in use: {ex.slots.in_use}")
            assert all(w.sub_status is SubStatus.DEFERRED for w in waiters), waiters
            assert ex.slots.in_use == 1  # the producer, in the slot the waiters gave back

            completions = [await w.wait() for w in waiters]
            assert (await producer.wait()).ok

    for name, c in zip(("sync", "async", "thread"), completions, strict=True):
        print(f"{name:6} predicate: {c.result} rows, deferred {c.deferred_seconds:.2f}s")
    assert [c.result for c in completions] == [5, 5, 5], completions
    assert all(c.deferred_seconds >= 0.2 for c in completions), completions
    assert ex.statistics().deferral_count == 3


if __name__ == "__main__":
    trio.run(main)
