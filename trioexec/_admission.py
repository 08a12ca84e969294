"""Admission's shell: `Gate` carries out the machine's decision (`admit`, in
`trioexec._machine._admit`): the capacity and the places held back (recovery's,
or handed to a woken submitter), the line of ``BLOCK`` submitters waiting for
space, and the refusals with their health events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, final

import outcome
import trio

from ._errors import CapacityExceeded, TaskRejected, TrioexecError
from ._events import EventStream
from ._machine._admit import Admit, admit, rejection_reason
from ._metrics import Tally
from ._records import HealthEventKind, Overflow

if TYPE_CHECKING:
    from ._journal import Journal
    from ._machine._pending import Pending
    from ._taskref import Job

__all__ = ["Gate"]


@final
class Gate:
    """The admission gate of one executor.

    Holds the bound (pending + active + deferred <= ``capacity``, less the places
    held back in ``reserved``) and the FIFO line of submitters blocked for space.
    The counts it decides on belong to the `Tally`; the store's backlog to the
    `Journal`.
    """

    __slots__ = (
        "_events",
        "_journal",
        "_pending",
        "_tally",
        "capacity",
        "overflow",
        "reserved",
        "waiters",
    )

    def __init__(
        self,
        capacity: int,
        overflow: Overflow,
        tally: Tally,
        pending: Pending,
        journal: Journal | None,
        events: EventStream,
    ) -> None:
        self.capacity = capacity
        self.overflow = overflow
        self.reserved = 0  # places held back: handed to woken submitters, or recovery's
        self._tally = tally
        self._pending = pending
        self._journal = journal
        self._events = events
        # BLOCK submitters, FIFO (always this one deque: the lifecycle holds it
        # to see at no cost whether a finished task's place goes to one of them).
        self.waiters: deque[trio.lowlevel.Task] = deque()

    @property
    def room(self) -> int:
        """Places free now (what recovery may claim)."""
        return max(0, self.capacity - self.reserved - self._tally.outstanding)

    def fits(self) -> bool:
        """Room for one more, the store keeping up, and no blocked submitter
        ahead in line: the common case, decided without `admit`."""
        tally = self._tally
        journal = self._journal
        return (
            tally.queue_depth + tally.active_count + tally.deferred_count
            < self.capacity - self.reserved
            and (journal is None or not journal.backlogged)
            and not self.waiters
        )

    def backlogged(self) -> bool:
        """The store's writer is too far behind to take more work."""
        return self._journal is not None and self._journal.backlogged

    def decide(self, can_wait: bool, woken: bool = False) -> Admit:
        """What to do with one more submission now. ``woken``: the caller was
        first in the line of blocked submitters."""
        if self.fits():
            return Admit.ACCEPT
        if not woken and self.waiters:
            # Blocked submitters are ahead in line: nobody overtakes them.
            return Admit.WAIT if can_wait else Admit.REJECT
        tally = self._tally
        return admit(
            pending=tally.queue_depth,
            active=tally.active_count,
            deferred=tally.deferred_count,
            capacity=self.capacity - self.reserved,
            policy=self.overflow,
            can_wait=can_wait,
            droppable=self._pending.live + self._pending.held,
            backlogged=self.backlogged(),
        )

    async def wait_turn(self, check_open: Callable[[], None]) -> Admit:
        """Park in the line until there may be space, and decide again, until the
        decision is not to wait; ``check_open`` raises if shutdown began meanwhile.
        The caller applies the decision, then calls `wake_next`."""
        front = False
        while True:
            if await self._park(front):
                self.reserved -= 1  # a finished task handed us the place it freed
            # (or the store caught up, or shutdown began: decide again)
            check_open()
            decision = self.decide(True, woken=True)
            if decision is not Admit.WAIT:
                return decision
            front = True  # still first in line

    async def _park(self, front: bool) -> bool:
        """Park, first in line or last, until woken: True if handed a freed place."""
        task = trio.lowlevel.current_task()
        waiters = self.waiters
        if front:
            waiters.appendleft(task)
        else:
            waiters.append(task)

        def abort(_: object) -> trio.lowlevel.Abort:
            waiters.remove(task)
            self.wake_next()  # the one behind may fit now
            return trio.lowlevel.Abort.SUCCEEDED

        woken: bool = await trio.lowlevel.wait_task_rescheduled(abort)
        return woken

    def hold(self, places: int) -> None:
        """Hold ``places`` back from submitters (recovery's room while it claims,
        a schedule's place while it claims its occurrence): give them back with
        `release`, or hand one to a submission (`Core.submit`'s ``held``)."""
        self.reserved += places

    def release(self, places: int) -> None:
        """Give back places `hold` held: a blocked submitter they fit takes one
        (and, once in, wakes the next)."""
        self.reserved -= places
        self.wake_next()

    def wake_next(self, *, handing_place: bool = False) -> None:
        """Wake the longest-waiting blocked submitter: with a freed place handed
        to it (a task finished), or to decide again if there may be room now."""
        if not self.waiters:
            return
        if handing_place:
            self.reserved += 1
        elif self._tally.outstanding >= self.capacity - self.reserved or self.backlogged():
            return  # no room yet
        trio.lowlevel.reschedule(self.waiters.popleft(), outcome.Value(handing_place))

    def wake_all(self) -> None:
        """Shutdown began: every blocked submitter decides again (and learns).
        A place handed to one is its own to give back."""
        waiters = list(self.waiters)
        self.waiters.clear()
        for task in waiters:
            trio.lowlevel.reschedule(task, outcome.Value(False))

    def refusal(self, job: Job, decision: Admit) -> TrioexecError:
        """Count and publish the refusal of ``job``; return the error to raise."""
        self._tally.rejected_count += 1
        behind = self.backlogged()
        reason = rejection_reason(decision, self.overflow, backlogged=behind)
        self.publish_refusal(HealthEventKind.TASK_REJECT, job, reason)
        cls = CapacityExceeded if decision is Admit.FAIL else TaskRejected
        if behind:
            assert self._journal is not None
            backlog, limit = len(self._journal.changes), self._journal.limit
            return cls(
                f"the store is {backlog} changes behind (limit {limit}); "
                f"overflow={self.overflow.value}; task {job.name!r} not accepted"
            )
        tally = self._tally
        return cls(
            f"executor at capacity ({self.capacity}: {tally.queue_depth} pending, "
            f"{tally.active_count} active, {tally.deferred_count} deferred); "
            f"overflow={self.overflow.value}; task {job.name!r} not accepted"
        )

    def publish_refusal(self, kind: HealthEventKind, job: Job, reason: str) -> None:
        tally = self._tally
        self._events.publish(
            kind,
            job.task_id,
            policy=self.overflow,
            reason=reason,
            attributes={
                "pending_depth": tally.queue_depth,
                "active_count": tally.active_count,
                "deferred_count": tally.deferred_count,
                "capacity": self.capacity,
            },
        )
