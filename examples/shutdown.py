"""Shutdown policies: what happens to outstanding work when the executor closes.

Every scenario uses the same setup, an executor with a single slot and:

- ``waiter``: started first, then deferred with ``handle.defer_until(ready)`` on a
  ``trio.Event`` that a task outside the executor sets 0.25 s after the start;
- ``worker``: holds the slot, 0.2 s of work;
- ``p1``, ``p2``, ``p3``: pending, 0.05 s of work each.

Then the body leaves the ``async with open_executor(...)`` block, and the
``shutdown_policy`` decides:

- ``DRAIN`` (the default): refuse new work, run everything queued and deferred to
  the end. Leaving the block waits for the event and all the work.
- ``CANCEL_PENDING``: the pending tasks end ``CANCELLED`` at once; the running
  and the deferred task finish.
- ``CANCEL``: everything is cancelled through its cancel scope; leaving is
  immediate. The deferred task sees ``handle.cancel_requested`` and
  ``await handle.cancelled()`` returns.

It also shows that a body that raises shuts down like ``CANCEL`` and that its
error comes out of the block as it is (not in an ``ExceptionGroup``), and that
submitting after ``await ex.shutdown()`` raises `trioexec.ExecutorClosed`.

Run it with ``python examples/shutdown.py`` (about 0.7 seconds of real time). It
asserts what it showed, so a regression makes it fail.
"""

from __future__ import annotations

import trio
import trio.testing

import trioexec
from trioexec import ShutdownPolicy, SubStatus, TaskStatus

EVENT_AT = 0.25  # when the outside world sets the waiter's event, after the start
WORKER_WORK = 0.2
PENDING_WORK = 0.05
TAIL_WORK = 0.02  # the waiter's work after it resumes
PENDING = ("p1", "p2", "p3")


class Notes:
    """What each task reports about itself, with times since the scenario began."""

    def __init__(self) -> None:
        self.t0 = trio.current_time()
        self.by_task: dict[str, list[str]] = {}

    def now(self) -> float:
        return trio.current_time() - self.t0

    def add(self, who: str, what: str) -> None:
        self.by_task.setdefault(who, []).append(f"{what} at {self.now():.2f}s")


async def waiter(notes: Notes, ready: trio.Event, handle: trioexec.TaskHandle) -> str:
    try:
        await handle.defer_until(ready)  # gives the slot back while it waits
    except trio.Cancelled:
        # The executor cancelled this task while it waited: it ends at once, without
        # waiting for a slot to come free (only a cancel scope of its own would).
        asked = handle.cancel_requested
        notes.add("waiter", f"cancelled while deferred (cancel_requested={asked})")
        with trio.CancelScope(shield=True):
            await handle.cancelled()  # returns at once: the executor asked us to stop
        notes.add("waiter", "await handle.cancelled() returned")
        raise
    notes.add("waiter", "resumed")
    await trio.sleep(TAIL_WORK)
    notes.add("waiter", "done")
    return "waiter"


async def work(notes: Notes, who: str, seconds: float, handle: trioexec.TaskHandle) -> str:
    notes.add(who, "started")
    try:
        await trio.sleep(seconds)
    except trio.Cancelled:
        notes.add(who, f"cancelled while active (cancel_requested={handle.cancel_requested})")
        raise
    notes.add(who, "done")
    return who


async def set_later(notes: Notes, ready: trio.Event) -> None:
    await trio.sleep_until(notes.t0 + EVENT_AT)
    notes.add("world", "sets the event")
    ready.set()


async def start_tasks(
    ex: trioexec.Executor, notes: Notes, ready: trio.Event
) -> dict[str, trioexec.TaskRef]:
    """Submit the five tasks and wait until the waiter is deferred and the worker
    holds the slot."""
    refs = {"waiter": await ex.submit(waiter, notes, ready, name="waiter")}
    refs["worker"] = await ex.submit(work, notes, "worker", WORKER_WORK, name="worker")
    for name in PENDING:
        refs[name] = await ex.submit(work, notes, name, PENDING_WORK, name=name)
    await trio.testing.wait_all_tasks_blocked()  # until every task is waiting on something
    assert refs["waiter"].sub_status is SubStatus.DEFERRED, refs
    assert refs["worker"].sub_status is SubStatus.ACTIVE, refs
    state = ", ".join(f"{n} {r.sub_status or r.status}" for n, r in refs.items())
    print(f"  before leaving the block: {state}")
    return refs


def report(refs: dict[str, trioexec.TaskRef], notes: Notes) -> dict[str, TaskStatus]:
    for name, ref in refs.items():
        said = "; ".join(notes.by_task.get(name, [])) or "never started"
        print(f"    {name:<7} {ref.status.name:<10} {said}")
    if "world" in notes.by_task:
        print(f"    (world: {'; '.join(notes.by_task['world'])})")
    return {name: ref.status for name, ref in refs.items()}


async def leave_with(policy: ShutdownPolicy) -> tuple[dict[str, TaskStatus], float, Notes]:
    print(f"\n== shutdown_policy=ShutdownPolicy.{policy.name}")
    notes = Notes()
    ready = trio.Event()
    async with trio.open_nursery() as world:
        world.start_soon(set_later, notes, ready)
        async with trioexec.open_executor(max_concurrent_tasks=1, shutdown_policy=policy) as ex:
            refs = await start_tasks(ex, notes, ready)
            leaving = trio.current_time()
        took = trio.current_time() - leaving
        world.cancel_scope.cancel()  # the event may not be needed any more
    print(f"  leaving the block took {took:.2f}s; then:")
    return report(refs, notes), took, notes


async def body_raises() -> tuple[dict[str, TaskStatus], float, BaseException, Notes]:
    print("\n== the body raises (shutdown_policy=DRAIN, but a failing body cancels)")
    notes = Notes()
    ready = trio.Event()
    async with trio.open_nursery() as world:
        world.start_soon(set_later, notes, ready)
        try:
            async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
                refs = await start_tasks(ex, notes, ready)
                leaving = trio.current_time()
                raise LookupError("the body failed")
        except Exception as exc:  # the body's own error, unwrapped
            error: BaseException = exc
        took = trio.current_time() - leaving
        world.cancel_scope.cancel()
    print(f"  leaving the block took {took:.2f}s and raised {type(error).__name__}: {error}")
    return report(refs, notes), took, error, notes


async def closed_after_shutdown() -> tuple[dict[str, TaskStatus], str, str]:
    print("\n== submitting after `await ex.shutdown()`")
    notes = Notes()
    async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
        refs = {n: await ex.submit(work, notes, n, 0.01, name=n) for n in ("a", "b")}
        await ex.shutdown()  # the executor's policy (DRAIN): returns when all is done
        statuses = ", ".join(f"{n} {r.status}" for n, r in refs.items())
        print(f"  after shutdown(): ex.closed={ex.closed}, {statuses}")
        try:
            await ex.submit(work, notes, "c", 0.01)
        except trioexec.ExecutorClosed as exc:
            submit_error = type(exc).__name__
            print(f"  await ex.submit(...) raised {submit_error}: {exc}")
        try:
            ex.submit_nowait(work, notes, "d", 0.01)
        except trioexec.ExecutorClosed as exc:
            nowait_error = type(exc).__name__
            print(f"  ex.submit_nowait(...) raised {nowait_error}")
    return {n: r.status for n, r in refs.items()}, submit_error, nowait_error


async def main() -> None:
    t0 = trio.current_time()
    print("One slot; waiter deferred on a trio.Event (set at 0.25s), worker active, p1-p3 pending.")
    drain, drain_took, _ = await leave_with(ShutdownPolicy.DRAIN)
    cancel_pending, cancel_pending_took, _ = await leave_with(ShutdownPolicy.CANCEL_PENDING)
    cancel, cancel_took, cancel_notes = await leave_with(ShutdownPolicy.CANCEL)
    raised, raised_took, error, raised_notes = await body_raises()
    closed, submit_error, nowait_error = await closed_after_shutdown()
    print(f"\ntotal: {trio.current_time() - t0:.2f}s")

    # ---- what this example demonstrates; a regression fails the `examples` session
    C, X = TaskStatus.COMPLETED, TaskStatus.CANCELLED
    assert drain == dict.fromkeys(["waiter", "worker", *PENDING], C), drain
    assert drain_took >= EVENT_AT - 0.05, drain_took  # it waited for the event
    assert cancel_pending == {"waiter": C, "worker": C, "p1": X, "p2": X, "p3": X}, cancel_pending
    assert cancel_pending_took >= EVENT_AT - 0.05, cancel_pending_took  # the waiter finished
    for statuses, took, notes in [
        (cancel, cancel_took, cancel_notes),
        (raised, raised_took, raised_notes),
    ]:
        assert statuses == dict.fromkeys(["waiter", "worker", *PENDING], X), statuses
        assert took < 0.1, took  # nothing waited for
        said = notes.by_task["waiter"]
        assert said[0].startswith("cancelled while deferred (cancel_requested=True)"), said
        assert said[1].startswith("await handle.cancelled() returned"), said
        assert notes.by_task["worker"][1].startswith("cancelled while active"), notes.by_task
        assert not any(n in notes.by_task for n in PENDING), notes.by_task  # never started
    assert type(error) is LookupError, repr(error)
    assert str(error) == "the body failed", repr(error)
    assert closed == {"a": C, "b": C}, closed
    assert submit_error == nowait_error == "ExecutorClosed"
    print("all assertions hold")


if __name__ == "__main__":
    trio.run(main)
