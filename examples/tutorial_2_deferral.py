"""Tutorial, part 2: a task that gives its slot back while it waits.

With a single slot, a task waiting for an upload would stop every other task if
it held the slot. It asks for a `trioexec.TaskHandle` (a parameter named
``handle``) and calls ``await handle.defer_until(upload_done)``: the slot goes back
to the pool, another task runs in it, and the waiter takes a slot back when the
event is set, its local variables intact. It also shows a polled predicate as
the condition, and giving up on a wait with ``trio.move_on_after``: the slot is
taken back before the code after the ``with`` block runs.

Run it with ``python examples/tutorial_2_deferral.py`` (about 0.5 s). It asserts
what it shows, so a regression makes it fail.
"""

from __future__ import annotations

import trio
import trio.testing

import trioexec
from trioexec import SubStatus, TaskStatus


async def add(a: int, b: int) -> int:
    await trio.sleep(0.05)
    return a + b


async def wait_for_upload(upload_done: trio.Event, handle: trioexec.TaskHandle) -> str:
    staged = ["row 1", "row 2"]  # local state
    await handle.defer_until(upload_done)
    # Back here holding a slot again; `staged` is the same list.
    return f"loaded {len(staged)} rows"


async def wait_for_flag(flags: dict[str, bool], handle: trioexec.TaskHandle) -> str:
    # A zero-argument callable is checked now, then every poll_interval seconds.
    await handle.defer_until(lambda: flags["ready"], poll_interval=0.02)
    return "flag seen"


async def patient(never: trio.Event, handle: trioexec.TaskHandle) -> str:
    with trio.move_on_after(0.1):
        await handle.defer_until(never)
    # The wait was cancelled, but the slot was taken back first:
    return f"gave up; slot held: {handle.slot.is_held}"


async def main() -> None:
    upload_done = trio.Event()
    async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
        waiter = await ex.submit(wait_for_upload, upload_done)

        # One slot, and the waiter took it first. This only finishes because
        # the waiter gave the slot back while it waits.
        assert await ex.run(add, 1, 2) == 3
        print(waiter.status, waiter.sub_status, ex.slots.in_use)  # running deferred 0
        assert waiter.status is TaskStatus.RUNNING
        assert waiter.sub_status is SubStatus.DEFERRED
        assert ex.slots.in_use == 0

        upload_done.set()
        completion = await waiter.wait()
        print(completion.result, f"(deferred {completion.deferred_seconds:.2f}s)")
        assert completion.result == "loaded 2 rows"
        assert completion.deferred_seconds >= 0.05  # at least add()'s 0.05 s

        # An event that is already set: defer_until returns at once, and the
        # slot is never released (no deferral is counted).
        before = ex.statistics().deferral_count
        assert (await ex.run(wait_for_upload, upload_done)) == "loaded 2 rows"
        assert ex.statistics().deferral_count == before

        # A polled predicate.
        flags = {"ready": False}
        flagged = await ex.submit(wait_for_flag, flags)
        await trio.testing.wait_all_tasks_blocked()  # until it has deferred
        assert flagged.sub_status is SubStatus.DEFERRED
        flags["ready"] = True
        assert (await flagged.wait()).result == "flag seen"

        # Giving up on a wait with a cancel scope.
        result = await ex.run(patient, trio.Event())
        print(result)  # gave up; slot held: True
        assert result == "gave up; slot held: True"

    stats = ex.statistics()
    print(f"deferrals {stats.deferral_count}, resumes {stats.resumed_count}")
    assert stats.deferral_count == stats.resumed_count == 3
    assert stats.completed_count == 5


if __name__ == "__main__":
    trio.run(main)
