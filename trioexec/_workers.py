"""`Workers`: the pool of worker tasks that run the executor's jobs, one per slot
(docs/design.rst, "The worker pool", says how they take, keep and give back
slots). This is the one place that runs a job, and the executor side of every
`TaskHandle`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NoReturn, final

import trio

from ._causation import running
from ._errors import PermanentError, TaskTimeout
from ._handle import TaskHandle
from ._machine._lifecycle import Lifecycle, journal_waiting, past_deadline
from ._poller import Poller
from ._records import CANCELLED, COMPLETED, DEFERRED, FAILED, TIMED_OUT, TaskStatus
from ._slots import SlotPool, SlotToken
from ._spec import TaskSpec
from ._taskref import Extras, Job
from ._waits import Timer, rejoin, wait_unpaused


@final
class Workers:
    """The worker tasks of one executor (none without a nursery: see `run_next`)."""

    def __init__(
        self,
        pool: SlotPool,
        lifecycle: Lifecycle,
        thread_workers: int,
        timers: tuple[Timer, ...],
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self.pool = pool
        self._timers = timers  # (they start with the workers)
        self.nursery: trio.Nursery | None = None  # (set by `start`)
        # This Trio run's registry of running executions (set by `start`).
        self.registry: dict[trio.lowlevel.Task, Job] | None = None
        self.thread_limiter = trio.CapacityLimiter(thread_workers)
        # Started, running, deferred or between attempts: the jobs of `_attempt`
        # and `_retrying` (a simple job is in the registry for as long).
        self.taken: set[Job] = set()
        self.closing = False  # shutdown began: idle workers end
        self.shared_poller: Poller | None = None  # started on first use
        self._lifecycle = lifecycle
        self._tally = lifecycle.tally
        self._pending = lifecycle.pending
        self._idle: list[trio.lowlevel.Task] = []  # parked, waiting for work
        # Workers woken (or started) for queued work that have not looked at the
        # queue yet: no other worker need stay up for the jobs they will take (one
        # wake-up per job, as in a channel pool).
        self._coming = 0
        self._count = 0  # workers not parked in a deferral
        self._total = pool.total
        self._lent_threads: set[TaskHandle] = set()  # deferred sync tasks' thread tokens
        # Told when a worker finds no work and gives its slot back (the key
        # broker asks for a shared rate's tokens only for tasks that can start).
        self.on_idle = on_idle
        pool.on_resize(self._resized)

    def start(self, nursery: trio.Nursery, *, inline: bool = False) -> None:
        """The executor's tasks run in ``nursery`` from now on: its workers, and
        what its parts start when first needed. ``inline`` (`DeterministicExecutor`,
        for one `run_ready`): jobs run in the caller's task (`run_next`), so no
        workers and no poller; the rest as in `open_executor`
        (tests/test_deterministic.py lists each task and its stand-in)."""
        for timer in self._timers:
            timer.start(nursery)
        if inline:
            return
        self.nursery = nursery
        self.registry = running()

    def close(self) -> None:
        """Shutdown began: idle workers end; busy ones end once there is no work."""
        self.closing = True
        self.wake_idle()

    # ------------------------------------------------------------ the pool

    def work_arrived(self) -> None:
        """A job may start: wake an idle worker, or start one if a slot has none
        (unless the workers already woken will take every job that may start)."""
        if self._pending.startable <= self._coming:
            return
        if self._idle:
            self._coming += 1
            trio.lowlevel.reschedule(self._idle.pop())
        elif self._count < self._total:
            self._spawn()

    def wake_idle(self) -> None:
        while self._idle:
            self._wake()

    def _wake(self) -> None:
        self._coming += 1
        trio.lowlevel.reschedule(self._idle.pop())

    def _spawn(self) -> None:
        if self.nursery is None:
            return
        self._count += 1
        self._coming += 1
        self.nursery.start_soon(self._worker, name="trioexec worker")  # a shared name string

    def _resized(self) -> None:
        # A larger pool needs workers for queued tasks now, not at the next submit.
        self._total = self.pool.total
        for _ in range(min(self._total - self._count, self._pending.startable)):
            self._spawn()

    def _stays_without_slot(self) -> None:
        """This worker stays with a task that holds no slot now (deferred, or
        between attempts); the freed slot needs another worker."""
        self._count -= 1
        self.work_arrived()  # (unless a worker already coming takes what may start)

    async def _worker(self) -> None:
        """Run jobs until the worker should stop. It queues for a slot *before*
        it takes a job, so a task is pending exactly while it is in the queue,
        and queued work and resuming tasks stand in the one FIFO line for slots."""
        self._coming -= 1
        # Few locals: a deferred task keeps its worker's frame (bytes per task).
        pool = self.pool
        token = SlotToken(pool)
        me = trio.lowlevel.current_task()
        registry = running()
        leave_idle = functools.partial(self._leave_idle, me)  # (one per worker, not per park)
        try:
            while True:
                # One cancel scope serves job after job until one is cancelled
                # (ref.cancel() cancels its worker's scope), then a fresh one: a
                # scope per job would be the largest cost of a small task.
                with trio.CancelScope() as scope:
                    while True:
                        if self._pending.startable <= self._coming:  # (those coming take it)
                            token.release()
                            if self.closing:
                                if self.on_idle is not None:
                                    self.on_idle()  # (a worker comes back for what is let through)
                                return
                            # Park until `_wake` (a ParkingLot would do, at twice the cost).
                            self._idle.append(me)
                            if self.on_idle is not None:
                                self.on_idle()
                            await trio.lowlevel.wait_task_rescheduled(leave_idle)
                            self._coming -= 1
                            continue
                        if pool.reclaiming:  # someone stands in line for a slot: after them
                            token.release()
                            await token.reclaim()
                        elif not token.hold_nowait():
                            await token.reclaim()
                        job = self._pending.pop()
                        if job is None:  # taken by another worker or cancelled meanwhile
                            continue
                        job.scope = scope
                        handle = None
                        job_token = token
                        if job.info.handle_param is not None:
                            # The held token goes with the handle; this worker takes a
                            # new one after. A deferred task keeps this frame: it
                            # holds nothing meanwhile that it need not (bytes per task).
                            handle = self._new_handle(job, job_token)
                            del leave_idle
                        status = CANCELLED  # if cancelled, even between attempts
                        try:
                            if job.simple:
                                # `_attempt` inlined for one plain async call: a running
                                # or deferred task carries no frame of ours but the worker's.
                                self._lifecycle.started(job)
                                registry[me] = job
                                try:
                                    if handle is None:
                                        job.result = await job.fn(*job.args)
                                    else:
                                        job.result = await job.fn(
                                            *job.args, **{job.info.handle_param or "handle": handle}
                                        )
                                    status = COMPLETED
                                except Exception as exc:
                                    job.error = exc
                                    status = FAILED
                                except BaseExceptionGroup as group:
                                    _reraise_cancellation(job, group)
                                finally:
                                    del registry[me]
                            else:
                                self.taken.add(job)
                                if isinstance(job.fn, TaskSpec):
                                    status = await self._retrying(job, job_token, handle)
                                else:  # (no frame of ours between the worker and the task)
                                    status = await self._attempt(job, handle)
                        finally:
                            if handle is None:
                                if not job.simple:
                                    self.taken.discard(job)
                                self._lifecycle.ended(job, status)
                            else:
                                self._ended(job, status)
                                job_token.release()
                                token = SlotToken(pool)
                                leave_idle = functools.partial(self._leave_idle, me)
                        if job.cancel_requested:
                            break  # the scope may be cancelled: take a fresh one
                        if self._count > self._total:
                            return  # over strength after a deferral or a shrink: retire
                        if self._pending.startable > self._coming:
                            # More work: yield between jobs (parking for work would
                            # be the schedule point otherwise).
                            await trio.lowlevel.checkpoint()
        finally:
            token.release()
            self._count -= 1

    def started_jobs(self) -> list[Job]:
        """The jobs started and not ended: running, deferred or between attempts."""
        taken, lifecycle, jobs = self.taken, self._lifecycle, (self.registry or {}).values()
        simple = [j for j in jobs if j.simple and j.owner is lifecycle and j not in taken]
        return [*taken, *simple]

    def _leave_idle(self, task: trio.lowlevel.Task, _: object) -> trio.lowlevel.Abort:
        """An idle worker is cancelled: it waits for work no more."""
        self._idle.remove(task)
        return trio.lowlevel.Abort.SUCCEEDED

    # ------------------------------------------------------------ one job

    async def run_next(self) -> Job | None:
        """Take a slot, then the next pending job, and run it to its end in the
        calling task (`DeterministicExecutor`). None if nothing was pending."""
        if not self._pending.startable:
            return None
        token = SlotToken(self.pool)
        await token.reclaim()
        job = self._pending.pop()
        if job is None:  # cancelled while we took the slot
            token.release()
            return None
        with token, trio.CancelScope() as scope:
            job.scope = scope
            self.taken.add(job)
            handle = None if job.info.handle_param is None else self._new_handle(job, token)
            status = CANCELLED  # if cancelled, even between attempts
            try:
                if isinstance(job.fn, TaskSpec):
                    status = await self._retrying(job, token, handle)
                else:
                    status = await self._attempt(job, handle)
            finally:
                self._ended(job, status)
        return job

    def _new_handle(self, job: Job, token: SlotToken) -> TaskHandle:
        handle = job.handle = TaskHandle(
            token, job.task_id, _observer=self, _job=job, _in_thread=not job.info.is_async
        )
        return handle

    async def _retrying(self, job: Job, token: SlotToken, handle: TaskHandle | None) -> TaskStatus:
        """The attempts of a spec's task, as many as its ``retries`` and
        ``backoff`` say, without a slot in between (``token`` holds the slot at
        the top of each). Returns how the last one ended; cancellation propagates."""
        spec = job.fn
        assert isinstance(spec, TaskSpec)
        while True:
            status = await self._attempt(job, handle)
            if not _should_retry(spec, job, status):
                return status
            # Pending again, without a slot (or its key), until the next attempt.
            token.release()
            if job.key is not None:
                self._pending.keys.release(job)
            delay = spec.backoff.delay(job.attempts)
            self._lifecycle.retrying(job, status, delay)
            self._stays_without_slot()
            backing_off = self._lifecycle.backing_off
            backing_off.add(job)
            try:
                await trio.sleep(delay)
                backing_off.discard(job)
                await wait_unpaused(self._pending, job)
                journal_waiting(self._lifecycle, job)  # (a slot, or its key, next)
                if job.key is not None:
                    await rejoin(self._pending, job)
            finally:
                backing_off.discard(job)
                self._count += 1
            if not token.try_reclaim():
                await token.reclaim()
            if job.key is not None:
                self._pending.keys.attempt_starts(job)  # (it takes its token now)
            if handle is not None and not job.info.is_async:
                # The last attempt's thread may live on (abandoned): it keeps its handle.
                handle = self._new_handle(job, token)

    async def _attempt(self, job: Job, handle: TaskHandle | None) -> TaskStatus:
        """One call of the task's function, holding a slot. Returns how it ended;
        cancellation of the task as a whole propagates."""
        self._lifecycle.started(job)
        info = job.info
        fn = job.fn
        budget = job.budget
        if budget is not None:
            t0 = trio.current_time()
            deferred0 = handle.deferred_seconds if handle is not None else 0.0
        me = trio.lowlevel.current_task()
        registry = running()
        outer = registry.get(me)  # DeterministicExecutor runs jobs in its caller's task
        registry[me] = job
        try:
            timeout = job.timeout
            extras = job.extras
            # (a child's deadline is never later than its ancestors')
            inherited = math.inf if extras is None else extras.deadline
            if handle is not None:
                fn = functools.partial(fn, **{info.handle_param or "handle": handle})
            if timeout is None and inherited == math.inf:
                job.result = await self._call(fn, job.args, info.is_async)
            else:
                now = trio.current_time()
                own = math.inf if timeout is None else now + timeout
                if inherited <= now:  # (passed while it waited: it does not run)
                    job.error = _timed_out(job, timeout, own)
                    return TIMED_OUT
                with trio.move_on_at(min(own, inherited)) as attempt_scope:
                    job.deadline = attempt_scope.deadline
                    job.result = await self._call(fn, job.args, info.is_async, abandon=True)
                if attempt_scope.cancelled_caught:
                    job.error = _timed_out(job, timeout, own)
                    return TIMED_OUT
            job.error = None
            return COMPLETED
        except Exception as exc:
            job.error = exc
            return FAILED
        except BaseExceptionGroup as group:
            _reraise_cancellation(job, group)
        finally:
            if outer is None:
                del registry[me]
            else:
                registry[me] = outer
            job.deadline = math.inf
            if handle is not None:
                if not info.is_async:
                    handle._end_attempt()  # its thread may live on, abandoned
                if handle.sub_status is DEFERRED:
                    self._deferral_abandoned(handle)
            if budget is not None:
                deferred = (handle.deferred_seconds if handle is not None else 0.0) - deferred0
                extras = job.extras
                if extras is None:
                    job.extras = extras = Extras()
                extras.active_seconds += trio.current_time() - t0 - deferred
                if extras.active_seconds > budget and not extras.budget_exceeded:
                    extras.budget_exceeded = True
                    self._tally.timeout_budget_exceeded_count += 1

    async def _call(
        self, fn: Callable[..., Any], args: tuple[Any, ...], is_async: bool, abandon: bool = False
    ) -> Any:
        if is_async:
            return await fn(*args)
        # With a timeout, the thread is abandoned when it expires (it keeps its
        # thread token until it returns). Without one, it is waited for, and its
        # calls back into Trio run in the task: causation ids and cancellation follow.
        return await trio.to_thread.run_sync(
            fn, *args, limiter=self.thread_limiter, abandon_on_cancel=abandon
        )

    def _ended(self, job: Job, status: TaskStatus) -> None:
        """A worker is done with ``job``: its last attempt ended with ``status``."""
        self.taken.discard(job)
        handle = job.handle
        if handle is not None and handle.sub_status is DEFERRED:
            self._deferral_abandoned(handle)  # it ends without taking a slot back
        self._lifecycle.ended(job, status)

    # ------------------------------------------------------------ TaskHandle's observer

    def poller(self) -> Poller | None:
        """The executor's one poller for deferred tasks' sync predicates (None
        without a nursery: DeterministicExecutor polls inline)."""
        if self.shared_poller is None and self.nursery is not None:
            self.shared_poller = Poller()
            self.nursery.start_soon(self.shared_poller.run)
        return self.shared_poller

    def deferred(self, handle: TaskHandle, job: Job) -> None:
        if not job.info.is_async:
            # The deferred task's thread is blocked: lend its thread token out
            # (taken back in `thread_resumed` before the thread goes on).
            self._lent_threads.add(handle)
            self.thread_limiter.total_tokens += 1
        if job.key is not None:
            self._pending.keys.release(job, deferred=True)
        self._lifecycle.deferred(job)
        self._stays_without_slot()

    async def reclaim(self, job: Job, slot: SlotToken) -> None:
        """A deferred task takes its key back (if any), then a slot; cancelled, it holds neither."""
        if self._lifecycle.journal is not None:
            journal_waiting(self._lifecycle, job)  # (its condition held: a slot next)
        if job.key is None:
            await slot.reclaim()
            return
        await rejoin(self._pending, job)
        try:
            await slot.reclaim()
        except BaseException:
            self._pending.keys.release(job, deferred=True)
            raise

    def resumed(self, handle: TaskHandle, job: Job) -> None:
        self._count += 1
        self._lifecycle.resumed(job)

    def reclaim_deadline(self, job: Job) -> float:
        """Until when a deferred task whose wait was cancelled may queue for its
        slot: never if the task itself is ending; else until its timeout."""
        return -math.inf if job.cancel_requested else float(job.deadline)

    async def thread_resumed(self, handle: TaskHandle) -> None:
        """A sync task's deferral ended: its thread may go on only once a thread
        token is free again (``thread_workers`` bounds running threads)."""
        if handle not in self._lent_threads:
            return
        limiter = self.thread_limiter
        try:
            await limiter.acquire_on_behalf_of(handle)
        finally:
            self.thread_lend_ended(handle)
        limiter.release_on_behalf_of(handle)

    def thread_lend_ended(self, handle: TaskHandle) -> None:
        if handle in self._lent_threads:
            self._lent_threads.discard(handle)
            self.thread_limiter.total_tokens -= 1

    def _deferral_abandoned(self, handle: TaskHandle) -> None:
        """A task ends (or its attempt does) while deferred: it took no slot back."""
        handle._close_deferral()
        self.thread_lend_ended(handle)
        self._lifecycle.deferral_abandoned()
        self._count += 1


def _reraise_cancellation(job: Job, group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """A task ended with a group holding a Cancelled: keep the whole group on
    record, and let only the cancellation travel on, so the task's own errors
    never escape into the executor's nursery."""
    job.error = group
    cancelled, _ = group.split(trio.Cancelled)
    if cancelled is None:
        raise group
    raise cancelled from None


def _should_retry(spec: TaskSpec, job: Job, status: TaskStatus) -> bool:
    if status is not FAILED and status is not TIMED_OUT:
        return False
    if job.attempts > spec.retries or job.cancel_requested:
        return False
    if job.extras is not None and job.extras.ended_by is not None:
        return False  # (an ancestor's deadline passed: every attempt would time out)
    error = job.error
    return isinstance(error, spec.retry_on) and not isinstance(error, PermanentError)


def _timed_out(job: Job, timeout: float | None, own: float) -> TaskTimeout:
    """The error of ``job``'s attempt that ran out of time: past its own
    ``timeout`` (its deadline ``own``), or past an ancestor's deadline."""
    extras = job.extras
    if extras is None or own <= extras.deadline:
        return TaskTimeout(f"task {job.name!r} ({job.task_id}) timed out after {timeout}s")
    extras.ended_by = extras.deadline_of
    return past_deadline(job, str(extras.deadline_of))
