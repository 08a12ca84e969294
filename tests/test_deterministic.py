import pytest
import trio

from trioexec import (
    Backoff,
    DeterministicExecutor,
    KeyLimit,
    Overflow,
    TaskRejected,
    TaskStatus,
    open_executor,
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


async def test_a_rate_limited_retry_waits_for_its_keys_next_token(autojump_clock):
    # Issue 30 item 9: the retry of a rate-limited key's task waits (in the
    # caller's task) for the key's next token, which only the refill timer gives.
    attempts = []

    @task(retries=1, backoff=Backoff(initial=0.5, jitter=0))
    async def flaky(i):
        attempts.append((i, trio.current_time()))
        if len(attempts) == 1:
            raise OSError("once")
        return i

    ex = DeterministicExecutor(key_limits={"k": KeyLimit(rate=1, per=2.0)})
    refs = [ex.submit_nowait(flaky, i, key="k") for i in range(2)]
    with trio.fail_after(60):  # (Trio's clock: it jumps; a hang fails here)
        done = await ex.run_ready()
    assert [c.status for c in done] == [TaskStatus.COMPLETED] * 2
    assert [c.result for c in done] == [0, 1]
    assert done[0].attempts == 2
    # One start each 2 s: the retry takes the second token, the next task the third.
    assert attempts == [(0, 0.0), (0, 2.0), (1, 4.0)]
    assert [r.status for r in refs] == [TaskStatus.COMPLETED] * 2
    # A token a key waited for when an earlier call returned still comes.
    ex.submit_nowait(flaky, 2, key="k")
    ex.submit_nowait(flaky, 3, key="k")
    with trio.fail_after(60):
        assert len(await ex.run_ready(max_tasks=1)) == 1
        assert [c.result for c in await ex.run_ready()] == [3]
    assert [t for _, t in attempts[3:]] == [6.0, 8.0]


async def test_a_concurrency_limited_retry_takes_its_key_back_first(autojump_clock):
    """A retry gives its key back for its backoff, which let the next task of the
    key through: a task that could only start in the caller's task, busy with the
    retry, which then waited for the key for ever. The retry takes the key back
    (the task let through goes back to its place); every task runs, in order,
    and ends as under `open_executor`."""
    attempts = []

    def flaky_spec():
        @task(retries=2, backoff=Backoff(initial=0.5, jitter=0))
        async def flaky(i):
            attempts.append(i)
            if len(attempts) <= 2:
                raise OSError("twice")
            return i

        return flaky

    limits = {"k": KeyLimit(concurrency=1)}
    ex = DeterministicExecutor(key_limits=limits)
    flaky = flaky_spec()
    for i in range(3):
        ex.submit_nowait(flaky, i, key="k")
    with trio.fail_after(60):  # (Trio's clock: it jumps; a hang fails here)
        done = await ex.run_ready()
    assert [(c.result, c.status, c.attempts) for c in done] == [
        (0, TaskStatus.COMPLETED, 3),
        (1, TaskStatus.COMPLETED, 1),
        (2, TaskStatus.COMPLETED, 1),
    ]
    assert attempts == [0, 0, 0, 1, 2]  # FIFO: one task at a time
    assert ex._core.pending.keys.statistics("k").pending == 0

    attempts.clear()
    flaky = flaky_spec()
    async with open_executor(key_limits=limits) as real:
        refs = [await real.submit(flaky, i, key="k") for i in range(3)]
        with trio.fail_after(60):
            real_done = [await r.wait() for r in refs]
    assert [c.status for c in real_done] == [c.status for c in done]
    assert sorted(attempts) == [0, 0, 1, 1, 2]  # (there, the next task ran meanwhile)


@pytest.mark.parametrize("condition", ["deadline", "predicate"])
async def test_a_deferred_task_of_a_concurrency_limited_key_resumes(autojump_clock, condition):
    """A deferral gives the key back too: the task deferred took it back only
    once the task let through meanwhile had run, which it never could."""
    seen = []

    async def defers(i, handle):
        seen.append(("start", i, trio.current_time()))
        until = trio.current_time() + 3
        if condition == "deadline":
            await handle.defer_until(until)
        else:
            await handle.defer_until(lambda: trio.current_time() >= until, poll_interval=1)
        seen.append(("resumed", i, trio.current_time()))
        return i

    ex = DeterministicExecutor(key_limits={"k": KeyLimit(concurrency=1)})
    for i in range(2):
        ex.submit_nowait(defers, i, key="k", timeout=100)  # (a failsafe: the wait ends)
    with trio.fail_after(60):
        done = await ex.run_ready()
    assert [(c.result, c.status) for c in done] == [
        (0, TaskStatus.COMPLETED),
        (1, TaskStatus.COMPLETED),
    ]
    assert seen == [("start", 0, 0.0), ("resumed", 0, 3.0), ("start", 1, 3.0), ("resumed", 1, 6.0)]


async def test_run_ready_is_cancellable_while_a_task_of_a_limited_key_is_deferred(
    autojump_clock,
):
    """Cancelled while its task is deferred, the task takes its key back (shielded,
    as a deferral does to run its code after the wait): at once, not never."""
    never = trio.Event()

    async def waits(handle):
        await handle.defer_until(never)

    ex = DeterministicExecutor(key_limits={"k": KeyLimit(concurrency=1)})
    first = ex.submit_nowait(waits, key="k", timeout=100)  # (a failsafe: the wait ends)
    ex.submit_nowait(waits, key="k", timeout=100)
    with trio.move_on_after(5) as scope:
        await ex.run_ready()
    assert scope.cancelled_caught
    assert trio.current_time() == 5.0  # (it returned when the key came back: 100)
    assert first.status is TaskStatus.CANCELLED
    assert ex.pending == 1
    assert ex.cancel_pending() == 1


async def test_the_cancel_event_is_heard_while_waiting_for_a_keys_token(autojump_clock):
    """run_ready(cancel=ev) waiting for a key's next token returns when ``ev`` is
    set, cancelling what is pending (it returned only when the token came)."""
    ex = DeterministicExecutor(key_limits={"k": KeyLimit(rate=1, per=100)})
    for _ in range(3):
        ex.submit_nowait(trio.sleep, 0, key="k")
    stop = trio.Event()

    async def stop_at_10():
        await trio.sleep(10)
        stop.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_at_10)
        done = await ex.run_ready(cancel=stop)
    assert [c.status for c in done] == [TaskStatus.COMPLETED] + [TaskStatus.CANCELLED] * 2
    assert trio.current_time() == 10.0
    assert ex.pending == 0


class _Spawned(trio.abc.Instrument):
    """The tasks trioexec's own code starts, by what they run (a store service by
    the service `ExecutorCore.guarded` runs)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        code = task.coro.cr_code
        if "/trioexec/" not in code.co_filename.replace("\\", "/"):
            return
        name = code.co_qualname
        if name == "ExecutorCore.guarded":
            name = "guarded " + task.coro.cr_frame.f_locals["service"].__qualname__
        self.names.add(name)


# Every task `open_executor` starts besides running jobs, and what stands in for it
# in a DeterministicExecutor: "the same" (it runs that task too), or why none is needed.
_STAND_INS = {
    "Timer._run": "the same",
    "Workers._worker": "run_ready runs each job in the caller's task",
    "Poller.run": "a deferred task polls its sync predicate in its own task",
    "WorkflowRun._coordinate": "no workflows: it has no start_workflow",
    "Schedules._run": "no schedules: it has no schedule",
    "guarded Schedules._run": "no schedules: it has no schedule",
    "Shutdown._expire_at": "no shutdown: it has no shutdown",
    "_close_events_when_done": "no shutdown: its events never end",
    "_store_services": "the store's services, below",
    "guarded Journal.run_writer": "run_ready writes an inline store after each task",
    "guarded Recovery.heartbeat": "its lease never expires (heartbeat at infinity)",
    "guarded Recovery.run": "recover=True is refused",
    "guarded Control.run": "its pauses are its own, not the store's",
    "guarded KeyBroker.run": "its key limits are its own, not shared through the store",
}


async def test_it_runs_every_background_task_of_open_executor_or_a_stand_in(
    autojump_clock, tmp_path
):
    """List what `open_executor` starts (a workload that needs each part) and
    check that the deterministic executor runs the same task, or has what makes
    it needless. A task added to `open_executor` fails this until it is listed."""
    from trioexec import MemoryStore, SQLiteStore, Workflow, open_executor

    real = _Spawned()
    trio.lowlevel.add_instrument(real)
    try:
        gate = trio.Event()

        async def waits(handle):
            await handle.defer_until(gate.is_set)  # a sync predicate: the poller's

        @task(id="step")
        async def step(context):
            await trio.lowlevel.checkpoint()

        async with open_executor(key_limits=KeyLimit(rate=1), shutdown_grace=60) as ex:
            for _ in range(2):
                await ex.submit(trio.sleep, 0, key="k")  # the second waits for a token
            deferred = await ex.submit(waits)
            await ex.run_workflow(Workflow("wf", [step]))
            ex.schedule(step, cron="0 0 1 1 *", schedule_id="yearly")
            await trio.sleep(1)
            gate.set()
            assert (await deferred.wait()).ok
            await ex.submit(trio.sleep, 5)  # still running at the end: the grace timer
        with SQLiteStore(tmp_path / "real.db", inline=True) as store:
            async with open_executor(store=store, recover=True, key_limits=KeyLimit(rate=1)) as ex:
                await ex.submit(trio.sleep, 0, key="k")
                ex.schedule(step, cron="0 0 1 1 *", schedule_id="yearly")
    finally:
        trio.lowlevel.remove_instrument(real)
    assert real.names == set(_STAND_INS), "list every task open_executor starts in _STAND_INS"

    deterministic = _Spawned()
    trio.lowlevel.add_instrument(deterministic)
    try:
        n = 0

        @task(retries=1, backoff=Backoff(initial=0.5, jitter=0))
        async def flaky():
            nonlocal n
            n += 1
            if n == 1:
                raise OSError("once")

        async def polls(handle):
            await handle.defer_until(lambda: trio.current_time() >= 30, poll_interval=1)

        with SQLiteStore(tmp_path / "det.db", inline=True) as store:
            ex = DeterministicExecutor(store=store, key_limits=KeyLimit(rate=1))
            refs = [ex.submit_nowait(flaky, key="k"), ex.submit_nowait(polls)]
            outer = trio.lowlevel.current_task()
            ran_in = []

            async def where():
                ran_in.append(trio.lowlevel.current_task())

            refs.append(ex.submit_nowait(where))
            with trio.fail_after(600):
                done = await ex.run_ready()
            assert [c.status for c in done] == [TaskStatus.COMPLETED] * 3
            # Stand-ins: the job ran in the caller's task, the inline store has
            # every completion, the lease never lapses.
            assert ran_in == [outer]
            assert [store.execution(r.task_id).status for r in refs] == [TaskStatus.COMPLETED] * 3
            assert store.execution(refs[0].task_id).lease_expires_at == float("inf")
    finally:
        trio.lowlevel.remove_instrument(deterministic)
    same = {name for name, stand_in in _STAND_INS.items() if stand_in == "the same"}
    assert deterministic.names == same
    for method in ("start_workflow", "schedule", "shutdown"):
        assert not hasattr(DeterministicExecutor, method)
    with pytest.raises(ValueError, match="recover"):
        DeterministicExecutor(store=MemoryStore(), recover=True)


def test_it_takes_every_option_open_executor_takes() -> None:
    """API §3: "takes the same options": both take ``**options`` of one list,
    `ExecutorOptions`, and read it the same way (`Setup.read`)."""
    import inspect
    import typing

    from trioexec import DeterministicExecutor, open_executor
    from trioexec._executor import ExecutorOptions

    for fn in (DeterministicExecutor.__init__, open_executor):
        params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
        assert [(p.name, p.kind) for p in params] == [("options", inspect.Parameter.VAR_KEYWORD)]
        hints = typing.get_type_hints(fn, include_extras=True)
        assert hints["options"] == typing.Unpack[ExecutorOptions]


async def test_an_unknown_option_is_refused_naming_it_and_the_call() -> None:
    """A misspelled option (``max_concurent_tasks``) is one TypeError that names
    the option and the call, on either facade; nothing starts."""
    from trioexec import DeterministicExecutor, open_executor

    with pytest.raises(
        TypeError, match=r"DeterministicExecutor\(\) got an unexpected option 'prio'"
    ):
        DeterministicExecutor(prio=1)  # type: ignore[call-arg]
    with pytest.raises(
        TypeError, match=r"open_executor\(\) got an unexpected option 'max_concurent_tasks'"
    ):
        async with open_executor(max_concurent_tasks=2):  # type: ignore[call-arg]
            pass
