"""Regression tests for the edges of issue 13: each one failed before its fix.

Numbers in the test names are the issue's defect numbers.
"""

from __future__ import annotations

import functools
import math
import threading

import pytest
import trio
import trio.lowlevel
import trio.testing
from faults import FaultyStore

import trioexec
from trioexec import (
    MemoryStore,
    SQLiteStore,
    StoreError,
    TaskHandle,
    TaskStatus,
    open_executor,
)

# ----------------------------------------------------------------- 1, 2: store failures


async def test_01_exit_ends_when_closing_the_store_fails(autojump_clock):
    store = FaultyStore(MemoryStore())
    with trio.fail_after(5):  # before the fix: hung forever in a shielded scope
        with pytest.raises(StoreError, match="injected failure in release_owner"):
            async with open_executor(store=store) as ex:
                await ex.run(trio.sleep, 0)
                store.fail_on.add("release_owner")


async def test_01_exit_ends_when_the_last_write_fails(autojump_clock):
    store = FaultyStore(MemoryStore())
    with trio.fail_after(5):
        with pytest.raises(StoreError, match="injected failure in write"):
            async with open_executor(store=store) as ex:
                ex.submit_nowait(trio.sleep, 1)
                await trio.testing.wait_all_tasks_blocked()
                store.fail_on.add("write")


async def test_02_store_failure_is_one_error_and_every_wait_returns(autojump_clock):
    store = FaultyStore(MemoryStore())
    outcomes: list[object] = []
    release = trio.Event()

    async def wait_on(ref: trioexec.TaskRef) -> None:
        try:
            outcomes.append(await ref.wait())
        except StoreError as exc:
            outcomes.append(exc)

    with trio.fail_after(100):
        async with trio.open_nursery() as outside:  # waiters outside the executor
            with pytest.raises(StoreError) as info:
                async with open_executor(store=store) as ex:
                    refs = [await ex.submit(release.wait) for _ in range(3)]
                    pending = await ex.submit(trio.sleep, 1)  # queued behind them
                    for ref in [*refs, pending]:
                        outside.start_soon(wait_on, ref)
                    await trio.testing.wait_all_tasks_blocked()
                    store.fail_on.add("write")
                    await ex.submit(trio.sleep, 0)  # gives the writer something to fail on
                    await trio.sleep(10)
                    pytest.fail("the body should have been cancelled by the failure")
    assert type(info.value) is StoreError  # not inside an ExceptionGroup
    assert "faulty.db" in str(info.value)
    assert len(outcomes) == 4
    assert all(isinstance(o, StoreError) for o in outcomes), outcomes


async def test_02_wait_after_the_failure_raises_at_once(autojump_clock):
    store = FaultyStore(MemoryStore())
    with pytest.raises(StoreError):
        async with open_executor(store=store) as ex:
            ref = await ex.submit(trio.sleep_forever)
            store.fail_on.add("write")
            await trio.sleep(1)
    with trio.fail_after(1):
        with pytest.raises(StoreError, match=r"faulty\.db"):
            await ref.wait()
        with pytest.raises(StoreError):
            await ex.flush()


async def test_wait_for_idle_is_a_checkpoint_after_the_failure_while_tasks_remain(autojump_clock):
    # (a thread the failure's cancel cannot stop keeps the executor busy; before
    # the fix wait_for_idle returned without a schedule point)
    store = FaultyStore(MemoryStore())
    gate = threading.Event()
    idle: list[bool] = []

    async def after_the_failure(ex: trioexec.Executor) -> None:
        while ex._core.lifecycle.failure is None:
            await trio.sleep(0.01)
        idle.append(ex._core.lifecycle.is_idle())
        try:
            with trio.testing.assert_checkpoints():
                await ex.wait_for_idle()
        finally:
            gate.set()

    async with trio.open_nursery() as outside:
        with pytest.raises(StoreError):
            async with open_executor(store=store) as ex:
                ex.submit_nowait(gate.wait)
                await trio.testing.wait_all_tasks_blocked()
                outside.start_soon(after_the_failure, ex)
                store.fail_on.add("write")
                await ex.submit(trio.sleep, 0)
                await trio.sleep_forever()
    assert idle == [False]


async def test_02_heartbeat_failure_stops_the_executor(autojump_clock):
    store = FaultyStore(MemoryStore())
    with trio.fail_after(100):
        with pytest.raises(StoreError, match="injected failure in renew_lease"):
            async with open_executor(store=store, lease=3.0) as ex:
                await ex.submit(trio.sleep_forever)
                store.fail_on.add("renew_lease")  # (the renewals; `heartbeat` took the lease)
                await trio.sleep_forever()


async def test_02_store_error_from_a_real_file(tmp_path, autojump_clock):
    store = SQLiteStore(tmp_path / "runs.db", inline=True)
    with pytest.raises(StoreError) as info:
        async with open_executor(store=store) as ex:
            await ex.run(trio.sleep, 0)
            ex.submit_nowait(trio.sleep, 1)
            store.close()  # every later write fails
            await trio.sleep(5)
    assert type(info.value) is StoreError
    assert str(tmp_path / "runs.db") in str(info.value)


# ----------------------------------------------------------------- 7: groups


async def test_07_a_users_exception_group_reaches_them_as_it_is():
    group = ExceptionGroup("mine", [ValueError("a")])
    with pytest.raises(ExceptionGroup) as info:
        async with open_executor():
            raise group
    assert info.value is group

    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [KeyError("k")])])
    with pytest.raises(ExceptionGroup) as info:
        async with open_executor(store=MemoryStore()):
            raise nested
    assert info.value is nested


async def test_07_a_single_error_is_still_unwrapped():
    with pytest.raises(KeyError):
        async with open_executor(store=MemoryStore()):
            raise KeyError("k")


# ----------------------------------------------------------------- 13: handle injection


async def test_13_a_handle_argument_the_caller_passes_is_not_replaced():
    class FileHandle:
        pass

    mine = FileHandle()

    async def copy(handle, size=1):
        return handle

    def copy_sync(path, handle):
        return handle

    async with open_executor() as ex:
        assert await ex.run(copy, mine) is mine  # positionally
        assert await ex.run(functools.partial(copy, handle=mine)) is mine  # by keyword
        assert await ex.run(copy_sync, "p", mine) is mine
        injected = await ex.run(copy)  # not supplied: injected
        assert isinstance(injected, TaskHandle)


async def test_13_an_annotated_handle_is_injected_under_any_name():
    async def job(x, ctl: TaskHandle):
        return x, ctl

    async with open_executor() as ex:
        x, ctl = await ex.run(job, 1)
    assert x == 1
    assert isinstance(ctl, TaskHandle)


# ----------------------------------------------------------------- 5: deferred tasks end at once


async def _fill_slots(ex: trioexec.Executor, seconds: float) -> None:
    for _ in range(ex.slots.total):
        await ex.submit(trio.sleep, seconds)


async def test_05_a_deferred_task_whose_timeout_expires_ends_at_once(autojump_clock):
    never = trio.Event()

    async def waits(handle: TaskHandle):
        await handle.defer_until(never)

    async with open_executor(max_concurrent_tasks=2) as ex:
        ref = await ex.submit(waits, timeout=1)
        await trio.testing.wait_all_tasks_blocked()
        await _fill_slots(ex, 100)  # every slot busy for 100 s
        start = trio.current_time()
        completion = await ref.wait()
        assert completion.status is TaskStatus.TIMED_OUT
        assert trio.current_time() - start <= 1  # before the fix: at t=100
        assert completion.deferred_seconds == pytest.approx(1)
        m = ex.statistics()
        assert (m.active_count, m.deferred_count) == (2, 0)
        assert ex.slots.in_use == 2


async def test_05_a_cancelled_deferred_task_ends_at_once(autojump_clock):
    never = trio.Event()
    cleanup_ran = []

    async def waits(handle: TaskHandle):
        try:
            await handle.defer_until(never)
        finally:
            cleanup_ran.append(handle.slot.is_held)

    async with open_executor(max_concurrent_tasks=1) as ex:
        ref = await ex.submit(waits)
        await trio.testing.wait_all_tasks_blocked()
        await _fill_slots(ex, 100)
        await trio.sleep(1)
        ref.cancel()
        with trio.fail_after(1):  # before the fix: waited for the slot until t=101
            completion = await ref.wait()
        assert completion.status is TaskStatus.CANCELLED
        assert cleanup_ran == [False]
        assert ex.statistics().deferred_count == 0
        assert ex.slots.in_use == 1


async def test_05_a_full_pool_of_deferred_tasks_shuts_down_with_cancel(autojump_clock):
    # The slot holders (shielded: think of threads) end only once the deferred
    # tasks have: before the fix those waited for a slot to end, a deadlock.
    never = trio.Event()
    deferred_ended = trio.Event()

    async def waits(handle: TaskHandle):
        await handle.defer_until(never)

    async def holds():
        with trio.CancelScope(shield=True):
            await deferred_ended.wait()

    async def watch(refs):
        for ref in refs:
            await ref.wait()
        deferred_ended.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as outside:
            async with open_executor(
                max_concurrent_tasks=2, shutdown_policy=trioexec.ShutdownPolicy.CANCEL
            ) as ex:
                deferred = [await ex.submit(waits) for _ in range(3)]
                await trio.testing.wait_all_tasks_blocked()
                holders = [await ex.submit(holds) for _ in range(2)]
                await trio.testing.wait_all_tasks_blocked()
                assert ex.slots.in_use == 2
                outside.start_soon(watch, deferred)
    assert all(r.status is TaskStatus.CANCELLED for r in deferred)
    assert all(r.status is TaskStatus.COMPLETED for r in holders)


async def test_05_an_inner_timeout_still_takes_the_slot_back(autojump_clock):
    # A cancel scope inside the task (not the task's own end): the code after it
    # runs holding a slot, as before.
    never = trio.Event()

    async def waits(handle: TaskHandle):
        with trio.move_on_after(1):
            await handle.defer_until(never)
        return handle.slot.is_held, trio.current_time()

    async with open_executor(max_concurrent_tasks=1) as ex:
        ref = await ex.submit(waits)
        await trio.testing.wait_all_tasks_blocked()
        await ex.submit(trio.sleep, 5)
        held, at = (await ref.wait()).result
    assert held
    assert at == pytest.approx(5)


async def test_05_timeout_while_queueing_for_the_slot_after_the_wait(autojump_clock):
    ready = trio.Event()

    async def waits(handle: TaskHandle):
        await handle.defer_until(ready)

    async with open_executor(max_concurrent_tasks=1) as ex:
        ref = await ex.submit(waits, timeout=3)
        await trio.testing.wait_all_tasks_blocked()
        await ex.submit(trio.sleep, 100)
        await trio.sleep(1)
        ready.set()  # it now queues for the slot, which is busy until t=100
        completion = await ref.wait()
        assert completion.status is TaskStatus.TIMED_OUT
        assert trio.current_time() == pytest.approx(3)


# ----------------------------------------------------------------- 6: sync tasks


async def test_06_timeout_applies_to_a_sync_task():
    release = threading.Event()

    def blocks():
        release.wait(10)

    try:
        async with open_executor(max_concurrent_tasks=1) as ex:
            with trio.fail_after(5):
                completion = await (await ex.submit(blocks, timeout=0.05)).wait()
            assert completion.status is TaskStatus.TIMED_OUT
            assert isinstance(completion.error, trioexec.TaskTimeout)
            assert ex.slots.in_use == 0
            release.set()
            assert await ex.run(lambda: "next") == "next"
    finally:
        release.set()


async def test_06_thread_workers_bound_threads_after_a_sync_deferral():
    lock = threading.Lock()
    running = 0
    peak = 0
    go = trio.Event()
    busy_started = trio.Event()
    release_busy = trio.Event()

    def enter():
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)

    def leave():
        nonlocal running
        with lock:
            running -= 1

    def deferring(handle):
        handle.defer_until_sync(go)  # the thread is blocked, its token lent out
        enter()
        leave()

    def busy():
        enter()
        trio.from_thread.run_sync(busy_started.set)
        trio.from_thread.run(release_busy.wait)
        leave()

    async with open_executor(max_concurrent_tasks=4, thread_workers=1) as ex:
        first = await ex.submit(deferring)
        async for event in ex.events:
            if event.kind is trioexec.HealthEventKind.TASK_DEFERRED:
                break
        other = await ex.submit(busy)  # takes the lent thread token
        await busy_started.wait()
        go.set()  # the first resumes while the busy task holds the one thread
        await trio.testing.wait_all_tasks_blocked()
        assert first.status is TaskStatus.RUNNING  # its thread waits for a token
        release_busy.set()
        assert (await first.wait()).ok
        assert (await other.wait()).ok
    assert peak == 1  # before the fix: 2
    assert ex._core.workers.thread_limiter.total_tokens == 1


# ----------------------------------------------------------------- 3: back-pressure from the store


async def test_03_a_stalled_store_bounds_the_backlog(autojump_clock, monkeypatch):
    from trioexec import _journal

    monkeypatch.setattr(_journal, "JOURNAL_LIMIT", 100)
    gate = trio.Event()
    original = _journal.Journal.write

    async def slow_write(self):
        await gate.wait()  # the store "stalls" until the gate opens
        await original(self)

    monkeypatch.setattr(_journal.Journal, "write", slow_write)

    async def noop():
        pass

    async with open_executor(
        store=MemoryStore(), max_concurrent_tasks=4, queue_capacity=10_000, overflow="reject"
    ) as ex:
        accepted = 0
        with pytest.raises(trioexec.TaskRejected, match="changes behind"):
            for _ in range(10_000):
                ex.submit_nowait(noop)
                accepted += 1
                if accepted % 10 == 0:
                    await trio.lowlevel.checkpoint()
        assert accepted <= 100
        assert len(ex._core.journal.changes) < 100 + 4 * 10  # bounded, not one per submission
        assert ex.statistics().rejected_count == 1
        gate.set()
        await ex.flush()
        assert await ex.run(noop) is None  # caught up: accepted again


async def test_03_block_waits_for_the_store_to_catch_up(autojump_clock, monkeypatch):
    from trioexec import _journal

    monkeypatch.setattr(_journal, "JOURNAL_LIMIT", 50)
    gate = trio.Event()
    original = _journal.Journal.write

    async def slow_write(self):
        await gate.wait()
        await original(self)

    monkeypatch.setattr(_journal.Journal, "write", slow_write)

    async def noop():
        pass

    peak = 0
    async with open_executor(store=MemoryStore(), queue_capacity=10_000) as ex:

        async def producer():
            nonlocal peak
            for _ in range(500):
                await ex.submit(noop)
                peak = max(peak, len(ex._core.journal.changes))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            await trio.sleep(5)
            assert ex.statistics().queued_count < 60  # waiting for the store
            gate.set()
        assert ex.statistics().queued_count == 500
    assert peak < 50 + 4 * 10


# ----------------------------------------------------------------- 8: shutdown from inside


async def test_08_shutdown_called_by_a_task_returns(autojump_clock):
    async def stopper(ex):
        await ex.shutdown()
        return "returned"

    with trio.fail_after(10):  # before the fix: waited for itself forever
        async with open_executor() as ex:
            ref = await ex.submit(stopper, ex)
            assert (await ref.wait()).result == "returned"
            assert ex.closed
            with pytest.raises(trioexec.ExecutorClosed):
                await ex.submit(trio.sleep, 0)


async def test_08_drain_lets_running_tasks_fan_out(autojump_clock):
    done = []

    async def leaf(i):
        await trio.sleep(1)
        done.append(i)

    async def fan_out(ex):
        await trio.sleep(2)  # still running when the block exits and the drain begins
        for i in range(3):
            await ex.submit(leaf, i)
        ex.submit_nowait(leaf, 3)

    async with open_executor(max_concurrent_tasks=2, queue_capacity=10) as ex:
        ref = await ex.submit(fan_out, ex)
    assert ref.status is TaskStatus.COMPLETED, ref.completion
    assert sorted(done) == [0, 1, 2, 3]


async def test_08_outside_submissions_during_a_drain_are_refused(autojump_clock):
    async with open_executor() as ex:
        await ex.submit(trio.sleep, 5)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ex.shutdown)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trioexec.ExecutorClosed):
                await ex.submit(trio.sleep, 0)


# ----------------------------------------------------------------- 9: ties in the given order


@pytest.mark.parametrize("seed", range(20))
async def test_09_ready_root_steps_start_in_the_workflow_order(seed):
    started = []

    def step(sid):
        @trioexec.task(id=sid)
        async def run(context):
            started.append(sid)

        return run

    wf = trioexec.Workflow("ties", [step(s) for s in "abcdef"])
    async with open_executor(max_concurrent_tasks=1) as ex:
        result = await ex.run_workflow(wf)
    assert result.ok
    assert started == list("abcdef")  # before the fix: often another order


@pytest.mark.parametrize("seed", range(5))
async def test_09_pending_tasks_start_in_submission_order(seed):
    started = []

    async def job(i):
        started.append(i)
        await trio.lowlevel.checkpoint()

    async with open_executor(max_concurrent_tasks=3) as ex:
        for i in range(30):
            ex.submit_nowait(job, i)
    assert started == list(range(30))


# ----------------------------------------------------------------- 12: accounting


async def test_12_shutdown_during_recovery_keeps_the_reservation_balanced(tmp_path, autojump_clock):
    # A submitter handed a freed place, then shutdown, then the submitter
    # consumes it: the count of held-back places never goes negative.
    async with open_executor(max_concurrent_tasks=1, queue_capacity=0) as ex:
        await ex.submit(trio.sleep, 1)

        async def blocked():
            with pytest.raises(trioexec.ExecutorClosed):
                await ex.submit(trio.sleep, 0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(blocked)
            nursery.start_soon(blocked)
            await trio.testing.wait_all_tasks_blocked()
            ex._core.gate.reserved += 3  # recovery holding three places back meanwhile
            await trio.sleep(1)  # the slot frees: a place is handed to the first
            ex._core.shutdown.begin(trioexec.ShutdownPolicy.DRAIN)
        assert ex._core.gate.reserved == 3  # before the fix: shutdown reset it to 0, then -3
        ex._core.gate.reserved -= 3


async def test_12_wait_for_idle_does_not_return_early(autojump_clock):
    async with open_executor(max_concurrent_tasks=1) as ex:
        held = await ex.slots.acquire()  # nothing can start meanwhile
        only = ex.submit_nowait(trio.sleep, 1)
        returned = []

        async def idle():
            await ex.wait_for_idle()
            returned.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(idle)
            await trio.testing.wait_all_tasks_blocked()
            only.cancel()  # idle for an instant...
            ex.submit_nowait(trio.sleep, 1)  # ...and not any more
            await trio.testing.wait_all_tasks_blocked()
            assert returned == []  # before the fix: it had returned
            held.release()
        assert returned == [pytest.approx(1)]


async def test_12_cancel_pending_shutdown_leaves_a_run_cancelled(autojump_clock):
    gate = trio.Event()

    @trioexec.task(id="first")
    async def first(context):
        await gate.wait()

    @trioexec.task(id="second", dependencies=["first"])
    async def second(context):
        pass

    wf = trioexec.Workflow("cut", [first, second])
    async with open_executor(
        max_concurrent_tasks=1, shutdown_policy=trioexec.ShutdownPolicy.CANCEL_PENDING
    ) as ex:
        run = await ex.start_workflow(wf)
        await trio.testing.wait_all_tasks_blocked()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ex.shutdown)
            await trio.testing.wait_all_tasks_blocked()
            gate.set()  # first ends; second may not start any more
    result = await run.wait()
    assert result.status is trioexec.RunStatus.CANCELLED  # before the fix: FAILED
    assert result.steps["first"].ok
    assert "second" not in result.steps


# ----------------------------------------------------------------- 10: ids and inputs


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("name", b"bytes"),
        ("name", ""),
        ("name", "\udc80"),
        ("name", "x" * 1001),
        ("task_id", ""),
        ("task_id", "lone\ud800"),
        ("task_id", 7),
        ("correlation_id", b"c"),
    ],
)
async def test_10_bad_ids_are_refused_at_the_call(option, value, tmp_path):
    store = SQLiteStore(tmp_path / "runs.db")
    async with open_executor(store=store) as ex:
        with pytest.raises(ValueError, match=option):
            await ex.submit(trio.sleep, 0, **{option: value})
        with pytest.raises(ValueError, match=option):
            ex.submit_nowait(trio.sleep, 0, **{option: value})
        assert await ex.run(trio.sleep, 0) is None  # the executor lives on
    store.close()


@pytest.mark.parametrize("value", [10**400, math.nan, -1, 0, math.inf])
async def test_10_unusable_durations_are_refused_at_the_call(value):
    async with open_executor() as ex:
        for option in ("timeout", "budget"):
            with pytest.raises(ValueError, match=option):
                await ex.submit(trio.sleep, 0, **{option: value})
        assert await ex.run(trio.sleep, 0) is None


async def test_10_a_non_callable_is_refused_at_the_call():
    async with open_executor() as ex:
        with pytest.raises(TypeError, match="callable"):
            await ex.submit(42)
        assert await ex.run(trio.sleep, 0) is None


async def test_10_a_live_task_id_is_refused_without_a_store(autojump_clock):
    async with open_executor() as ex:
        ref = await ex.submit(trio.sleep, 5, task_id="nightly")
        with pytest.raises(ValueError, match="'nightly' is already live"):
            await ex.submit(trio.sleep, 0, task_id="nightly")
        await ref.wait()
        again = await ex.submit(trio.sleep, 0, task_id="nightly")  # ended: free again
        assert (await again.wait()).ok


async def test_10_reusing_a_recorded_task_id_keeps_its_row(tmp_path, autojump_clock):
    ran = []

    async def job(tag):
        ran.append(tag)

    store = SQLiteStore(tmp_path / "runs.db", inline=True)
    async with open_executor(store=store) as ex:
        await (await ex.submit(job, "first", task_id="order-42")).wait()
    async with open_executor(store=store) as ex:
        with pytest.raises(ValueError, match="'order-42' is already recorded"):
            await ex.submit(job, "second", task_id="order-42")
    row = store.execution("order-42")
    store.close()
    assert ran == ["first"]  # before the fix: it ran again...
    assert row.status is TaskStatus.COMPLETED  # ...and its row flipped to CANCELLED


async def test_10_duplicate_run_ids_are_refused(tmp_path, autojump_clock):
    @trioexec.task(id="s")
    async def s(context):
        context["n"] = context.get("n", 0) + 1

    wf = trioexec.Workflow("w", [s])
    store = SQLiteStore(tmp_path / "runs.db", inline=True)
    async with open_executor(store=store) as ex:
        assert (await ex.run_workflow(wf, run_id="run-1")).ok
        with pytest.raises(ValueError, match="'run-1' is already recorded"):
            await ex.start_workflow(wf, run_id="run-1")
        with pytest.raises(ValueError, match="run_id"):
            await ex.start_workflow(wf, run_id="")
    assert store.run("run-1").status == "completed"
    store.close()


def test_10_the_deterministic_executor_checks_its_options():
    with pytest.raises(ValueError, match="lease"):
        trioexec.DeterministicExecutor(lease=-1)
    with pytest.raises(ValueError, match="max_recovery_attempts"):
        trioexec.DeterministicExecutor(max_recovery_attempts=-1)
    with pytest.raises(TypeError, match="store"):
        trioexec.DeterministicExecutor(store="runs.db")


async def test_10_odd_but_valid_ids_go_through_a_real_store(tmp_path):
    store = SQLiteStore(tmp_path / "runs.db")
    ids = ["batch[/]", "it's", "🚀 launch", "a" * 1000, 'quote"d', "[bold]x[/bold]"]
    async with open_executor(store=store) as ex:
        for i in ids:
            ref = await ex.submit(trio.sleep, 0, task_id=i, name=i)
            assert (await ref.wait()).ok
    assert {r.task_id for r in store.executions() if r.task_id in ids} == set(ids)
    store.close()


# ----------------------------------------------------------------- 11: values a store cannot hold


async def test_11_an_error_the_store_cannot_hold_is_recorded_escaped(tmp_path):
    class Odd(Exception):
        def __repr__(self):
            return "odd\udc80" + "!" * 20_000

    async def fails():
        raise Odd()

    store = SQLiteStore(tmp_path / "runs.db")
    async with open_executor(store=store) as ex:  # before the fix: died of it
        completion = await (await ex.submit(fails)).wait()
        assert completion.status is TaskStatus.FAILED
        assert isinstance(completion.error, Odd)
        assert await ex.run(trio.sleep, 0) is None
    row = store.execution(completion.task_id)
    store.close()
    assert row.error.startswith("odd\\udc80!!!")
    assert row.error.endswith("more characters)")


def test_10_a_spec_timeout_too_large_for_a_float_is_refused_at_definition():
    with pytest.raises(trioexec.TaskDefinitionError, match="timeout"):
        trioexec.task(timeout=10**400)(trio.sleep)


async def test_11_a_retried_error_with_a_broken_repr_does_not_kill_the_executor(autojump_clock):
    class Broken(Exception):
        def __repr__(self):
            raise RuntimeError("no repr")

    @trioexec.task(id="flaky", retries=1, backoff=trioexec.Backoff(initial=1, jitter=0))
    async def flaky():
        raise Broken()

    async with open_executor(store=MemoryStore()) as ex:
        completion = await (await ex.submit(flaky)).wait()
        assert completion.status is TaskStatus.FAILED
        assert completion.attempts == 2
        assert await ex.run(trio.sleep, 0) is None
