"""The executor with a store: what is recorded, when it is durable, leases, recovery."""

from __future__ import annotations

import json
import threading
import time

import attrs
import pytest
import trio
import trio.testing

from trioexec import (
    HealthEventKind,
    MemoryStore,
    ShutdownPolicy,
    SQLiteStore,
    SubStatus,
    TaskHandle,
    TaskStatus,
    open_executor,
    task,
)
from trioexec._changes import Finish, Retry, Start, Sub, submitted
from trioexec.testing import FakeWallClock


async def test_sub_status_sequence_through_the_store(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=1000))
    ev = trio.Event()
    seen = []

    async def job(handle: TaskHandle):
        await trio.sleep(1)
        await handle.defer_until(ev)
        await trio.sleep(1)
        return "done"

    def look(ref):
        rec = store.execution(ref.task_id)
        seen.append(None if rec is None else (rec.status, rec.sub_status))

    async with open_executor(store=store) as ex:
        ref = await ex.submit(job)
        await trio.testing.wait_all_tasks_blocked()  # it has started
        await ex.flush()
        look(ref)
        await trio.sleep(0.5)
        await ex.flush()
        look(ref)
        await trio.sleep(1)
        await ex.flush()
        look(ref)
        assert ref.sub_status is SubStatus.DEFERRED
        rec = store.execution(ref.task_id)
        assert rec.deferred_since == 1001
        ev.set()
        await trio.testing.wait_all_tasks_blocked()
        await ex.flush()
        look(ref)
        c = await ref.wait()
        look(ref)  # wait() returned: the completion is durable
    assert c.ok
    R, A, D = TaskStatus.RUNNING, SubStatus.ACTIVE, SubStatus.DEFERRED
    assert seen == [
        (TaskStatus.RUNNING, A),
        (R, A),
        (R, D),
        (R, A),
        (TaskStatus.COMPLETED, None),
    ]
    rec = store.execution(ref.task_id)
    assert rec.attempt == 1
    assert (rec.submitted_at, rec.started_at, rec.finished_at) == (1000, 1000, 1001 + 1.5)
    assert rec.deferred_since is None
    assert rec.owner == ex.owner


async def test_every_outcome_is_recorded(make_store, autojump_clock):
    store = make_store()

    async def boom():
        raise KeyError("lost key")

    @task(retries=1)
    async def flaky():
        raise OSError("flaky")

    async with open_executor(
        store=store, max_concurrent_tasks=1, queue_capacity=1, overflow="drop_newest"
    ) as ex:
        await ex.submit(trio.sleep, 5)
        await ex.submit(trio.sleep, 5)
        refs = {"dropped": await ex.submit(trio.sleep, 1)}  # full: dropped on arrival
        await ex.wait_for_idle()
        refs["failed"] = await ex.submit(boom)
        refs["flaky"] = await ex.submit(flaky)
        await ex.wait_for_idle()
        refs["timed_out"] = await ex.submit(trio.sleep, 10, timeout=1)
        refs["completed"] = await ex.submit(trio.sleep, 0)
        await ex.wait_for_idle()
        refs["cancelled"] = await ex.submit(trio.sleep_forever)
        await trio.testing.wait_all_tasks_blocked()
        refs["cancelled"].cancel()
    for ref in refs.values():
        await ref.wait()
    got = {k: store.execution(r.task_id) for k, r in refs.items()}
    assert {k: r.status for k, r in got.items()} == {
        "failed": TaskStatus.FAILED,
        "flaky": TaskStatus.FAILED,
        "dropped": TaskStatus.DROPPED,
        "timed_out": TaskStatus.TIMED_OUT,
        "completed": TaskStatus.COMPLETED,
        "cancelled": TaskStatus.CANCELLED,
    }
    assert all(r.sub_status is None for r in got.values())
    assert "lost key" in got["failed"].error
    assert got["flaky"].attempt == 2
    assert "TaskTimeout" in got["timed_out"].error
    assert got["flaky"].spec_id == flaky.id
    assert json.loads(got["flaky"].args) == []


async def test_queries(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=0))
    events = [trio.Event() for _ in range(3)]

    async def waiter(i, handle):
        await handle.defer_until(events[i])

    async with open_executor(store=store) as ex:
        refs = []
        for i in range(3):
            refs.append(await ex.submit(waiter, i))
            await trio.sleep(10)
        await ex.flush()
        deferred = store.executions(sub_status="deferred")
        assert [r.task_id for r in deferred] == [r.task_id for r in refs]
        assert [r.task_id for r in store.executions(deferred_longer_than=15)] == [
            r.task_id for r in refs[:2]
        ]
        import datetime

        assert len(store.executions(deferred_longer_than=datetime.timedelta(seconds=25))) == 1
        assert store.executions(status=TaskStatus.COMPLETED) == []
        assert len(store.executions(status="running", sub_status=SubStatus.DEFERRED)) == 3
        assert store.executions(run_id="nope") == []
        for e in events:
            e.set()
    assert len(store.executions(status="completed")) == 3
    assert store.execution("missing") is None


async def test_lease_lost_cancels_and_does_not_retry(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=0))

    @task(retries=3)
    async def long_job(handle: TaskHandle):
        await handle.defer_until(trio.Event())

    async with open_executor(store=store, lease=3) as ex:
        ref = await ex.submit(long_job)
        await ex.flush()
        # Another executor takes it over (as if ours had stopped heartbeating).
        rec = store.recover("thief", 10**6, lambda r: True, 3)
        assert [r.task_id for r in rec.claimed] == [ref.task_id]
        c = await ref.wait()
    assert c.status is TaskStatus.CANCELLED
    assert "lease_lost" in str(c.error)
    assert c.attempts == 1
    row = store.execution(ref.task_id)
    assert (row.owner, row.status, row.version) == ("thief", TaskStatus.PENDING, 2)


def _dead_owner_rows(store, spec, n, *, owner="dead", args=(1,)):
    changes = []
    for i in range(n):
        tid = f"{owner}-{i}"
        changes.append(submitted(tid, 1, spec.id, None, spec.id, json.dumps(args), owner, 0.0))
        changes.append(Start((tid, 1, 1, 0.0)))
    store.write(changes)
    store.heartbeat(owner, 5.0)  # long expired at t >= 5
    return [f"{owner}-{i}" for i in range(n)]


async def test_recovery_reruns_orphans_and_abandons(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))
    ran = []

    @task(id="work")
    async def work(x):
        ran.append(x)
        return x * 2

    @task(id="unregistered")
    async def other(x):  # pragma: no cover - never re-created
        return x

    reruns = _dead_owner_rows(store, work, 3, args=(21,))
    orphans = _dead_owner_rows(store, other, 1, owner="dead2")
    nonjson = ["dead3-0"]
    store.write(
        [
            submitted("dead3-0", 1, "x", None, "work", None, "dead3", 0.0),
            submitted("done-0", 1, "x", None, "work", "[1]", "dead4", 0.0),
            Finish(("done-0", 1, TaskStatus.COMPLETED, 1.0, None, None, None)),
        ]
    )
    async with open_executor(store=store, recover=True, tasks=[work], lease=10) as ex:
        await ex.wait_for_idle()
        events = []
        while (e := ex.events.get_nowait()) is not None:
            events.append(e)
    assert ran == [21, 21, 21]
    for tid in reruns:
        rec = store.execution(tid)
        assert rec.status is TaskStatus.COMPLETED
        assert rec.recovery_attempts == 1
        assert rec.version == 2
        assert rec.attempt == 2  # the interrupted attempt, then ours
    for tid in orphans + nonjson:
        rec = store.execution(tid)
        assert rec.status is TaskStatus.FAILED
        assert rec.error.startswith("orphaned")
    assert store.execution("done-0").status is TaskStatus.COMPLETED  # never touched
    assert store.execution("done-0").version == 1
    assert not [e for e in events if e.kind is HealthEventKind.TASK_ABANDONED]


async def test_recovery_abandons_after_max_attempts(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))

    @task(id="work")
    async def work(x):  # pragma: no cover - abandoned, never run
        return x

    store.write(
        [
            submitted("t", 1, "work", None, "work", "[1]", "a", 0.0),
            Start(("t", 1, 1, 0.0)),
        ]
    )
    # Three earlier recoveries, each by an owner that died too.
    for n, owner in enumerate(["b", "c", "d"], start=1):
        rec = store.recover(owner, 10.0 * n, lambda r: True, 3)
        assert [r.recovery_attempts for r in rec.claimed] == [n]
    async with open_executor(
        store=store, recover=True, tasks=[work], max_recovery_attempts=3
    ) as ex:
        await ex.wait_for_idle()
        ev = ex.events.get_nowait()
    rec = store.execution("t")
    assert rec.status is TaskStatus.FAILED
    assert rec.error.startswith("abandoned")
    assert (ev.kind, ev.task_id) == (HealthEventKind.TASK_ABANDONED, "t")


async def test_recovery_waits_for_the_lease_to_lapse(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=0))
    ran = []

    @task(id="work")
    async def work(x):
        ran.append((x, trio.current_time()))

    store.write([submitted("t", 1, "work", None, "work", "[7]", "crashed", 0.0)])
    store.heartbeat("crashed", 25.0)  # its lease runs until t=25
    async with open_executor(store=store, recover=True, tasks=[work], lease=10) as ex:
        await trio.sleep(5)
        assert ran == []
        await trio.sleep(40)
        assert ex.statistics().completed_count == 1
    assert ran == [(7, 30.0)]  # the pass every `lease` seconds after t=25


async def test_two_executors_one_store_never_share(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=0))
    running: dict[str, int] = {}
    overlaps = []

    @task(id="work")
    async def work(i):
        running[i] = running.get(i, 0) + 1
        if running[i] > 1:
            overlaps.append(i)
        await trio.sleep(1)
        running[i] -= 1

    store.write(
        [
            submitted(f"t{i}", 1, "work", None, "work", json.dumps([i]), "dead", 0.0)
            for i in range(50)
        ]
    )
    store.heartbeat("dead", -1.0)
    async with trio.open_nursery() as n:
        for _ in range(2):

            async def one():
                async with open_executor(store=store, recover=True, tasks=[work]) as ex:
                    await ex.wait_for_idle()

            n.start_soon(one)
    assert overlaps == []
    assert all(r.status is TaskStatus.COMPLETED for r in store.executions())
    assert len(store.executions(status="completed")) == 50


async def test_leaving_releases_the_lease(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=0))
    async with open_executor(store=store, lease=30) as ex:
        ref = await ex.submit(trio.sleep, 1)
        await ref.wait()
        held = store.execution(ref.task_id)
        assert (held.owner, held.lease_expires_at) == (ex.owner, 30.0)  # renewed at entry
    released = store.execution(ref.task_id)
    assert released.owner == ex.owner
    assert released.lease_expires_at is None  # the owner's lease row is gone


async def test_a_claim_made_while_closing_is_given_back_and_not_counted_again(tmp_path):
    """A recovery pass whose claim comes back after the executor began to close
    gives the executions back, ownerless: the next executor's claim counts no
    recovery more (counted twice, a few unlucky closings would abandon a task
    that never ran). A SQLite store in threads, on the real
    clocks: the pass's store call must be under way while the executor closes."""
    store = SQLiteStore(str(tmp_path / "t.db"))
    ran = []

    @task(id="work")
    async def work(i):
        ran.append(i)

    entered, proceed = threading.Event(), threading.Event()
    recover = store.recover

    def held_recover(*args):
        entered.set()
        proceed.wait(30)  # (until the executor is closing)
        return recover(*args)

    async def proceed_once_closing():
        await trio.testing.wait_all_tasks_blocked()  # (the executor's exit waits for the pass)
        proceed.set()

    async with trio.open_nursery() as outer:
        async with open_executor(store=store, recover=True, tasks=[work], lease=1.0) as ex:
            ids = _dead_owner_rows(store, work, 2)
            store.heartbeat("dead", time.time() - 60)
            store.recover = held_recover  # (the next pass, within a lease)
            assert await trio.to_thread.run_sync(entered.wait, 30)
            outer.start_soon(proceed_once_closing)
    for tid in ids:
        row = store.execution(tid)
        assert (row.status, row.owner, row.recovery_attempts, row.version) == (
            TaskStatus.PENDING,
            None,
            1,  # (the dead owner's lease expired: one recovery)
            3,  # (claimed: 2; given back: 3)
        ), row
    del store.recover
    async with open_executor(store=store, recover=True, tasks=[work]) as again:
        await again.wait_for_idle()
    assert sorted(ran) == [1, 1]
    for tid in ids:
        row = store.execution(tid)
        assert (row.status, row.owner, row.recovery_attempts) == (
            TaskStatus.COMPLETED,
            again.owner,
            1,
        ), row
    assert ex.owner != again.owner
    store.close()


async def test_flush_without_store_returns():
    async with open_executor() as ex:
        await ex.flush()


async def test_recover_needs_store():
    with pytest.raises(ValueError, match="store"):
        async with open_executor(recover=True):
            pass  # pragma: no cover
    with pytest.raises(TypeError, match="Store"):
        async with open_executor(store="runs.db"):
            pass  # pragma: no cover


async def test_recovery_keeps_to_the_admission_bound(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))

    @task(id="work")
    async def work(x):
        await trio.sleep(1)

    _dead_owner_rows(store, work, 20, args=(0,))
    async with open_executor(
        store=store, recover=True, tasks=[work], max_concurrent_tasks=2, queue_capacity=2
    ) as ex:
        with trio.fail_after(100):
            while len(store.executions(status="completed")) < 20:
                await trio.sleep(1)
                assert ex.statistics().max_outstanding_count <= 4
    assert ex.statistics().completed_count == 20
    assert trio.current_time() < 30  # passes come back as room frees, not every lease


async def test_room_a_recovery_pass_held_and_did_not_use_goes_to_a_blocked_submitter(
    autojump_clock,
):
    """A recovery pass holds the free places while it claims; a ``submit`` that
    blocked meanwhile gets the place the pass did not use at once (it waited for
    the next task to end, here never)."""
    store = MemoryStore(clock=FakeWallClock(start=100))
    ran = []

    async def mine():
        ran.append("mine")

    async with open_executor(
        store=store,
        recover=True,
        lease=30.0,
        max_concurrent_tasks=2,
        queue_capacity=0,
        shutdown_policy=ShutdownPolicy.CANCEL,
    ) as ex:
        await ex.submit(trio.sleep_forever)  # one place left
        async with trio.open_nursery() as nursery:
            async with ex._core.journal._lock:  # the pass takes its time
                await trio.sleep(31)  # the next pass (every lease) holds the place
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(ex.submit, mine)
                await trio.testing.wait_all_tasks_blocked()
                assert ran == []  # blocked: the pass holds the free place
            with trio.fail_after(600):  # (the task that runs for ever never frees its place)
                while not ran:
                    await trio.sleep(1)


async def test_the_writer_gathers_a_batch_unless_someone_waits(make_store, mock_clock):
    """Group commit: nobody waiting, the journal gathers changes for
    GATHER_SECONDS into one transaction; a waiter on a completion (or a flush)
    has it written at once, without the clock moving."""
    from trioexec import _journal

    store = make_store()
    batches: list[int] = []
    write = store.write

    def counting_write(changes):
        batches.append(len(changes))
        return write(changes)

    store.write = counting_write

    async def noop():
        pass

    async with open_executor(max_concurrent_tasks=2, store=store) as ex:
        await trio.testing.wait_all_tasks_blocked()
        before = list(batches)  # (the executor's own records, if any)
        refs = [await ex.submit(noop) for _ in range(10)]
        await trio.testing.wait_all_tasks_blocked()
        assert batches == before  # gathering: nothing written, the clock stands still
        assert store.execution(refs[0].task_id) is None
        mock_clock.jump(_journal.GATHER_SECONDS)
        await trio.testing.wait_all_tasks_blocked()
        # One batch, one change per task: its submit, start and finish folded into
        # one "row" while the batch gathered.
        assert batches[len(before) :] == [10]
        assert store.execution(refs[9].task_id).status is TaskStatus.COMPLETED

        ref = await ex.submit(noop)
        start = trio.current_time()
        completion = await ref.wait()  # durable at once: a waiter hurries the writer
        assert completion.status is TaskStatus.COMPLETED
        assert trio.current_time() == start
        assert store.execution(ref.task_id).status is TaskStatus.COMPLETED

        await ex.submit(noop)
        await ex.flush()  # so does a flush
        assert trio.current_time() == start
        assert sum(batches) - sum(before) == 10 + 1 + 1


def test_a_row_change_is_the_same_as_the_changes_folded_into_it(make_store):
    """A `Row` (an execution with its next changes folded in by the executor)
    leaves the store as the separate changes would."""
    from trioexec._store._base import fold_row

    def changes(task_id):
        submit = submitted(task_id, 1, "job", None, "spec", "[1]", "me", 1.0)
        return submit, [
            Start((task_id, 1, 1, 2.0)),
            Sub((task_id, 1, SubStatus.DEFERRED, 3.0, None)),
            Sub((task_id, 1, SubStatus.ACTIVE, None, None)),
            Retry((task_id, 1, "boom")),
            Start((task_id, 1, 2, 4.0)),
            Finish((task_id, 1, TaskStatus.FAILED, 5.0, "boom again", None, None)),
        ]

    store = make_store()
    for cut in range(7):
        submit, later = changes(f"apart-{cut}")
        assert store.write([submit, *later]) == []
        submit, later = changes(f"folded-{cut}")
        row = list(submit)
        assert all(fold_row(row, change) for change in later[:cut])
        before = list(row)
        assert store.write([row, *later[cut:]]) == []
        assert row == before  # the store folded the rest into a copy, not the executor's list
        apart, folded = store.execution(f"apart-{cut}"), store.execution(f"folded-{cut}")
        assert attrs.evolve(folded, task_id=apart.task_id) == apart, cut


async def test_odd_text_is_recorded_as_it_is_and_nul_is_refused(make_store, autojump_clock):
    """Names with brackets, quotes and emoji, arguments and errors with NUL: every
    store records what it is given (an error's NUL escaped), and a name no store
    can hold (PostgreSQL's text has no NUL) is refused before anything runs."""
    store = make_store()

    async def fail(text: str) -> None:
        raise ValueError(text)

    async with open_executor(store=store) as ex:
        ok = await ex.submit(trio.lowlevel.checkpoint, name="batch[/] 'x' \"y\" 🚀")
        bad = await ex.submit(fail, "a\x00b 🚀")
        with pytest.raises(ValueError, match="NUL character"):
            await ex.submit(trio.lowlevel.checkpoint, name="a\x00b")
        with pytest.raises(ValueError, match="NUL character"):
            await ex.submit(trio.lowlevel.checkpoint, task_id="t\x00")
        assert (await ok.wait()).ok
        assert not (await bad.wait()).ok
    assert store.execution(ok.task_id).name == "batch[/] 'x' \"y\" 🚀"
    record = store.execution(bad.task_id)
    assert record.status is TaskStatus.FAILED
    assert "a\\x00b 🚀" in record.error
    assert "\x00" not in record.error
    assert [r.task_id for r in store.executions()] == [ok.task_id, bad.task_id]
