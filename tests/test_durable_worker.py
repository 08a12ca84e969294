"""open_worker, in one process, under the mock clock, over every store (memory,
SQLite and PostgreSQL, inline: the wall clock follows Trio's)."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from trioexec.durable import (
    DurableStore,
    PromiseRejected,
    PromiseState,
    TaskState,
    open_worker,
)
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
async def ds(make_store, durable):
    return durable(make_store(clock=FakeWallClock(0)))


async def settled(ds, id):
    with trio.fail_after(1000):
        while (p := await ds.promises.get(id)).pending:
            await trio.sleep(0.1)
    return p


async def test_claims_runs_and_fulfils(ds, autojump_clock):
    for n in range(10):
        await ds.promises.create(f"t{n}", 100, target="w", data={"n": n})
    await ds.promises.create("other", 100, target="elsewhere", data={"n": -1})

    async def double(param):
        await trio.sleep(1)
        return param["n"] * 2

    async with open_worker(ds, "w", double, max_concurrent_tasks=2) as worker:
        results = [json.loads((await settled(ds, f"t{n}")).data) for n in range(10)]
        assert worker.executor.statistics().max_inflight_count <= 4
    assert results == [2 * n for n in range(10)]
    assert worker.fulfilled == 10
    assert (await ds.tasks.get("other")).state is TaskState.PENDING  # not our target
    assert await ds.check_invariants() == []


async def test_handler_error_rejects_the_promise(ds, autojump_clock):
    await ds.promises.create("t", 100, target="w", data=None)

    async def boom(param):
        raise ValueError("bad refund")

    async with open_worker(ds, "w", boom):
        p = await settled(ds, "t")
    assert p.state is PromiseState.REJECTED
    assert "bad refund" in p.data


async def test_a_rejected_promise_is_no_unread_failure(ds, autojump_clock, capsys):
    """The worker turned the handler's failure into the promise's rejection: its
    executor does not report it on stderr as a failure nobody read (issue 34)."""
    for n in range(3):
        await ds.promises.create(f"t{n}", 100, target="w", data=None)

    async def boom(param):
        raise ValueError("bad refund")

    async with open_worker(ds, "w", boom):
        for n in range(3):
            assert (await settled(ds, f"t{n}")).state is PromiseState.REJECTED
    assert capsys.readouterr().err == ""


async def test_handlers_by_name(make_store, durable):
    """Plain-def handlers run in threads: on the real clock (threads and the autojump
    clock do not mix: it jumped past the leases and the promises' timeouts while a
    handler's thread ran), waiting for events."""
    ds = durable(make_store())
    done = await fulfilled_event(ds)
    await ds.promises.create("a", 100, target="w", data={"handler": "inc", "param": 1})
    await ds.promises.create("b", 100, target="w", data={"handler": "neg", "param": 5})
    await ds.promises.create("c", 100, target="w", data={"handler": "nope", "param": 0})
    handlers = {"inc": lambda x: x + 1, "neg": lambda x: -x}
    with trio.fail_after(10):
        async with open_worker(ds, "w", handlers, poll_interval=0.01):
            for id in "abc":
                await done(id).wait()
    a, b, c = [await ds.promises.get(i) for i in "abc"]
    assert (a.data, b.data) == ("2", "-5")
    assert c.state is PromiseState.REJECTED
    assert "nope" in c.data


async def test_await_promise_suspends_frees_the_slot_and_redelivers(ds, autojump_clock):
    await ds.promises.create("approval", 1000)
    await ds.promises.create("job", 1000, target="w", data={"x": 1})
    runs = []

    async def needs_approval(param, handle):
        runs.append(trio.current_time())
        decision = await handle.await_promise("approval")
        return {"approved": decision}

    async with open_worker(ds, "w", needs_approval, max_concurrent_tasks=1) as worker:
        with trio.fail_after(100):
            while (await ds.tasks.get("job")).state is not TaskState.SUSPENDED:
                await trio.sleep(0.1)
        await trio.testing.wait_all_tasks_blocked()
        assert worker.executor.slots.in_use == 0
        task = await ds.tasks.get("job")
        assert (task.lease_expires_at, task.pid, task.awaiting) == (None, None, ("approval",))
        await trio.sleep(50)
        assert len(runs) == 1  # nothing runs or polls the task meanwhile
        await ds.promises.resolve("approval", data="yes")
        assert (await ds.tasks.get("job")).state is TaskState.PENDING  # at once
        p = await settled(ds, "job")
    assert json.loads(p.data) == {"approved": "yes"}
    assert len(runs) == 2  # re-run from the top
    assert worker.suspended == 1
    assert await ds.check_invariants() == []


async def test_await_settled_promise_returns_at_once_and_rejection_raises(ds, autojump_clock):
    await ds.promises.create("yes", 1000)
    await ds.promises.resolve("yes", data=7)
    await ds.promises.create("no", 1000)
    await ds.promises.reject("no", data="denied")
    await ds.promises.create("job", 1000, target="w")
    seen = []

    async def handler(param, handle):
        seen.append(await handle.await_promise("yes"))
        try:
            await handle.await_promise("no")
        except PromiseRejected as exc:
            seen.append(exc.record.state)
        return "done"

    async with open_worker(ds, "w", handler) as worker:
        await settled(ds, "job")
    assert seen == [7, PromiseState.REJECTED]
    assert worker.suspended == 0


async def test_heartbeat_keeps_a_long_task(ds, autojump_clock):
    await ds.promises.create("long", 1000, target="w")

    async def slow(param):
        await trio.sleep(30)  # ten times the lease
        return "ok"

    async with open_worker(ds, "w", slow, lease=3) as worker:
        p = await settled(ds, "long")
    assert p.data == '"ok"'
    assert (await ds.tasks.get("long")).version == 1  # acquired once, never lost
    assert worker.claimed == 1


async def test_an_abandoned_lease_is_claimed_again_at_a_higher_version(ds, autojump_clock):
    await ds.promises.create("t", 1000, target="w", data=1)
    await ds.tasks.acquire("t", 0, pid="dead-worker", ttl=5)  # then it "dies"

    async def inc(x):  # async: a thread would let the autojump clock pass the lease
        return x + 1

    async with open_worker(ds, "w", inc, lease=5):
        p = await settled(ds, "t")
    assert p.data == "2"
    assert (await ds.tasks.get("t")).version == 2
    assert trio.current_time() >= 5


async def test_leaving_releases_what_the_worker_holds(ds, autojump_clock):
    for n in range(3):
        await ds.promises.create(f"t{n}", 1000, target="w")

    async def forever(param):
        await trio.sleep_forever()

    async with open_worker(ds, "w", forever, max_concurrent_tasks=1):
        await trio.sleep(1)
    tasks = [await ds.tasks.get(f"t{n}") for n in range(3)]
    assert [t.state for t in tasks] == [TaskState.PENDING] * 3
    assert await ds.check_invariants() == []


# ---------------------------------------------------------------------- issue 13


async def wait_for_state(ds, id, state):
    with trio.fail_after(1000):
        while (await ds.tasks.get(id)).state is not state:
            await trio.sleep(0.1)


async def test_await_promise_in_nested_nurseries_suspends_the_task(ds, autojump_clock):
    """#14: the suspension signal from a grandchild task must not crash the worker."""
    await ds.promises.create("approval", 1000)
    await ds.promises.create("job", 1000, target="w")
    await ds.promises.create("other", 1000, target="w", data=5)
    runs = []

    async def handler(param, handle):
        if param == 5:
            return "other done"
        runs.append(trio.current_time())
        found = []

        async def deep():
            found.append(await handle.await_promise("approval"))

        async with trio.open_nursery() as outer:
            outer.start_soon(trio.sleep_forever)  # a sibling, cancelled by the unwinding
            async with trio.open_nursery() as inner:
                inner.start_soon(deep)
            outer.cancel_scope.cancel()
        return {"approved": found[0]}

    async with open_worker(ds, "w", handler, max_concurrent_tasks=1) as worker:
        await wait_for_state(ds, "job", TaskState.SUSPENDED)
        assert (await settled(ds, "other")).data == '"other done"'  # the worker lives on
        await trio.testing.wait_all_tasks_blocked()
        assert (await ds.tasks.get("job")).awaiting == ("approval",)
        assert worker.executor.slots.in_use == 0
        await ds.promises.resolve("approval", data="yes")
        p = await settled(ds, "job")
    assert json.loads(p.data) == {"approved": "yes"}
    assert len(runs) == 2
    assert worker.suspended == 1
    stats = worker.executor.statistics()
    assert (stats.failed_count, stats.cancelled_count) == (0, 0)
    assert await ds.check_invariants() == []


async def test_children_awaiting_several_pending_promises_suspend_and_redeliver(ds, autojump_clock):
    """#14: several children await different pending promises: the task suspends
    on those reached (at least one) and runs again when they settle."""
    await ds.promises.create("a", 1000)
    await ds.promises.create("b", 1000)
    await ds.promises.create("job", 1000, target="w")
    runs = 0

    async def handler(param, handle):
        nonlocal runs
        runs += 1
        values = {}

        async def get(id):
            values[id] = await handle.await_promise(id)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(get, "a")
            nursery.start_soon(get, "b")
        return values

    async with open_worker(ds, "w", handler) as worker:
        for _ in range(2):
            await wait_for_state(ds, "job", TaskState.SUSPENDED)
            awaiting = (await ds.tasks.get("job")).awaiting
            assert awaiting
            assert set(awaiting) <= {"a", "b"}
            for id in awaiting:
                await ds.promises.resolve(id, data=id.upper())
            if len(awaiting) == 2:
                break
        p = await settled(ds, "job")
    assert json.loads(p.data) == {"a": "A", "b": "B"}
    assert worker.suspended == runs - 1
    assert worker.executor.statistics().failed_count == 0
    assert await ds.check_invariants() == []


async def test_a_suspension_during_outside_cancellation_lets_the_cancellation_through(
    ds, autojump_clock
):
    """#14: a real Cancelled (the worker closing) in the group with a suspension
    signal propagates: the run ends cancelled, and the task is released, not
    suspended."""
    await ds.promises.create("approval", 1000)
    await ds.promises.create("job", 1000, target="w")
    started = trio.Event()

    async def handler(param, handle):
        async def child():
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await handle.await_promise("approval")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(child)
            started.set()
            await trio.sleep_forever()

    async with open_worker(ds, "w", handler) as worker:
        await started.wait()
    assert (await ds.tasks.get("job")).state is TaskState.PENDING
    assert worker.suspended == 0
    assert worker.executor.statistics().cancelled_count == 1
    assert await ds.check_invariants() == []


async def test_a_stuck_heartbeat_loses_the_lease_before_another_worker_claims(
    make_store, durable, autojump_clock
):
    """#15: the first worker's heartbeat never returns; its lease runs out and a
    second worker claims the task: the first run is cancelled first, and the work
    is done exactly once."""
    store = make_store(clock=FakeWallClock(0))
    ds1, ds2 = durable(store), durable(store)
    await ds1.promises.create("charge", 1000, target="w")
    log = []

    async def charge(param, handle):
        log.append(("start", handle.version, trio.current_time()))
        try:
            await trio.sleep(10)
        except trio.Cancelled:
            log.append(("cancelled", handle.version, trio.current_time()))
            raise
        log.append(("charged", handle.version, trio.current_time()))
        return handle.version

    async def stuck(pid, tasks):
        await trio.sleep_forever()

    ds1.tasks.heartbeat = stuck
    async with open_worker(ds1, "w", charge, lease=3, pid="one") as one:
        await wait_for_state(ds1, "charge", TaskState.ACQUIRED)
        async with open_worker(ds2, "w", charge, lease=3, pid="two") as two:
            p = await settled(ds2, "charge")
    assert p.state is PromiseState.RESOLVED
    charged = [version for kind, version, _ in log if kind == "charged"]
    assert charged == [int(p.data)]  # exactly once
    # Every other run (the first worker may claim it again: its heartbeat is stuck,
    # not its claims) was cancelled at the end of its lease, before the next began.
    runs = [entry for entry in log if entry[0] != "charged"]
    assert [kind for kind, _, _ in runs] == ["start", "cancelled"] * (len(runs) // 2) + ["start"]
    for (_, v1, began), (_, v2, ended), (_, v3, next_began) in zip(
        runs[::2], runs[1::2], runs[2::2], strict=False
    ):
        assert (v1, v2, v3) == (v1, v1, v1 + 1)
        assert ended == began + 3
        assert ended <= next_began
    assert (one.lost, one.fulfilled, two.fulfilled) == (len(runs) // 2, 0, 1)
    assert await ds1.check_invariants() == []


async def test_a_heartbeat_finding_the_task_taken_over_cancels_the_run(
    make_store, durable, autojump_clock
):
    """#15: the store's clock jumps past the first worker's lease (its heartbeat was
    late, as far as the store knows) and a second worker takes the task: the first
    worker's next heartbeat cancels its run; the task completes once."""
    skew = [0.0]
    base = FakeWallClock(0)
    store = make_store(clock=lambda: base() + skew[0])
    ds1, ds2 = durable(store), durable(store)
    await ds1.promises.create("charge", 1000, target="w")
    charged = []
    cancelled = []

    async def charge(param, handle):
        try:
            await trio.sleep(20)
        except trio.Cancelled:
            cancelled.append((handle.version, trio.current_time()))
            raise
        charged.append(handle.version)
        return handle.version

    async with open_worker(ds1, "w", charge, lease=3, pid="one") as one:
        await wait_for_state(ds1, "charge", TaskState.ACQUIRED)
        skew[0] = 100.0
        async with open_worker(ds2, "w", charge, lease=3, pid="two") as two:
            p = await settled(ds2, "charge")
    assert p.data == "2"
    assert charged == [2]
    assert len(cancelled) == 1
    assert cancelled[0][0] == 1
    assert cancelled[0][1] <= 1  # at the first heartbeat (every lease / 3)
    assert (one.lost, one.fulfilled, two.fulfilled) == (1, 0, 1)


async def test_a_fulfil_that_conflicts_counts_as_lost_not_fulfilled(ds, autojump_clock):
    """#15: the lease is lost between the handler's end and its fulfil: the other
    owner's claim stands, and this run's result is not recorded."""
    await ds.promises.create("t", 1000, target="w")

    async def handler(param, handle):
        # Someone halts it and takes it meanwhile (in one step: no checkpoint lets
        # this worker's own claim loop in).
        core = ds._core
        core.halt("t")
        core.continue_("t")
        core.acquire("t", 1, pid="thief", ttl=100)
        return "mine"

    async with open_worker(ds, "w", handler) as worker:
        await wait_for_state(ds, "t", TaskState.ACQUIRED)
        await trio.testing.wait_all_tasks_blocked()
    task = await ds.tasks.get("t")
    assert (task.pid, task.version) == ("thief", 2)
    assert (await ds.promises.get("t")).pending
    assert (worker.lost, worker.fulfilled) == (1, 0)


async def test_a_result_that_is_not_json_rejects_the_promise(ds, autojump_clock):
    """#16a: not retried forever: rejected once, naming the task and the type."""
    await ds.promises.create("obj", 1000, target="w", data="obj")
    await ds.promises.create("nan", 1000, target="w", data="nan")

    class Receipt:
        pass

    async def handler(param):
        return Receipt() if param == "obj" else float("nan")

    async with open_worker(ds, "w", handler, lease=3) as worker:
        obj, nan = await settled(ds, "obj"), await settled(ds, "nan")
        await trio.sleep(30)  # ten leases: nothing is claimed again
    assert obj.state is PromiseState.REJECTED
    assert "'obj'" in obj.data
    assert "Receipt" in obj.data
    assert nan.state is PromiseState.REJECTED
    assert "'nan'" in nan.data
    assert "float" in nan.data
    assert worker.claimed == 2
    assert worker.executor.statistics().failed_count == 2
    assert [(await ds.tasks.get(i)).state for i in ("obj", "nan")] == [TaskState.FULFILLED] * 2


async def test_leaving_the_worker_by_cancellation_releases_its_tasks_at_once(ds, autojump_clock):
    """#16c: cancelled from outside, the worker still gives its tasks back (shielded)."""
    for n in range(3):
        await ds.promises.create(f"t{n}", 1000, target="w")

    async def forever(param):
        await trio.sleep_forever()

    with trio.move_on_after(1) as scope:
        async with open_worker(ds, "w", forever, max_concurrent_tasks=1, lease=30):
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert trio.current_time() == 1
    tasks = [await ds.tasks.get(f"t{n}") for n in range(3)]
    assert [t.state for t in tasks] == [TaskState.PENDING] * 3
    assert [t.version for t in tasks] == [1, 1, 0]  # two claimed (twice the slots)
    assert await ds.check_invariants() == []


@pytest.mark.parametrize("option", ["lease", "poll_interval"])
@pytest.mark.parametrize("bad", [0, -1, 0.0, float("nan"), float("inf"), True, "1", None])
async def test_open_worker_refuses_unusable_intervals(ds, option, bad):
    """#16d: poll_interval=0 used to spin; a bad lease is as bad."""
    with pytest.raises(ValueError, match=option) as info:
        async with open_worker(ds, "w", lambda x: x, **{option: bad}):
            pass  # pragma: no cover
    assert repr(bad) in str(info.value)


# Sync handlers use worker threads: these tests run on the real clock (threads and
# the autojump clock do not mix) and wait for events, never for time.


async def fulfilled_event(ds):
    """An event per promise id, set when a worker's fulfil of it has returned."""
    events = {}
    fulfill = ds.tasks.fulfill

    async def observed(id, version, **kwargs):
        record = await fulfill(id, version, **kwargs)
        events.setdefault(id, trio.Event()).set()
        return record

    ds.tasks.fulfill = observed
    return lambda id: events.setdefault(id, trio.Event())


async def test_a_sync_handler_runs_in_a_worker_thread(make_store, durable):
    """#16b: a plain def handler no longer blocks the Trio thread; its handle's
    blocking methods work from the thread."""
    import threading

    ds = durable(make_store())
    done = await fulfilled_event(ds)
    await ds.promises.create("ready", 100)
    await ds.promises.resolve("ready", data=41)
    await ds.promises.create("approval", 100)
    await ds.promises.create("plain", 100, target="w", data="plain")
    await ds.promises.create("waits", 100, target="w", data="waits")
    trio_thread = threading.get_ident()
    threads = []
    go = trio.Event()

    def handler(param, handle):
        threads.append(threading.get_ident())
        if param == "plain":
            handle.defer_until_sync(go)  # blocks this thread only, without a slot
            return handle.await_promise_sync("ready") + 1
        return {"approved": handle.await_promise_sync("approval")}

    with trio.fail_after(10):
        async with open_worker(ds, "w", handler, poll_interval=0.01) as worker:
            while worker.executor.statistics().deferred_count != 1:
                await trio.testing.wait_all_tasks_blocked()
            go.set()
            await done("plain").wait()
            while (await ds.tasks.get("waits")).state is not TaskState.SUSPENDED:
                await trio.testing.wait_all_tasks_blocked()
            await ds.promises.resolve("approval", data=True)
            await done("waits").wait()
    assert (await ds.promises.get("plain")).data == "42"
    assert json.loads((await ds.promises.get("waits")).data) == {"approved": True}
    assert trio_thread not in threads
    assert len(threads) == 3  # "waits" ran twice
    assert (worker.fulfilled, worker.suspended) == (2, 1)


async def test_a_sync_handler_whose_lease_is_lost_is_never_recorded(
    make_store, durable, mock_clock
):
    """#15 with a thread: the run cannot be interrupted, but it is told
    (``handle.cancel_requested``) and its result is never written."""
    import threading

    skew = [0.0]
    base = FakeWallClock(0)
    store = make_store(clock=lambda: base() + skew[0])
    ds1, ds2 = durable(store), durable(store)
    done = await fulfilled_event(ds2)
    await ds1.promises.create("charge", 1000, target="w")
    entered = trio.Event()
    release = threading.Event()
    seen = []

    def slow(param, handle):
        trio.from_thread.run_sync(entered.set)
        release.wait(10)
        seen.append(handle.cancel_requested)
        return "one"

    async def fast(param):
        return "two"

    async with open_worker(ds1, "w", slow, lease=3, pid="one") as one:
        await entered.wait()
        skew[0] = 100.0  # the store now sees the lease as expired
        async with open_worker(ds2, "w", fast, lease=3, pid="two"):
            await done("charge").wait()
        mock_clock.jump(1)  # the first worker's heartbeat
        await trio.testing.wait_all_tasks_blocked()
        assert one.lost == 1
        release.set()
    assert seen == [True]
    assert (await ds1.promises.get("charge")).data == '"two"'
    assert (one.lost, one.fulfilled) == (1, 0)


async def test_a_promise_settling_before_the_suspend_reruns_the_handler_in_place(
    ds, autojump_clock
):
    """#14: the promise settles between the handler's look and the worker's suspend
    (Suspend.ALREADY_SETTLED): the handler runs again at once, same lease."""
    await ds.promises.create("approval", 1000)
    await ds.promises.create("job", 1000, target="w")
    suspend = ds.tasks.suspend
    runs = 0

    async def settle_first(id, version, awaited):
        await ds.promises.resolve("approval", data="late yes")
        return await suspend(id, version, awaited)

    ds.tasks.suspend = settle_first

    async def handler(param, handle):
        nonlocal runs
        runs += 1
        return await handle.await_promise("approval")

    async with open_worker(ds, "w", handler) as worker:
        p = await settled(ds, "job")
    assert p.data == '"late yes"'
    assert runs == 2
    assert (worker.claimed, worker.suspended, worker.fulfilled) == (1, 0, 1)
    assert (await ds.tasks.get("job")).version == 1


async def test_a_handler_that_swallows_the_suspension_still_suspends(ds, autojump_clock):
    """#14: the signal caught by an over-broad ``except BaseException`` in the
    handler: the task still suspends (its value after that is meaningless)."""
    await ds.promises.create("approval", 1000)
    await ds.promises.create("job", 1000, target="w")

    async def handler(param, handle):
        try:
            return await handle.await_promise("approval")
        except BaseException:
            return "guessed"

    async with open_worker(ds, "w", handler) as worker:
        await wait_for_state(ds, "job", TaskState.SUSPENDED)
        assert (await ds.promises.get("job")).pending
        await ds.promises.resolve("approval", data="real")
        p = await settled(ds, "job")
    assert p.data == '"real"'
    assert worker.suspended == 1
