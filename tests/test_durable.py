"""`trioexec.durable.DurableStore` by example: each operation's happy path and its
`Conflict` path, through the async facade.

Most tests run three times under the autojump clock, on ``DurableStore(MemoryStore(
clock=FakeWallClock()))``, on a SQLite file and on a PostgreSQL schema (an inline
`SQLiteStore` or `PostgresStore`, so the same wall clock can follow Trio's); time
moves with ``await trio.sleep``. A few tests use ``DurableStore(path)`` (calls in a
thread) with a hand-moved clock: two stores on one file, another process, and a
deliberately corrupted file.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from pg_server import STORE_KINDS

import trioexec
from trioexec.durable import (
    Conflict,
    DurableStore,
    NotFound,
    PromiseCreate,
    PromiseSettle,
    PromiseState,
    Suspend,
    TaskState,
)
from trioexec.testing import FakeWallClock

START = 1_000.0
RETRY = 30.0  # DurableStore's default retry timeout for pending tasks


@pytest.fixture(params=STORE_KINDS)
async def ds(request: pytest.FixtureRequest, store_maker: Any) -> AsyncIterator[DurableStore]:
    """A durable store whose wall clock follows Trio's (tests take autojump_clock)."""
    durable = DurableStore(store_maker(request.param, clock=FakeWallClock(start=START)))
    try:
        yield durable
    finally:
        durable.close()


def now(ds: DurableStore) -> float:
    return ds.clock()


# ---------------------------------------------------------------------- promises


async def test_promise_create_and_get(ds: DurableStore, autojump_clock: Any) -> None:
    p = await ds.promises.create("p", 60, data={"x": 1}, tags={"k": "v"})
    assert p.id == "p"
    assert p.state is PromiseState.PENDING
    assert p.pending
    assert p.data == '{"x": 1}'
    assert p.tags == {"k": "v"}
    assert p.created_at == START
    assert p.timeout_at == START + 60
    assert p.settled_at is None
    assert await ds.promises.get("p") == p
    assert await ds.promises.get("nope") is None
    assert await ds.tasks.get("p") is None  # no target: no task


async def test_promise_create_existing_conflicts(ds: DurableStore, autojump_clock: Any) -> None:
    await ds.promises.create("p", 60, idempotency_key="a")
    with pytest.raises(Conflict):
        await ds.promises.create("p", 60)  # no key
    with pytest.raises(Conflict):
        await ds.promises.create("p", 60, idempotency_key="b")  # another key
    await ds.promises.create("q", 60)
    with pytest.raises(Conflict):
        await ds.promises.create("q", 60)  # no key either time: not "the same create"


async def test_promise_create_is_idempotent_with_its_key(
    ds: DurableStore, autojump_clock: Any
) -> None:
    first = await ds.promises.create("p", 60, idempotency_key="a", data=1, target="t")
    await trio.sleep(5)
    again = await ds.promises.create("p", 99, idempotency_key="a", data=2, target="u")
    assert again == first  # the existing promise, unchanged
    assert (await ds.tasks.get("p")).target == "t"
    await ds.promises.resolve("p", data="done")
    settled = await ds.promises.create("p", 60, idempotency_key="a")
    assert settled.state is PromiseState.RESOLVED  # the promise as it is now


@pytest.mark.parametrize(
    ("method", "state"),
    [
        ("resolve", PromiseState.RESOLVED),
        ("reject", PromiseState.REJECTED),
        ("cancel", PromiseState.REJECTED_CANCELED),
    ],
)
async def test_promise_settle(
    ds: DurableStore, autojump_clock: Any, method: str, state: PromiseState
) -> None:
    await ds.promises.create("p", 60)
    await trio.sleep(2)
    p = await getattr(ds.promises, method)("p", idempotency_key="s", data=[1])
    assert p.state is state
    assert p.data == "[1]"
    assert p.idempotency_key_settle == "s"
    assert p.settled_at == START + 2
    assert await ds.promises.get("p") == p
    # The same settle again (same key, same outcome) returns the same promise...
    await trio.sleep(1)
    assert await getattr(ds.promises, method)("p", idempotency_key="s", data=[2]) == p
    # ...anything else is a conflict.
    with pytest.raises(Conflict):
        await getattr(ds.promises, method)("p")
    with pytest.raises(Conflict):
        await getattr(ds.promises, method)("p", idempotency_key="other")
    other = "reject" if method == "resolve" else "resolve"
    with pytest.raises(Conflict):
        await getattr(ds.promises, other)("p", idempotency_key="s")
    assert await ds.promises.get("p") == p


async def test_promise_settle_missing(ds: DurableStore, autojump_clock: Any) -> None:
    with pytest.raises(NotFound):
        await ds.promises.resolve("nope")


async def test_promise_times_out_inclusively(ds: DurableStore, autojump_clock: Any) -> None:
    await ds.promises.create("p", 10, target="t")
    await trio.sleep(9.5)
    assert (await ds.promises.get("p")).state is PromiseState.PENDING
    await trio.sleep(0.5)  # now == timeout_at: timed out
    p = await ds.promises.get("p")
    assert p.state is PromiseState.REJECTED_TIMEDOUT
    assert p.settled_at == START + 10
    task = await ds.tasks.get("p")
    assert task.state is TaskState.FULFILLED  # its own task is done
    assert task.timeout_at is None
    with pytest.raises(Conflict):
        await ds.promises.resolve("p")
    assert await ds.check_invariants() == []


async def test_promise_zero_timeout_is_born_timed_out(
    ds: DurableStore, autojump_clock: Any
) -> None:
    p = await ds.promises.create("p", 0, target="t")
    assert p.state is PromiseState.REJECTED_TIMEDOUT
    assert (await ds.tasks.get("p")).state is TaskState.FULFILLED


async def test_promise_bad_arguments(ds: DurableStore, autojump_clock: Any) -> None:
    for bad in (-1, float("nan"), True, "5"):
        with pytest.raises(ValueError, match="timeout"):
            await ds.promises.create("p", bad)
    with pytest.raises(ValueError, match="limit"):
        await ds.promises.search(limit=0)
    assert await ds.promises.get("p") is None


async def test_promise_search_pages_and_filters(ds: DurableStore, autojump_clock: Any) -> None:
    for i in range(7):
        await ds.promises.create(f"p{i}", 60, tags={"parity": str(i % 2)})
    await ds.promises.resolve("p3")
    await ds.promises.resolve("p4")

    async def everything(**filters: Any) -> list[str]:
        ids, cursor, pages = [], None, 0
        while True:
            page, cursor = await ds.promises.search(limit=2, cursor=cursor, **filters)
            pages += 1
            assert len(page) <= 2
            ids += [p.id for p in page]
            if cursor is None:
                return ids
            assert cursor == page[-1].id
            assert pages < 10

    assert await everything() == [f"p{i}" for i in range(7)]
    assert await everything(state=PromiseState.PENDING) == ["p0", "p1", "p2", "p5", "p6"]
    assert await everything(state="resolved") == ["p3", "p4"]
    assert await everything(tag=("parity", "1")) == ["p1", "p3", "p5"]
    assert await everything(tag=("parity", "1"), state="pending") == ["p1", "p5"]
    assert await everything(tag=("nope", "1")) == []
    page, cursor = await ds.promises.search(limit=7)
    assert len(page) == 7
    assert cursor is None  # exactly one page: no cursor


# ---------------------------------------------------------------------- tasks


async def test_task_lifecycle_acquire_increments_version(
    ds: DurableStore, autojump_clock: Any
) -> None:
    await ds.promises.create("p", 600, target="t")
    task = await ds.tasks.get("p")
    assert task.state is TaskState.PENDING
    assert task.version == 0
    assert task.target == "t"
    assert task.timeout_at == START + RETRY  # pending: a retry timeout
    assert task.lease_expires_at is None
    assert (await ds.promises.get("p")).tags == {"resonate:target": "t"}

    await trio.sleep(1)
    task = await ds.tasks.acquire("p", 0, pid="w1", ttl=10)
    assert task.state is TaskState.ACQUIRED
    assert task.version == 1
    assert task.pid == "w1"
    assert task.lease_expires_at == START + 1 + 10
    assert task.timeout_at is None
    assert await ds.tasks.get("p") == task

    with pytest.raises(Conflict):
        await ds.tasks.acquire("p", 0, pid="w2", ttl=10)  # stale version
    with pytest.raises(Conflict):
        await ds.tasks.acquire("p", 1, pid="w2", ttl=10)  # current version, not pending
    with pytest.raises(NotFound):
        await ds.tasks.acquire("nope", 0, pid="w2", ttl=10)
    with pytest.raises(ValueError, match="ttl"):
        await ds.tasks.acquire("p", 1, pid="w2", ttl=0)
    assert await ds.tasks.get("p") == task

    released = await ds.tasks.release("p", 1)
    assert released.state is TaskState.PENDING
    assert released.version == 1  # release keeps the version
    assert released.pid is None
    assert released.lease_expires_at is None
    assert released.timeout_at == START + 1 + RETRY
    with pytest.raises(Conflict):
        await ds.tasks.release("p", 1)  # not acquired any more
    again = await ds.tasks.acquire("p", 1, pid="w2", ttl=10)
    assert again.version == 2
    assert await ds.check_invariants() == []


async def test_pending_task_retry_timeout_is_rearmed(ds: DurableStore, autojump_clock: Any) -> None:
    await ds.promises.create("p", 600, target="t")
    await trio.sleep(RETRY + 5)
    task = await ds.tasks.get("p")
    assert task.state is TaskState.PENDING
    assert task.version == 0
    assert task.timeout_at == START + RETRY + 5 + RETRY


async def test_lease_expiry_returns_to_pending_with_the_same_version(
    ds: DurableStore, autojump_clock: Any
) -> None:
    await ds.promises.create("p", 600, target="t")
    await ds.tasks.acquire("p", 0, pid="w1", ttl=10)
    await trio.sleep(9.5)
    assert (await ds.tasks.get("p")).state is TaskState.ACQUIRED
    await trio.sleep(0.5)  # now == lease_expires_at: expired
    task = await ds.tasks.get("p")
    assert task.state is TaskState.PENDING
    assert task.version == 1  # not incremented by the expiry
    assert task.pid is None
    assert task.lease_expires_at is None
    assert task.timeout_at == START + 10 + RETRY
    # The old holder is fenced out...
    assert await ds.tasks.heartbeat("w1", [("p", 1)]) == 0
    with pytest.raises(Conflict):
        await ds.tasks.fulfill("p", 1, data="late")
    with pytest.raises(Conflict):
        await ds.tasks.release("p", 1)
    # ...and a successor's acquire increments it.
    successor = await ds.tasks.acquire("p", 1, pid="w2", ttl=10)
    assert successor.version == 2
    with pytest.raises(Conflict):
        await ds.tasks.fence("p", 1, PromiseCreate(id="q", timeout=60))
    assert await ds.promises.get("q") is None
    assert (await ds.tasks.fulfill("p", 2, data="ok")).state is PromiseState.RESOLVED


async def test_heartbeat_renews_a_batch_and_skips_mismatches(
    ds: DurableStore, autojump_clock: Any
) -> None:
    for id in ("a", "b", "c", "d"):
        await ds.promises.create(id, 600, target="t")
    await ds.tasks.acquire("a", 0, pid="w1", ttl=10)
    await ds.tasks.acquire("b", 0, pid="w1", ttl=20)
    await ds.tasks.acquire("c", 0, pid="w2", ttl=10)  # another process's
    await trio.sleep(8)
    renewed = await ds.tasks.heartbeat("w1", [("a", 1), ("b", 0), ("c", 1), ("d", 0), ("nope", 0)])
    assert renewed == 1  # a only: b's version is wrong, c is w2's, d is pending
    assert (await ds.tasks.get("a")).lease_expires_at == START + 8 + 10
    assert (await ds.tasks.get("b")).lease_expires_at == START + 20
    assert (await ds.tasks.get("c")).lease_expires_at == START + 10
    assert (await ds.tasks.get("d")).state is TaskState.PENDING
    await trio.sleep(4)  # past the first lease: a holds, c does not
    assert (await ds.tasks.get("a")).state is TaskState.ACQUIRED
    assert (await ds.tasks.get("c")).state is TaskState.PENDING
    assert await ds.tasks.heartbeat("w1", []) == 0


async def test_suspend_and_settlement_resumes_without_polling(
    ds: DurableStore, autojump_clock: Any
) -> None:
    await ds.promises.create("job", 600, target="t")
    await ds.promises.create("x", 600)
    await ds.promises.create("y", 600)
    await ds.tasks.acquire("job", 0, pid="w1", ttl=10)
    assert await ds.tasks.suspend("job", 1, ["x", "y"]) is Suspend.SUSPENDED
    task = await ds.tasks.get("job")
    assert task.state is TaskState.SUSPENDED
    assert task.awaiting == ("x", "y")
    assert task.version == 1
    assert task.pid is None
    assert task.lease_expires_at is None
    assert task.timeout_at is None
    await trio.sleep(100)  # suspended: no lease to expire, no retry timeout
    assert (await ds.tasks.get("job")).state is TaskState.SUSPENDED
    assert await ds.check_invariants() == []

    await ds.promises.resolve("y", data="why")
    # No polling, no sleep: pending the moment resolve has returned.
    task = await ds.tasks.get("job")
    assert task.state is TaskState.PENDING
    assert task.version == 1
    assert task.awaiting == ()
    assert task.timeout_at == START + 100 + RETRY
    await ds.promises.resolve("x")  # its other callback was dropped: nothing happens
    assert await ds.tasks.get("job") == task
    assert (await ds.tasks.acquire("job", 1, pid="w2", ttl=10)).version == 2
    assert await ds.check_invariants() == []


async def test_suspend_on_a_settled_promise_is_the_300(
    ds: DurableStore, autojump_clock: Any
) -> None:
    await ds.promises.create("job", 600, target="t")
    await ds.promises.create("x", 600)
    await ds.promises.create("done", 600)
    await ds.promises.reject("done")
    held = await ds.tasks.acquire("job", 0, pid="w1", ttl=10)
    assert await ds.tasks.suspend("job", 1, ["x", "done"]) is Suspend.ALREADY_SETTLED
    assert await ds.tasks.get("job") == held  # still acquired, lease and version as were
    await ds.promises.resolve("x")  # no callback was registered
    assert await ds.tasks.get("job") == held


async def test_suspend_conflicts(ds: DurableStore, autojump_clock: Any) -> None:
    await ds.promises.create("job", 600, target="t")
    await ds.promises.create("x", 600)
    with pytest.raises(Conflict):
        await ds.tasks.suspend("job", 0, ["x"])  # pending, not acquired
    await ds.tasks.acquire("job", 0, pid="w1", ttl=10)
    with pytest.raises(Conflict):
        await ds.tasks.suspend("job", 0, ["x"])  # stale version
    with pytest.raises(NotFound):
        await ds.tasks.suspend("job", 1, ["x", "missing"])
    with pytest.raises(NotFound):
        await ds.tasks.suspend("nope", 1, ["x"])
    with pytest.raises(ValueError, match="at least one"):
        await ds.tasks.suspend("job", 1, [])
    assert (await ds.tasks.get("job")).state is TaskState.ACQUIRED
    assert await ds.tasks.suspend("job", 1, ["x"]) is Suspend.SUSPENDED
    with pytest.raises(Conflict):
        await ds.tasks.suspend("job", 1, ["x"])  # already suspended


async def test_an_awaited_timeout_resumes_the_task(ds: DurableStore, autojump_clock: Any) -> None:
    await ds.promises.create("job", 600, target="t")
    await ds.promises.create("x", 20)
    await ds.tasks.acquire("job", 0, pid="w1", ttl=10)
    await ds.tasks.suspend("job", 1, ["x"])
    await trio.sleep(20)
    assert (await ds.promises.get("x")).state is PromiseState.REJECTED_TIMEDOUT
    assert (await ds.tasks.get("job")).state is TaskState.PENDING


async def test_resume_by_hand(ds: DurableStore, autojump_clock: Any) -> None:
    await ds.promises.create("job", 600, target="t")
    await ds.promises.create("x", 600)
    with pytest.raises(Conflict):
        await ds.tasks.resume("job", 0)  # not suspended
    await ds.tasks.acquire("job", 0, pid="w1", ttl=10)
    await ds.tasks.suspend("job", 1, ["x"])
    with pytest.raises(Conflict):
        await ds.tasks.resume("job", 0)  # stale version
    with pytest.raises(NotFound):
        await ds.tasks.resume("nope", 1)
    task = await ds.tasks.resume("job", 1)
    assert task.state is TaskState.PENDING
    assert task.version == 1
    assert task.awaiting == ()
    await ds.promises.resolve("x")
    assert await ds.tasks.get("job") == task
    assert await ds.check_invariants() == []


async def test_fulfill(ds: DurableStore, autojump_clock: Any) -> None:
    await ds.promises.create("a", 600, target="t")
    await ds.promises.create("b", 600, target="t")
    await ds.tasks.acquire("a", 0, pid="w1", ttl=10)
    await ds.tasks.acquire("b", 0, pid="w1", ttl=10)
    with pytest.raises(Conflict):
        await ds.tasks.fulfill("a", 0, data=1)  # stale version
    with pytest.raises(NotFound):
        await ds.tasks.fulfill("nope", 1)
    await trio.sleep(3)
    p = await ds.tasks.fulfill("a", 1, data={"ok": True})
    assert p.state is PromiseState.RESOLVED
    assert p.data == '{"ok": true}'
    assert p.settled_at == START + 3
    assert await ds.promises.get("a") == p
    task = await ds.tasks.get("a")
    assert task.state is TaskState.FULFILLED
    assert task.version == 1
    assert task.lease_expires_at is None
    assert task.timeout_at is None
    with pytest.raises(Conflict):
        await ds.tasks.fulfill("a", 1, data=2)  # done already
    with pytest.raises(Conflict):
        await ds.tasks.acquire("a", 1, pid="w2", ttl=10)
    assert (await ds.tasks.fulfill("b", 1, rejected=True)).state is PromiseState.REJECTED
    assert await ds.check_invariants() == []


async def test_settling_the_promise_fulfils_its_task(ds: DurableStore, autojump_clock: Any) -> None:
    await ds.promises.create("a", 600, target="t")
    await ds.tasks.acquire("a", 0, pid="w1", ttl=10)
    await ds.promises.cancel("a")
    task = await ds.tasks.get("a")
    assert task.state is TaskState.FULFILLED
    assert task.lease_expires_at is None
    with pytest.raises(Conflict):
        await ds.tasks.fulfill("a", 1)


async def test_fence(ds: DurableStore, autojump_clock: Any) -> None:
    await ds.promises.create("job", 600, target="t")
    await ds.promises.create("other", 600)
    action = PromiseCreate(id="child", timeout=60, idempotency_key="c", data=[1], tags={"k": "v"})
    with pytest.raises(Conflict):
        await ds.tasks.fence("job", 0, action)  # not acquired
    await ds.tasks.acquire("job", 0, pid="w1", ttl=10)
    with pytest.raises(Conflict):
        await ds.tasks.fence("job", 0, action)  # stale version
    assert await ds.promises.get("child") is None
    child = await ds.tasks.fence("job", 1, action)
    assert child.id == "child"
    assert child.state is PromiseState.PENDING
    assert child.data == "[1]"
    assert child.tags == {"k": "v"}
    assert await ds.tasks.fence("job", 1, action) == child  # same create key: same promise
    with pytest.raises(Conflict):
        await ds.tasks.fence("job", 1, PromiseCreate(id="child", timeout=60))
    settled = await ds.tasks.fence(
        "job", 1, PromiseSettle(id="other", state=PromiseState.RESOLVED, data="v")
    )
    assert settled.state is PromiseState.RESOLVED
    assert settled.data == '"v"'
    with pytest.raises(NotFound):
        await ds.tasks.fence("job", 1, PromiseSettle(id="nope", state=PromiseState.RESOLVED))
    with pytest.raises(ValueError, match="timeout"):
        await ds.tasks.fence("job", 1, PromiseCreate(id="neg", timeout=-1))
    with pytest.raises(ValueError, match="settled as"):
        await ds.tasks.fence("job", 1, PromiseSettle(id="other", state=PromiseState.PENDING))
    # The guard: once the task's own promise has settled, fencing is a conflict.
    await ds.tasks.fulfill("job", 1)
    with pytest.raises(Conflict):
        await ds.tasks.fence("job", 1, PromiseCreate(id="late", timeout=60))
    assert await ds.promises.get("late") is None


async def test_fence_after_the_own_promise_timed_out(ds: DurableStore, autojump_clock: Any) -> None:
    await ds.promises.create("job", 5, target="t")
    await ds.tasks.acquire("job", 0, pid="w1", ttl=60)
    await trio.sleep(5)
    with pytest.raises(Conflict):
        await ds.tasks.fence("job", 1, PromiseCreate(id="child", timeout=60))
    assert await ds.promises.get("child") is None


async def test_halt_and_continue(ds: DurableStore, autojump_clock: Any) -> None:
    for id in ("pending", "held", "waiting"):
        await ds.promises.create(id, 600, target="t")
    await ds.promises.create("x", 600)
    await ds.tasks.acquire("held", 0, pid="w1", ttl=10)
    await ds.tasks.acquire("waiting", 0, pid="w1", ttl=10)
    await ds.tasks.suspend("waiting", 1, ["x"])
    for id in ("pending", "held", "waiting"):
        task = await ds.tasks.halt(id)
        assert task.state is TaskState.HALTED
        assert task.lease_expires_at is None
        assert task.timeout_at is None
        assert task.pid is None
        assert task.awaiting == ()
    assert (await ds.tasks.halt("held")).state is TaskState.HALTED  # halting twice: same
    with pytest.raises(Conflict):
        await ds.tasks.acquire("pending", 0, pid="w1", ttl=10)
    assert await ds.tasks.heartbeat("w1", [("held", 1)]) == 0  # no lease to renew
    with pytest.raises(Conflict):
        await ds.tasks.resume("waiting", 1)
    await ds.promises.resolve("x")  # a halted task is not resumed
    assert (await ds.tasks.get("waiting")).state is TaskState.HALTED
    await trio.sleep(100)  # nor does time move it
    assert (await ds.tasks.get("held")).state is TaskState.HALTED
    task = await ds.tasks.continue_("held")
    assert task.state is TaskState.PENDING
    assert task.version == 1
    assert task.timeout_at == START + 100 + RETRY
    with pytest.raises(Conflict):
        await ds.tasks.continue_("held")  # not halted any more
    with pytest.raises(NotFound):
        await ds.tasks.halt("nope")
    with pytest.raises(NotFound):
        await ds.tasks.continue_("nope")
    assert (await ds.tasks.acquire("held", 1, pid="w2", ttl=10)).version == 2
    await ds.tasks.fulfill("held", 2)
    with pytest.raises(Conflict):
        await ds.tasks.halt("held")  # fulfilled
    await ds.promises.resolve("waiting")  # a halted task's own promise still fulfils it
    assert (await ds.tasks.get("waiting")).state is TaskState.FULFILLED
    assert await ds.check_invariants() == []


async def test_task_create_starts_acquired(ds: DurableStore, autojump_clock: Any) -> None:
    task = await ds.tasks.create("job", pid="w1", ttl=10, timeout=600, data=[1], target="t")
    assert task.state is TaskState.ACQUIRED
    assert task.version == 1
    assert task.pid == "w1"
    assert task.lease_expires_at == START + 10
    assert task.target == "t"
    p = await ds.promises.get("job")
    assert p.state is PromiseState.PENDING
    assert p.data == "[1]"
    assert p.tags == {"resonate:target": "t"}
    with pytest.raises(Conflict):
        await ds.tasks.create("job", pid="w2", ttl=10, timeout=600, target="t")
    await ds.promises.create("plain", 600)
    with pytest.raises(Conflict):
        await ds.tasks.create("plain", pid="w2", ttl=10, timeout=600, target="t")
    assert await ds.tasks.get("plain") is None
    with pytest.raises(ValueError, match="ttl"):
        await ds.tasks.create("new", pid="w2", ttl=-1, timeout=600, target="t")
    assert await ds.promises.get("new") is None
    assert (await ds.tasks.fulfill("job", 1, data="ok")).state is PromiseState.RESOLVED


async def test_task_get_missing_and_search(ds: DurableStore, autojump_clock: Any) -> None:
    assert await ds.tasks.get("nope") is None
    for i in range(5):
        await ds.promises.create(f"j{i}", 600, target="a" if i % 2 else "b")
    await ds.promises.create("plain", 600)
    await ds.tasks.acquire("j1", 0, pid="w", ttl=10)
    await ds.tasks.acquire("j2", 0, pid="w", ttl=10)

    async def everything(**filters: Any) -> list[str]:
        ids: list[str] = []
        cursor = None
        while True:
            page, cursor = await ds.tasks.search(limit=1, cursor=cursor, **filters)
            ids += [t.id for t in page]
            if cursor is None:
                return ids

    assert await everything() == ["j0", "j1", "j2", "j3", "j4"]
    assert await everything(target="a") == ["j1", "j3"]
    assert await everything(state=TaskState.ACQUIRED) == ["j1", "j2"]
    assert await everything(state="pending", target="b") == ["j0", "j4"]
    assert await everything(target="zzz") == []
    with pytest.raises(ValueError, match="bogus"):
        await ds.tasks.search(state="bogus")


async def test_invariants_hold_on_a_busy_store(ds: DurableStore, autojump_clock: Any) -> None:
    for i in range(6):
        await ds.promises.create(f"j{i}", 50 + i, target="t")
    await ds.promises.create("x", 600)
    await ds.tasks.acquire("j0", 0, pid="w", ttl=5)
    await ds.tasks.acquire("j1", 0, pid="w", ttl=5)
    await ds.tasks.suspend("j1", 1, ["x", "j2"])
    await ds.tasks.acquire("j3", 0, pid="w", ttl=5)
    await ds.tasks.halt("j4")
    await ds.tasks.fulfill("j3", 1)
    assert await ds.check_invariants() == []
    for _ in range(8):
        await trio.sleep(9)
        await ds.tasks.get("j0")  # let time act
        assert await ds.check_invariants() == []


# ---------------------------------------------------------------------- bugs found


async def test_tag_search_with_a_quote_in_the_key_on_sqlite(
    tmp_path: Path, autojump_clock: Any
) -> None:
    store = trioexec.SQLiteStore(tmp_path / "d.db", clock=FakeWallClock(), inline=True)
    with store, DurableStore(store) as ds:
        await ds.promises.create("p", 60, tags={'say "hi"': "v"})
        page, _ = await ds.promises.search(tag=('say "hi"', "v"))
        assert [p.id for p in page] == ["p"]


async def test_a_timeout_that_rounds_to_now_is_born_timed_out(autojump_clock: Any) -> None:
    ds = DurableStore(trioexec.MemoryStore(clock=FakeWallClock(start=1e9)))
    p = await ds.promises.create("p", 1e-9)
    assert p.timeout_at == p.created_at  # the deadline is already reached...
    assert p.state is PromiseState.REJECTED_TIMEDOUT  # ...so it is timed out


async def test_fence_settle_with_a_string_state(autojump_clock: Any) -> None:
    ds = DurableStore(trioexec.MemoryStore(clock=FakeWallClock()))
    await ds.promises.create("x", 60)
    await ds.tasks.create("job", pid="w", ttl=10, timeout=60, target="t")
    p = await ds.tasks.fence("job", 1, PromiseSettle(id="x", state="resolved"))  # type: ignore[arg-type]
    assert p.state is PromiseState.RESOLVED


# ---------------------------------------------------------------------- SQLite files


class HandClock:
    """A wall clock moved by hand (safe to read from the store's worker thread)."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_sqlite_path_two_stores_see_each_other(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    clock = HandClock()
    with DurableStore(path, clock=clock) as a, DurableStore(path, clock=clock) as b:
        assert not a.inline
        await a.promises.create("job", 600, target="t")
        await a.promises.create("x", 600)
        assert (await b.promises.get("job")).state is PromiseState.PENDING
        held = await b.tasks.acquire("job", 0, pid="worker-b", ttl=10)
        assert held.version == 1
        with pytest.raises(Conflict):
            await a.tasks.acquire("job", 0, pid="worker-a", ttl=10)
        assert await a.tasks.get("job") == held
        assert await b.tasks.suspend("job", 1, ["x"]) is Suspend.SUSPENDED
        await a.promises.resolve("x", data=7)
        assert (await b.tasks.get("job")).state is TaskState.PENDING  # at once
        clock.now += 1
        assert (await a.tasks.acquire("job", 1, pid="worker-a", ttl=10)).version == 2
        clock.now += 10  # worker-a's lease expires; b sees it
        assert (await b.tasks.get("job")).state is TaskState.PENDING
        assert await a.check_invariants() == []
        assert await b.check_invariants() == []


async def test_sqlite_path_another_process(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    with DurableStore(path) as ds:
        await ds.promises.create("mine", 600, target="t")
        script = textwrap.dedent(
            f"""
            import trio
            from trioexec.durable import DurableStore

            async def main():
                with DurableStore({str(path)!r}) as ds:
                    task = await ds.tasks.acquire("mine", 0, pid="other", ttl=60)
                    assert task.version == 1, task
                    await ds.promises.create("theirs", 600, data={{"from": "child"}})

            trio.run(main)
            """
        )
        await trio.run_process([sys.executable, "-c", script])
        task = await ds.tasks.get("mine")
        assert task.state is TaskState.ACQUIRED
        assert task.pid == "other"
        assert (await ds.promises.get("theirs")).data == '{"from": "child"}'


PROMISE = "INSERT INTO durable_promises (id, state, timeout_at, tags, created_at) VALUES "
TASK = "INSERT INTO durable_tasks (id, state, version, lease_expires_at, timeout_at) VALUES "
FAR = 1e12


@pytest.mark.parametrize(
    ("invariant", "rows"),
    [
        (
            "acquired_task_no_lease",
            [
                PROMISE + f"('t', 'pending', {FAR}, '{{}}', 0)",
                TASK + "('t', 'acquired', 1, NULL, NULL)",
            ],
        ),
        ("orphan_tasks", [TASK + f"('t', 'pending', 0, NULL, {FAR})"]),
        (
            "pending_task_no_ttimeout",
            [
                PROMISE + f"('t', 'pending', {FAR}, '{{}}', 0)",
                TASK + "('t', 'pending', 0, NULL, NULL)",
            ],
        ),
        (
            "suspended_no_callback",
            [
                PROMISE + f"('t', 'pending', {FAR}, '{{}}', 0)",
                TASK + "('t', 'suspended', 1, NULL, NULL)",
            ],
        ),
        (
            "suspended_with_consumed_callbacks",
            [
                PROMISE + f"('t', 'pending', {FAR}, '{{}}', 0)",
                PROMISE + f"('x', 'resolved', {FAR}, '{{}}', 0)",
                TASK + "('t', 'suspended', 1, NULL, NULL)",
                "INSERT INTO durable_callbacks (promise_id, task_id) VALUES ('x', 't')",
            ],
        ),
        (
            "suspended_task_has_ttimeout",
            [
                PROMISE + f"('t', 'pending', {FAR}, '{{}}', 0)",
                PROMISE + f"('x', 'pending', {FAR}, '{{}}', 0)",
                TASK + f"('t', 'suspended', 1, NULL, {FAR})",
                "INSERT INTO durable_callbacks (promise_id, task_id) VALUES ('x', 't')",
            ],
        ),
        (
            "fulfilled_task_has_ttimeout",
            [
                PROMISE + f"('t', 'resolved', {FAR}, '{{}}', 0)",
                TASK + f"('t', 'fulfilled', 1, NULL, {FAR})",
            ],
        ),
    ],
)
async def test_check_invariants_names_a_corruption(
    tmp_path: Path, invariant: str, rows: list[str]
) -> None:
    path = tmp_path / "corrupt.db"
    with DurableStore(path, clock=HandClock()) as ds:
        await ds.promises.create("healthy", 600, target="t")  # a good row alongside
        assert await ds.check_invariants() == []
        conn = sqlite3.connect(path)
        try:
            with conn:
                for sql in rows:
                    conn.execute(sql)
        finally:
            conn.close()
        assert await ds.check_invariants() == [invariant]


# ---------------------------------------------------------------------- issue 13 #16e

BAD_IDS = [None, "", 7, b"p", ("p",), "lone \ud800 surrogate"]
BAD_TIMEOUTS = [-1, -0.5, float("nan"), float("inf"), True, False, "5", None, [1]]


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_unusable_ids_are_value_errors_naming_them(
    ds: DurableStore, autojump_clock: Any, bad: Any
) -> None:
    await ds.promises.create("ok", 60, target="t")
    await ds.promises.create("plain", 60)
    calls = [
        lambda: ds.promises.create(bad, 60),
        (lambda: ds.promises.create("p", 60, target=bad)) if bad is not None else None,
        (lambda: ds.promises.create("p", 60, idempotency_key=bad)) if bad is not None else None,
        lambda: ds.promises.resolve(bad),
        lambda: ds.promises.reject(bad),
        lambda: ds.promises.cancel(bad),
        lambda: ds.promises.get(bad),
        lambda: ds.tasks.create(bad, pid="w", ttl=5, timeout=60, target="t"),
        lambda: ds.tasks.create("p", pid=bad, ttl=5, timeout=60, target="t"),
        lambda: ds.tasks.acquire(bad, 0, pid="w", ttl=5),
        lambda: ds.tasks.acquire("ok", 0, pid=bad, ttl=5),
        lambda: ds.tasks.claim(bad, pid="w", ttl=5, limit=1),
        lambda: ds.tasks.heartbeat("w", [(bad, 1)]),
        lambda: ds.tasks.suspend(bad, 1, ["plain"]),
        lambda: ds.tasks.suspend("ok", 1, [bad]),
        lambda: ds.tasks.resume(bad, 1),
        lambda: ds.tasks.release(bad, 1),
        lambda: ds.tasks.fulfill(bad, 1),
        lambda: ds.tasks.fence(bad, 1, PromiseCreate(id="x", timeout=5)),
        lambda: ds.tasks.fence("ok", 1, PromiseCreate(id=bad, timeout=5)),
        lambda: ds.tasks.halt(bad),
        lambda: ds.tasks.continue_(bad),
        lambda: ds.tasks.get(bad),
    ]
    for call in calls:
        if call is None:
            continue
        with pytest.raises(ValueError, match=r"must be a non-empty str|lone surrogate") as info:
            await call()
        assert repr(bad) in str(info.value)
    assert [p.id for p in (await ds.promises.search())[0]] == ["ok", "plain"]
    assert await ds.check_invariants() == []


@pytest.mark.parametrize("bad", BAD_TIMEOUTS)
async def test_unusable_timeouts_are_value_errors_naming_them(
    ds: DurableStore, autojump_clock: Any, bad: Any
) -> None:
    await ds.promises.create("ok", 60, target="t")
    await ds.tasks.acquire("ok", 0, pid="w", ttl=5)
    for call in (
        lambda: ds.promises.create("p", bad),
        lambda: ds.tasks.create("q", pid="w", ttl=5, timeout=bad, target="t"),
        lambda: ds.tasks.fence("ok", 1, PromiseCreate(id="r", timeout=bad)),
    ):
        with pytest.raises(ValueError, match="timeout") as info:
            await call()
        assert repr(bad) in str(info.value)
    if bad != 0:  # False is 0; ttl must be > 0 anyway
        with pytest.raises(ValueError, match="ttl") as info:
            await ds.tasks.create("q", pid="w", ttl=bad, timeout=5, target="t")
        assert repr(bad) in str(info.value)
    assert await ds.promises.get("p") is None
    assert await ds.tasks.get("q") is None


async def test_data_that_is_not_json_is_a_value_error(
    ds: DurableStore, autojump_clock: Any
) -> None:
    for bad in (object(), float("nan"), {1j: 2}):
        with pytest.raises(ValueError, match="JSON"):
            await ds.promises.create("p", 60, data=bad)
    assert await ds.promises.get("p") is None


async def test_suspend_refuses_a_str_for_the_awaited_list(
    ds: DurableStore, autojump_clock: Any
) -> None:
    await ds.promises.create("t", 60, target="t")
    await ds.promises.create("ab", 60)
    await ds.tasks.acquire("t", 0, pid="w", ttl=5)
    with pytest.raises(ValueError, match="'ab'"):
        await ds.tasks.suspend("t", 1, "ab")


@pytest.mark.parametrize(
    "id", ["job[0]", "it's", "O'Brien's \"quote\"", "\U0001f600 emoji", "a[b]'c\U0001f680%_*"]
)
async def test_ids_with_brackets_quotes_and_emoji_work_end_to_end(
    ds: DurableStore, autojump_clock: Any, id: str
) -> None:
    from trioexec.durable import open_worker

    approval = f"approval {id}"
    await ds.promises.create(approval, 600, tags={id: id})
    await ds.promises.create(id, 600, target=id, data={"n": id}, idempotency_key=id)
    assert (await ds.promises.create(id, 600, target=id, idempotency_key=id)).id == id

    async def handler(param: Any, handle: Any) -> Any:
        return [param["n"], await handle.await_promise(approval)]

    async with open_worker(ds, id, handler, pid=id) as worker:
        with trio.fail_after(100):
            while (await ds.tasks.get(id)).state is not TaskState.SUSPENDED:
                await trio.sleep(0.1)
        assert (await ds.tasks.get(id)).awaiting == (approval,)
        await ds.promises.resolve(approval, data=id, idempotency_key=id)
        with trio.fail_after(100):
            while (p := await ds.promises.get(id)).pending:
                await trio.sleep(0.1)
    assert p.state is PromiseState.RESOLVED
    assert json.loads(p.data) == [id, id]
    assert worker.suspended == 1
    assert [r.id for r in (await ds.promises.search(tag=(id, id)))[0]] == [approval]
    assert [r.id for r in (await ds.tasks.search(target=id))[0]] == [id]
    first, second = sorted([id, approval])  # by code point, on both backends
    page, cursor = await ds.promises.search(limit=1)
    assert [r.id for r in page] == [first]
    assert cursor == first
    assert [r.id for r in (await ds.promises.search(cursor=cursor))[0]] == [second]
    assert await ds.check_invariants() == []
