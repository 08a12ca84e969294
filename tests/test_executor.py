"""The first executor: slots, handle injection, refs and completions, clean exit."""

from __future__ import annotations

import functools

import pytest
import trio
import trio.testing

import trioexec
from trioexec import (
    ExecutorClosed,
    Overflow,
    ShutdownPolicy,
    SubStatus,
    TaskHandle,
    TaskRejected,
    TaskStatus,
    open_executor,
    task,
)


async def test_cancel_inside_task_while_deferred_keeps_slot_afterwards(autojump_clock):
    seen = []

    async def patient(handle: TaskHandle) -> str:
        with trio.move_on_after(5) as scope:
            await handle.defer_until(trio.Event())
        seen.append((scope.cancelled_caught, handle.slot.is_held, handle.sub_status))
        return "gave up"

    async with open_executor(max_concurrent_tasks=1) as ex:
        ref = await ex.submit(patient)
        c = await ref.wait()
        assert ex.slots.in_use == 0
    assert c.result == "gave up"
    assert c.deferred_seconds == 5
    assert seen == [(True, True, SubStatus.ACTIVE)]
    m = ex.statistics()
    assert (m.active_count, m.deferred_count, m.deferral_count, m.resumed_count) == (0, 0, 1, 1)


async def test_raising_condition_fails_task_and_frees_everything(autojump_clock):
    def broken() -> bool:
        raise LookupError("no such job")

    async def job(handle: TaskHandle) -> None:
        await handle.defer_until(lambda: False, poll_interval=1)

    async def bad(handle: TaskHandle) -> None:
        n = 0

        def cond():
            nonlocal n
            n += 1
            return broken() if n > 1 else False

        await handle.defer_until(cond, poll_interval=1)

    async with open_executor(max_concurrent_tasks=1) as ex:
        ref = await ex.submit(bad)
        c = await ref.wait()
        assert c.status is TaskStatus.FAILED
        assert isinstance(c.error, LookupError)
        assert ex.slots.in_use == 0
        m = ex.statistics()
        assert (m.active_count, m.deferred_count, m.failed_count) == (0, 0, 1)
        assert await ex.run(lambda: 5) == 5  # the slot is usable again


async def test_handle_injected_only_where_asked():
    got = {}

    async def by_name(x, handle):
        got["by_name"] = (x, type(handle))

    async def by_alt_name(x, *, task_handle):
        got["alt"] = type(task_handle)

    async def by_annotation(x, h: TaskHandle):
        got["ann"] = type(h)

    async def none(*args, **kwargs):
        got["none"] = (args, kwargs)

    async with open_executor() as ex:
        await ex.submit(by_name, 1)
        await ex.submit(by_alt_name, 2)
        await ex.submit(by_annotation, 3)
        await ex.submit(none, 4)
        await ex.submit(task(by_name), 5)
    assert got == {
        "by_name": (5, TaskHandle),
        "alt": TaskHandle,
        "ann": TaskHandle,
        "none": ((4,), {}),
    }


async def test_sync_function_runs_in_a_thread_and_can_defer():
    import threading

    main_thread = threading.get_ident()
    ev = trio.Event()

    def sync_job(x, handle):
        assert threading.get_ident() != main_thread
        handle.defer_until_sync(ev)
        return x * 2, handle.slot.is_held

    async def other():
        return "other"

    # Real threads: a wall-clock guard against a hang, never a wait for progress.
    with trio.fail_after(10):
        async with open_executor(max_concurrent_tasks=1) as ex:
            ref = await ex.submit(sync_job, 21)
            # With one slot, this can only run once the thread has given it back.
            assert await ex.run(other) == "other"
            assert ref.sub_status is SubStatus.DEFERRED
            ev.set()
            c = await ref.wait()
    assert c.result == (42, True)


async def test_sync_spec_in_thread():
    @task
    def double(x):
        return 2 * x

    async with open_executor() as ex:
        assert await ex.run(double, 4) == 8


async def test_ref_status_and_completion_fields(autojump_clock):
    ev = trio.Event()

    async def job(handle):
        await trio.sleep(1)
        await handle.defer_until(ev)
        await trio.sleep(1)
        return "ok"

    async with open_executor(max_concurrent_tasks=1) as ex:
        blocker_release = trio.Event()
        blocker = await ex.submit(blocker_release.wait, name="blocker")
        ref = await ex.submit(job, task_id="job-1", correlation_id="corr")
        await trio.testing.wait_all_tasks_blocked()
        assert ref.task_id == "job-1"
        assert ref.name.endswith("<locals>.job")
        assert ref.status is TaskStatus.PENDING
        assert ref.sub_status is None
        assert ex.statistics().queue_depth == 1
        blocker_release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert ref.status is TaskStatus.RUNNING
        assert ref.sub_status is SubStatus.ACTIVE
        await trio.sleep(1)
        await trio.testing.wait_all_tasks_blocked()
        assert ref.sub_status is SubStatus.DEFERRED
        await trio.sleep(3)
        ev.set()
        c = await ref.wait()
    assert blocker.status is TaskStatus.COMPLETED
    assert ref.status is TaskStatus.COMPLETED
    assert ref.sub_status is None
    assert c.task_id == "job-1"
    assert c.ok
    assert c.result == "ok"
    assert c.error is None
    assert c.attempts == 1
    assert c.deferred_seconds == 3
    assert c.submitted_at <= c.started_at <= c.finished_at
    assert c.correlation_id == "corr"
    assert c.causation_id is None
    assert await ref.wait() is c  # the same completion every time


async def test_failure_is_captured_and_run_reraises():
    async def boom():
        raise ValueError("bad input 7")

    async with open_executor() as ex:
        ref = await ex.submit(boom)
        c = await ref.wait()
        assert not c.ok
        assert c.status is TaskStatus.FAILED
        assert isinstance(c.error, ValueError)
        with pytest.raises(ValueError, match="bad input 7"):
            await ex.run(boom)
    assert ex.statistics().failed_count == 2


async def test_positional_args_and_partial_keywords():
    async def f(a, b, *, c):
        return (a, b, c)

    async with open_executor() as ex:
        assert await ex.run(functools.partial(f, c=3), 1, 2) == (1, 2, 3)


async def test_causation_and_correlation_inherited():
    refs = {}

    async def child():
        return "child"

    async def parent(ex):
        refs["child"] = await ex.submit(child)

    async with open_executor() as ex:
        refs["parent"] = await ex.submit(parent, ex, correlation_id="order-9")
        await ex.wait_for_idle()  # after the body, DRAIN accepts no new submissions
    p, c = (await refs["parent"].wait()), (await refs["child"].wait())
    assert c.correlation_id == "order-9"
    assert c.causation_id == p.task_id


async def test_causation_from_child_tasks_threads_and_other_executors():
    """Submissions from a task's child Trio tasks and from its worker thread
    (trio.from_thread) name it as their cause; so does another executor's
    submission from inside it. A submission from outside any task names none."""
    refs = {}

    async def leaf():
        return None

    async def spawner(ex):
        async with trio.open_nursery() as n:
            n.start_soon(lambda: _submit_into(refs, "from_child", ex))

    def threaded(ex):
        refs["from_thread"] = trio.from_thread.run(ex.submit, leaf)

    async def across(other):
        refs["across"] = await other.submit(leaf)

    async with open_executor() as ex, open_executor() as other:
        refs["spawner"] = await ex.submit(spawner, ex, correlation_id="c-1")
        refs["threaded"] = await ex.submit(threaded, ex)
        refs["across_parent"] = await ex.submit(across, other)
        refs["root"] = await ex.submit(leaf)
        await ex.wait_for_idle()
        await other.wait_for_idle()
    done = {k: await r.wait() for k, r in refs.items()}
    assert done["from_child"].causation_id == done["spawner"].task_id
    assert done["from_child"].correlation_id == "c-1"
    assert done["from_thread"].causation_id == done["threaded"].task_id
    assert done["across"].causation_id == done["across_parent"].task_id
    assert done["root"].causation_id is None


async def _submit_into(refs, key, ex):
    async def leaf():
        return None

    refs[key] = await ex.submit(leaf)


async def test_timeout_is_hard_and_counts_deferral(autojump_clock):
    async def slow(handle):
        await handle.defer_until(trio.Event())

    async with open_executor() as ex:
        ref = await ex.submit(slow, timeout=3)
        c = await ref.wait()
    assert c.status is TaskStatus.TIMED_OUT
    assert isinstance(c.error, trioexec.TaskTimeout)
    assert c.finished_at - c.started_at >= 0
    assert ex.slots.in_use == 0
    m = ex.statistics()
    assert (m.timed_out_count, m.deferred_count, m.active_count) == (1, 0, 0)


async def test_cancel_pending_running_and_deferred(autojump_clock):
    fired = []

    async def deferrer(handle):
        async def watch():
            await handle.cancelled()
            fired.append(handle.task_id)

        async with trio.open_nursery() as n:
            n.start_soon(watch)
            await handle.defer_until(trio.Event())

    async with open_executor(max_concurrent_tasks=1) as ex:
        d = await ex.submit(deferrer)
        await trio.testing.wait_all_tasks_blocked()
        running = await ex.submit(trio.sleep_forever)
        pending = await ex.submit(trio.sleep_forever)
        await trio.testing.wait_all_tasks_blocked()
        assert (d.sub_status, running.status, pending.status) == (
            SubStatus.DEFERRED,
            TaskStatus.RUNNING,
            TaskStatus.PENDING,
        )
        pending.cancel()
        assert pending.status is TaskStatus.CANCELLED  # at once
        running.cancel()
        d.cancel()
        d.cancel()  # twice is harmless
        for r in (d, running, pending):
            assert (await r.wait()).status is TaskStatus.CANCELLED
    assert fired == [d.task_id]
    m = ex.statistics()
    assert m.cancellation_requested_count == 3
    assert m.cancellation_observed_count == 3
    assert m.cancelled_count == 3
    assert ex.slots.in_use == 0


async def test_cancel_pending_counts(autojump_clock):
    async with open_executor(max_concurrent_tasks=1) as ex:
        await ex.submit(trio.sleep, 5)
        queued = [await ex.submit(trio.sleep, 1) for _ in range(3)]
        await trio.testing.wait_all_tasks_blocked()
        assert ex.cancel_pending() == 3
        assert all(r.status is TaskStatus.CANCELLED for r in queued)
        assert ex.statistics().queue_depth == 0
    assert ex.statistics().completed_count == 1


async def test_exit_drains_by_default(autojump_clock):
    async with open_executor(max_concurrent_tasks=2) as ex:
        refs = [await ex.submit(trio.sleep, i) for i in range(5)]
    assert all(r.status is TaskStatus.COMPLETED for r in refs)
    assert trio.current_time() > 0
    with pytest.raises(ExecutorClosed):
        await ex.submit(trio.sleep, 1)


async def test_body_error_cancels_and_propagates_unwrapped(autojump_clock):
    refs = []
    with pytest.raises(KeyError, match="body"):
        async with open_executor(max_concurrent_tasks=1) as ex:
            refs.append(await ex.submit(trio.sleep_forever))
            refs.append(await ex.submit(trio.sleep_forever))
            await trio.testing.wait_all_tasks_blocked()
            raise KeyError("body")
    assert [r.status for r in refs] == [TaskStatus.CANCELLED, TaskStatus.CANCELLED]


async def test_outer_cancel_leaves_nothing_behind(autojump_clock):
    refs = []
    with trio.move_on_after(2):
        async with open_executor(max_concurrent_tasks=1) as ex:
            refs.append(await ex.submit(trio.sleep_forever))
            refs.append(await ex.submit(trio.sleep_forever))
            await trio.sleep_forever()
    assert [r.done for r in refs] == [True, True]
    assert ex.slots.in_use == 0


async def test_shutdown_cancel_policy_on_exit(autojump_clock):
    async with open_executor(shutdown_policy=ShutdownPolicy.CANCEL) as ex:
        ref = await ex.submit(trio.sleep_forever)
    assert ref.status is TaskStatus.CANCELLED


async def test_wait_for_idle(autojump_clock):
    async with open_executor(max_concurrent_tasks=2) as ex:
        t0 = trio.current_time()
        await ex.wait_for_idle()  # idle already: returns at once
        assert trio.current_time() == t0
        for i in range(4):
            await ex.submit(trio.sleep, i + 1)
        await ex.wait_for_idle()
        # Two slots: 1 s and 2 s start at once; 3 s starts at 1, 4 s at 2 -> idle at 6.
        assert trio.current_time() - t0 == 6
        m = ex.statistics()
        assert (m.completed_count, m.active_count, m.queue_depth) == (4, 0, 0)


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"max_concurrent_tasks": 0}, ValueError),
        ({"queue_capacity": -1}, ValueError),
        ({"max_concurrent_tasks": 2.0}, TypeError),
        ({"overflow": "sideways"}, ValueError),
        ({"task_budget": 0}, ValueError),
    ],
)
async def test_bad_options(kwargs, exc):
    with pytest.raises(exc):
        async with open_executor(**kwargs):
            pass  # pragma: no cover


async def test_reject_and_drop_policies(autojump_clock):
    async with open_executor(
        max_concurrent_tasks=1, queue_capacity=1, overflow=Overflow.REJECT
    ) as ex:
        await ex.submit(trio.sleep, 1)
        await ex.submit(trio.sleep, 1)
        with pytest.raises(TaskRejected, match="capacity"):
            await ex.submit(trio.sleep, 1)
        with pytest.raises(TaskRejected):
            ex.submit_nowait(trio.sleep, 1)
    assert ex.statistics().rejected_count == 2

    async with open_executor(
        max_concurrent_tasks=1, queue_capacity=1, overflow="drop_oldest"
    ) as ex:
        await ex.submit(trio.sleep, 1)
        old = await ex.submit(trio.sleep, 1)
        new = await ex.submit(trio.sleep, 1)
        assert old.status is TaskStatus.DROPPED
    assert new.status is TaskStatus.COMPLETED

    async with open_executor(
        max_concurrent_tasks=1, queue_capacity=0, overflow="drop_newest"
    ) as ex:
        await ex.submit(trio.sleep, 1)
        new = await ex.submit(trio.sleep, 1)
        assert new.status is TaskStatus.DROPPED
    assert ex.statistics().dropped_count == 1


async def test_block_waits_for_space(autojump_clock):
    async with open_executor(max_concurrent_tasks=1, queue_capacity=1) as ex:
        await ex.submit(trio.sleep, 5)
        await ex.submit(trio.sleep, 5)
        t0 = trio.current_time()
        await ex.submit(trio.sleep, 5)  # waits until the first finishes
        assert trio.current_time() - t0 == 5
        with pytest.raises(TaskRejected):
            ex.submit_nowait(trio.sleep, 1)
    assert ex.statistics().max_outstanding_count == 2


async def test_a_task_that_swallows_its_cancellation_does_not_taint_the_next(autojump_clock):
    """Workers share one cancel scope across jobs until a job is cancelled."""

    async def stubborn():
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            return "swallowed"  # bad manners, but must not hurt the next task

    async with open_executor(max_concurrent_tasks=1) as ex:
        first = await ex.submit(stubborn)
        nxt = await ex.submit(trio.sleep, 1, name="next")
        await trio.testing.wait_all_tasks_blocked()
        first.cancel()
        assert (await first.wait()).result == "swallowed"
        assert (await nxt.wait()).status is TaskStatus.COMPLETED


async def test_timeout_then_the_next_job_runs_untimed(autojump_clock):
    async with open_executor(max_concurrent_tasks=1) as ex:
        slow = await ex.submit(trio.sleep, 10, timeout=2)
        after = await ex.submit(trio.sleep, 50)
        assert (await slow.wait()).status is TaskStatus.TIMED_OUT
        c = await after.wait()
    assert c.status is TaskStatus.COMPLETED


async def test_group_with_cancelled_and_an_error_is_kept_on_record(autojump_clock):
    async def messy():
        async with trio.open_nursery() as n:

            async def fail_on_cancel():
                try:
                    await trio.sleep_forever()
                finally:
                    raise ValueError("cleanup failed")

            n.start_soon(fail_on_cancel)
            await trio.sleep_forever()

    async with open_executor(max_concurrent_tasks=1) as ex:
        ref = await ex.submit(messy)
        await trio.testing.wait_all_tasks_blocked()
        ref.cancel()
        c = await ref.wait()
        assert c.status is TaskStatus.CANCELLED
        assert isinstance(c.error, BaseExceptionGroup)
        assert await ex.run(trio.sleep, 1) is None  # the worker survived


class _Spawns(trio.abc.Instrument):
    """Counts the Trio tasks spawned, by name, and the steps workers take."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.worker_steps = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name)

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.worker_steps += task.name == "trioexec worker"


@pytest.mark.parametrize("limit", [1, 4])
async def test_a_deferral_starts_no_worker_that_only_parks(limit):
    """Each task defers as it starts, so each keeps its worker and the slot it gave
    back needs another: submitted one at a time, n tasks take n workers, each in
    one step (start, run the task, park in its deferral): no spare worker per
    deferral that parks idle and is woken for the next submission. The slot bound
    holds throughout."""
    n = 40
    spawns = _Spawns()
    event = trio.Event()
    active = most = 0

    async def one(handle: trioexec.TaskHandle) -> None:
        nonlocal active, most
        active += 1
        most = max(most, active)
        active -= 1
        await handle.defer_until(event)

    async with trioexec.open_executor(max_concurrent_tasks=limit, queue_capacity=n) as ex:
        trio.lowlevel.add_instrument(spawns)
        try:
            for _ in range(n):
                await ex.submit(one)
            await trio.testing.wait_all_tasks_blocked()
            assert ex.statistics().deferred_count == n
        finally:
            trio.lowlevel.remove_instrument(spawns)
        event.set()
    assert spawns.names.count("trioexec worker") == n
    assert spawns.worker_steps == n, spawns.worker_steps
    assert most <= limit
    assert ex.statistics().completed_count == n
