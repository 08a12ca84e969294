"""Hypothesis over random submission sequences, overflow policies and capacities:
invariants 1-3 of ARCHITECTURE.md (slot bound, no lost task, bounded memory) and
the arithmetic that ties the counters together."""

from __future__ import annotations

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trioexec import (
    CapacityExceeded,
    Overflow,
    ShutdownPolicy,
    TaskHandle,
    TaskRejected,
    TaskStatus,
    open_executor,
)

op = st.one_of(
    st.tuples(st.just("submit"), st.integers(0, 4), st.integers(0, 6), st.booleans()),
    st.tuples(st.just("nowait"), st.integers(0, 4), st.integers(0, 6)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("cancel_pending")),
    st.tuples(st.just("advance"), st.integers(1, 5)),
)
TERMINAL = {
    TaskStatus.COMPLETED,
    TaskStatus.FAILED,
    TaskStatus.CANCELLED,
    TaskStatus.TIMED_OUT,
    TaskStatus.DROPPED,
}


async def scenario(slots, queue_capacity, policy, shutdown, ops):
    active_now = 0
    peak = 0

    async def job(work: int, defer_for: int, handle: TaskHandle) -> None:
        nonlocal active_now, peak
        active_now += 1
        peak = max(peak, active_now)
        assert active_now <= slots
        try:
            await trio.sleep(work)
            if defer_for:
                active_now -= 1
                try:
                    deadline = trio.current_time() + defer_for
                    await handle.defer_until(lambda: trio.current_time() >= deadline, 1)
                finally:
                    active_now += 1
                    # A task cancelled while deferred ends at once, without a slot
                    # (issue 13): only code holding one counts against the bound.
                    assert active_now <= slots or not handle.slot.is_held
        finally:
            active_now -= 1

    refs = []
    refused = 0
    gave_up = 0  # BLOCKed submits whose caller stopped waiting
    capacity = slots + queue_capacity
    async with open_executor(
        max_concurrent_tasks=slots,
        queue_capacity=queue_capacity,
        overflow=policy,
        shutdown_policy=shutdown,
    ) as ex:

        def check() -> None:
            m = ex.statistics()
            assert ex.slots.in_use <= slots
            assert m.queue_depth + m.active_count + m.deferred_count <= capacity
            assert m.max_outstanding_count <= capacity
            assert m.active_count <= slots

        for o in ops:
            if o[0] == "submit" or o[0] == "nowait":
                try:
                    if o[0] == "submit":
                        with trio.move_on_after(3 if o[3] else 1000) as waited:
                            refs.append(await ex.submit(job, o[1], o[2]))
                        if waited.cancelled_caught:
                            assert policy is Overflow.BLOCK
                            gave_up += 1
                    else:
                        refs.append(ex.submit_nowait(job, o[1], o[2]))
                except CapacityExceeded:
                    assert policy is Overflow.FAIL_FAST
                    refused += 1
                except TaskRejected:
                    assert policy in (Overflow.REJECT, Overflow.BLOCK, Overflow.DROP_OLDEST)
                    refused += 1
            elif o[0] == "cancel" and refs:
                refs[o[1] % len(refs)].cancel()
            elif o[0] == "cancel_pending":
                ex.cancel_pending()
            elif o[0] == "advance":
                await trio.sleep(o[1])
            check()
            await trio.testing.wait_all_tasks_blocked()
            check()

    # No lost task: every accepted ref has exactly one terminal completion.
    completions = [await r.wait() for r in refs]
    assert all(c.status in TERMINAL for c in completions)
    assert len({c.task_id for c in completions}) == len(refs)
    m = ex.statistics()
    ended = (
        m.completed_count + m.failed_count + m.cancelled_count + m.timed_out_count + m.dropped_count
    )
    assert ended == len(refs)
    assert m.failed_count == 0
    assert m.rejected_count == refused
    assert m.submitted_count == len(refs) + refused + gave_up
    dropped_at_submit = sum(
        1 for r in refs if r.status is TaskStatus.DROPPED and r.completion.started_at is None
    )
    assert m.queued_count + refused <= m.submitted_count
    assert m.queued_count >= len(refs) - dropped_at_submit
    if shutdown is ShutdownPolicy.DRAIN and policy not in (
        Overflow.DROP_NEWEST,
        Overflow.DROP_OLDEST,
    ):
        assert m.dropped_count == 0
    assert (m.active_count, m.deferred_count, m.queue_depth) == (0, 0, 0)
    # A deferral ends in a resume, or (cancelled) in the task's end.
    assert m.resumed_count <= m.deferral_count
    if shutdown is not ShutdownPolicy.CANCEL and not any(o[0] == "cancel" for o in ops):
        assert m.deferral_count == m.resumed_count
    assert m.cancellation_observed_count <= m.cancellation_requested_count
    assert peak <= slots
    assert ex.slots.in_use == 0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    slots=st.integers(1, 3),
    queue_capacity=st.integers(0, 3),
    policy=st.sampled_from(Overflow),
    shutdown=st.sampled_from(ShutdownPolicy),
    ops=st.lists(op, max_size=30),
)
def test_invariants_over_random_submissions(slots, queue_capacity, policy, shutdown, ops):
    trio.run(
        scenario,
        slots,
        queue_capacity,
        policy,
        shutdown,
        ops,
        clock=trio.testing.MockClock(autojump_threshold=0),
    )


async def test_topoexec_overload_exactly_capacity_accepted(autojump_clock):
    """Many concurrent submitters against a small capacity that never frees up:
    exactly `capacity` are accepted, every other one is rejected, nothing deadlocks."""
    release = trio.Event()
    accepted, rejected = [], []

    async with open_executor(
        max_concurrent_tasks=2, queue_capacity=3, overflow=Overflow.REJECT
    ) as ex:

        async def submitter(i):
            try:
                accepted.append(await ex.submit(release.wait))
            except TaskRejected:
                rejected.append(i)

        async with trio.open_nursery() as n:
            for i in range(100):
                n.start_soon(submitter, i)
        assert len(accepted) == 5
        assert len(rejected) == 95
        assert ex.statistics().rejected_count == 95
        release.set()
    assert all(r.status is TaskStatus.COMPLETED for r in accepted)


async def test_blocked_submitters_are_admitted_fifo_as_space_frees(autojump_clock):
    async with open_executor(max_concurrent_tasks=1, queue_capacity=0) as ex:
        await ex.submit(trio.sleep, 10)
        admitted = []

        async def submitter(i):
            await ex.submit(trio.sleep, 10)
            admitted.append((i, trio.current_time()))

        async with trio.open_nursery() as n:
            for i in range(3):
                n.start_soon(submitter, i)
                await trio.testing.wait_all_tasks_blocked()
        assert [i for i, _ in admitted] == [0, 1, 2]
        assert [t for _, t in admitted] == [10, 20, 30]
