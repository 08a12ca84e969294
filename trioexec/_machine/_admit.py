"""The admission decision: who gets in, who waits, who is refused.

A pure, await-free function over counts (`admit`), tested exhaustively without
an event loop, in the manner of httpcore's connection pool: decide
synchronously, then park or act. Part of the machine (`trioexec._machine`);
`trioexec._admission.Gate` is its shell.
"""

from __future__ import annotations

import enum

from .._records import Overflow

__all__ = ["Admit", "admit", "rejection_reason"]


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
    if backlogged:
        if policy is Overflow.BLOCK:
            return Admit.WAIT if can_wait else Admit.REJECT
        return Admit.FAIL if policy is Overflow.FAIL_FAST else Admit.REJECT
    if pending + active + deferred < capacity:
        return Admit.ACCEPT
    if policy is Overflow.BLOCK:
        return Admit.WAIT if can_wait else Admit.REJECT
    if policy is Overflow.REJECT:
        return Admit.REJECT
    if policy is Overflow.FAIL_FAST:
        return Admit.FAIL
    if policy is Overflow.DROP_NEWEST:
        return Admit.DROP_NEW
    # DROP_OLDEST needs someone pending to drop; with nothing queued it rejects.
    if droppable is None:
        droppable = pending
    return Admit.DROP_OLDEST if droppable > 0 else Admit.REJECT


def rejection_reason(decision: Admit, policy: Overflow, *, backlogged: bool = False) -> str:
    """The ``reason`` attribute of the health event a refusal emits."""
    if backlogged:
        return "store_backlog"
    if decision is Admit.FAIL:
        return "capacity_exceeded"
    if decision is Admit.REJECT and policy is Overflow.DROP_OLDEST:
        return "nothing_to_drop"
    return "queue_full"
