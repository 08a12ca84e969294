"""The overflow-policy matrix: for each policy and each way of submitting, what a
submission against a full executor does — exception, completion, counters, event."""

import pytest
import trio
import trio.testing

from trioexec import (
    CapacityExceeded,
    HealthEventKind,
    Overflow,
    TaskRejected,
    TaskStatus,
    open_executor,
)

P, D = TaskStatus.PENDING, TaskStatus.DROPPED

# policy, nowait?, expected exception, new ref status, oldest status, event kind, reason
MATRIX = [
    (Overflow.REJECT, False, TaskRejected, None, P, "task_reject", "queue_full"),
    (Overflow.REJECT, True, TaskRejected, None, P, "task_reject", "queue_full"),
    (Overflow.BLOCK, True, TaskRejected, None, P, "task_reject", "queue_full"),
    (
        Overflow.FAIL_FAST,
        False,
        CapacityExceeded,
        None,
        P,
        "task_reject",
        "capacity_exceeded",
    ),
    (
        Overflow.FAIL_FAST,
        True,
        CapacityExceeded,
        None,
        P,
        "task_reject",
        "capacity_exceeded",
    ),
    (
        Overflow.DROP_NEWEST,
        False,
        None,
        D,
        P,
        "task_drop",
        "queue_full",
    ),
    (
        Overflow.DROP_NEWEST,
        True,
        None,
        D,
        P,
        "task_drop",
        "queue_full",
    ),
    (
        Overflow.DROP_OLDEST,
        False,
        None,
        P,
        D,
        "task_drop",
        "queue_full",
    ),
    (
        Overflow.DROP_OLDEST,
        True,
        None,
        P,
        D,
        "task_drop",
        "queue_full",
    ),
]


@pytest.mark.parametrize(
    ("policy", "nowait", "exc", "new_status", "oldest_status", "kind", "reason"), MATRIX
)
async def test_full_executor(policy, nowait, exc, new_status, oldest_status, kind, reason):
    release = trio.Event()
    async with open_executor(max_concurrent_tasks=1, queue_capacity=1, overflow=policy) as ex:
        running = await ex.submit(release.wait)
        await trio.testing.wait_all_tasks_blocked()
        oldest = await ex.submit(release.wait)

        async def submit():
            if nowait:
                return ex.submit_nowait(release.wait)
            return await ex.submit(release.wait)

        if exc is not None:
            with pytest.raises(exc) as info:
                await submit()
            assert exc is CapacityExceeded or not isinstance(info.value, CapacityExceeded)
            new = None
        else:
            new = await submit()
            assert new.status is new_status
        assert oldest.status is oldest_status
        assert running.status is TaskStatus.RUNNING

        ev = ex.events.get_nowait()
        assert ev.kind == kind
        assert ev.policy is policy
        assert ev.reason == reason
        assert ev.attributes == {
            "pending_depth": 1,  # the counts as the refusal found them
            "active_count": 1,
            "deferred_count": 0,
            "capacity": 2,
        }
        dropped_id = (new if new_status is TaskStatus.DROPPED else oldest).task_id
        if kind == "task_drop":
            assert ev.task_id == dropped_id
        m = ex.statistics()
        assert m.submitted_count == 3
        assert m.rejected_count == (1 if exc else 0)
        assert m.dropped_count == (0 if exc else 1)
        assert m.queued_count == (3 if policy is Overflow.DROP_OLDEST else 2)
        release.set()


async def test_block_really_blocks_until_space(autojump_clock):
    async with open_executor(max_concurrent_tasks=1, queue_capacity=1) as ex:
        await ex.submit(trio.sleep, 3)
        await ex.submit(trio.sleep, 3)
        with trio.move_on_after(1):
            await ex.submit(trio.sleep, 3)
            pytest.fail("should have blocked")  # pragma: no cover
        assert ex.statistics().rejected_count == 0  # waiting is not rejecting
        t0 = trio.current_time()
        await ex.submit(trio.sleep, 3)
        assert trio.current_time() - t0 == 2  # space at t=3


async def test_deferred_tasks_count_against_capacity(autojump_clock):
    ev = trio.Event()

    async def waiter(handle):
        await handle.defer_until(ev)

    async with open_executor(max_concurrent_tasks=1, queue_capacity=1, overflow="reject") as ex:
        await ex.submit(waiter)
        await ex.submit(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert ex.slots.in_use == 0
        assert ex.statistics().deferred_count == 2
        with pytest.raises(TaskRejected):
            await ex.submit(trio.sleep, 1)
        ev.set()


async def test_drop_oldest_with_nothing_queued_rejects():
    async with open_executor(
        max_concurrent_tasks=1, queue_capacity=0, overflow="drop_oldest"
    ) as ex:
        release = trio.Event()
        await ex.submit(release.wait)
        await trio.testing.wait_all_tasks_blocked()  # it has started: not droppable
        with pytest.raises(TaskRejected, match="drop_oldest"):
            await ex.submit(release.wait)
        ev = ex.events.get_nowait()
        assert (ev.kind, ev.reason) == (HealthEventKind.TASK_REJECT, "nothing_to_drop")
        release.set()
