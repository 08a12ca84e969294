"""`Worker.drain`, and what leaving or draining a worker does to the tasks it holds:
a claim loop cancelled in the middle of a batch, a cancelled thread's error, and a
handler that suspends while the worker drains or cancels its run (a suspension is
an outcome, never a cancelled run to release). Over every store (memory, SQLite and
PostgreSQL, inline; the mock clock where no thread is involved)."""

from __future__ import annotations

import collections
import time

import pytest
import trio
import trio.testing

import trioexec.durable._worker as worker_module
from trioexec.durable import DurableStore, PromiseState, TaskState, open_worker
from trioexec.testing import FakeWallClock


@pytest.fixture
def durable():
    """``durable(store)``: a `DurableStore` on it, closed after the test."""
    made = []

    def make(store):
        made.append(DurableStore(store))
        return made[-1]

    yield make
    for ds in made:
        ds.close()


@pytest.fixture
async def store(make_store):
    return make_store(clock=FakeWallClock(0))


async def states(ds, ids):
    return [(t.state, t.version) for t in [await ds.tasks.get(id) for id in ids]]


async def create(ds, n):
    ids = [f"t{i}" for i in range(n)]
    for id in ids:
        await ds.promises.create(id, 10_000, target="w", data=id)
    return ids


async def test_drain_gives_back_what_has_not_started_and_lets_the_runs_finish(
    store, durable, autojump_clock
):
    ds_a, ds_b = durable(store), durable(store)
    ids = await create(ds_a, 8)
    runs = collections.Counter()

    async def slow(param):
        runs[param] += 1
        await trio.sleep(10)
        return "a"

    async def fast(param):
        runs[param] += 1
        return "b"

    async with open_worker(ds_a, "w", slow, max_concurrent_tasks=2) as a:
        while a.running < 2 or a.claimed < 4:
            await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        started = [id for id in ids if runs[id]]
        held = a.claimed
        async with trio.open_nursery() as nursery:

            async def drain():
                assert await a.drain() is True
                assert trio.current_time() == start + 10  # the runs' own length
                nursery.cancel_scope.cancel()

            nursery.start_soon(drain)
            await trio.testing.wait_all_tasks_blocked()
            # At once, before any run ended: the tasks claimed ahead are pending
            # again (same version), the running ones still held.
            assert trio.current_time() == start
            now = dict(zip(ids, await states(ds_a, ids), strict=True))
            ahead = [id for id in ids if now[id] == (TaskState.PENDING, 1)]
            assert len(ahead) == held - 2
            assert [now[id][0] for id in started] == [TaskState.ACQUIRED] * 2
            # Another worker takes them (and the rest) while the first drains.
            async with open_worker(ds_b, "w", fast, max_concurrent_tasks=2):
                await trio.sleep_forever()
        assert a.running == 0
        assert a.claimed == held  # nothing claimed after the drain
    promises = [await ds_a.promises.get(id) for id in ids]
    assert [p.state for p in promises] == [PromiseState.RESOLVED] * 8
    assert [p.data for p in promises] == ['"a"' if id in started else '"b"' for id in ids]
    assert runs == collections.Counter(dict.fromkeys(ids, 1))  # none ran twice
    assert (a.fulfilled, a.cancelled) == (2, 0)
    assert await ds_a.check_invariants() == []


async def test_drain_grace_cancels_the_runs_and_releases_their_tasks(
    store, durable, autojump_clock
):
    ds = durable(store)
    ids = await create(ds, 3)

    async def forever(param):
        await trio.sleep_forever()

    async with open_worker(ds, "w", forever, max_concurrent_tasks=2) as worker:
        while worker.running < 2:
            await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        assert await worker.drain(grace=5) is False
        assert trio.current_time() == start + 5
        # Released by the drain, before the block is left.
        assert [s for s, _ in await states(ds, ids)] == [TaskState.PENDING] * 3
        assert (worker.running, worker.cancelled, worker.fulfilled) == (0, 2, 0)
        assert await worker.drain(grace=5) is True  # nothing left to drain
    assert [p.state for p in [await ds.promises.get(id) for id in ids]] == [
        PromiseState.PENDING
    ] * 3
    assert await ds.check_invariants() == []


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "1"])
async def test_drain_refuses_an_unusable_grace(store, durable, bad):
    async with open_worker(durable(store), "w", lambda x: x) as worker:
        with pytest.raises(ValueError, match="grace") as info:
            await worker.drain(grace=bad)
    assert repr(bad) in str(info.value)


async def test_a_claim_loop_cancelled_in_the_middle_of_a_batch_leaves_nothing_claimed(
    store, durable, autojump_clock, monkeypatch
):
    """The claim's batch comes back, and the worker is cancelled right then: its
    claim loop is cancelled at the first submit, before the rest of the batch was
    held. Every task of the batch must still be released on leaving."""
    ds = durable(store)
    ids = await create(ds, 6)
    claim_work = worker_module.claim_work
    batches = []

    async def claim_then_leave(*args, **kwargs):
        batch = await claim_work(*args, **kwargs)
        batches.append(len(batch))
        leaving.cancel()  # lands at the claim loop's next checkpoint
        return batch

    monkeypatch.setattr(worker_module, "claim_work", claim_then_leave)

    async def forever(param):
        await trio.sleep_forever()

    with trio.CancelScope() as leaving:
        async with open_worker(ds, "w", forever, max_concurrent_tasks=2):
            await trio.sleep_forever()
    assert batches == [4]  # the slots, and as many claimed ahead
    assert [s for s, _ in await states(ds, ids)] == [TaskState.PENDING] * 6
    assert await ds.check_invariants() == []


async def test_a_drain_during_a_claim_holds_then_releases_its_batch(
    store, durable, autojump_clock, monkeypatch
):
    """The drain begins while a claim's transaction is under way (it completes: see
    `DurableStore`); the batch is then held, never started, and released by the
    drain."""
    ds = durable(store)
    ids = await create(ds, 6)
    claim_work = worker_module.claim_work
    drained = trio.Event()

    async def drain():
        assert await worker.drain() is True
        drained.set()

    async def claim_during_a_drain(*args, **kwargs):
        nursery.start_soon(drain)
        with trio.CancelScope(shield=True):  # under way: it completes
            await trio.testing.wait_all_tasks_blocked()  # the drain waits for it
            return await claim_work(*args, **kwargs)

    monkeypatch.setattr(worker_module, "claim_work", claim_during_a_drain)
    runs = []

    async def record(param):
        runs.append(param)  # pragma: no cover - nothing may start

    async with trio.open_nursery() as nursery, open_worker(ds, "w", record) as worker:
        await drained.wait()
        assert [s for s, _ in await states(ds, ids)] == [TaskState.PENDING] * 6
        assert worker.claimed == 6
    assert runs == []
    assert await ds.check_invariants() == []


# A plain def handler runs in a thread: the real clock (threads and the autojump
# clock do not mix), and events, never time.


class Stopped(Exception):
    """What a cancelled thread raises (it learns of its cancellation by looking)."""


@pytest.mark.parametrize("how", ["leave", "drain"])
async def test_a_cancelled_thread_that_raises_has_its_task_released_not_rejected(
    make_store, durable, how
):
    ds = durable(make_store())
    await ds.promises.create("t", 10_000, target="w", data="t")
    entered = trio.Event()

    def looks(param, handle):
        trio.from_thread.run_sync(entered.set)
        for _ in range(10_000):  # (bounded: a thread outlives a failing test)
            if handle.cancel_requested:
                raise Stopped(param)
            time.sleep(0.001)
        return "not cancelled"  # pragma: no cover

    with trio.fail_after(10), trio.CancelScope() as leaving:
        async with open_worker(ds, "w", looks, poll_interval=0.01) as worker:
            await entered.wait()
            if how == "drain":
                assert await worker.drain(grace=0) is False
                assert (await ds.tasks.get("t")).state is TaskState.PENDING
            leaving.cancel()
    task, promise = await ds.tasks.get("t"), await ds.promises.get("t")
    assert (task.state, task.version, promise.state) == (
        TaskState.PENDING,
        1,
        PromiseState.PENDING,
    )
    assert (worker.cancelled, worker.fulfilled) == (1, 0)


async def test_a_thread_that_ignores_its_cancellation_does_not_hold_the_drain(make_store, durable):
    import threading

    ds = durable(make_store())
    await ds.promises.create("t", 10_000, target="w", data="t")
    entered, let_go = trio.Event(), threading.Event()

    def deaf(param):
        trio.from_thread.run_sync(entered.set)
        let_go.wait(30)  # (never looks at cancel_requested)
        return "done"

    with trio.fail_after(20):
        async with open_worker(ds, "w", deaf, poll_interval=0.01, lease=1.0) as worker:
            await entered.wait()
            started = trio.current_time()
            assert await worker.drain(grace=0) is False  # after at most a lease more
            assert trio.current_time() - started < 1.0 + 2.0  # (slack for a loaded host)
            assert worker.running == 1
            # Its task is not given back while its thread runs (it would run twice).
            assert (await ds.tasks.get("t")).state is not TaskState.PENDING
            let_go.set()


# A suspension is the run's outcome, not a cancellation: once the handler asked to
# suspend (and unwound with nothing but the suspension), the worker writes it,
# even if the drain's grace or the worker's leaving cancels the run meanwhile; the
# task is then the store's, suspended: never released at its version, never run
# again here.


def suspend_held_until(ds, proceed):
    """Make ``ds.tasks.suspend`` wait for ``proceed`` before it is written (as a write
    queued behind another transaction does); returns an event set once it waits."""
    real = ds.tasks.suspend
    waiting = trio.Event()

    async def held(id, version, awaited):
        waiting.set()
        await proceed.wait()
        return await real(id, version, awaited)

    ds.tasks.suspend = held
    return waiting


async def test_a_handler_that_suspends_during_a_drain_stays_suspended(
    store, durable, autojump_clock
):
    ds = durable(store)
    await ds.promises.create("approval", 10_000)
    await ds.promises.create("job", 10_000, target="w")
    entered, go = trio.Event(), trio.Event()
    runs = []

    async def handler(param, handle):
        runs.append(handle.version)
        if handle.version == 1:
            entered.set()
            await go.wait()
        return await handle.await_promise("approval")

    async with open_worker(ds, "w", handler) as worker:
        await entered.wait()
        async with trio.open_nursery() as nursery:

            async def drain():
                assert await worker.drain() is True

            nursery.start_soon(drain)
            await trio.testing.wait_all_tasks_blocked()
            assert worker.running == 1  # the drain waits for it
            go.set()  # it suspends now, the drain under way
        task = await ds.tasks.get("job")
        assert (task.state, task.version, task.awaiting) == (
            TaskState.SUSPENDED,
            1,
            ("approval",),
        )
        assert (worker.suspended, worker.cancelled, worker.running) == (1, 0, 0)
    assert (await ds.tasks.get("job")).state is TaskState.SUSPENDED  # not released
    await ds.promises.resolve("approval", data="yes")
    async with open_worker(ds, "w", handler) as again:
        while (await ds.promises.get("job")).pending:
            await trio.sleep(0.1)
    assert (await ds.promises.get("job")).data == '"yes"'
    assert runs == [1, 2]  # once per version
    assert (again.fulfilled, again.cancelled) == (1, 0)
    assert await ds.check_invariants() == []


async def cancel_the_run(how, worker, leaving, handle, nursery, meanwhile):
    """Cancel the run of ``handle`` while its suspension waits to be written: by the
    drain's grace (0), or by leaving the worker's block by a cancellation. Then
    ``meanwhile()`` (shielded), and the suspension goes on (``proceed``)."""
    if how == "grace":

        async def once_cancelled():
            await handle.task.cancelled()  # the drain's grace ran out: it cancels
            await meanwhile()

        nursery.start_soon(once_cancelled)
        assert await worker.drain(grace=0) is False
    else:
        leaving.cancel()  # the run, in the block, is cancelled from now on
        with trio.CancelScope(shield=True):
            await meanwhile()


@pytest.mark.parametrize("how", ["grace", "leave"])
async def test_a_suspension_written_as_the_worker_cancels_the_run_is_kept(
    store, durable, autojump_clock, how
):
    """The handler suspended; its suspension is waiting to be written when the run
    is cancelled (the drain's grace runs out, or the worker's block is left by a
    cancellation). It is written all the same: the task is suspended, not
    released, and its handler does not run again until the promise settles."""
    ds = durable(store)
    await ds.promises.create("approval", 10_000)
    await ds.promises.create("job", 10_000, target="w")
    proceed = trio.Event()
    waiting = suspend_held_until(ds, proceed)
    handles = []

    async def handler(param, handle):
        handles.append(handle)
        return await handle.await_promise("approval")

    async def meanwhile():
        proceed.set()

    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as leaving:
                async with open_worker(ds, "w", handler) as worker:
                    await waiting.wait()
                    await cancel_the_run(how, worker, leaving, handles[0], nursery, meanwhile)
    task = await ds.tasks.get("job")
    assert (task.state, task.version, task.awaiting) == (TaskState.SUSPENDED, 1, ("approval",))
    assert (worker.suspended, worker.cancelled, worker.running) == (1, 0, 0)
    assert len(handles) == 1
    await ds.promises.resolve("approval", data="yes")
    async with open_worker(ds, "w", handler):
        while (await ds.promises.get("job")).pending:
            await trio.sleep(0.1)
    assert [h.version for h in handles] == [1, 2]
    assert await ds.check_invariants() == []


@pytest.mark.parametrize("how", ["grace", "leave"])
async def test_a_suspension_refused_as_the_run_is_cancelled_does_not_run_the_handler_again(
    store, durable, autojump_clock, how
):
    """The promise settles before the suspension is written (the store refuses it:
    `Suspend.ALREADY_SETTLED`) while the run is being cancelled: its handler is
    not called again here (in place, as it would be otherwise); nothing was
    recorded, so the task is released, and the next run takes it from the top."""
    ds = durable(store)
    await ds.promises.create("approval", 10_000)
    await ds.promises.create("job", 10_000, target="w")
    proceed = trio.Event()
    waiting = suspend_held_until(ds, proceed)
    handles = []

    async def handler(param, handle):
        handles.append(handle)
        return await handle.await_promise("approval")

    async def meanwhile():
        await ds.promises.resolve("approval", data="yes")
        proceed.set()

    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as leaving:
                async with open_worker(ds, "w", handler) as worker:
                    await waiting.wait()
                    await cancel_the_run(how, worker, leaving, handles[0], nursery, meanwhile)
    task = await ds.tasks.get("job")
    assert (task.state, task.version) == (TaskState.PENDING, 1)
    assert (worker.suspended, worker.cancelled, worker.fulfilled) == (0, 1, 0)
    assert len(handles) == 1
    async with open_worker(ds, "w", handler):
        while (await ds.promises.get("job")).pending:
            await trio.sleep(0.1)
    assert (await ds.promises.get("job")).data == '"yes"'
    assert [h.version for h in handles] == [1, 2]
    assert await ds.check_invariants() == []


@pytest.mark.parametrize("how", ["grace", "leave"])
async def test_a_thread_whose_suspension_is_written_as_the_run_is_cancelled_stays_suspended(
    store, durable, how
):
    """`test_a_suspension_written_as_the_worker_cancels_the_run_is_kept` for a plain
    ``def`` handler (its suspension is written from its thread)."""
    ds = durable(store)
    await ds.promises.create("approval", 10_000)
    await ds.promises.create("job", 10_000, target="w")
    proceed = trio.Event()
    waiting = suspend_held_until(ds, proceed)
    handles = []

    def handler(param, handle):
        handles.append(handle)
        return handle.await_promise_sync("approval")

    async def meanwhile():
        proceed.set()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as leaving:
                async with open_worker(ds, "w", handler, poll_interval=0.01) as worker:
                    await waiting.wait()
                    await cancel_the_run(how, worker, leaving, handles[0], nursery, meanwhile)
    task = await ds.tasks.get("job")
    assert (task.state, task.version, task.awaiting) == (TaskState.SUSPENDED, 1, ("approval",))
    assert (worker.suspended, worker.cancelled, worker.running) == (1, 0, 0)
    assert len(handles) == 1
    assert await ds.check_invariants() == []
