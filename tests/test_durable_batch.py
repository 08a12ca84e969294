"""Group commit in the durable store and batched claims and fulfils in the worker.

`Core.run` (several operations, one transaction) on every table backend;
`DurableStore` putting the operations queued meanwhile into one transaction (and
taking back one cancelled before its transaction began); `open_worker` claiming
batches and writing the fulfils of finished runs together, without ever handing
one task to two workers, and without losing a batch whose worker died.
"""

from __future__ import annotations

import functools
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from pg_server import STORE_KINDS

import trioexec
from trioexec._store._durable_rows import TransactionAborted
from trioexec.durable import (
    Conflict,
    DurableStore,
    NotFound,
    PromiseState,
    Suspend,
    TaskState,
    open_worker,
)
from trioexec.durable._bulk import AloneTables
from trioexec.durable._protocol import Core
from trioexec.durable._store import RETRIES
from trioexec.durable._worker import AHEAD
from trioexec.testing import FakeWallClock

START = 1_000.0


class HandClock:
    """A wall clock moved by hand (the `Core` tests run without Trio)."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=STORE_KINDS)
def core(request: pytest.FixtureRequest, store_maker: Any) -> Any:
    clock = HandClock()
    tables = store_maker(request.param, clock=clock).durable_tables()
    try:
        yield Core(tables, clock)
    finally:
        tables.close()


@pytest.fixture(params=STORE_KINDS)
def make_store(request: pytest.FixtureRequest, store_maker: Any) -> Any:
    return functools.partial(store_maker, request.param)


def seed(core: Core, n: int) -> list[Any]:
    """``n`` pending tasks of target "w", all claimed by "p" (version 1)."""
    for i in range(n):
        core.create_promise(f"t{i}", 600, target="w", data=i)
    return [task for task, _ in core.claim_work("w", pid="p", ttl=60, limit=n)]


def states(core: Core) -> dict[str, tuple[str, str, int]]:
    with core.tables.transaction():
        promises = {r["id"]: r["state"] for r in core.tables.all_promises()}
        tasks = {r["id"]: (r["state"], r["version"]) for r in core.tables.all_tasks()}
    return {id: (promises[id], *tasks[id]) for id in tasks}


def test_run_answers_each_operation_as_alone_and_undoes_only_a_failing_one(core: Any) -> None:
    tasks = seed(core, 3)
    core.create_promise("extra", 600, target="w")
    calls = [
        functools.partial(core.fulfill, tasks[0].id, tasks[0].version, data="a"),
        functools.partial(core.fulfill, tasks[1].id, tasks[1].version + 7, data="stale"),
        functools.partial(core.fulfill, "nope", 1),
        functools.partial(core.claim_work, "w", pid="q", ttl=60, limit=5),
        functools.partial(core.fulfill, tasks[2].id, tasks[2].version, rejected=True),
    ]
    results = core.run(lambda: calls)
    assert [ok for ok, _ in results] == [True, False, False, True, True]
    assert results[0][1].state is PromiseState.RESOLVED
    assert isinstance(results[1][1], Conflict)
    assert isinstance(results[2][1], NotFound)
    assert [(t.id, t.version, t.pid) for t, _ in results[3][1]] == [("extra", 1, "q")]
    assert results[4][1].state is PromiseState.REJECTED
    assert states(core) == {
        "t0": ("resolved", "fulfilled", 1),
        "t1": ("pending", "acquired", 1),  # the stale fulfil changed nothing
        "t2": ("rejected", "fulfilled", 1),
        "extra": ("pending", "acquired", 1),
    }
    assert core.check_invariants() == []


def test_run_all_at_one_moment_time_applied_once(core: Any) -> None:
    tasks = seed(core, 2)
    core.clock.now += 60  # both leases lapse now
    calls = [
        functools.partial(core.fulfill, tasks[0].id, tasks[0].version),
        functools.partial(core.claim_work, "w", pid="q", ttl=30, limit=5),
    ]
    (fulfilled, claimed) = core.run(lambda: calls)
    assert not fulfilled[0]
    assert isinstance(fulfilled[1], Conflict)  # the lease had lapsed: fenced
    assert [(t.id, t.version, t.lease_expires_at) for t, _ in claimed[1]] == [
        ("t0", 2, START + 90),
        ("t1", 2, START + 90),
    ]


def spy_bulk(core: Core) -> Counter[str]:
    """Count the backend's one-statement runs (PostgreSQL's `BulkTables`)."""
    used: Counter[str] = Counter()
    for name in ("fulfil_many", "create_many"):
        method = getattr(core.tables, name, None)
        if method is not None:

            def counted(*args: Any, _name: str = name, _method: Any = method) -> Any:
                used[_name] += 1
                return _method(*args)

            setattr(core.tables, name, counted)
    return used


def test_runs_of_fulfils_and_creates_answer_as_one_by_one(core: Any) -> None:
    """A batch of fulfils then creates then a claim (a worker's and a producer's
    shape): on PostgreSQL each run is one statement; the answers and the tables
    are what the operations one by one give, waiters included."""
    tasks = seed(core, 3)
    core.create_promise("waiter", 600, target="v")
    ((waiter, _),) = core.claim_work("v", pid="p", ttl=60, limit=1)
    assert core.suspend("waiter", waiter.version, ["t0", "t2"]) is Suspend.SUSPENDED
    used = spy_bulk(core)
    calls: list[Any] = [
        functools.partial(core.fulfill, t.id, t.version, data={"n": t.id}, rejected=t.id == "t1")
        for t in tasks
    ]
    calls += [
        functools.partial(core.create_promise, f"n{i}", 600, target="w", tags={"k": str(i)})
        for i in range(3)
    ]
    calls.append(functools.partial(core.create_promise, "plain", 60, idempotency_key="i"))
    calls.append(functools.partial(core.claim_work, "v", pid="q", ttl=60, limit=5))
    results = core.run(lambda: calls)
    assert all(ok for ok, _ in results), results
    settled = [r for _, r in results[:3]]
    assert [(p.id, p.state, p.data) for p in settled] == [
        ("t0", PromiseState.RESOLVED, '{"n": "t0"}'),
        ("t1", PromiseState.REJECTED, '{"n": "t1"}'),
        ("t2", PromiseState.RESOLVED, '{"n": "t2"}'),
    ]
    assert all(p.settled_at == START for p in settled)
    created = [r for _, r in results[3:7]]
    assert [(p.id, p.state, p.tags, p.timeout_at) for p in created] == [
        ("n0", PromiseState.PENDING, {"k": "0", "resonate:target": "w"}, START + 600),
        ("n1", PromiseState.PENDING, {"k": "1", "resonate:target": "w"}, START + 600),
        ("n2", PromiseState.PENDING, {"k": "2", "resonate:target": "w"}, START + 600),
        ("plain", PromiseState.PENDING, {}, START + 60),
    ]
    # t0's fulfil resumed the waiter: the claim in the same transaction got it.
    assert [(t.id, t.version) for t, _ in results[-1][1]] == [("waiter", 2)]
    assert states(core) == {
        "t0": ("resolved", "fulfilled", 1),
        "t1": ("rejected", "fulfilled", 1),
        "t2": ("resolved", "fulfilled", 1),
        "waiter": ("pending", "acquired", 2),
        "n0": ("pending", "pending", 0),
        "n1": ("pending", "pending", 0),
        "n2": ("pending", "pending", 0),
    }
    assert core.get_promise("plain").idempotency_key_create == "i"
    assert core.check_invariants() == []
    if hasattr(core.tables, "fulfil_many"):  # runs in one statement each: it did
        assert used == {"fulfil_many": 1, "create_many": 1}


def test_a_run_with_one_failing_operation_answers_each_alone(core: Any) -> None:
    """A run of fulfils with a stale one, a run of creates with an existing id
    (and its repeat by idempotency key): each answers alone, the failing ones
    change nothing (the one-statement path writes all or nothing, then steps aside)."""
    tasks = seed(core, 3)
    core.create_promise("dup", 600, idempotency_key="k", target="w")
    calls: list[Any] = [
        functools.partial(core.fulfill, tasks[0].id, tasks[0].version),
        functools.partial(core.fulfill, tasks[1].id, tasks[1].version + 1),
        functools.partial(core.fulfill, tasks[2].id, tasks[2].version),
        functools.partial(core.create_promise, "new", 600, target="w"),
        functools.partial(core.create_promise, "dup", 600, idempotency_key="k", target="w"),
        functools.partial(core.create_promise, "dup", 600, target="w"),
        functools.partial(core.create_promise, "new2", 600),
    ]
    results = core.run(lambda: calls)
    assert [ok for ok, _ in results] == [True, False, True, True, True, False, True]
    assert isinstance(results[1][1], Conflict)
    assert results[4][1].id == "dup"
    assert isinstance(results[5][1], Conflict)
    assert states(core) == {
        "t0": ("resolved", "fulfilled", 1),
        "t1": ("pending", "acquired", 1),
        "t2": ("resolved", "fulfilled", 1),
        "dup": ("pending", "pending", 0),
        "new": ("pending", "pending", 0),
    }
    assert core.get_promise("new2").state is PromiseState.PENDING
    assert core.check_invariants() == []


def test_an_operation_failing_after_writing_is_undone_alone(core: Any) -> None:
    """Operations run without a savepoint where the backend can tell a failed one
    wrote nothing; one that fails after writing rolls the transaction back, and
    the batch runs again with a savepoint each: the others are written once, the
    failing one's write is not."""
    tasks = seed(core, 2)
    core.create_promise("extra", 600, target="w")
    runs = []

    def writes_then_fails() -> None:
        halted = core.halt("extra")  # a write
        raise ValueError(f"fails after halting {halted.id}")

    def taking() -> list[Any]:
        runs.append(1)
        return [
            functools.partial(core.fulfill, tasks[0].id, tasks[0].version),
            functools.partial(core.get_promise, "nope"),
            functools.partial(core.fulfill, "nope", 1),  # fails, writing nothing
            writes_then_fails,
            functools.partial(core.claim_work, "w", pid="q", ttl=60, limit=5),
            functools.partial(core.fulfill, tasks[1].id, tasks[1].version, rejected=True),
        ]

    results = core.run(taking)
    assert [ok for ok, _ in results] == [True, True, False, False, True, True]
    assert results[1][1] is None
    assert isinstance(results[2][1], NotFound)
    assert isinstance(results[3][1], ValueError)
    assert [(t.id, t.version) for t, _ in results[4][1]] == [("extra", 1)]
    # (Without savepoints first, then again with them; SQLite's cost little: always.)
    assert len(runs) == (2 if isinstance(core.tables, AloneTables) else 1)
    assert states(core) == {
        "t0": ("resolved", "fulfilled", 1),
        "t1": ("rejected", "fulfilled", 1),
        "extra": ("pending", "acquired", 1),  # not halted: that write was undone
    }
    assert core.check_invariants() == []


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_failing_transaction_writes_none_of_its_fulfils(kind: str, store_maker: Any) -> None:
    """All or nothing: the storage failing after some fulfils of the batch were
    made (here: a statement the database refuses) leaves every task as it was."""
    clock = HandClock()
    tables = store_maker(kind, clock=clock).durable_tables()
    core = Core(tables, clock)
    tasks = seed(core, 3)
    before = states(core)

    def broken() -> None:
        tables.conn.execute("INSERT INTO no_such_table VALUES (1)")

    calls: list[Any] = [functools.partial(core.fulfill, t.id, t.version) for t in tasks[:2]]
    with pytest.raises(trioexec.StoreError, match="no_such_table"):
        core.run(lambda: [*calls, broken])
    assert states(core) == before
    tables.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_the_whole_batch_is_undone_on_an_interrupt(kind: str, store_maker: Any) -> None:
    clock = HandClock()
    tables = store_maker(kind, clock=clock).durable_tables()
    core = Core(tables, clock)
    tasks = seed(core, 2)
    before = states(core)

    def interrupt() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        core.run(lambda: [functools.partial(core.fulfill, tasks[0].id, 1), interrupt])
    assert states(core) == before
    tables.close()


# ---------------------------------------------------------------------- DurableStore


def count_runs(ds: DurableStore) -> list[list[str]]:
    """Record the operations (by name) of each transaction ``ds`` writes."""
    batches: list[list[str]] = []
    core = ds._core
    run = core.run

    def recorded(take: Any) -> Any:
        def taking() -> Any:
            calls = take()
            batches.append([c.func.__name__ for c in calls])
            return calls

        return run(taking)

    core.run = recorded  # type: ignore[method-assign]
    return batches


async def test_a_transaction_the_database_aborted_runs_again(
    make_store: Any, autojump_clock: Any
) -> None:
    """A transaction aborted for a concurrent one (`TransactionAborted`: on
    PostgreSQL a deadlock, or a row another host inserted meanwhile) is run again;
    after `RETRIES` more tries its operations fail with that error, and nothing was
    written."""
    ds = DurableStore(make_store(clock=FakeWallClock(START)))
    run = ds._core.run
    aborts = [1]
    taken: list[list[str]] = []

    def flaky(take: Any) -> Any:
        def taking() -> Any:
            calls = take()
            taken.append([c.args[0] if c.args else c.func.__name__ for c in calls])
            if aborts[0]:
                aborts[0] -= 1
                raise TransactionAborted("aborted for a concurrent one")
            return calls

        return run(taking)

    ds._core.run = flaky  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        for id in ("a", "b", "c"):
            nursery.start_soon(functools.partial(ds.promises.create, id, 60, target="w"))
    assert len(taken) == 2  # aborted once, then run again
    assert sorted(taken[0]) == sorted(taken[1]) == ["a", "b", "c"]
    assert [p.id for p in (await ds.promises.search())[0]] == ["a", "b", "c"]
    aborts[0] = 1 + RETRIES
    with pytest.raises(TransactionAborted):
        await ds.promises.create("d", 60)
    assert aborts[0] == 0
    assert await ds.promises.get("d") is None
    ds.close()


async def test_concurrent_operations_share_one_transaction(
    make_store: Any, autojump_clock: Any
) -> None:
    ds = DurableStore(make_store(clock=FakeWallClock(START)))
    for i in range(8):
        await ds.promises.create(f"t{i}", 600, target="w")
    tasks = await ds.tasks.claim("w", pid="p", ttl=60, limit=8)
    batches = count_runs(ds)
    results: dict[str, Any] = {}

    async def fulfil(task: Any) -> None:
        results[task.id] = await ds.tasks.fulfill(task.id, task.version, data=task.id)

    async def stale() -> None:
        with pytest.raises(Conflict):
            await ds.tasks.fulfill("t0", 5)

    async with trio.open_nursery() as nursery:
        for task in tasks:
            nursery.start_soon(fulfil, task)
        nursery.start_soon(stale)
    assert batches == [["fulfill"] * 9]  # one transaction
    assert {id: r.data for id, r in results.items()} == {f"t{i}": f'"t{i}"' for i in range(8)}
    page, _ = await ds.tasks.search(state="fulfilled")
    assert len(page) == 8
    assert await ds.check_invariants() == []
    ds.close()


async def test_an_operation_cancelled_before_its_transaction_began_is_not_written(
    tmp_path: Path,
) -> None:
    """Real threads: the first operation's transaction waits for the write lock
    (another connection holds it); one queued meanwhile and cancelled is taken
    back; the first is written once the lock is free."""
    path = tmp_path / "locked.db"
    with DurableStore(path) as ds:
        await ds.promises.create("seed", 600)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # the write lock, held
        done = trio.Event()

        async def first() -> None:
            await ds.promises.create("first", 600)
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await trio.testing.wait_all_tasks_blocked()  # its thread waits for the lock
            queued = trio.CancelScope()

            async def second() -> None:
                with queued:
                    await ds.promises.create("second", 600)

            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            assert len(ds._queue) == 2  # both wait for the lock: neither is taken
            queued.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert queued.cancelled_caught
            assert len(ds._queue) == 1  # taken back
            other.execute("ROLLBACK")
            await done.wait()
        other.close()
        assert await ds.promises.get("first") is not None
        assert await ds.promises.get("second") is None


# ---------------------------------------------------------------------- the worker


async def test_the_worker_writes_finished_runs_fulfils_together(
    make_store: Any, autojump_clock: Any
) -> None:
    ds = DurableStore(make_store(clock=FakeWallClock(START)))
    for i in range(16):
        await ds.promises.create(f"t{i:02d}", 600, target="w", data=i)
    batches = count_runs(ds)

    async def double(param: int) -> int:
        await trio.sleep(1)
        return 2 * param

    all_done = trio.Event()
    fulfill = ds.tasks.fulfill

    async def counted(*args: Any, **kwargs: Any) -> Any:
        record = await fulfill(*args, **kwargs)
        if record.id == "t15":
            all_done.set()
        return record

    ds.tasks.fulfill = counted  # type: ignore[method-assign]
    async with open_worker(ds, "w", double, max_concurrent_tasks=4):
        with trio.fail_after(100):
            await all_done.wait()
        assert trio.current_time() == 4  # four rounds of four one-second runs
    fulfils = [b.count("fulfill") for b in batches]
    assert sum(fulfils) == 16
    assert max(fulfils) == 4  # the four runs ending together: one transaction
    # The claim after a round went in the same transaction as its fulfils.
    assert any(b.count("fulfill") == 4 and "claim_work" in b for b in batches)
    page, _ = await ds.promises.search(state="resolved")
    assert sorted(int(p.data) for p in page) == [2 * i for i in range(16)]
    assert await ds.check_invariants() == []
    ds.close()


async def test_a_batch_claimed_by_a_dead_worker_is_claimed_again_and_run_once(
    make_store: Any, autojump_clock: Any
) -> None:
    """A worker that died holding a batch (it claimed eight, then nothing: no
    heartbeat, no release): the leases lapse, another worker claims them all
    again, at a higher version, and runs each once."""
    ds = DurableStore(make_store(clock=FakeWallClock(START)))
    for i in range(8):
        await ds.promises.create(f"t{i}", 600, target="w", data=i)
    dead = await ds.tasks.claim("w", pid="dead", ttl=5, limit=8)
    assert len(dead) == 8
    runs: Counter[tuple[int, int]] = Counter()

    async def handler(param: int, handle: Any) -> int:
        runs[param, handle.version] += 1
        return param

    async with open_worker(ds, "w", handler, lease=5) as worker:
        with trio.fail_after(100):
            while worker.fulfilled < 8:
                await trio.sleep(0.5)
    assert runs == {(i, 2): 1 for i in range(8)}
    assert trio.current_time() >= 5  # not before the dead worker's leases lapsed
    tasks, _ = await ds.tasks.search(target="w")
    assert [(t.state, t.version) for t in tasks] == [(TaskState.FULFILLED, 2)] * 8
    assert await ds.check_invariants() == []
    ds.close()


async def test_batch_claims_never_hand_a_task_to_two_workers(db_target: str) -> None:
    """Three workers (each its own connection and thread) on one SQLite file or
    PostgreSQL database claim in batches: every task runs exactly once."""
    path = db_target
    n = 300
    with DurableStore(path) as setup:
        for i in range(n):
            await setup.promises.create(f"t{i:04d}", 600, target="w", data=i)
    runs: Counter[int] = Counter()
    all_done = trio.Event()
    stores = [DurableStore(path) for _ in range(3)]
    workers: list[Any] = []

    async def handler(param: int) -> int:
        runs[param] += 1
        await trio.lowlevel.checkpoint()
        return param

    fulfilled = 0

    async def one(ds: DurableStore, pid: str) -> None:
        fulfill = ds.tasks.fulfill

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal fulfilled
            record = await fulfill(*args, **kwargs)
            fulfilled += 1
            if fulfilled == n:
                all_done.set()
            return record

        ds.tasks.fulfill = counted  # type: ignore[method-assign]
        async with open_worker(ds, "w", handler, pid=pid, lease=60) as worker:
            workers.append(worker)
            await all_done.wait()

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for k, ds in enumerate(stores):
                nursery.start_soon(one, ds, f"w{k}")
    assert runs == dict.fromkeys(range(n), 1)
    assert sum(w.claimed for w in workers) == n
    assert sum(w.fulfilled for w in workers) == n
    assert all(w.lost == 0 for w in workers)
    tasks, _ = await stores[0].tasks.search(state="fulfilled", limit=1000)
    assert len(tasks) == n
    assert await stores[0].check_invariants() == []
    for ds in stores:
        ds.close()


def claim_limits(ds: DurableStore) -> list[int]:
    """Record the ``limit`` of each claim ``ds`` writes."""
    limits: list[int] = []
    claim = ds._core.claim_work

    def recorded(*args: Any, **kwargs: Any) -> Any:
        limits.append(kwargs["limit"])
        return claim(*args, **kwargs)

    ds._core.claim_work = recorded  # type: ignore[method-assign]
    return limits


@pytest.mark.parametrize("seconds", [0, 1])
async def test_the_worker_claims_ahead_as_far_as_its_runs_go(
    seconds: int, make_store: Any, autojump_clock: Any
) -> None:
    """Runs that end as soon as they start: each claim asks for as many more as
    ran out since the last one was sent (at most `AHEAD` times the slots ahead).
    Runs that take a while: never more than the slots ahead."""
    ds = DurableStore(make_store(clock=FakeWallClock(START)))
    n = 300
    for i in range(n):
        await ds.promises.create(f"t{i:03d}", 600, target="w", data=i)
    limits = claim_limits(ds)

    async def run(param: int) -> int:
        await trio.sleep(seconds)
        return param

    async with open_worker(ds, "w", run, max_concurrent_tasks=2, lease=600) as worker:
        with trio.fail_after(1000):
            while worker.fulfilled < n:
                await trio.sleep(0.5)
    assert max(limits) <= 2 + 2 * AHEAD
    if seconds:
        assert max(limits) == 4  # the slots, and as many ahead
    else:
        assert max(limits) > 4 * 4  # (it was 4 with claims up to twice the slots)
    assert await ds.check_invariants() == []
    ds.close()
