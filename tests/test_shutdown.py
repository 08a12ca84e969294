"""Each shutdown policy against pending, active and deferred tasks."""

import pytest
import trio
import trio.testing

from trioexec import (
    ExecutorClosed,
    Overflow,
    ShutdownPolicy,
    SubStatus,
    TaskDefinitionError,
    TaskStatus,
    open_executor,
    task,
)

C, X = TaskStatus.COMPLETED, TaskStatus.CANCELLED


async def three_kinds(ex, fired):
    """One deferred, one active, one pending task (1 slot)."""
    wake = trio.Event()

    async def deferred(handle):
        async def watch():
            await handle.cancelled()
            fired.append(trio.current_time())

        async with trio.open_nursery() as n:
            n.start_soon(watch)
            await handle.defer_until(wake)
            n.cancel_scope.cancel()

    async def active():
        await trio.sleep(10)
        wake.set()

    d = await ex.submit(deferred)
    await trio.testing.wait_all_tasks_blocked()
    a = await ex.submit(active)
    p = await ex.submit(trio.sleep, 1)
    await trio.testing.wait_all_tasks_blocked()
    assert (d.sub_status, a.sub_status, p.status) == (
        SubStatus.DEFERRED,
        SubStatus.ACTIVE,
        TaskStatus.PENDING,
    )
    return d, a, p


@pytest.mark.parametrize(
    ("policy", "expected", "handle_fired"),
    [
        (ShutdownPolicy.DRAIN, (C, C, C), False),
        (ShutdownPolicy.CANCEL_PENDING, (C, C, X), False),
        (ShutdownPolicy.CANCEL, (X, X, X), True),
    ],
)
async def test_policy_on_exit(policy, expected, handle_fired, autojump_clock):
    fired = []
    async with open_executor(max_concurrent_tasks=1, shutdown_policy=policy) as ex:
        d, a, p = await three_kinds(ex, fired)
    assert (d.status, a.status, p.status) == expected
    assert bool(fired) is handle_fired
    m = ex.statistics()
    assert (m.active_count, m.deferred_count, m.queue_depth) == (0, 0, 0)
    assert ex.slots.in_use == 0
    if policy is ShutdownPolicy.CANCEL:
        assert trio.current_time() == 0  # nothing waited for
        assert m.cancellation_requested_count == 3
        assert m.cancellation_observed_count == 3


@pytest.mark.parametrize("policy", list(ShutdownPolicy))
async def test_explicit_shutdown_overrides_and_closes(policy, autojump_clock):
    fired = []
    async with open_executor(max_concurrent_tasks=1) as ex:
        d, a, p = await three_kinds(ex, fired)
        await ex.shutdown(policy)
        assert ex.closed
        assert all(r.done for r in (d, a, p))
        with pytest.raises(ExecutorClosed):
            await ex.submit(trio.sleep, 1)
        with pytest.raises(ExecutorClosed):
            ex.submit_nowait(trio.sleep, 1)
        with pytest.raises(ExecutorClosed):
            await ex.run(trio.sleep, 1)
    assert ex.statistics().submitted_count == 6


async def test_blocked_submitter_sees_executor_closed(autojump_clock):
    async with open_executor(max_concurrent_tasks=1, queue_capacity=0) as ex:
        await ex.submit(trio.sleep, 5)
        result = []

        async def blocked():
            try:
                await ex.submit(trio.sleep, 1)
            except ExecutorClosed:
                result.append("closed")

        async with trio.open_nursery() as n:
            n.start_soon(blocked)
            await trio.testing.wait_all_tasks_blocked()
            await ex.shutdown(ShutdownPolicy.CANCEL_PENDING)
    assert result == ["closed"]


async def test_body_exception_behaves_as_cancel(autojump_clock):
    fired = []
    refs = []
    with pytest.raises(RuntimeError, match="oops"):
        async with open_executor(max_concurrent_tasks=1) as ex:
            refs.extend(await three_kinds(ex, fired))
            raise RuntimeError("oops")
    assert [r.status for r in refs] == [X, X, X]
    assert fired
    assert trio.current_time() == 0


async def test_tasks_option_rejects_duplicates_and_non_specs():
    @task(id="same")
    async def one():
        pass

    @task(id="same")
    async def two():
        pass

    with pytest.raises(TaskDefinitionError, match="same"):
        async with open_executor(tasks=[one, two]):
            pass  # pragma: no cover
    with pytest.raises(TaskDefinitionError, match="TaskSpec"):
        async with open_executor(tasks=[len]):
            pass  # pragma: no cover


async def test_nothing_outlives_the_block(autojump_clock):
    async with trio.open_nursery() as outer:
        async with open_executor(
            max_concurrent_tasks=2, overflow=Overflow.BLOCK, shutdown_policy="cancel"
        ) as ex:
            for _ in range(5):
                await ex.submit(trio.sleep_forever)
        # Only this test's own task remains in the outer nursery.
        assert outer.child_tasks == frozenset()
    assert ex.slots.in_use == 0
