"""Hypothesis: the slot bound and 'no lost task' over random mixes of working and
deferring tasks, slot counts and condition timings (fresh MockClock per example)."""

from __future__ import annotations

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio_util import AsyncBool

from trioexec import Backoff, TaskHandle, TaskStatus, open_executor

work = st.tuples(st.just("work"), st.integers(0, 5))
defer = st.tuples(
    st.just("defer"),
    st.sampled_from(["event", "bool", "predicate", "async_predicate", "backoff"]),
    st.integers(0, 20),  # when the condition becomes true (virtual seconds from start)
    st.booleans(),  # wrapped in a move_on_after that may cancel the wait
)
steps = st.lists(st.one_of(work, defer), min_size=1, max_size=4)
programs = st.lists(steps, min_size=1, max_size=12)


class Meter:
    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)
        assert self.now <= self.bound

    def leave(self) -> None:
        self.now -= 1


async def run_program(slots: int, program: list, submit_gap: int) -> None:
    meter = Meter(slots)
    t0 = trio.current_time()
    events: list[tuple[int, trio.Event | AsyncBool]] = []

    def condition(kind: str, at: int):
        if kind == "event":
            ev = trio.Event()
            events.append((at, ev))
            return ev, 1.0
        if kind == "bool":
            b = AsyncBool(False)
            events.append((at, b))
            return b, 1.0

        def due() -> bool:
            return trio.current_time() - t0 >= at

        async def async_due() -> bool:
            await trio.lowlevel.checkpoint()
            return due()

        if kind == "backoff":
            return due, Backoff(initial=0.5, factor=2, max=4)
        return (due if kind == "predicate" else async_due), 1.0

    async def body(steps: list, handle: TaskHandle) -> int:
        meter.enter()
        try:
            done = 0
            for step in steps:
                if step[0] == "work":
                    await trio.sleep(step[1])
                else:
                    _, kind, at, cancel = step
                    cond, poll = condition(kind, at)
                    meter.leave()
                    try:
                        with trio.move_on_after(at / 2 if cancel else float("inf")):
                            await handle.defer_until(cond, poll_interval=poll)
                    finally:
                        meter.enter()
                        assert handle.slot.is_held
                done += 1
            return done
        finally:
            meter.leave()

    async def fire_due_events() -> None:
        # The outside world: sets each condition once its time has come.
        while True:
            for at, ev in events:
                if trio.current_time() - t0 >= at:
                    if isinstance(ev, trio.Event):
                        ev.set()
                    else:
                        ev.value = True
            await trio.sleep(0.5)

    async def check_bounds(ex) -> None:
        while True:
            await trio.testing.wait_all_tasks_blocked()
            assert ex.slots.in_use <= slots
            m = ex.statistics()
            assert m.queue_depth + m.active_count + m.deferred_count <= slots + 4
            await trio.sleep(0.25)

    async with open_executor(max_concurrent_tasks=slots, queue_capacity=4) as ex:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fire_due_events)
            nursery.start_soon(check_bounds, ex)
            refs = []
            for steps_ in program:
                refs.append(await ex.submit(body, steps_))
                assert ex.slots.in_use <= slots
                if submit_gap:
                    await trio.sleep(submit_gap)
            for r in refs:
                await r.wait()
            nursery.cancel_scope.cancel()

    # No lost task: exactly one completion each, all completed.
    completions = [await r.wait() for r in refs]
    assert [c.status for c in completions] == [TaskStatus.COMPLETED] * len(refs)
    assert [c.result for c in completions] == [len(s) for s in program]
    m = ex.statistics()
    assert (m.active_count, m.deferred_count, m.queue_depth) == (0, 0, 0)
    assert m.completed_count == len(program)
    assert m.deferral_count == m.resumed_count
    assert m.max_inflight_count <= slots + 4
    assert meter.peak <= slots
    assert meter.now == 0
    assert ex.slots.in_use == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slots=st.integers(1, 4), program=programs, submit_gap=st.integers(0, 2))
def test_slot_bound_and_no_lost_task(slots, program, submit_gap):
    trio.run(
        run_program,
        slots,
        program,
        submit_gap,
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
