"""Accepting a submission is all or nothing (issue 30, item 11): whatever raises
while a task is accepted leaves no trace. Nothing is counted, queued, journaled
or dropped for it, its key keeps no state, its chosen id is free again, and the
executor still drains (and cancels) as if the call had not been made.

The failure provoked here is a real one: a task spec's arguments are written to
the store as JSON, and arguments nested 100,000 deep make ``json.dumps`` raise
``RecursionError`` in the middle of the acceptance (before the fix, after the
task was counted and queued: the drain then hung)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import trioexec
from trioexec import (
    HealthEventKind,
    KeyLimit,
    KeyStatistics,
    MemoryStore,
    Overflow,
    ShutdownPolicy,
    TaskStatus,
    open_executor,
)
from trioexec.testing import FakeWallClock


def nested(levels: int = 100_000) -> list[object]:
    """A list nested ``levels`` deep: Python holds it, JSON cannot write it."""
    value: list[object] = []
    for _ in range(levels):
        value = [value]
    return value


@trioexec.task(key="k")
async def work(value: object) -> None:
    await trio.sleep(1)


def counts(ex: trioexec.Executor) -> tuple[int, ...]:
    """Accepted, queued or running, dropped, refused."""
    s = ex.statistics()
    return (s.queued_count, s.queue_depth + s.active_count, s.dropped_count, s.rejected_count)


async def events_of(ex: trioexec.Executor) -> list[HealthEventKind]:
    return [event.kind async for event in ex.events]  # (ends: the executor has closed)


@pytest.mark.parametrize(
    ("overflow", "full", "how"),
    [
        (Overflow.BLOCK, False, "submit"),  # room: the fast path
        (Overflow.BLOCK, False, "submit_nowait"),
        (Overflow.BLOCK, True, "submit"),  # waits for room, then raises
        (Overflow.DROP_NEWEST, True, "submit"),
        (Overflow.DROP_OLDEST, True, "submit"),  # nothing older may be dropped for it
    ],
)
async def test_a_submission_that_raises_while_accepted_leaves_no_trace(
    autojump_clock, overflow, full, how
):
    store = MemoryStore(clock=FakeWallClock(1_000.0))
    limits = KeyLimit(concurrency=1, rate=1)
    with trio.fail_after(60):  # (before the fix: the drain hung)
        async with open_executor(
            store=store,
            key_limits=limits,
            max_concurrent_tasks=1,
            queue_capacity=1,
            overflow=overflow,
        ) as ex:
            earlier = []
            if full:  # one running, one queued: the executor is full
                earlier = [await ex.submit(trio.sleep, 1), await ex.submit(trio.sleep, 1)]
            before = counts(ex)
            with pytest.raises(RecursionError):
                if how == "submit":
                    await ex.submit(work, nested(), task_id="mine")
                else:
                    ex.submit_nowait(work, nested(), task_id="mine")
            if full and overflow is Overflow.BLOCK:
                before = (before[0], before[1] - 1, *before[2:])  # (one ended meanwhile)
            assert counts(ex) == before
            assert ex.key_statistics("k") == KeyStatistics(key="k")
            assert "k" not in ex._core.pending.keys.states  # no state of the key either
            assert store.execution("mine") is None
            await ex.wait_for_idle()
            again = await ex.submit(work, [1], task_id="mine")  # its id is free again
        kinds = await events_of(ex)
    assert [(await ref.wait()).status for ref in earlier] == [TaskStatus.COMPLETED] * len(earlier)
    assert (await again.wait()).status is TaskStatus.COMPLETED
    assert ex.statistics().dropped_count == 0
    assert HealthEventKind.TASK_DROP not in kinds
    assert store.execution("mine").status is TaskStatus.COMPLETED


async def test_after_a_submission_raised_a_cancel_ends_the_executor_cleanly(autojump_clock):
    """The block raises: the shutdown cancels what is left (the running task;
    nothing of the submission that raised), and the block's own error comes out."""
    store = MemoryStore(clock=FakeWallClock(1_000.0))
    with pytest.raises(LookupError, match="the body's own"):
        with trio.fail_after(60):
            async with open_executor(store=store, key_limits=KeyLimit(concurrency=1)) as ex:
                running = await ex.submit(work, [1])
                await trio.testing.wait_all_tasks_blocked()
                with pytest.raises(RecursionError):
                    await ex.submit(work, nested())
                stats = ex.key_statistics("k")
                assert (stats.active, stats.pending) == (1, 0)
                raise LookupError("the body's own")
    assert (await running.wait()).status is TaskStatus.CANCELLED
    assert ex.statistics().cancelled_count == 1


@pytest.mark.parametrize("policy", [ShutdownPolicy.DRAIN, ShutdownPolicy.CANCEL])
async def test_after_a_submission_raised_shutdown_ends_under_either_policy(autojump_clock, policy):
    store = MemoryStore(clock=FakeWallClock(1_000.0))
    with trio.fail_after(60):
        async with open_executor(store=store, shutdown_policy=policy) as ex:
            with pytest.raises(RecursionError):
                await ex.submit(work, nested())
            assert counts(ex) == (0, 0, 0, 0)
    assert ex.statistics().submitted_count == 1  # (every call counts there, and only there)
