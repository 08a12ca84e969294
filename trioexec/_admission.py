"""Admission's shell: `Gate`, the machine's `Admission` (`trioexec._machine._admit`)
with its ``BLOCK`` submitters parked, and woken."""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import outcome
import trio

from ._machine._admit import Admission, Admit

__all__ = ["Gate"]


@final
class Gate(Admission):
    """The admission gate of one executor: the machine's `Admission`, whose
    ``BLOCK`` submitters park here until woken."""

    __slots__ = ()

    async def wait_turn(self, check_open: Callable[[], None]) -> Admit:
        """Park in the line until there may be space, and decide again, until the
        decision is not to wait; ``check_open`` raises if shutdown began meanwhile.
        The caller applies the decision, then calls `wake_next`."""
        task = trio.lowlevel.current_task()
        waiters = self.waiters

        def abort(_: object) -> trio.lowlevel.Abort:
            waiters.remove(task)
            self.wake_next()  # the one behind may fit now
            return trio.lowlevel.Abort.SUCCEEDED

        waiters.append(task)  # last in line...
        while True:
            # (woken with True: a finished task handed us the place it freed)
            if await trio.lowlevel.wait_task_rescheduled(abort):
                self.reserved -= 1
            # (or the store caught up, or shutdown began: decide again)
            check_open()
            decision = self.decide(True, woken=True)
            if decision is not Admit.WAIT:
                return decision
            waiters.appendleft(task)  # ...then first, to wait again

    def hold(self, places: int) -> None:
        """Hold ``places`` back from submitters (recovery's room while it claims,
        a schedule's place while it claims its occurrence): give them back with
        `release`, or hand one to a submission (`ExecutorCore.submit`'s ``held``)."""
        self.reserved += places

    def release(self, places: int) -> None:
        """Give back places `hold` held: a blocked submitter they fit takes one
        (and, once in, wakes the next)."""
        self.reserved -= places
        self.wake_next()

    def wake_next(self, *, handing_place: bool = False) -> None:
        """Wake the longest-waiting blocked submitter: with a freed place handed
        to it (a task finished), or to decide again if there may be room now."""
        task = self.next_waiter(handing_place)
        if task is not None:
            trio.lowlevel.reschedule(task, outcome.Value(handing_place))

    def wake_all(self) -> None:
        """Shutdown began: every blocked submitter decides again (and learns).
        A place handed to one is its own to give back."""
        while self.waiters:
            trio.lowlevel.reschedule(self.waiters.popleft(), outcome.Value(False))
