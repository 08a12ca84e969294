"""The seed scenario (Cloacina "Task Deferral"): four slots all held by tasks that
wait on the outside world; with deferral, new work flows through the freed slots
and the waiters resume with their state intact, taking slots FIFO."""

from __future__ import annotations

import trio
import trio.testing

from trioexec import SubStatus, TaskHandle, TaskStatus, open_executor


class SlotMeter:
    """Counts tasks running non-deferred code; fails the test the moment the bound breaks."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)
        assert self.now <= self.bound, f"{self.now} tasks active with {self.bound} slots"

    def leave(self) -> None:
        self.now -= 1
        assert self.now >= 0

    async def defer(self, handle: TaskHandle, condition, **kw) -> None:
        self.leave()
        try:
            await handle.defer_until(condition, **kw)
        finally:
            self.enter()


async def test_seed_scenario_deferred_tasks_free_their_slots(autojump_clock):
    """4 slots, all held by tasks that defer: new tasks start at once; the deferred
    ones resume afterwards with their locals intact."""
    meter = SlotMeter(4)
    outside_world = [trio.Event() for _ in range(4)]
    starts: dict[str, float] = {}

    async def waiter(i: int, handle: TaskHandle) -> dict:
        meter.enter()
        state = {"id": i, "partial": [i * 10, i * 10 + 1]}
        await meter.defer(handle, outside_world[i])
        state["partial"].append("done")
        meter.leave()
        return state

    async def work(name: str) -> str:
        meter.enter()
        starts[name] = trio.current_time()
        await trio.sleep(1)
        meter.leave()
        return name

    async with open_executor(max_concurrent_tasks=4) as ex:
        waiters = [await ex.submit(waiter, i) for i in range(4)]
        await trio.testing.wait_all_tasks_blocked()
        assert ex.slots.in_use == 0
        assert [w.sub_status for w in waiters] == [SubStatus.DEFERRED] * 4
        assert ex.statistics().deferred_count == 4

        t0 = trio.current_time()
        workers = [await ex.submit(work, n) for n in "EFGH"]
        await trio.testing.wait_all_tasks_blocked()
        assert ex.slots.in_use == 4
        assert starts == dict.fromkeys("EFGH", t0)  # all started at once
        for ev in outside_world:
            ev.set()
    for i, w in enumerate(waiters):
        c = await w.wait()
        assert c.ok
        assert c.result == {"id": i, "partial": [i * 10, i * 10 + 1, "done"]}
    assert [(await w.wait()).result for w in workers] == list("EFGH")
    assert meter.peak == 4
    assert meter.now == 0
    m = ex.statistics()
    assert (m.deferral_count, m.resumed_count, m.completed_count) == (4, 4, 8)
    assert ex.slots.in_use == 0


async def test_resume_waits_for_a_slot_and_is_fifo(autojump_clock):
    """Deferred tasks whose conditions fire while all slots are busy reclaim in
    the order their conditions fired."""
    order: list[int] = []
    events = [trio.Event() for _ in range(3)]
    release_blockers = trio.Event()

    async def deferrer(i: int, handle: TaskHandle) -> None:
        await handle.defer_until(events[i])
        order.append(i)

    async def blocker() -> None:
        await release_blockers.wait()

    # One slot, so grants happen one at a time and the order is observable.
    async with open_executor(max_concurrent_tasks=1) as ex:
        for i in range(3):
            await ex.submit(deferrer, i)
        await trio.testing.wait_all_tasks_blocked()
        blockers = [await ex.submit(blocker)]
        await trio.testing.wait_all_tasks_blocked()
        assert ex.slots.in_use == 1
        for i in (2, 0, 1):
            events[i].set()
            await trio.testing.wait_all_tasks_blocked()  # each queues before the next fires
        assert ex.slots.waiting == 3
        assert order == []
        release_blockers.set()
    assert order == [2, 0, 1]
    assert all(b.status is TaskStatus.COMPLETED for b in blockers)
