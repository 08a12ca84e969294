"""The recovery verdict (issue 30 item 7): an operator's requeue is no lease
expiry. A requeued execution is claimed without counting a recovery attempt, is
never abandoned for attempts it did not make (``max_recovery_attempts=0``
included), and an executor that cannot re-create it leaves it, its error kept,
for one that can. The verdict is one pure function (`recovery_verdict`), tested
here by a table and a hypothesis property, and the three stores carry it out
alike (a conformance test over `STORE_KINDS`), as an executor does end to end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from hypothesis import given
from hypothesis import strategies as st

import trioexec
from trioexec import ExecutionRecord, SQLiteStore, TaskStatus
from trioexec._changes import Finish, Release, Start, submitted
from trioexec._store._verdict import Verdict, claimed_attempts, recovery_verdict
from trioexec.testing import FakeWallClock

WHO = "ops@host pid 7"
NOW = 1_000.0


def _record(*, owner: str | None, attempts: int) -> ExecutionRecord:
    return ExecutionRecord(task_id="t", name="n", owner=owner, recovery_attempts=attempts)


# (owner, recovery attempts, re-creatable, max attempts, room) -> verdict
TABLE = [
    # A lease expired: counted, abandoned past the bound, orphaned if not re-creatable.
    ("dead", 0, True, 3, True, Verdict.CLAIM),
    ("dead", 2, True, 3, True, Verdict.CLAIM),
    ("dead", 3, True, 3, True, Verdict.ABANDON),
    ("dead", 3, False, 3, True, Verdict.ABANDON),
    ("dead", 0, False, 3, True, Verdict.ORPHAN),
    ("dead", 0, False, 3, False, Verdict.ORPHAN),  # (failing one needs no room)
    ("dead", 0, True, 3, False, Verdict.LEAVE),
    ("dead", 0, True, 0, True, Verdict.ABANDON),
    # Requeued by an operator: no owner, never abandoned, never orphaned.
    (None, 0, True, 0, True, Verdict.CLAIM),
    (None, 0, False, 0, True, Verdict.LEAVE),
    (None, 5, True, 3, True, Verdict.CLAIM),
    (None, 5, False, 3, True, Verdict.LEAVE),
    (None, 0, True, 3, False, Verdict.LEAVE),
]


def test_the_verdict_table() -> None:
    for owner, attempts, recreatable, bound, room, want in TABLE:
        got = recovery_verdict(_record(owner=owner, attempts=attempts), recreatable, bound, room)
        assert got is want, (owner, attempts, recreatable, bound, room)


@given(
    owner=st.sampled_from([None, "dead"]),
    attempts=st.integers(0, 10),
    recreatable=st.booleans(),
    bound=st.integers(0, 10),
    room=st.booleans(),
)
def test_a_requeued_execution_is_never_failed_and_only_an_expiry_counts(
    owner: str | None, attempts: int, recreatable: bool, bound: int, room: bool
) -> None:
    record = _record(owner=owner, attempts=attempts)
    verdict = recovery_verdict(record, recreatable, bound, room)
    if owner is None:
        assert verdict in (Verdict.CLAIM, Verdict.LEAVE)
        assert claimed_attempts(record) == attempts
    else:
        assert claimed_attempts(record) == attempts + 1
    # A claim needs room and a way to re-create it; without room nothing is claimed.
    assert verdict is not Verdict.CLAIM or (recreatable and room)
    if verdict is Verdict.ABANDON:
        assert owner is not None
        assert attempts >= bound


def _dead_letter(store: Any) -> None:
    """``dead``: ran once on A (lease live), failed with its own error, requeued."""
    store.heartbeat("A", NOW + 60)
    store.write(
        [
            submitted("dead", 1, "job", None, "spec.x", "[1]", "A", 1.0),
            Start(("dead", 1, 1, 2.0)),
            Finish(("dead", 1, TaskStatus.FAILED, 5.0, "ValueError('real')", "Traceback", None)),
        ]
    )
    [requeued] = store.requeue(["dead"], who=WHO).requeued
    assert (requeued.owner, requeued.recovery_attempts) == (None, 0)


def test_a_requeued_dead_letter_survives_an_executor_with_no_recovery_attempts(
    make_store: Any,
) -> None:
    store = make_store(clock=lambda: NOW)
    _dead_letter(store)
    # An executor that cannot re-create it, with max_recovery_attempts=0: leaves it.
    found = store.recover("C", NOW, lambda r: False, 0)
    assert (found.claimed, found.orphaned, found.abandoned) == ([], [], [])
    record = store.execution("dead")
    assert (record.status, record.owner, record.error) == (
        TaskStatus.PENDING,
        None,
        "ValueError('real')",
    )
    # One that can, also with max_recovery_attempts=0: claims it, counting no attempt.
    found = store.recover("D", NOW, lambda r: True, 0)
    assert (found.orphaned, found.abandoned) == ([], [])
    [claimed] = found.claimed
    assert (claimed.task_id, claimed.owner, claimed.recovery_attempts) == ("dead", "D", 0)
    assert claimed.error == "ValueError('real')"  # (until its next attempt ends)
    # D's lease expires: that is a recovery attempt, and with a bound of 0 it is abandoned.
    [abandoned] = store.recover("E", NOW, lambda r: True, 0).abandoned
    assert abandoned.task_id == "dead"
    assert abandoned.error.startswith("abandoned after 0 recovery attempts")


def test_a_requeued_dead_letter_claimed_then_expired_counts_one_attempt(make_store: Any) -> None:
    store = make_store(clock=lambda: NOW)
    _dead_letter(store)
    [claimed] = store.recover("D", NOW, lambda r: True, 1).claimed
    assert claimed.recovery_attempts == 0
    # D dies: E recovers it, and that one counts.
    [again] = store.recover("E", NOW, lambda r: True, 1).claimed
    assert (again.owner, again.recovery_attempts) == ("E", 1)
    # E dies too: one attempt was allowed.
    [abandoned] = store.recover("F", NOW, lambda r: True, 1).abandoned
    assert abandoned.recovery_attempts == 1


def test_a_claim_given_back_is_ownerless_and_its_next_claim_counts_nothing_more(
    make_store: Any,
) -> None:
    store = make_store(clock=lambda: NOW)
    store.write(
        [submitted("t", 1, "job", None, "spec.x", "[1]", "A", 1.0), Start(("t", 1, 1, 2.0))]
    )
    store.heartbeat("A", NOW - 1)  # A died
    [claimed] = store.recover("B", NOW, lambda r: True, 1).claimed
    assert (claimed.owner, claimed.version, claimed.recovery_attempts) == ("B", 2, 1)
    store.heartbeat("B", NOW + 60)  # B lives, but gives the claim back (it was closing)
    assert store.write([Release(("t", 2))]) == []
    given = store.execution("t")
    assert (given.status, given.owner, given.version, given.recovery_attempts) == (
        TaskStatus.PENDING,
        None,
        3,
        1,
    )
    assert store.write([Release(("t", 2))]) == ["t"]  # (fenced: an old version)
    # Any executor claims it at once, and with max_recovery_attempts=1 it is not abandoned.
    [again] = store.recover("C", NOW, lambda r: True, 1).claimed
    assert (again.owner, again.version, again.recovery_attempts) == ("C", 4, 1)


@trioexec.task(id="job")
async def job(n: int) -> int:
    return n * 2


async def test_a_retried_task_waits_for_an_executor_that_can_run_it(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """End to end: ``trioexec retry`` of a dead letter, an executor with
    ``max_recovery_attempts=0`` and no spec for it, then one with its spec."""
    clock = FakeWallClock(start=NOW)
    with SQLiteStore(tmp_path / "runs.db", clock=clock, inline=True) as store:
        store.heartbeat("A", NOW + 3600)
        store.write(
            [
                submitted("dead", 1, "job", None, "job", "[21]", "A", 1.0),
                Start(("dead", 1, 1, 2.0)),
                Finish(("dead", 1, TaskStatus.FAILED, 5.0, "ValueError('real')", "tb", None)),
            ]
        )
        store.requeue(["dead"], who=WHO)
        async with trioexec.open_executor(
            store=store, recover=True, max_recovery_attempts=0, lease=3.0
        ):
            await trio.sleep(10)  # (three recovery passes)
        record = store.execution("dead")
        assert (record.status, record.error) == (TaskStatus.PENDING, "ValueError('real')")
        async with trioexec.open_executor(
            store=store, recover=True, max_recovery_attempts=0, tasks=[job]
        ) as ex:
            await ex.wait_for_idle()
        record = store.execution("dead")
        assert (record.status, record.attempt, record.recovery_attempts) == (
            TaskStatus.COMPLETED,
            2,
            0,
        )
