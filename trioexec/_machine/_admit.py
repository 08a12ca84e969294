"""The admission decision: who gets in, who waits, who is refused.

`admit` is a pure, await-free function over counts, tested without an event
loop (as httpcore's connection pool: decide synchronously, then park or act).
Its shell, `trioexec._admission.Gate`, parks and wakes the submitters in line.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from .._errors import CapacityExceeded, TaskRejected, TrioexecError
from .._metrics import Tally
from .._records import HealthEventKind, Overflow

if TYPE_CHECKING:
    from .._events import EventStream
    from .._taskref import Job
    from ._pending import Pending

__all__ = ["Admission", "Admit", "admit", "rejection_reason"]


class Backlog(Protocol):
    """The journal, as admission sees it: how far behind the store is."""

    changes: list[Any]
    limit: int

    @property
    def backlogged(self) -> bool: ...


class Admit(enum.Enum):
    """The decision for one submission."""

    ACCEPT = enum.auto()  # queue it
    WAIT = enum.auto()  # park until space, then decide again
    REJECT = enum.auto()  # raise TaskRejected
    FAIL = enum.auto()  # raise CapacityExceeded
    DROP_NEW = enum.auto()  # complete the new one as DROPPED
    DROP_OLDEST = enum.auto()  # drop the oldest pending one, then accept


def admit(
    *,
    pending: int,
    active: int,
    deferred: int,
    capacity: int,
    policy: Overflow,
    can_wait: bool = True,
    droppable: int | None = None,
    backlogged: bool = False,
) -> Admit:
    """Decide what to do with one more submission.

    ``capacity`` bounds pending + active + deferred. ``can_wait`` is False for
    ``submit_nowait``, where ``BLOCK`` acts as ``REJECT``. ``droppable`` is how
    many pending submissions ``DROP_OLDEST`` may drop (those that never started;
    default: all pending). ``backlogged``: the store is too far behind; only
    ``BLOCK`` waits, every other policy refuses (dropping would write more).
    """
    if not backlogged and pending + active + deferred < capacity:
        return Admit.ACCEPT
    if policy is Overflow.BLOCK:
        return Admit.WAIT if can_wait else Admit.REJECT
    if policy is Overflow.FAIL_FAST:
        return Admit.FAIL
    if backlogged or policy is Overflow.REJECT:
        return Admit.REJECT
    if policy is Overflow.DROP_NEWEST:
        return Admit.DROP_NEW
    # DROP_OLDEST needs someone pending to drop; with nothing queued it rejects.
    return Admit.DROP_OLDEST if (pending if droppable is None else droppable) > 0 else Admit.REJECT


def rejection_reason(decision: Admit, policy: Overflow, *, backlogged: bool = False) -> str:
    """The ``reason`` attribute of the health event a refusal emits."""
    if backlogged:
        return "store_backlog"
    if decision is Admit.FAIL:
        return "capacity_exceeded"
    if decision is Admit.REJECT and policy is Overflow.DROP_OLDEST:
        return "nothing_to_drop"
    return "queue_full"


@attrs.define(eq=False)
class Admission:
    """The admission of one executor: the bound (pending + active + deferred <=
    ``capacity``, less the places held back in ``reserved``) and the FIFO line
    of submitters blocked for space (``waiters``, the shell's, opaque here)."""

    capacity: int
    overflow: Overflow
    _tally: Tally
    _pending: Pending
    _journal: Backlog | None
    _events: EventStream
    # places held back: handed to woken submitters, or recovery's
    reserved: int = attrs.field(default=0, init=False)
    # Always this one deque: the lifecycle holds it to see at no cost
    # whether a finished task's place goes to a BLOCK submitter.
    waiters: deque[Any] = attrs.field(factory=deque, init=False)

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
            droppable=self._pending.startable + self._pending.keys.held,
            backlogged=self.backlogged(),
        )

    def next_waiter(self, handing_place: bool) -> Any:
        """The longest-waiting blocked submitter to wake (taken out of line), with
        a freed place handed to it (a task finished), or to decide again if there
        may be room now; None if nobody is to be woken."""
        if not self.waiters:
            return None
        if handing_place:
            self.reserved += 1
        elif self._tally.outstanding >= self.capacity - self.reserved or self.backlogged():
            return None  # no room yet
        return self.waiters.popleft()

    def refusal(self, job: Job, decision: Admit) -> TrioexecError:
        """Count and publish the refusal of ``job``; return the error to raise."""
        self._tally.rejected_count += 1
        behind = self.backlogged()
        reason = rejection_reason(decision, self.overflow, backlogged=behind)
        self.publish_refusal(HealthEventKind.TASK_REJECT, job, reason)
        cls = CapacityExceeded if decision is Admit.FAIL else TaskRejected
        tally, journal = self._tally, self._journal
        if behind:
            assert journal is not None
            why = f"the store is {len(journal.changes)} changes behind (limit {journal.limit})"
        else:
            why = (
                f"executor at capacity ({self.capacity}: {tally.queue_depth} pending, "
                f"{tally.active_count} active, {tally.deferred_count} deferred)"
            )
        return cls(f"{why}; overflow={self.overflow.value}; task {job.name!r} not accepted")

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
