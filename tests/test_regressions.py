"""One test per bug found in review; each failed before its fix."""

import pytest
import trio
import trio.testing

import trioexec
from trioexec import (
    Backoff,
    Overflow,
    TaskRejected,
    TaskStatus,
    open_executor,
    task,
)


async def test_drop_oldest_never_drops_a_started_task(autojump_clock):
    @task(retries=1, backoff=Backoff(initial=5))
    async def flaky():
        raise ValueError

    async with open_executor(
        max_concurrent_tasks=1, queue_capacity=0, overflow=Overflow.DROP_OLDEST
    ) as ex:
        retrying = ex.submit_nowait(flaky)
        await trio.sleep(1)  # between attempts: pending, but it has started
        assert ex.statistics().queue_depth == 1
        with pytest.raises(TaskRejected, match="drop_oldest"):
            ex.submit_nowait(trio.sleep, 0)
    assert (await retrying.wait()).attempts == 2


async def test_drop_oldest_drops_the_oldest_queued(autojump_clock):
    async with open_executor(
        max_concurrent_tasks=1, queue_capacity=2, overflow=Overflow.DROP_OLDEST
    ) as ex:
        running = await ex.submit(trio.sleep, 5)
        c = await ex.submit(trio.sleep, 1, name="C")
        d = await ex.submit(trio.sleep, 1, name="D")
        e = await ex.submit(trio.sleep, 1, name="E")
    assert [r.status for r in (running, c, d, e)] == [
        TaskStatus.COMPLETED,
        TaskStatus.DROPPED,
        TaskStatus.COMPLETED,
        TaskStatus.COMPLETED,
    ]


async def test_growing_the_pool_starts_queued_tasks_at_once(autojump_clock):
    async with open_executor(max_concurrent_tasks=1, shutdown_policy="cancel") as ex:
        refs = [await ex.submit(trio.sleep_forever) for _ in range(3)]
        await trio.testing.wait_all_tasks_blocked()
        assert ex.statistics().active_count == 1
        ex.slots.total = 3
        await trio.testing.wait_all_tasks_blocked()
        assert [r.status for r in refs] == [TaskStatus.RUNNING] * 3
        assert ex.slots.in_use == 3


async def test_shrinking_the_pool_retires_workers(autojump_clock):
    meter = {"now": 0, "peak_after_shrink": 0}

    async def job():
        meter["now"] += 1
        await trio.sleep(1)
        meter["now"] -= 1

    async with open_executor(max_concurrent_tasks=3) as ex:
        for _ in range(3):
            await ex.submit(job)
        ex.slots.total = 1
        for _ in range(6):
            await ex.submit(job)
        await trio.sleep(1.5)  # the first three are done; now one at a time
        for _ in range(5):
            assert meter["now"] <= 1
            await trio.sleep(1)


async def test_outer_cancel_during_exit_drain_cancels_the_queue(autojump_clock):
    with trio.move_on_after(5):
        async with open_executor(max_concurrent_tasks=1) as ex:
            refs = [ex.submit_nowait(trio.sleep, 10) for _ in range(2)]
    assert [r.status for r in refs] == [TaskStatus.CANCELLED] * 2
    assert ex.statistics().queue_depth == 0


async def test_deferred_sync_task_lends_its_thread_token():
    """Real threads; fail_after only guards against the old deadlock."""
    ev = trio.Event()

    def a(handle):
        handle.defer_until_sync(ev)
        return "a"

    def b():
        trio.from_thread.run_sync(ev.set)
        return "b"

    with trio.fail_after(10):
        async with open_executor(max_concurrent_tasks=1) as ex:
            ra = await ex.submit(a)
            rb = await ex.submit(b)
    assert ((await ra.wait()).result, (await rb.wait()).result) == ("a", "b")
    assert ex._core.workers.thread_limiter.total_tokens == 1


async def test_cancelled_event_read_takes_nothing():
    async with open_executor(max_concurrent_tasks=1, queue_capacity=0, overflow="reject") as ex:
        ex.submit_nowait(trio.sleep, 1)
        with pytest.raises(TaskRejected):
            ex.submit_nowait(trio.sleep, 1)
        assert len(ex.events) == 1
        with trio.CancelScope() as cs:
            cs.cancel()
            await ex.events.__anext__()
        assert len(ex.events) == 1


async def test_task_error_during_cancel_never_escapes_the_executor(autojump_clock):
    async def messy():
        async with trio.open_nursery() as n:

            async def cleanup_fails():
                try:
                    await trio.sleep_forever()
                finally:
                    raise ValueError("task cleanup failed")

            n.start_soon(cleanup_fails)
            await trio.sleep_forever()

    refs = []
    with pytest.raises(KeyError, match="body"):
        async with open_executor() as ex:
            refs.append(await ex.submit(messy))
            await trio.testing.wait_all_tasks_blocked()
            raise KeyError("body")
    c = await refs[0].wait()
    assert c.status is TaskStatus.CANCELLED
    assert c.error.subgroup(ValueError) is not None


async def test_broken_repr_does_not_hang_waiters(autojump_clock):
    class BadRepr(Exception):
        def __repr__(self):
            raise RuntimeError("no repr")

    async def boom():
        await trio.sleep(1)
        raise BadRepr

    async with open_executor() as ex:
        with trio.fail_after(100):
            c = await (await ex.submit(boom)).wait()
        ev = ex.events.get_nowait()
    assert c.status is TaskStatus.FAILED
    assert "unrepresentable" in ev.attributes["error"]


async def test_blocked_submitters_keep_their_place(autojump_clock):
    async with open_executor(
        max_concurrent_tasks=1, queue_capacity=1, shutdown_policy="cancel"
    ) as ex:
        a = await ex.submit(trio.sleep_forever)
        b = await ex.submit(trio.sleep_forever)
        admitted = []

        async def submitter(i):
            await ex.submit(trio.sleep_forever)
            admitted.append(i)

        async with trio.open_nursery() as n:
            for i in (1, 2):
                n.start_soon(submitter, i)
                await trio.testing.wait_all_tasks_blocked()
            b.cancel()  # frees a place: it belongs to submitter 1
            with pytest.raises(TaskRejected):
                ex.submit_nowait(trio.sleep_forever)  # cannot overtake
            await trio.testing.wait_all_tasks_blocked()
            assert admitted == [1]
            a.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert admitted == [1, 2]


async def test_cancel_pending_counts_only_what_it_cancels(autojump_clock):
    @task(retries=1, backoff=Backoff(initial=5))
    async def flaky():
        if trio.current_time() < 1:
            raise ValueError
        return "second"

    async with open_executor(max_concurrent_tasks=1) as ex:
        r = await ex.submit(flaky)
        await trio.sleep(1)
        assert ex.cancel_pending() == 0  # between attempts is not "not started"
    assert (await r.wait()).result == "second"


async def test_a_refused_or_abandoned_submission_frees_its_task_id(autojump_clock):
    """A caller-chosen id is taken only by an accepted submission: one refused,
    or whose BLOCK wait was cancelled, can be submitted again under that id
    (before, the id stayed 'already live' for the executor's lifetime)."""
    async with trioexec.open_executor(
        max_concurrent_tasks=1, queue_capacity=0, overflow=trioexec.Overflow.REJECT
    ) as ex:
        await ex.submit(trio.sleep, 1)
        with pytest.raises(trioexec.TaskRejected):
            await ex.submit(trio.sleep, 0, task_id="again")
        with pytest.raises(trioexec.TaskRejected):
            ex.submit_nowait(trio.sleep, 0, task_id="again")
        await ex.wait_for_idle()
        ref = await ex.submit(trio.sleep, 0, task_id="again")
        assert (await ref.wait()).ok
    async with trioexec.open_executor(max_concurrent_tasks=1, queue_capacity=0) as ex:
        await ex.submit(trio.sleep, 1)
        with trio.move_on_after(0.5) as scope:
            await ex.submit(trio.sleep, 0, task_id="blocked")  # BLOCK: waits for space
        assert scope.cancelled_caught
        ref = await ex.submit(trio.sleep, 0, task_id="blocked")  # waits, then accepted
        assert (await ref.wait()).ok


async def test_two_blocked_submissions_cannot_share_a_task_id(autojump_clock):
    """With a store too, a chosen id is taken while its submission waits for
    space: a second submission with it is refused at once, not accepted beside it
    once both get in (before, with a store, both ran under one record)."""
    async with trioexec.open_executor(
        max_concurrent_tasks=1, queue_capacity=0, store=trioexec.MemoryStore()
    ) as ex:
        await ex.submit(trio.sleep, 1)
        refs = []

        async def submit_first():
            refs.append(await ex.submit(trio.sleep, 0, task_id="dup"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(submit_first)
            await trio.testing.wait_all_tasks_blocked()  # it waits for space
            with pytest.raises(ValueError, match="already live"):
                await ex.submit(trio.sleep, 0, task_id="dup")
        assert [(await r.wait()).ok for r in refs] == [True]
