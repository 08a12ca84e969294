import pytest
import trio

from trioexec import (
    Backoff,
    DeterministicExecutor,
    Overflow,
    TaskRejected,
    TaskStatus,
    task,
)


async def test_nothing_runs_until_run_ready_then_fifo():
    order = []

    async def job(i):
        order.append(i)
        return i * i

    ex = DeterministicExecutor(max_concurrent_tasks=2)
    refs = [ex.submit_nowait(job, i) for i in range(5)]
    await trio.lowlevel.checkpoint()
    assert order == []
    assert all(r.status is TaskStatus.PENDING for r in refs)
    done = await ex.run_ready(max_tasks=2)
    assert [c.result for c in done] == [0, 1]
    assert order == [0, 1]
    done = await ex.run_ready()
    assert [c.result for c in done] == [4, 9, 16]
    assert order == [0, 1, 2, 3, 4]
    assert await ex.run_ready() == []
    assert ex.statistics().completed_count == 5


async def test_cancel_event_cancels_pending_before_next_task():
    stop = trio.Event()
    ran = []

    async def job(i):
        ran.append(i)
        if i == 1:
            stop.set()

    ex = DeterministicExecutor()
    refs = [ex.submit_nowait(job, i) for i in range(4)]
    done = await ex.run_ready(cancel=stop)
    assert ran == [0, 1]
    assert [c.status for c in done] == [
        TaskStatus.COMPLETED,
        TaskStatus.COMPLETED,
        TaskStatus.CANCELLED,
        TaskStatus.CANCELLED,
    ]
    assert [r.status for r in refs[2:]] == [TaskStatus.CANCELLED] * 2
    m = ex.statistics()
    assert (m.cancellation_requested_count, m.cancellation_observed_count) == (2, 2)


async def test_admission_block_acts_as_reject():
    ex = DeterministicExecutor(max_concurrent_tasks=1, queue_capacity=1)
    ex.submit_nowait(trio.sleep, 0)
    ex.submit_nowait(trio.sleep, 0)
    with pytest.raises(TaskRejected):
        ex.submit_nowait(trio.sleep, 0)
    assert ex.statistics().rejected_count == 1


async def test_drop_newest():
    ex = DeterministicExecutor(max_concurrent_tasks=1, queue_capacity=0, overflow="drop_newest")
    kept = ex.submit_nowait(trio.sleep, 0)
    dropped = ex.submit_nowait(trio.sleep, 0)
    assert dropped.status is TaskStatus.DROPPED
    await ex.run_ready()
    assert kept.status is TaskStatus.COMPLETED
    assert ex.statistics().dropped_count == 1
    assert Overflow.DROP_NEWEST == "drop_newest"


async def test_defer_waits_inline_and_retries_work(autojump_clock):
    ev = trio.Event()
    log = []

    async def deferring(handle):
        log.append("defer")
        await handle.defer_until(lambda: trio.current_time() >= 3, poll_interval=1)
        log.append("resumed")

    n = 0

    @task(retries=1, backoff=Backoff(initial=2))
    async def flaky():
        nonlocal n
        n += 1
        if n == 1:
            raise OSError
        return "second"

    ex = DeterministicExecutor(max_concurrent_tasks=1)
    ex.submit_nowait(deferring)
    ex.submit_nowait(flaky)
    t0 = trio.current_time()
    done = await ex.run_ready()
    assert trio.current_time() - t0 == 5  # 3 s deferred inline, then a 2 s backoff
    assert log == ["defer", "resumed"]
    assert [c.status for c in done] == [TaskStatus.COMPLETED] * 2
    assert done[1].attempts == 2
    assert ex.statistics().deferral_count == 1
    assert not ev.is_set()


async def test_bad_max_tasks():
    with pytest.raises(ValueError, match="max_tasks"):
        await DeterministicExecutor().run_ready(max_tasks=-1)


async def test_with_an_inline_store_records_every_task(tmp_path):
    from trioexec import MemoryStore, SQLiteStore

    store = MemoryStore()
    ex = DeterministicExecutor(store=store)
    refs = [ex.submit_nowait(trio.sleep, 0) for _ in range(3)]
    await ex.run_ready(max_tasks=2)
    assert [store.execution(r.task_id).status for r in refs] == [
        TaskStatus.COMPLETED,
        TaskStatus.COMPLETED,
        TaskStatus.PENDING,
    ]
    assert (await refs[0].wait()).ok  # acknowledged: durable

    with SQLiteStore(tmp_path / "d.db") as threaded, pytest.raises(ValueError, match="inline"):
        DeterministicExecutor(store=threaded)
    with pytest.raises(ValueError, match="recover"):
        DeterministicExecutor(store=MemoryStore(), recover=True)
