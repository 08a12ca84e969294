"""The recovery verdict: what a recovery pass does with one live execution whose
owner's lease expired (or that an operator requeued), written once for every
store (`MemoryStore`, `SQLiteStore`, `PostgresStore` each read the candidates
and carry the verdict out; none of them decides).

Two kinds of execution reach recovery, and they are not alike:

* **expired**: its owner's lease ran out while it was live. Taking it over is a
  recovery attempt: it counts (``recovery_attempts`` + 1), and past
  ``max_recovery_attempts`` the execution is abandoned; one this executor cannot
  re-create is failed ``orphaned`` (its owner is gone; nobody else will).
* **requeued** (`Store.requeue`, ``trioexec retry``): pending with no owner. An
  operator asked for it to run again, or an executor that claimed it gave it
  back unrun as it closed (``Release``, its recovery counted once already); no
  lease expired. Claiming it is not a
  recovery attempt, it is never abandoned for attempts it did not make, and an
  executor that cannot re-create it leaves it for one that can (its error and
  traceback stay until its next attempt ends).
"""

from __future__ import annotations

import enum

from .._records import ExecutionRecord

__all__ = ["Verdict", "claimed_attempts", "is_requeued", "recovery_verdict"]


class Verdict(enum.Enum):
    """What recovery does with one candidate execution."""

    CLAIM = "claim"  #: take it: pending, ours, version + 1 (`claimed_attempts`)
    ORPHAN = "orphan"  #: fail it ``orphaned``: it cannot be re-created, and its owner is gone
    ABANDON = "abandon"  #: fail it ``abandoned``: recovered too often
    LEAVE = "leave"  #: leave it as it is (for an executor that can re-create it, or with room)


def is_requeued(record: ExecutionRecord) -> bool:
    """A live execution with no owner: an operator requeued it (`Store.requeue`),
    or its claimer gave it back as it closed (`trioexec._changes.Release`)."""
    return record.owner is None


def recovery_verdict(
    record: ExecutionRecord, recreatable: bool, max_recovery_attempts: int, room: bool
) -> Verdict:
    """The verdict on ``record`` (a live execution of an expired owner, or a
    requeued one), for an executor that ``recreatable``-ly can run it again and
    has ``room`` for one more claim."""
    if is_requeued(record):
        return Verdict.CLAIM if recreatable and room else Verdict.LEAVE
    if record.recovery_attempts >= max_recovery_attempts:
        return Verdict.ABANDON
    if not recreatable:
        return Verdict.ORPHAN
    return Verdict.CLAIM if room else Verdict.LEAVE


def claimed_attempts(record: ExecutionRecord) -> int:
    """``recovery_attempts`` of ``record`` once claimed: one more after a lease
    expired, the same for a requeued one (an operator's retry is no recovery)."""
    return record.recovery_attempts + (0 if is_requeued(record) else 1)
