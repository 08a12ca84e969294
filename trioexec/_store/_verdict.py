"""The recovery verdict on one live execution whose owner's lease expired, or that
is requeued (no owner), written once for every store (each reads the candidates
and carries the verdict out; none of them decides).

Taking over an expired one is a recovery attempt: it counts, past
``max_recovery_attempts`` the execution is abandoned, and one this executor cannot
re-create fails ``orphaned`` (its owner is gone; nobody else will). A requeued one
(`Store.requeue`, or a claim an executor gave back unrun as it closed) made no
attempt: claiming it counts none, it is never abandoned, and an executor that
cannot re-create it leaves it for one that can.
"""

from __future__ import annotations

import enum

from .._records import ExecutionRecord


class Verdict(enum.Enum):
    """What recovery does with one candidate execution."""

    CLAIM = "claim"  #: take it: pending, ours, version + 1 (`claimed_attempts`)
    ORPHAN = "orphan"  #: fail it ``orphaned``: it cannot be re-created, and its owner is gone
    ABANDON = "abandon"  #: fail it ``abandoned``: recovered too often
    LEAVE = "leave"  #: leave it as it is (for an executor that can re-create it, or with room)


def recovery_verdict(
    record: ExecutionRecord, recreatable: bool, max_recovery_attempts: int, room: bool
) -> Verdict:
    """The verdict on ``record`` (a live execution of an expired owner, or a
    requeued one), for an executor that ``recreatable``-ly can run it again and
    has ``room`` for one more claim."""
    if record.owner is None:  # requeued, or given back unrun (`trioexec._changes.Release`)
        return Verdict.CLAIM if recreatable and room else Verdict.LEAVE
    if record.recovery_attempts >= max_recovery_attempts:
        return Verdict.ABANDON
    if not recreatable:
        return Verdict.ORPHAN
    return Verdict.CLAIM if room else Verdict.LEAVE


def claimed_attempts(record: ExecutionRecord) -> int:
    """``recovery_attempts`` of ``record`` once claimed: one more after a lease
    expired, the same for a requeued one (an operator's retry is no recovery)."""
    return record.recovery_attempts + (0 if record.owner is None else 1)
