"""Every ExecutorMetrics field, checked against a scenario where it must move."""

import attrs
import pytest
import trio
import trio.testing

from trioexec import Backoff, ExecutorMetrics, Overflow, TaskRejected, open_executor, task


async def test_every_metric_moves(autojump_clock):
    ev = trio.Event()

    async def deferring(handle):
        await handle.defer_until(ev)

    async def boom():
        await trio.sleep(1)
        raise ValueError

    @task(retries=0, backoff=Backoff(initial=1))
    async def over_budget():
        await trio.sleep(3)

    seen: dict[str, int] = {}

    def peak(ex):
        for k, v in attrs.asdict(ex.statistics()).items():
            seen[k] = max(seen.get(k, 0), v)

    async with open_executor(
        max_concurrent_tasks=2, queue_capacity=2, overflow=Overflow.REJECT, event_capacity=2
    ) as ex:
        d = await ex.submit(deferring)
        await trio.testing.wait_all_tasks_blocked()
        peak(ex)  # deferred_count, max_deferred_count
        await ex.submit(boom)  # failed_count
        await ex.submit(trio.sleep, 10, timeout=1)  # timed_out_count
        await ex.submit(over_budget, budget=1)  # timeout_budget_exceeded_count
        peak(ex)  # active_count, queue_depth, max_inflight/outstanding
        with pytest.raises(TaskRejected):  # rejected_count, events (reject)
            await ex.submit(trio.sleep, 1)
        d.cancel()  # cancellation_requested/observed, cancelled_count
        await ex.wait_for_idle()
        ex.submit_nowait(trio.sleep, 0)  # completed_count
        ev.set()
        await ex.wait_for_idle()
        peak(ex)

    async with open_executor(
        max_concurrent_tasks=1, queue_capacity=0, overflow=Overflow.DROP_NEWEST
    ) as ex2:
        await ex2.submit(trio.sleep, 1)
        await ex2.submit(trio.sleep, 1)  # dropped_count

    async with open_executor(max_concurrent_tasks=1) as ex3:
        e = trio.Event()

        async def dr(handle):
            await handle.defer_until(e)

        await ex3.submit(dr)
        await trio.testing.wait_all_tasks_blocked()
        e.set()  # deferral_count, resumed_count

    final = attrs.asdict(ex.statistics())
    m2, m3 = ex2.statistics(), ex3.statistics()
    moved = {k for k, v in final.items() if v or seen.get(k)}
    moved |= {"dropped_count"} if m2.dropped_count == 1 else set()
    moved |= {"deferral_count", "resumed_count"} if m3.resumed_count == 1 else set()
    assert moved == set(attrs.fields_dict(ExecutorMetrics))
    assert final["submitted_count"] == 6
    assert final["queued_count"] == 5
    assert final["rejected_count"] == 1
    assert final["failed_count"] == 1
    assert final["timed_out_count"] == 1
    assert final["timeout_budget_exceeded_count"] == 1
    assert final["cancelled_count"] == 1
    assert final["completed_count"] == 2
    assert final["cancellation_requested_count"] == 1
    assert final["cancellation_observed_count"] == 1
    assert final["max_deferred_count"] == 1
    assert final["max_outstanding_count"] == 4
    assert final["max_inflight_count"] == 3
    assert final["events_dropped_count"] > 0
    assert seen["active_count"] == 2
    assert seen["queue_depth"] == 1
    assert seen["deferred_count"] == 1
    assert (final["active_count"], final["deferred_count"], final["queue_depth"]) == (0, 0, 0)


async def test_statistics_is_a_frozen_snapshot_and_metrics_the_same():
    async with open_executor() as ex:
        s = ex.statistics()
        assert s == ex.metrics
        assert isinstance(s, ExecutorMetrics)
        await ex.submit(trio.sleep, 0)
        assert s.submitted_count == 0  # a snapshot does not move
        assert ex.metrics.submitted_count == 1


async def test_blocked_thread_never_stops_other_tasks():
    """A sync task stuck in its thread holds a slot and a thread, nothing more."""
    import threading

    gate = threading.Event()
    ran = []

    def stuck():
        gate.wait(timeout=30)

    async def quick(i):
        ran.append(i)

    with trio.fail_after(20):
        async with open_executor(max_concurrent_tasks=2, thread_workers=1) as ex:
            blocked = await ex.submit(stuck)
            for i in range(5):
                await ex.run(quick, i)
            assert ran == list(range(5))
            assert blocked.status.value == "running"
            gate.set()
