"""How-to: pause a task until a human approves, without holding a slot (in-process).

Refund tasks ask for approval and defer on it. Ways to wake them, none polls:

- a ``trio_util.AsyncValue`` holding the decision (None until someone decides):
  ``defer_until`` waits until its value is truthy, and the task then reads it, so
  one object carries "approved" or "rejected";
- a plain ``trio.Event``, or a ``trio_util.AsyncBool``, when the only answer is
  "go" (shipping tasks wait on those).

A refund nobody decides on within an hour gives up (``trio.move_on_after``
around the wait) and is escalated. Meanwhile, an operator's query on the store,
``store.executions(deferred_longer_than=15 * 60)``, finds the approvals that have
been waiting too long.

Humans answer in minutes, so the script runs on Trio's ``MockClock`` with
autojump (virtual time; the run takes milliseconds) and gives the store a
`trioexec.testing.FakeWallClock` so stored times follow it too. In production:
``trio.run(main)`` and a store with the default wall clock.

Run it with ``python examples/howto_approval.py``. For approvals that survive a
restart and come from another process, see ``examples/durable_approval.py``.
"""

from __future__ import annotations

import trio
import trio.testing
import trio_util

import trioexec
from trioexec import SubStatus, TaskHandle
from trioexec.testing import FakeWallClock

MINUTE = 60.0
APPROVAL_TIMEOUT = 60 * MINUTE


class Approvals:
    """What the web app's "approve"/"reject" buttons call into."""

    def __init__(self) -> None:
        self.pending: dict[str, trio_util.AsyncValue[str | None]] = {}

    def request(self, order: str) -> trio_util.AsyncValue[str | None]:
        return self.pending.setdefault(order, trio_util.AsyncValue(None))

    def decide(self, order: str, verdict: str) -> None:
        self.pending[order].value = verdict  # wakes the task at once


async def refund(order: str, amount: float, approvals: Approvals, handle: TaskHandle) -> str:
    decision = approvals.request(order)
    with trio.move_on_after(APPROVAL_TIMEOUT):
        await handle.defer_until(decision)  # no slot held while a human thinks
    # The slot is held again here, whether decided or timed out.
    if decision.value is None:
        return f"{order}: escalated after {handle.deferred_seconds / MINUTE:.0f} min"
    if decision.value == "approved":
        return f"{order}: refunded {amount}"
    return f"{order}: refund {decision.value}"


async def ship(order: str, cleared: trio.Event | trio_util.AsyncBool, handle: TaskHandle) -> str:
    await handle.defer_until(cleared)  # woken the moment it is set / turns true
    return f"{order}: shipped"


async def humans(approvals: Approvals, cleared: trio.Event, signed: trio_util.AsyncBool) -> None:
    await trio.sleep(5 * MINUTE)
    approvals.decide("A-1", "approved")
    await trio.sleep(10 * MINUTE)
    cleared.set()
    await trio.sleep(5 * MINUTE)
    approvals.decide("A-2", "rejected")
    await trio.sleep(5 * MINUTE)
    signed.value = True
    # Nobody looks at A-3.


async def main() -> None:
    approvals = Approvals()
    cleared = trio.Event()
    signed = trio_util.AsyncBool(False)
    with trioexec.MemoryStore(clock=FakeWallClock()) as store:
        async with (
            trio.open_nursery() as nursery,
            trioexec.open_executor(max_concurrent_tasks=1, store=store) as ex,
        ):
            nursery.start_soon(humans, approvals, cleared, signed)
            refs = [
                await ex.submit(refund, "A-1", 120.0, approvals, name="refund A-1"),
                await ex.submit(refund, "A-2", 35.0, approvals, name="refund A-2"),
                await ex.submit(refund, "A-3", 80.0, approvals, name="refund A-3"),
                await ex.submit(ship, "A-4", cleared, name="ship A-4"),
                await ex.submit(ship, "A-5", signed, name="ship A-5"),
            ]
            await trio.testing.wait_all_tasks_blocked()
            assert all(r.sub_status is SubStatus.DEFERRED for r in refs)
            assert ex.slots.in_use == 0  # five waiting tasks, one slot, and it is free

            await trio.sleep(30 * MINUTE)
            await ex.flush()
            stale = store.executions(deferred_longer_than=15 * MINUTE)
            print("waiting over 15 min at t=30 min:", [r.name for r in stale])
            assert [r.name for r in stale] == ["refund A-3"]

            completions = [await r.wait() for r in refs]

    results = [c.result for c in completions]
    for c in completions:
        print(f"{c.result:28} deferred {c.deferred_seconds / MINUTE:.0f} min")
    assert results == [
        "A-1: refunded 120.0",
        "A-2: refund rejected",
        "A-3: escalated after 60 min",
        "A-4: shipped",
        "A-5: shipped",
    ], results
    deferred_minutes = [c.deferred_seconds / MINUTE for c in completions]
    assert deferred_minutes == [5, 20, 60, 15, 25], deferred_minutes  # exact: virtual time


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
