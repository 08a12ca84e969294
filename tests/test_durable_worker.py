"""open_worker, in one process, under the mock clock (MemoryStore backend)."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

import trioexec
from trioexec.durable import (
    DurableStore,
    PromiseRejected,
    PromiseState,
    TaskState,
    open_worker,
)
from trioexec.testing import FakeWallClock


@pytest.fixture
async def ds():
    return DurableStore(trioexec.MemoryStore(clock=FakeWallClock(0)))


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


async def test_handlers_by_name(ds, autojump_clock):
    await ds.promises.create("a", 100, target="w", data={"handler": "inc", "param": 1})
    await ds.promises.create("b", 100, target="w", data={"handler": "neg", "param": 5})
    await ds.promises.create("c", 100, target="w", data={"handler": "nope", "param": 0})
    handlers = {"inc": lambda x: x + 1, "neg": lambda x: -x}
    async with open_worker(ds, "w", handlers):
        a, b, c = [await settled(ds, i) for i in "abc"]
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

    async with open_worker(ds, "w", lambda x: x + 1, lease=5):
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
