"""Pause and resume by task name or key, in one executor (no store): what is
paused does not start, what runs goes on, and resumed tasks keep their place."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import trioexec
from trioexec import DeterministicExecutor, KeyLimit, TaskStatus


async def test_a_paused_name_waits_and_others_run(autojump_clock: trio.abc.Clock) -> None:
    started: list[str] = []

    async def work(tag: str) -> None:
        started.append(tag)
        await trio.sleep(1)

    async with trioexec.open_executor(max_concurrent_tasks=2) as ex:
        ex.pause(name="report")
        refs = [await ex.submit(work, f"r{i}", name="report") for i in range(3)]
        other = await ex.submit(work, "other", name="mail")
        await (await ex.submit(work, "x", name="mail")).wait()
        assert started == ["other", "x"]
        assert [r.waiting_on for r in refs] == ["paused"] * 3
        assert other.status is TaskStatus.COMPLETED
        assert ex.paused() == (frozenset({"report"}), frozenset())
        ex.resume(name="report")
        for ref in refs:
            assert (await ref.wait()).ok
    assert started == ["other", "x", "r0", "r1", "r2"]


async def test_pausing_queued_tasks_keeps_their_order(autojump_clock: trio.abc.Clock) -> None:
    started: list[int] = []
    gate = trio.Event()

    async def blocker() -> None:
        await gate.wait()

    async def work(i: int) -> None:
        started.append(i)

    async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
        first = await ex.submit(blocker)
        refs = [await ex.submit(work, i, name="a" if i % 2 else "b") for i in range(6)]
        ex.pause(name="a")  # queued already: they leave the queue
        assert [r.waiting_on for r in refs] == ["slot", "paused"] * 3
        gate.set()
        await first.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert started == [0, 2, 4]
        ex.pause(name="a")  # twice is once
        ex.resume(name="a")
        for ref in refs:
            await ref.wait()
    assert started == [0, 2, 4, 1, 3, 5]


async def test_running_tasks_go_on_and_a_key_pause(autojump_clock: trio.abc.Clock) -> None:
    started: list[str] = []

    async def work(tag: str) -> None:
        started.append(tag)
        await trio.sleep(1)

    limits = {"api": KeyLimit(concurrency=1)}
    async with trioexec.open_executor(max_concurrent_tasks=4, key_limits=limits) as ex:
        running = await ex.submit(work, "api-0", key="api")
        await trio.testing.wait_all_tasks_blocked()
        held = await ex.submit(work, "api-1", key="api")  # held back by its key
        assert held.waiting_on == "key concurrency api"
        ex.pause(key="api")
        assert held.waiting_on == "paused"
        loose = await ex.submit(work, "free-0", key="free")
        await running.wait()
        await loose.wait()
        assert held.status is TaskStatus.PENDING
        assert running.status is TaskStatus.COMPLETED
        ex.resume(key="api")
        await held.wait()
    assert started == ["api-0", "free-0", "api-1"]


async def test_a_paused_task_can_be_cancelled_and_shutdown_cancels_the_rest(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def work() -> None:
        await trio.sleep(1)

    async with trioexec.open_executor(max_concurrent_tasks=2) as ex:
        ex.pause(name="p")
        a = await ex.submit(work, name="p")
        b = await ex.submit(work, name="p")
        a.cancel()
        assert (await a.wait()).status is TaskStatus.CANCELLED
        assert ex.statistics().queue_depth == 1
    # Leaving the block drains: a paused task would never start, so it ends.
    assert (await b.wait()).status is TaskStatus.CANCELLED
    assert ex.statistics().queue_depth == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({}, "name= or a key="), ({"name": ""}, "name must not be empty"), ({"key": 3}, "key")],
)
async def test_bad_targets_are_refused(kwargs: dict[str, object], match: str) -> None:
    async with trioexec.open_executor() as ex:
        with pytest.raises(ValueError, match=match):
            ex.pause(**kwargs)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=match):
            ex.resume(**kwargs)  # type: ignore[arg-type]


async def test_resume_of_what_is_not_paused_does_nothing() -> None:
    async with trioexec.open_executor() as ex:
        ex.resume(name="never")
        ref = await ex.submit(trio.sleep, 0, name="never")
        assert (await ref.wait()).ok
        assert ex.paused() == (frozenset(), frozenset())


# ------------------------------------------------------------ against a model

NAMES = ("a", "b")
KEYS = (None, "k1", "k2")


class PauseMachine(RuleBasedStateMachine):
    """Submit, pause, resume, cancel and run one task at a time: the next task
    to start is always the best-ranked one that is not paused (priority, then
    submission order), and every queued task says whether it is paused."""

    @initialize()
    def make(self) -> None:
        # k1 lets one task through at a time: tasks wait in its line, or are let
        # through, when a pause takes them out and puts them back.
        self.ex = DeterministicExecutor(
            max_concurrent_tasks=1, priority_aging=None, key_limits={"k1": KeyLimit(concurrency=1)}
        )
        self.names: set[str] = set()
        self.keys: set[str] = set()
        self.queued: list[tuple[int, int, str, str | None, trioexec.TaskRef]] = []
        self.seq = 0
        self.ran: list[int] = []

    @staticmethod
    def _in_trio(fn: Callable[[], object]) -> None:
        """Run ``fn`` inside a Trio run (the queue reads Trio's clock)."""

        async def call() -> None:
            fn()

        trio.run(call)

    def _paused(self, name: str, key: str | None) -> bool:
        return name in self.names or key in self.keys

    @rule(name=st.sampled_from(NAMES), key=st.sampled_from(KEYS), priority=st.integers(0, 2))
    def submit(self, name: str, key: str | None, priority: int) -> None:
        self.seq += 1
        seq = self.seq

        async def work() -> None:
            self.ran.append(seq)

        refs: list[trioexec.TaskRef] = []
        self._in_trio(
            lambda: refs.append(self.ex.submit_nowait(work, name=name, key=key, priority=priority))
        )
        self.queued.append((priority, seq, name, key, refs[0]))

    @rule(name=st.sampled_from(NAMES))
    def pause_name(self, name: str) -> None:
        self._in_trio(lambda: self.ex.pause(name=name))
        self.names.add(name)

    @rule(key=st.sampled_from(KEYS[1:]))
    def pause_key(self, key: str) -> None:
        self._in_trio(lambda: self.ex.pause(key=key))
        self.keys.add(key)

    @rule(name=st.sampled_from(NAMES))
    def resume_name(self, name: str) -> None:
        self._in_trio(lambda: self.ex.resume(name=name))
        self.names.discard(name)

    @rule(key=st.sampled_from(KEYS[1:]))
    def resume_key(self, key: str) -> None:
        self._in_trio(lambda: self.ex.resume(key=key))
        self.keys.discard(key)

    @precondition(lambda self: self.queued)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(self.queued))
        self._in_trio(entry[4].cancel)
        self.queued.remove(entry)
        assert entry[4].status is TaskStatus.CANCELLED

    @rule()
    def run_one(self) -> None:
        runnable = [e for e in self.queued if not self._paused(e[2], e[3])]
        expected = min(runnable, key=lambda e: (-e[0], e[1])) if runnable else None
        before = len(self.ran)
        trio.run(self.ex.run_ready, 1)
        if expected is None:
            assert len(self.ran) == before
        else:
            assert self.ran[before:] == [expected[1]]
            self.queued.remove(expected)

    @invariant()
    def waiting_on_is_exact(self) -> None:
        self._in_trio(self._check_waiting_on)  # (a key's answer reads Trio's clock)

    def _check_waiting_on(self) -> None:
        for _, _, name, key, ref in self.queued:
            assert ref.status is TaskStatus.PENDING
            paused = self._paused(name, key)
            assert (ref.waiting_on == "paused") is paused, (name, key, ref.waiting_on)
        assert self.ex.pending == len(self.queued)

    @invariant()
    def the_queue_counts_add_up(self) -> None:
        pending = self.ex._core.pending
        paused = [e for e in self.queued if self._paused(e[2], e[3])]
        assert len(pending.pauses.parked) == len(paused)
        assert pending.startable + pending.keys.held == len(self.queued) - len(paused)
        for key, state in pending.keys.states.items():
            assert state.pending == sum(e[3] == key for e in self.queued), key
            assert state.parked == sum(e[3] == key for e in paused), key
            assert state.statistics().pending == state.pending


TestPauseMachine = PauseMachine.TestCase
# (`nox -s soak` runs it again and again under new seeds)
TestPauseMachine.settings = settings(max_examples=50, stateful_step_count=40, deadline=None)


async def test_a_pause_holds_a_retry_until_resumed(autojump_clock: trio.abc.Clock) -> None:
    attempts: list[float] = []

    @trioexec.task(retries=1, backoff=trioexec.Backoff(initial=10, jitter=0.0))
    async def flaky() -> None:
        attempts.append(trio.current_time())
        if len(attempts) == 1:
            raise ValueError("first attempt fails")

    async with trioexec.open_executor() as ex:
        t0 = trio.current_time()
        ref = await ex.submit(flaky)
        await trio.sleep(1)
        assert ref.waiting_on == "retry backoff"
        ex.pause(name=ref.name)
        await trio.sleep(20)  # the backoff is over, the pause holds the next attempt
        assert len(attempts) == 1
        assert ref.waiting_on == "paused"
        ex.resume(name=ref.name)
        assert (await ref.wait()).ok
    assert [t - t0 for t in attempts] == [0.0, 21.0]


async def test_a_retry_held_by_a_pause_can_be_cancelled(autojump_clock: trio.abc.Clock) -> None:
    @trioexec.task(retries=1, backoff=trioexec.Backoff(initial=1, jitter=0.0))
    async def fails() -> None:
        raise ValueError("no")

    async with trioexec.open_executor() as ex:
        ex.pause(name="fails")
        ref = await ex.submit(fails, name="x")
        ex.pause(name="x")
        await trio.sleep(5)
        assert ref.waiting_on == "paused"
        ref.cancel()
        assert (await ref.wait()).status is TaskStatus.CANCELLED
