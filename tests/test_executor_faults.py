"""A hypothesis state machine of the executor under faults (issue 13).

Random interleavings of submit / submit_nowait (every overflow policy), cancel,
cancel_pending, timeouts, retries, resize, deferral and resume, a paused store
writer, an injected store failure and each shutdown policy, checked after every
step and at the end against a small reference model: slot bound, admission
bound, counters that agree with the tasks' own view, no lost task (every
accepted submission ends exactly once), every ``wait()`` returns, and the store's
rows match the completions.

Trio runs in a thread of its own with a `MockClock` that only moves when a rule
says so; each rule calls into it with `trio.from_thread.run` and returns once
every task is blocked again, so a rule is one deterministic step.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import trio
import trio.testing
from faults import FaultyStore
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import trioexec
from trioexec import (
    MemoryStore,
    Overflow,
    ShutdownPolicy,
    StoreError,
    SubStatus,
    TaskHandle,
    TaskRejected,
    TaskStatus,
    open_executor,
)
from trioexec.testing import FakeWallClock

TERMINAL = {
    TaskStatus.COMPLETED,
    TaskStatus.FAILED,
    TaskStatus.CANCELLED,
    TaskStatus.TIMED_OUT,
    TaskStatus.DROPPED,
}
EVENTS = 3


class Boom(Exception):
    pass


class Job:
    """What one submission does, and what the model expects of it."""

    def __init__(self, work: int, defer_on: int | None, fail: bool, timeout: int | None) -> None:
        self.work = work
        self.defer_on = defer_on
        self.fail = fail
        self.timeout = timeout
        self.ref: trioexec.TaskRef | None = None
        self.cancelled_while_pending = False
        self.cancel_requested = False


class ExecutorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = trio.testing.MockClock()  # moves only when a rule jumps it
        self.thread: threading.Thread | None = None
        self.jobs: list[Job] = []
        self.refused = 0
        self.store_failed = False
        self.exited = False
        self.exit_error: BaseException | None = None
        self.running = 0  # tasks in non-deferred code now (their own count)
        self.peak_over = 0  # how far `running` ever exceeded the pool's total
        self.max_total = 0
        self.paused: trio.Event | None = None
        self.writes_before_failure = 0
        self.crash: BaseException | None = None

    # ------------------------------------------------------------ the trio side

    @initialize(
        slots=st.integers(1, 3),
        queue_capacity=st.integers(0, 4),
        overflow=st.sampled_from(Overflow),
        shutdown=st.sampled_from(ShutdownPolicy),
    )
    def start(self, slots: int, queue_capacity: int, overflow: Overflow, shutdown: ShutdownPolicy):
        self.slots = slots
        self.max_total = slots
        self.capacity = slots + queue_capacity
        self.overflow = overflow
        self.shutdown = shutdown
        ready = threading.Event()

        async def main() -> None:
            self.token = trio.lowlevel.current_trio_token()
            self.events = [trio.Event() for _ in range(EVENTS)]
            self.stop = trio.Event()
            self.store = FaultyStore(MemoryStore(clock=FakeWallClock(start=1000)))
            try:
                async with open_executor(
                    max_concurrent_tasks=slots,
                    queue_capacity=queue_capacity,
                    overflow=overflow,
                    shutdown_policy=shutdown,
                    store=self.store,
                    lease=1000.0,
                ) as ex:
                    self.ex = ex
                    async with trio.open_nursery() as outside:  # submitters, the pause
                        self.outside = outside
                        ready.set()
                        await self.stop.wait()
                        outside.cancel_scope.cancel()  # submitters still blocked, if any
            except StoreError as exc:
                self.exit_error = exc
            finally:
                self.exited = True
                ready.set()

        def run() -> None:
            try:
                trio.run(main, clock=self.clock)
            except BaseException as exc:  # anything else is a failure of the test
                self.crash = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)
        assert not self.exited

    def call(self, afn: Any, *args: Any) -> Any:
        """Run ``afn`` in Trio, then wait until every task is blocked again."""

        async def step() -> Any:
            result = await afn(*args)
            await trio.testing.wait_all_tasks_blocked()
            return result

        try:
            return trio.from_thread.run(step, trio_token=self.token)
        except (trio.Cancelled, trio.RunFinishedError):
            # The run ended meanwhile (the executor stopped: shutdown, or the
            # store failed); the end-of-run checks look at it.
            self.thread.join(10)
            assert self.exited
            return None

    async def job_fn(self, job: Job, handle: TaskHandle) -> str:
        self.running += 1
        self._note_running()
        try:
            await trio.sleep(job.work)
            if job.defer_on is not None:
                self.running -= 1
                try:
                    await handle.defer_until(self.events[job.defer_on])
                finally:
                    if handle.slot.is_held:  # (one ending deferred holds none)
                        self.running += 1
                        self._note_running()
                    else:
                        self.running += 1
            if job.fail:
                raise Boom()
            return "ok"
        finally:
            self.running -= 1

    def _note_running(self) -> None:
        self.peak_over = max(self.peak_over, self.running - self.max_total)

    # ------------------------------------------------------------ rules

    def alive(self) -> bool:
        return not self.exited and not self.store_failed

    jobs_st = st.builds(
        Job,
        work=st.integers(0, 3),
        defer_on=st.none() | st.integers(0, EVENTS - 1),
        fail=st.booleans(),
        timeout=st.none() | st.integers(1, 6),
    )

    @precondition(alive)
    @rule(job=jobs_st, retrying=st.booleans())
    def submit(self, job: Job, retrying: bool) -> None:
        fn = self._fn(job, retrying)

        async def go() -> None:
            async def submitter() -> None:
                try:
                    job.ref = await self.ex.submit(fn, job, timeout=job.timeout)
                    self.jobs.append(job)
                except TaskRejected:
                    self.refused += 1
                except trioexec.ExecutorClosed:
                    pass

            self.outside.start_soon(submitter)

        self.call(go)

    @precondition(alive)
    @rule(job=jobs_st)
    def submit_nowait(self, job: Job) -> None:
        async def go() -> None:
            try:
                job.ref = self.ex.submit_nowait(self.job_fn, job, timeout=job.timeout)
                self.jobs.append(job)
            except TaskRejected:
                self.refused += 1

        self.call(go)

    def _fn(self, job: Job, retrying: bool) -> Any:
        if not retrying:
            return self.job_fn
        # a spec with one retry: a failing job fails twice (both attempts)
        return trioexec.task(
            id="retrying", retries=1, backoff=trioexec.Backoff(initial=1, jitter=0)
        )(self.job_fn)

    @precondition(lambda self: self.alive() and self.jobs)
    @rule(i=st.integers(0, 1000))
    def cancel(self, i: int) -> None:
        job = self.jobs[i % len(self.jobs)]

        async def go() -> None:
            assert job.ref is not None
            if job.ref.status is TaskStatus.PENDING and job.ref._job.scope is None:
                job.cancelled_while_pending = True
            if not job.ref.done:
                job.cancel_requested = True
            job.ref.cancel()
            if job.cancelled_while_pending:
                assert job.ref.status is TaskStatus.CANCELLED  # at once

        self.call(go)

    @precondition(alive)
    @rule()
    def cancel_pending(self) -> None:
        async def go() -> None:
            pending = [j for j in self.jobs if j.ref and j.ref.status is TaskStatus.PENDING]
            self.ex.cancel_pending()
            for j in pending:
                if j.ref.status is TaskStatus.CANCELLED:
                    j.cancelled_while_pending = j.cancel_requested = True

        self.call(go)

    @precondition(alive)
    @rule(i=st.integers(0, EVENTS - 1))
    def resume(self, i: int) -> None:
        async def go() -> None:
            self.events[i].set()
            self.events[i] = trio.Event()

        self.call(go)

    @precondition(lambda self: not self.exited)
    @rule(seconds=st.integers(1, 4))
    def advance(self, seconds: int) -> None:
        self.clock.jump(seconds)
        self.call(trio.lowlevel.checkpoint)

    @precondition(alive)
    @rule(total=st.integers(1, 3))
    def resize(self, total: int) -> None:
        async def go() -> None:
            self.ex.slots.total = total
            self.max_total = max(self.max_total, total)

        self.call(go)

    @precondition(lambda self: self.alive() and self.paused is None)
    @rule()
    def pause_writer(self) -> None:
        async def go() -> None:
            gate = self.paused = trio.Event()

            async def hold() -> None:
                async with self.ex._core.journal._lock:  # the writer stalls behind it
                    await gate.wait()

            self.outside.start_soon(hold)

        self.call(go)

    @precondition(lambda self: self.paused is not None)
    @rule()
    def unpause_writer(self) -> None:
        async def go() -> None:
            assert self.paused is not None
            self.paused.set()
            self.paused = None

        self.call(go)

    @precondition(alive)
    @rule()
    def fail_store(self) -> None:
        async def go() -> None:
            self.store.fail_on.add("write")
            self.store_failed = True  # the next write fails: the executor stops
            self.writes_before_failure = self.store.calls.get("write", 0)

        self.call(go)

    @rule()
    def look(self) -> None:
        """Nothing: a step that is always possible (after the executor ended)."""

    # ------------------------------------------------------------ invariants

    @invariant()
    def bounds(self) -> None:
        if self.thread is None or self.exited:
            return

        async def check() -> None:
            m = self.ex.statistics()
            outstanding = m.queue_depth + m.active_count + m.deferred_count
            assert outstanding <= self.capacity
            assert self.ex.slots.in_use <= max(self.ex.slots.total, self.max_total)
            assert self.peak_over <= 0, "more tasks ran non-deferred code than slots"
            deferred = sum(
                1 for j in self.jobs if j.ref is not None and j.ref.sub_status is SubStatus.DEFERRED
            )
            assert m.deferred_count == deferred
            live = sum(1 for j in self.jobs if j.ref is not None and not j.ref.done)
            assert outstanding == live

        self.call(check)

    # ------------------------------------------------------------ the end

    def teardown(self) -> None:
        if self.thread is None:
            return
        try:
            self._finish()
        finally:
            if not self.exited:  # a failure above: stop the run regardless
                self.token.run_sync_soon(lambda: self.outside.cancel_scope.cancel())
            self.thread.join(10)
        if self.exited:
            self._check_end()

    def _finish(self) -> None:
        if self.exited:
            return

        async def release() -> None:
            if self.paused is not None:
                self.paused.set()
            for event in self.events:
                event.set()
            self.stop.set()

        self.call(release)
        for _ in range(200):  # time runs until the executor is done
            if self.exited:
                return
            self.clock.jump(10)
            self.call(trio.lowlevel.checkpoint)
        pytest.fail("the executor did not finish within 2,000 virtual seconds")

    def _check_end(self) -> None:
        assert self.thread is not None
        assert not self.thread.is_alive()
        if self.crash is not None:
            raise self.crash
        # The store failed if a write was tried after the fault was injected
        # (with nothing left to write, the executor never noticed).
        self.store_failed = self.store_failed and (
            self.store.calls.get("write", 0) > self.writes_before_failure
        )
        if self.store_failed:
            assert isinstance(self.exit_error, StoreError), self.exit_error
        else:
            assert self.exit_error is None, self.exit_error
        m = self.ex.statistics()
        assert (m.queue_depth, m.active_count, m.deferred_count) == (0, 0, 0)
        assert self.ex.slots.in_use == 0
        assert m.rejected_count == self.refused
        ended = (
            m.completed_count
            + m.failed_count
            + m.cancelled_count
            + m.timed_out_count
            + m.dropped_count
        )
        assert ended == len(self.jobs)  # no lost task, none counted twice

        rows = {r.task_id: r for r in self.store._inner.executions()}
        for job in self.jobs:
            ref = job.ref
            assert ref is not None
            assert ref.status in TERMINAL, ref
            if self.store_failed and ref._job.pending_ack:
                continue  # not durable: its wait raises the StoreError
            completion = ref.completion
            assert completion is not None
            assert completion.status is ref.status
            if not self.store_failed:
                assert rows[ref.task_id].status is ref.status, (rows[ref.task_id], ref)
                assert rows[ref.task_id].sub_status is None
            # what the model knows of each task's end
            if job.cancelled_while_pending:
                assert ref.status is TaskStatus.CANCELLED
            if ref.status is TaskStatus.COMPLETED:
                assert not job.fail
            if ref.status is TaskStatus.TIMED_OUT:
                assert job.timeout is not None
            if ref.status is TaskStatus.DROPPED:
                assert self.overflow in (Overflow.DROP_NEWEST, Overflow.DROP_OLDEST)
            if (
                not job.fail
                and job.timeout is None
                and not job.cancel_requested
                and not self.store_failed
                and self.shutdown is ShutdownPolicy.DRAIN
                and ref.status is not TaskStatus.DROPPED
            ):
                assert ref.status is TaskStatus.COMPLETED, ref

        # every wait() returns, or raises the store's error
        async def waits() -> None:
            for job in self.jobs:
                assert job.ref is not None
                try:
                    completion = await job.ref.wait()
                except StoreError:
                    assert self.store_failed
                else:
                    assert completion.status in TERMINAL

        trio.run(waits)


ExecutorMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("TRIOEXEC_FAULT_EXAMPLES", "60")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestExecutorUnderFaults = ExecutorMachine.TestCase
TestExecutorUnderFaults.pytestmark = [pytest.mark.hypothesis]  # in the soak's passes too
