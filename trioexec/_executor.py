"""`open_executor`: run submitted callables through a bounded pool of slots.

Shape (chosen for speed; see docs/design): submissions wait in a bounded deque;
a pool of worker tasks in the executor's nursery takes them one at a time, takes a
slot (FIFO, the same line deferred tasks rejoin), and runs them. There is one
worker per slot, not one Trio task per submission. When a task defers, its
coroutine keeps its worker and a fresh worker is started for the freed slot; when
the deferred task finishes, its worker retires if the pool is over strength.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, NoReturn, final

import attrs
import outcome
import trio
from trio_util import periodic

from ._admission import Admit, Overflow, admit, rejection_reason
from ._causation import current_ref, running
from ._coordinator import WorkflowResult, WorkflowRun
from ._errors import (
    CapacityExceeded,
    ExecutorClosed,
    PermanentError,
    StoreError,
    TaskCancelled,
    TaskDefinitionError,
    TaskRejected,
    TaskTimeout,
)
from ._events import EventStream, HealthEventKind
from ._handle import TaskHandle
from ._journal import Journal
from ._metrics import ExecutorMetrics
from ._poller import Poller
from ._records import (
    ExecutionRecord,
    ShutdownPolicy,
    SubStatus,
    TaskStatus,
    check_id,
    safe_repr,
)
from ._slots import SlotPool, SlotToken
from ._spec import CallInfo, TaskSpec, call_info, collect_specs
from ._store import Change, RunRecord, Store
from ._taskref import TaskRef, unwrap
from ._workflow import Workflow


@attrs.frozen(kw_only=True)
class ExecutorConfig:
    """The options of `open_executor`, validated once."""

    max_concurrent_tasks: int = 4
    queue_capacity: int = 1024
    overflow: Overflow = attrs.field(default=Overflow.BLOCK, converter=Overflow)
    shutdown_policy: ShutdownPolicy = attrs.field(
        default=ShutdownPolicy.DRAIN, converter=ShutdownPolicy
    )
    thread_workers: int | None = None
    event_capacity: int = 1024
    task_budget: float | None = None
    lease: float = 30.0
    max_recovery_attempts: int = 3

    def __attrs_post_init__(self) -> None:
        _check_int("max_concurrent_tasks", self.max_concurrent_tasks, minimum=1)
        _check_int("queue_capacity", self.queue_capacity, minimum=0)
        _check_int("event_capacity", self.event_capacity, minimum=1)
        if self.thread_workers is not None:
            _check_int("thread_workers", self.thread_workers, minimum=1)
        _check_seconds("task_budget", self.task_budget)
        _check_seconds("lease", self.lease)
        _check_int("max_recovery_attempts", self.max_recovery_attempts, minimum=0)

    @property
    def capacity(self) -> int:
        """The admission bound over pending + active + deferred."""
        return self.max_concurrent_tasks + self.queue_capacity


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


def _check_seconds(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds or None, got {value!r}")
    try:
        seconds = float(value)  # an int too large for a float is no duration either
    except OverflowError:
        seconds = math.inf
    if not (0 < seconds < math.inf):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")


def check_store(store: object) -> None:
    """``store=``: None or something with the `Store` operations."""
    if store is not None and not callable(getattr(store, "write", None)):
        raise TypeError(f"store must be a trioexec Store (e.g. SQLiteStore), got {store!r}")


def _describe(fn: Callable[..., Any]) -> str:
    if isinstance(fn, TaskSpec):
        return fn.id
    while isinstance(fn, functools.partial):
        fn = fn.func
    return str(getattr(fn, "__qualname__", None) or type(fn).__name__)


@final
class Executor:
    """The object `open_executor` yields. See `open_executor` for the options."""

    def __init__(
        self,
        nursery: trio.Nursery | None,
        config: ExecutorConfig,
        store: Store | None = None,
        specs: dict[str, TaskSpec] | None = None,
        workflows: dict[str, Workflow] | None = None,
    ) -> None:
        # nursery=None: no workers; something else (DeterministicExecutor) runs jobs.
        self._nursery = nursery
        self._store = store
        self._specs = specs or {}
        self._workflows = workflows or {}
        self._active_runs: dict[str, WorkflowRun] = {}
        self._wall: Callable[[], float] = time.time if store is None else store.clock
        self.owner = uuid.uuid4().hex
        # What goes to the store and when (None without one).
        self._journal = None if store is None else Journal(store, self._written)
        self._live: dict[str, TaskRef] = {}  # with a store: accepted and not finished
        self._named: dict[str, TaskRef] = {}  # without one: live tasks with a chosen id
        self._space_freed = trio.Event()  # set when a task ends (recovery waits on it)
        self._shared_poller: Poller | None = None  # started on first use
        self._lent_threads: set[TaskHandle] = set()  # deferred sync tasks' thread tokens
        self._config = config
        self._capacity = config.capacity
        self._overflow = config.overflow
        self._pool = SlotPool(config.max_concurrent_tasks)
        self._thread_limiter = trio.CapacityLimiter(
            config.thread_workers or config.max_concurrent_tasks
        )
        self._id_prefix = uuid.uuid4().hex[:12] + "-"
        self._ids = itertools.count(1)
        self._pending: deque[TaskRef] = deque()
        self._stale = 0  # cancelled refs still sitting in _pending
        self._taken: set[TaskRef] = set()  # started: running, deferred, or between attempts
        self._idle_workers: list[trio.lowlevel.Task] = []  # parked, waiting for work
        self._space_waiters: deque[trio.lowlevel.Task] = deque()  # BLOCK submitters, FIFO
        self._reserved = 0  # places held back: handed to woken submitters, or recovery's
        self._idle_lot = trio.lowlevel.ParkingLot()  # wait_for_idle callers
        self._workers = 0  # workers not parked in a deferral
        self._closing = False
        self._drain_runs = True  # under DRAIN, started workflow runs may still submit steps
        self._runs = 0  # workflow runs not finished
        self._events = EventStream(config.event_capacity)
        # gauges
        self._queue = 0  # accepted and waiting: in _pending, or between attempts
        self._active = 0
        self._deferred = 0
        # counters
        self._submitted = 0
        self._queued = 0
        self._completed = 0
        self._failed = 0
        self._cancelled = 0
        self._rejected = 0
        self._dropped = 0
        self._timed_out = 0
        self._deferrals = 0
        self._resumes = 0
        self._cancel_requests = 0
        self._cancels_observed = 0
        self._budget_exceeded = 0
        self._max_inflight = 0
        self._max_outstanding = 0
        self._max_deferred = 0
        self._slots_total = config.max_concurrent_tasks
        self._pool._listeners.append(self._slots_resized)
        self._last_fn: object = None
        self._last_info = CallInfo(True, None)
        self._last_name = ""

    # ---------------------------------------------------------------- submission

    @property
    def slots(self) -> SlotPool:
        """The executor's `SlotPool` (``max_concurrent_tasks`` slots)."""
        return self._pool

    @property
    def closed(self) -> bool:
        """True once shutdown has begun; submissions raise `ExecutorClosed`."""
        return self._closing

    async def submit(
        self,
        fn: Callable[..., Any],
        *args: Any,
        name: str | None = None,
        task_id: str | None = None,
        timeout: float | None = None,
        budget: float | None = None,
        correlation_id: str | None = None,
    ) -> TaskRef:
        """Submit ``fn(*args)`` and return its `TaskRef` once it is accepted.

        A checkpoint. Under ``Overflow.BLOCK`` waits for space when the executor is
        at capacity; if cancelled while waiting, nothing was submitted.

        With a store, the store's backlog counts too: while the writer is more than
        ``JOURNAL_LIMIT`` changes behind, ``BLOCK`` waits and every other policy
        refuses (reason ``store_backlog``).

        Raises:
          ExecutorClosed: if shutdown has begun (also while waiting for space);
            under ``DRAIN``, the executor's own running tasks may still submit.
          TaskRejected: under ``REJECT`` (or ``DROP_OLDEST`` with nothing to drop).
          CapacityExceeded: under ``FAIL_FAST``.
          ValueError: a ``task_id``, ``name`` or ``correlation_id`` that is not a
            non-empty str of at most 1,000 characters a store can hold; a
            ``task_id`` live in this executor or recorded in its store; a
            ``timeout`` or ``budget`` that is not a finite number > 0.
          TypeError: ``fn`` is not callable.
        """
        # Exactly one schedule point: parking for space is one; otherwise a
        # cancel-shielded checkpoint after the (then certain) acceptance.
        await trio.lowlevel.checkpoint_if_cancelled()
        ref = self._new_ref(fn, args, name, task_id, timeout, budget, correlation_id)
        if self._fits():  # the common case, without the general decision
            self._enqueue(ref)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return ref
        return await self._admit(ref, internal=False)

    def submit_nowait(
        self,
        fn: Callable[..., Any],
        *args: Any,
        name: str | None = None,
        task_id: str | None = None,
        timeout: float | None = None,
        budget: float | None = None,
        correlation_id: str | None = None,
    ) -> TaskRef:
        """Like `submit`, but never blocks: under ``Overflow.BLOCK`` a full executor
        raises `TaskRejected`."""
        ref = self._new_ref(fn, args, name, task_id, timeout, budget, correlation_id)
        decision = self._decide(can_wait=False)
        self._apply(ref, decision)
        return ref

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Submit ``fn(*args)``, wait for it, and return its value or raise its error.

        Raises:
          Exception: the task's own exception, as it is, if it failed.
          TaskTimeout: if it timed out.
          TaskCancelled: if it was cancelled.
          TaskRejected: if it was dropped.
        """
        ref = await self.submit(fn, *args)
        completion = await ref.wait()
        return unwrap(completion)

    async def _submit_step(self, fn: TaskSpec, args: tuple[Any, ...], run_id: str) -> TaskRef:
        """`submit` for a workflow run's step (allowed while a DRAIN lets started
        runs finish)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        ref = self._new_ref(fn, args, fn.id, None, None, None, run_id, run_id)
        return await self._admit(ref, internal=True)

    async def _admit(self, ref: TaskRef, *, internal: bool) -> TaskRef:
        decision = self._decide(True, internal=internal)
        if decision is Admit.WAIT:
            front = False
            while decision is Admit.WAIT:
                if await self._wait_for_space(front):
                    self._reserved -= 1  # _finish handed us the place it freed
                # (or the store caught up, or shutdown began: decide again)
                decision = self._decide(True, woken=True, internal=internal)
                front = True  # still first in line
            self._apply(ref, decision)
            self._wake_next_submitter()
        else:
            self._apply(ref, decision)
            await trio.lowlevel.cancel_shielded_checkpoint()
        return ref

    async def _wait_for_space(self, front: bool) -> bool:
        """Park, first in line or last, until woken: True if handed a freed place."""
        task = trio.lowlevel.current_task()
        waiters = self._space_waiters
        if front:
            waiters.appendleft(task)
        else:
            waiters.append(task)

        def abort(_: object) -> trio.lowlevel.Abort:
            waiters.remove(task)
            self._wake_next_submitter()  # the one behind may fit now
            return trio.lowlevel.Abort.SUCCEEDED

        woken: bool = await trio.lowlevel.wait_task_rescheduled(abort)
        return woken

    def _wake_next_submitter(self, *, handing_place: bool = False) -> None:
        """Wake the longest-waiting BLOCK submitter: with a freed place handed to
        it (``_finish``), or to decide again if there may be room now."""
        if not self._space_waiters:
            return
        if handing_place:
            self._reserved += 1
        elif not self._has_room():
            return
        trio.lowlevel.reschedule(self._space_waiters.popleft(), outcome.Value(handing_place))

    def _has_room(self) -> bool:
        return (
            self._queue + self._active + self._deferred < self._capacity - self._reserved
            and not self._store_behind()
        )

    def _store_behind(self) -> bool:
        """The store's writer is too far behind to take more work (back-pressure)."""
        journal = self._journal
        return journal is not None and len(journal.changes) >= journal.limit

    def _new_ref(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        name: str | None,
        task_id: str | None,
        timeout: float | None,
        budget: float | None,
        correlation_id: str | None,
        run_id: str | None = None,
        *,
        recovered: bool = False,
    ) -> TaskRef:
        self._submitted += 1
        if self._closing and not self._may_submit_while_closing(run_id is not None):
            raise ExecutorClosed("the executor is shutting down; no new submissions")
        if not callable(fn):
            raise TypeError(f"submit needs a callable, got {fn!r}")
        if fn is not self._last_fn:  # producers tend to submit one function many times
            self._last_info = call_info(fn)
            self._last_name = _describe(fn)
            self._last_fn = fn
        info = self._last_info
        position = info.handle_position
        if position is not None and len(args) > position:
            info = info.for_args(args)  # the caller passes that argument: no handle
        if isinstance(fn, TaskSpec):
            timeout = fn.timeout if timeout is None else timeout
            budget = fn.budget if budget is None else budget
        if timeout is not None:
            _check_seconds("timeout", timeout)
        if budget is not None:
            _check_seconds("budget", budget)
        if name is not None:
            check_id("name", name)
        if correlation_id is not None:
            check_id("correlation_id", correlation_id)
        if task_id is not None and not recovered:
            self._check_new_task_id(task_id)
        parent = current_ref()
        causation_id = None
        if parent is not None:
            causation_id = parent.task_id
            if correlation_id is None:
                correlation_id = parent._correlation_id
        ref = TaskRef(
            self,
            fn,
            args,
            info,
            task_id if task_id is not None else self._id_prefix + str(next(self._ids)),
            name if name is not None else self._last_name,
            timeout,
            budget if budget is not None else self._config.task_budget,
            correlation_id,
            causation_id,
            self._wall(),
            self._journal is not None,
        )
        ref._run_id = run_id
        if task_id is not None and self._store is None:
            self._named[task_id] = ref  # (with a store, _live tracks every task)
        return ref

    def _may_submit_while_closing(self, internal: bool) -> bool:
        """Under DRAIN, started workflow runs (``internal``) and running tasks of
        this executor may still submit (fan-out) until the drain ends."""
        if not self._drain_runs:
            return False
        if internal:
            return True
        caller = current_ref()
        return caller is not None and caller._executor is self

    def _check_new_task_id(self, task_id: str) -> None:
        """A caller-chosen task id must be new: not live here, not in the store
        (else the same execution would run twice under one record)."""
        check_id("task_id", task_id)
        if task_id in self._live or task_id in self._named:
            raise ValueError(f"task id {task_id!r} is already live in this executor")
        if self._store is not None and self._store.execution(task_id) is not None:
            raise ValueError(f"task id {task_id!r} is already recorded in the store")

    def _decide(self, can_wait: bool, woken: bool = False, internal: bool = False) -> Admit:
        if self._closing and not self._may_submit_while_closing(internal):
            raise ExecutorClosed("the executor is shutting down; no new submissions")
        if self._fits():
            return Admit.ACCEPT  # the common case, without the general decision
        if not woken and self._space_waiters:
            # Blocked submitters are ahead in line: nobody overtakes them.
            return Admit.WAIT if can_wait else Admit.REJECT
        return admit(
            pending=self._queue,
            active=self._active,
            deferred=self._deferred,
            capacity=self._capacity - self._reserved,
            policy=self._overflow,
            can_wait=can_wait,
            droppable=len(self._pending) - self._stale,
            backlogged=self._store_behind(),
        )

    def _fits(self) -> bool:
        """Room for one more, the store keeping up, and no blocked submitter
        ahead in line."""
        journal = self._journal
        return (
            self._queue + self._active + self._deferred < self._capacity - self._reserved
            and (journal is None or len(journal.changes) < journal.limit)
            and not self._space_waiters
        )

    def _apply(self, ref: TaskRef, decision: Admit) -> None:
        if decision is Admit.ACCEPT:
            self._enqueue(ref)
        elif decision is Admit.DROP_NEW:
            self._publish_refusal(HealthEventKind.TASK_DROP, ref, "queue_full")
            if self._store is not None:
                self._log_submit(ref)
            self._finish(ref, TaskStatus.DROPPED, freed=False)
        elif decision is Admit.DROP_OLDEST:
            oldest = self._pop_pending()
            assert oldest is not None
            self._publish_refusal(HealthEventKind.TASK_DROP, oldest, "queue_full")
            self._queue -= 1
            self._finish(oldest, TaskStatus.DROPPED)
            self._enqueue(ref)
        else:
            self._rejected += 1
            behind = self._store_behind()
            reason = rejection_reason(decision, self._overflow, backlogged=behind)
            self._publish_refusal(HealthEventKind.TASK_REJECT, ref, reason)
            cls = CapacityExceeded if decision is Admit.FAIL else TaskRejected
            if behind:
                assert self._journal is not None
                backlog, limit = len(self._journal.changes), self._journal.limit
                raise cls(
                    f"the store is {backlog} changes behind (limit {limit}); "
                    f"overflow={self._overflow.value}; task {ref.name!r} not accepted"
                )
            raise cls(
                f"executor at capacity ({self._capacity}: {self._queue} pending, "
                f"{self._active} active, {self._deferred} deferred); "
                f"overflow={self._overflow.value}; task {ref.name!r} not accepted"
            )

    def _publish_refusal(self, kind: HealthEventKind, ref: TaskRef, reason: str) -> None:
        self._events.publish(
            kind,
            ref.task_id,
            policy=self._overflow,
            reason=reason,
            attributes={
                "pending_depth": self._queue,
                "active_count": self._active,
                "deferred_count": self._deferred,
                "capacity": self._capacity,
            },
        )

    def _enqueue(self, ref: TaskRef, *, recovered: bool = False) -> None:
        self._queued += 1
        self._queue += 1
        self._pending.append(ref)
        if self._store is not None:
            self._live[ref.task_id] = ref
            if not recovered:
                self._log_submit(ref)
        self._note_high_water()
        if self._idle_workers:
            trio.lowlevel.reschedule(self._idle_workers.pop())
        elif self._workers < self._slots_total:
            self._spawn_worker()

    def _log(self, change: Change) -> None:
        journal = self._journal
        assert journal is not None
        journal.append(change)

    def _log_submit(self, ref: TaskRef) -> None:
        fn = ref._fn
        spec_id = fn.id if isinstance(fn, TaskSpec) else None
        try:
            args = json.dumps(ref._args) if spec_id is not None else None
        except (TypeError, ValueError):
            args = None  # not JSON: recorded, but recovery cannot re-create it
        self._log(
            (
                "submit",
                ref.task_id,
                ref._version,
                ref.name,
                ref._run_id,
                spec_id,
                args,
                self.owner,
                ref._submitted_at,
            )
        )

    def _slots_resized(self) -> None:
        # A larger pool needs workers for queued tasks now, not at the next submit.
        self._slots_total = self._pool.total
        missing = min(self._slots_total - self._workers, len(self._pending) - self._stale)
        for _ in range(missing):
            self._spawn_worker()

    def _note_high_water(self) -> None:
        inflight = self._queue + self._active
        if inflight > self._max_inflight:
            self._max_inflight = inflight
        outstanding = inflight + self._deferred
        if outstanding > self._max_outstanding:
            self._max_outstanding = outstanding

    def _pop_pending(self) -> TaskRef | None:
        pending = self._pending
        while pending:
            ref = pending.popleft()
            if ref._status is TaskStatus.PENDING:
                return ref
            self._stale -= 1
        return None

    # ---------------------------------------------------------------- workers

    def _spawn_worker(self) -> None:
        if self._nursery is None:
            return
        self._workers += 1
        self._nursery.start_soon(self._worker, name="trioexec worker")  # a shared name string

    async def _worker(self) -> None:
        """Run jobs until the worker should stop.

        A worker queues for a slot *before* it takes a job, so a task is pending
        exactly while it is in the deque, and queued work and resuming tasks
        stand in the one FIFO line for slots. Between jobs it keeps its slot
        unless someone is queued for one or the deque is empty.
        """
        pool = self._pool
        token = SlotToken(pool)
        me = trio.lowlevel.current_task()
        registry = running()
        try:
            while True:
                # One cancel scope serves job after job until one of them is
                # cancelled (ref.cancel() cancels the scope of the worker running
                # it); then the worker takes a fresh scope. Entering a scope per
                # job would be the largest cost of running a small task.
                with trio.CancelScope() as scope:
                    while True:
                        if len(self._pending) == self._stale:
                            token.release()
                            if self._closing:
                                return
                            await self._wait_for_work()
                            continue
                        if not token._held:
                            if not token._try_reclaim():
                                await token.reclaim()
                        elif pool._queued:  # someone stands in line for a slot: after them
                            token.release()
                            await token.reclaim()
                        ref = self._pop_pending()
                        if ref is None:  # taken by another worker or cancelled meanwhile
                            continue
                        ref._scope = scope
                        self._taken.add(ref)
                        handle = None
                        job_token = token
                        if ref._info.handle_param is not None:
                            # The held token goes with the handle; this worker takes a new one.
                            handle = self._new_handle(ref, job_token)
                            token = SlotToken(pool)
                        status = TaskStatus.CANCELLED  # if cancelled, even between attempts
                        try:
                            if ref._simple:
                                # One plain async call, inline: a running or deferred
                                # task carries no frame of ours but the worker's.
                                self._begin_attempt(ref)
                                registry[me] = ref
                                try:
                                    if handle is None:
                                        ref._result = await ref._fn(*ref._args)
                                    else:
                                        param = ref._info.handle_param or "handle"
                                        ref._result = await ref._fn(*ref._args, **{param: handle})
                                    status = TaskStatus.COMPLETED
                                except Exception as exc:
                                    ref._error = exc
                                    status = TaskStatus.FAILED
                                except BaseExceptionGroup as group:
                                    _reraise_cancellation(ref, group)
                                finally:
                                    del registry[me]
                            elif isinstance(ref._fn, TaskSpec):
                                status = await self._retrying(ref, job_token, handle)
                            else:
                                status = await self._attempt(ref, handle)
                        finally:
                            self._ended(ref, status)
                            if handle is not None:
                                job_token.release()
                        if ref._cancel_requested:
                            break  # the scope may be cancelled: take a fresh one
                        if self._workers > self._slots_total:
                            return  # over strength after a deferral or a shrink: retire
                        if len(self._pending) != self._stale:
                            # More work: yield between jobs (parking for work would
                            # be the schedule point otherwise).
                            await trio.lowlevel.checkpoint()
        finally:
            token.release()
            self._workers -= 1

    async def _wait_for_work(self) -> None:
        # A ParkingLot would do, at twice the cost of this on the hot path.
        task = trio.lowlevel.current_task()
        idle = self._idle_workers
        idle.append(task)

        def abort(_: object) -> trio.lowlevel.Abort:
            idle.remove(task)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _wake_idle_workers(self) -> None:
        while self._idle_workers:
            trio.lowlevel.reschedule(self._idle_workers.pop())

    async def _run(self, ref: TaskRef, token: SlotToken) -> None:
        """Run one accepted task to its completion, holding ``token``'s slot (the
        worker loop has this inline, to keep a frame off every running task)."""
        handle = None if ref._info.handle_param is None else self._new_handle(ref, token)
        status = TaskStatus.CANCELLED  # if cancelled, even between attempts
        try:
            if isinstance(ref._fn, TaskSpec):
                status = await self._retrying(ref, token, handle)
            else:
                status = await self._attempt(ref, handle)
        finally:
            self._ended(ref, status)

    def _new_handle(self, ref: TaskRef, token: SlotToken) -> TaskHandle:
        handle = ref._handle = TaskHandle(token, ref.task_id, _observer=self)
        handle._in_thread = not ref._info.is_async
        handle._ref = ref
        return handle

    async def _retrying(
        self, ref: TaskRef, token: SlotToken, handle: TaskHandle | None
    ) -> TaskStatus:
        """The attempts of a spec's task, retried as its ``retries`` and ``backoff``
        say, without a slot in between (``token`` holds the slot at the top of
        each). Returns how the last one ended; cancellation propagates."""
        spec = ref._fn
        assert isinstance(spec, TaskSpec)
        while True:
            status = await self._attempt(ref, handle)
            if not _should_retry(spec, ref, status):
                return status
            # Back to pending, without a slot, until the next attempt.
            token.release()
            self._active -= 1
            self._queue += 1
            ref._status = TaskStatus.PENDING
            delay = spec.backoff.delay(ref._attempts)
            if self._store is not None:
                self._log(("retry", ref.task_id, ref._version, safe_repr(ref._error)))
            self._events.publish(
                HealthEventKind.TASK_RETRY_SCHEDULED,
                ref.task_id,
                reason=status.value,
                attributes={
                    "attempt": ref._attempts,
                    "delay": delay,
                    "error": safe_repr(ref._error),
                },
            )
            ref._error = None
            self._worker_parked()
            try:
                await trio.sleep(delay)
            finally:
                self._worker_unparked()
            if not token._try_reclaim():
                await token.reclaim()
            if handle is not None and handle._attempt_over:
                # The last attempt's thread may live on (abandoned): it keeps its handle.
                handle = self._new_handle(ref, token)

    def _ended(self, ref: TaskRef, status: TaskStatus) -> None:
        """A worker is done with ``ref``: its last attempt ended with ``status``
        (CANCELLED if cancelled between attempts)."""
        self._taken.discard(ref)
        handle = ref._handle
        if handle is not None and handle._sub_status is SubStatus.DEFERRED:
            self._deferral_abandoned(handle)  # it ends without taking a slot back
        if ref._status is TaskStatus.RUNNING:
            self._active -= 1
        else:  # cancelled between attempts
            self._queue -= 1
        if ref._status is TaskStatus.RUNNING or ref._status is TaskStatus.PENDING:
            self._finish(ref, status)

    def _begin_attempt(self, ref: TaskRef) -> None:
        self._queue -= 1
        self._active += 1
        ref._status = TaskStatus.RUNNING
        ref._attempts += 1
        if self._store is not None:
            self._log(("start", ref.task_id, ref._version, ref._attempts, self._wall()))
        if ref._run_id is not None:
            self._step_changed(ref)
        if ref._started_at is None:
            ref._started_at = self._wall()

    async def _attempt(self, ref: TaskRef, handle: TaskHandle | None) -> TaskStatus:
        """One call of the task's function, holding a slot. Returns how it ended;
        cancellation of the task as a whole propagates. (The worker loop runs a
        plain async call without timeout or budget inline instead.)"""
        self._begin_attempt(ref)
        info = ref._info
        fn = ref._fn
        budget = ref._budget
        if budget is not None:
            t0 = trio.current_time()
            deferred0 = handle.deferred_seconds if handle is not None else 0.0
        me = trio.lowlevel.current_task()
        registry = running()
        outer = registry.get(me)  # DeterministicExecutor runs jobs in its caller's task
        registry[me] = ref
        try:
            timeout = ref._timeout
            if handle is not None:
                fn = functools.partial(fn, **{info.handle_param or "handle": handle})
            if timeout is None:
                ref._result = await self._call(fn, ref._args, info.is_async)
            else:
                with trio.move_on_after(timeout) as attempt_scope:
                    ref._deadline = attempt_scope.deadline
                    ref._result = await self._call(fn, ref._args, info.is_async, abandon=True)
                if attempt_scope.cancelled_caught:
                    ref._error = TaskTimeout(
                        f"task {ref.name!r} ({ref.task_id}) timed out after {timeout}s"
                    )
                    return TaskStatus.TIMED_OUT
            ref._error = None
            return TaskStatus.COMPLETED
        except Exception as exc:
            ref._error = exc
            return TaskStatus.FAILED
        except BaseExceptionGroup as group:
            _reraise_cancellation(ref, group)
        finally:
            if outer is None:
                del registry[me]
            else:
                registry[me] = outer
            ref._deadline = math.inf
            if handle is not None:
                if not info.is_async:
                    handle._end_attempt()  # its thread may live on, abandoned
                if handle._sub_status is SubStatus.DEFERRED:
                    self._deferral_abandoned(handle)
            if budget is not None:
                deferred = (handle.deferred_seconds if handle is not None else 0.0) - deferred0
                ref._active_seconds += trio.current_time() - t0 - deferred
                if ref._active_seconds > budget and not ref._budget_exceeded:
                    ref._budget_exceeded = True
                    self._budget_exceeded += 1

    async def _call(
        self, fn: Callable[..., Any], args: tuple[Any, ...], is_async: bool, abandon: bool = False
    ) -> Any:
        if is_async:
            return await fn(*args)
        # With a timeout the thread is abandoned when it expires: the attempt ends
        # then, and the thread keeps its thread token until it really returns.
        # (Without one, a thread is waited for, and calls back into Trio from it
        # run in the task itself: causation ids and cancellation follow it.)
        return await trio.to_thread.run_sync(
            functools.partial(fn, *args), limiter=self._thread_limiter, abandon_on_cancel=abandon
        )

    # ------------------------------------------------------ handle observer hooks

    def _poller(self) -> Poller | None:
        """The executor's one poller for deferred tasks' sync predicates (None
        without a nursery: DeterministicExecutor polls inline)."""
        if self._shared_poller is None and self._nursery is not None:
            self._shared_poller = Poller()
            self._nursery.start_soon(self._shared_poller.run)
        return self._shared_poller

    def _worker_parked(self) -> None:
        """This worker stays with a task that holds no slot now (deferred, or
        between attempts); the freed slot needs another worker."""
        self._workers -= 1
        if self._queue > len(self._idle_workers) and self._workers < self._slots_total:
            self._spawn_worker()
        elif self._idle_workers and self._pending:
            trio.lowlevel.reschedule(self._idle_workers.pop())

    def _worker_unparked(self) -> None:
        self._workers += 1

    def _handle_deferred(self, handle: TaskHandle) -> None:
        if handle._in_thread:
            # The deferred task's thread is blocked: lend its thread token out
            # (taken back in _thread_resumed before the thread goes on).
            self._lent_threads.add(handle)
            self._thread_limiter.total_tokens += 1
        self._active -= 1
        self._deferred += 1
        self._deferrals += 1
        if self._deferred > self._max_deferred:
            self._max_deferred = self._deferred
        self._events.note(HealthEventKind.TASK_DEFERRED, handle._task_id)
        ref = handle._ref
        if ref is not None:
            if self._store is not None:
                self._log(("sub", ref.task_id, ref._version, SubStatus.DEFERRED, self._wall()))
            if ref._run_id is not None:
                self._step_changed(ref)
        self._worker_parked()

    def _handle_resumed(self, handle: TaskHandle) -> None:
        self._deferred -= 1
        self._active += 1
        self._resumes += 1
        self._worker_unparked()
        self._events.note(HealthEventKind.TASK_RESUMED, handle._task_id)
        ref = handle._ref
        if ref is not None:
            if self._store is not None:
                self._log(("sub", ref.task_id, ref._version, SubStatus.ACTIVE, None))
            if ref._run_id is not None:
                self._step_changed(ref)
        self._note_high_water()

    async def _thread_resumed(self, handle: TaskHandle) -> None:
        """A sync task's deferral ended: its thread may go on only once a thread
        token is free again (``thread_workers`` bounds running threads)."""
        if handle not in self._lent_threads:
            return
        limiter = self._thread_limiter
        try:
            await limiter.acquire_on_behalf_of(handle)
        finally:
            self._thread_lend_ended(handle)
        limiter.release_on_behalf_of(handle)

    def _thread_lend_ended(self, handle: TaskHandle) -> None:
        if handle in self._lent_threads:
            self._lent_threads.discard(handle)
            self._thread_limiter.total_tokens -= 1

    def _reclaim_deadline(self, handle: TaskHandle) -> float:
        """Until when a deferred task whose wait was cancelled may queue for its
        slot: never if the task itself is ending; else until its timeout."""
        ref = handle._ref
        if ref is None:
            return math.inf
        return -math.inf if ref._cancel_requested else float(ref._deadline)

    def _deferral_abandoned(self, handle: TaskHandle) -> None:
        """A task ends (or its attempt does) while deferred: it took no slot back."""
        handle._close_deferral()
        self._thread_lend_ended(handle)
        self._deferred -= 1
        self._active += 1
        self._worker_unparked()

    # ---------------------------------------------------------------- completion

    def _finish(self, ref: TaskRef, status: TaskStatus, *, freed: bool = True) -> None:
        """Record the one completion of ``ref`` and wake whoever waits on it.

        ``freed``: the task counted against capacity until now (False only for a
        submission dropped on arrival).
        """
        ref._status = status
        ref._finished_at = self._wall()
        if status is TaskStatus.COMPLETED:
            self._completed += 1
        elif status is TaskStatus.FAILED:
            self._failed += 1
        elif status is TaskStatus.CANCELLED:
            self._cancelled += 1
            if ref._cancel_requested:
                self._cancels_observed += 1
        elif status is TaskStatus.TIMED_OUT:
            self._timed_out += 1
        else:
            self._dropped += 1
        journal = self._journal
        if journal is None:
            if self._named:
                self._named.pop(ref.task_id, None)
            done = ref._done
            if done is not None:
                done.set()
        else:
            # Acknowledged (ref.wait() returns) only once the record is durable.
            self._live.pop(ref.task_id, None)
            error = None if ref._error is None else safe_repr(ref._error)
            self._log(("finish", ref.task_id, ref._version, status, ref._finished_at, error))
            if ref._run_id is not None and status is TaskStatus.COMPLETED:
                # A completed step's record goes into the same transaction as its
                # execution's, so a crash cannot leave one without the other.
                run = self._active_runs.get(ref._run_id)
                if run is not None:
                    run._record_completed_step(ref)
            journal.notify.append(ref)
            if not self._space_freed.is_set():
                self._space_freed.set()  # (recovery only happens with a store)
        if freed and self._space_waiters:
            # Hand the freed place to the longest-waiting BLOCK submitter.
            self._wake_next_submitter(handing_place=True)
        if self._idle_lot and self._is_idle():
            self._idle_lot.unpark_all()
        if status is TaskStatus.FAILED or status is TaskStatus.TIMED_OUT:
            self._events.publish(
                HealthEventKind.TASK_FAILED,
                ref.task_id,
                reason=status.value,
                attributes={"error": safe_repr(ref._error), "name": ref.name},
            )

    def _is_idle(self) -> bool:
        return self._queue == 0 and self._active == 0 and self._deferred == 0 and self._runs == 0

    # ---------------------------------------------------------------- cancellation

    def _cancel_ref(self, ref: TaskRef) -> None:
        if ref.done or ref._cancel_requested:
            return
        self._cancel_requests += 1
        ref._cancel_requested = True
        scope = ref._scope
        if scope is None:
            # Still in the deque: end it now and leave a tombstone for the workers.
            self._queue -= 1
            self._stale += 1
            self._finish(ref, TaskStatus.CANCELLED)
            if self._stale > 64 and self._stale * 2 > len(self._pending):
                self._pending = deque(r for r in self._pending if not r.done)
                self._stale = 0
            return
        if ref._handle is not None:
            ref._handle._request_cancel()
        scope.cancel()

    def cancel_pending(self) -> int:
        """End every task that has not started yet as ``CANCELLED``; return how many.

        Never blocks. Running and deferred tasks, and tasks waiting between
        attempts, are not touched.
        """
        count = 0
        while (ref := self._pop_pending()) is not None:
            self._cancel_requests += 1
            ref._cancel_requested = True
            self._queue -= 1
            self._finish(ref, TaskStatus.CANCELLED)
            count += 1
        self._stale = 0
        return count

    # ---------------------------------------------------------------- workflows

    async def start_workflow(
        self,
        workflow: Workflow,
        context: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
    ) -> WorkflowRun:
        """Start a run of ``workflow`` and return its `WorkflowRun` at once.

        A coordinator task (in the executor's nursery) submits each step through
        the executor's slots as soon as its dependencies are complete; steps may
        defer, and independent branches run concurrently. A checkpoint.

        Raises:
          ExecutorClosed: if shutdown has begun.
        """
        if self._closing:
            raise ExecutorClosed("the executor is shutting down; no new workflow runs")
        if self._nursery is None:
            raise TypeError("workflows need an executor from open_executor")
        if run_id is not None:
            check_id("run_id", run_id)
            if run_id in self._active_runs:
                raise ValueError(f"run id {run_id!r} is already running in this executor")
            if self._store is not None and self._store.run(run_id) is not None:
                raise ValueError(f"run id {run_id!r} is already recorded in the store")
        run = WorkflowRun(self, workflow, context, run_id)
        self._runs += 1
        self._active_runs[run.run_id] = run
        await self._nursery.start(run._coordinate)
        return run

    @property
    def workflow_runs(self) -> Mapping[str, WorkflowRun]:
        """The runs in progress in this executor (started here or resumed by
        recovery), by run id."""
        return self._active_runs

    async def run_workflow(
        self,
        workflow: Workflow,
        context: Mapping[str, Any] | None = None,
        *,
        run_id: str | None = None,
    ) -> WorkflowResult:
        """`start_workflow` and wait for the `WorkflowResult` (a failed run is
        returned, not raised)."""
        run = await self.start_workflow(workflow, context, run_id=run_id)
        return await run.wait()

    def _log_run(self, change: Change) -> None:
        """Journal a workflow-run change (with a store). A 'run' change gets its
        owner and creation time here."""
        if self._store is None:
            return
        if change[0] == "run":
            change = (*change, self.owner, self._wall())
        else:  # step/run_end: guarded by our ownership of the run
            change = (change[0], change[1], self.owner, *change[3:])
        self._log(change)

    def _step_changed(self, ref: TaskRef) -> None:
        """A workflow step started, deferred or resumed: its run may publish."""
        run = self._active_runs.get(ref._run_id or "")
        if run is not None:
            run._publish()

    def _run_finished(self, run: WorkflowRun) -> None:
        self._runs -= 1
        self._active_runs.pop(run.run_id, None)
        if self._idle_lot and self._is_idle():
            self._idle_lot.unpark_all()

    # ---------------------------------------------------------------- persistence

    async def flush(self) -> None:
        """Wait until every transition so far is durable in the store. A checkpoint.

        Without a store, returns at once. What waits for durability on its own:
        `TaskRef.wait` (and so `run`) returns only once the task's completion is
        durable, and leaving `open_executor` flushes everything. Submissions and
        sub-status changes are written in the background (group commit); call
        ``flush`` when another process must see them now.

        Raises:
          StoreError: the store failed before everything so far was durable.
        """
        if self._journal is None:
            await trio.lowlevel.checkpoint()
            return
        await self._journal.flush()

    @property
    def _failure(self) -> StoreError | None:
        """The store's failure, which stopped this executor (or None)."""
        return None if self._journal is None else self._journal.failure

    def _failure_error(self) -> StoreError:
        assert self._journal is not None
        return self._journal.failure_error()

    def _written(self, notify: list[TaskRef], fenced: list[str]) -> None:
        """A batch is durable: acknowledge its completions; deal with what the
        store fenced out (another owner has it now)."""
        if fenced:
            lost = set(fenced)
            for run_id in lost & self._active_runs.keys():
                self._active_runs[run_id]._lost()
            for ref in notify:
                if ref.task_id in lost:
                    self._overruled(ref)
            for task_id in lost:
                self._lease_lost(task_id)
        for ref in notify:
            ref._pending_ack = False
            if ref._done is not None:
                ref._done.set()
        self._wake_next_submitter()  # the store caught up: there may be room

    async def _guarded(self, service: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Run one of the store's services (writer, heartbeat, recovery); a failure
        of the store stops the executor instead of escaping into its nursery."""
        try:
            await service(*args)
        except Exception as exc:
            self._store_failed(exc)

    def _store_failed(self, exc: Exception) -> None:
        """The store failed: stop everything and wake every waiter, who learns
        of it as one `StoreError` naming the store."""
        journal = self._journal
        assert journal is not None
        if journal.fail(exc) is None:
            return  # (failed already)
        self._begin_shutdown(ShutdownPolicy.CANCEL)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        for ref in [*self._live.values(), *journal.notify]:
            if ref._done is not None:
                ref._done.set()
        self._idle_lot.unpark_all()

    async def _heartbeat(self, lease: float) -> None:
        """One lease for all of this executor's executions, renewed at a third of it."""
        journal = self._journal
        assert journal is not None
        store = journal.store
        # trio_util.periodic: a renewal that takes a while does not push the next one back.
        async with contextlib.aclosing(periodic(lease / 3)) as beats:
            async for _, since_last in beats:
                if since_last is None:
                    continue  # renewed on entry
                await journal.call(store.heartbeat, self.owner, self._wall() + lease)
                live = {t: r._version for t, r in self._live.items()}
                for task_id in await journal.call(store.taken_over, self.owner, live):
                    self._lease_lost(task_id)
                if self._active_runs:
                    runs = list(self._active_runs)
                    for run_id in await journal.call(store.runs_taken_over, self.owner, runs):
                        run = self._active_runs.get(run_id)
                        if run is not None:
                            run._lost()

    def _overruled(self, ref: TaskRef) -> None:
        """``ref`` ended here, but its completion was fenced out: another owner has
        the execution (or its record never existed). Its waiter learns that, not a
        result that was never recorded."""
        counters = {
            TaskStatus.COMPLETED: "_completed",
            TaskStatus.FAILED: "_failed",
            TaskStatus.TIMED_OUT: "_timed_out",
            TaskStatus.DROPPED: "_dropped",
        }
        name = counters.get(ref._status)
        if name is None:
            return  # already cancelled
        setattr(self, name, getattr(self, name) - 1)
        self._cancelled += 1
        ref._status = TaskStatus.CANCELLED
        ref._result = None
        ref._completion = None
        ref._error = TaskCancelled(
            f"lease_lost: task {ref.name!r} ({ref.task_id}) is another executor's now; "
            "its result here was not recorded"
        )

    def _lease_lost(self, task_id: str) -> None:
        """Another owner has this execution now: stop running it here, no retry."""
        ref = self._live.pop(task_id, None)
        if ref is None or ref.done:
            return
        ref._version = -1  # nothing more of it can be written
        ref._error = TaskCancelled(
            f"lease_lost: task {ref.name!r} ({task_id}) was taken over by another executor"
        )
        ref._cancel_requested = True
        self._cancel_requests += 1
        if ref._scope is None:  # still queued here
            self._queue -= 1
            self._stale += 1
            self._finish(ref, TaskStatus.CANCELLED)
        else:
            if ref._handle is not None:
                ref._handle._request_cancel()
            ref._scope.cancel()

    async def _recover(self, max_recovery_attempts: int) -> bool:
        """Claim the executions of owners whose lease expired, and run them here:
        as many as there is room for, so recovery keeps to the admission bound and
        several recovering executors share a dead one's backlog. Returns True if
        it filled the room (more may be waiting)."""
        journal = self._journal
        assert journal is not None
        store = journal.store
        specs = self._specs

        def recreatable(record: ExecutionRecord) -> bool:
            return record.args is not None and record.spec_id in specs

        if self._closing:
            return False
        room = max(0, self._capacity - self._reserved - self._queue - self._active - self._deferred)
        self._reserved += room  # submissions meanwhile must not take recovery's room
        try:
            result = await journal.call(
                store.recover, self.owner, self._wall(), recreatable, max_recovery_attempts, room
            )
        finally:
            self._reserved -= room
        for record in result.abandoned:
            self._events.publish(
                HealthEventKind.TASK_ABANDONED,
                record.task_id,
                reason="abandoned",
                attributes={"name": record.name, "recovery_attempts": record.recovery_attempts},
            )
        for record in result.claimed:
            if self._is_closing():  # (the store call above awaited)
                return False  # left claimed under our lease: recovered once it lapses
            assert record.spec_id is not None
            assert record.args is not None
            spec = specs[record.spec_id]
            args = tuple(json.loads(record.args))
            ref = self._new_ref(
                spec, args, record.name, record.task_id, None, None, None, recovered=True
            )
            ref._version = record.version
            ref._attempts = record.attempt
            ref._submitted_at = record.submitted_at or ref._submitted_at
            self._submitted -= 1  # a recovered execution is not a new submission
            self._enqueue(ref, recovered=True)
        if not self.closed:
            runs = await journal.call(
                store.claim_runs,
                self.owner,
                self._wall(),
                list(self._workflows),
                max_recovery_attempts,
            )
            for run in runs.abandoned:
                self._events.publish(
                    HealthEventKind.TASK_ABANDONED,
                    None,
                    reason="abandoned",
                    attributes={"run_id": run.run_id, "workflow": run.workflow},
                )
            for record in runs.claimed:
                if self._is_closing():
                    break  # claimed under our lease, which lapses: recovered again later
                self._resume_run(record)
        return len(result.claimed) >= room

    def _is_closing(self) -> bool:
        # A method, not the attribute: type checkers keep `self._closing` narrowed
        # across awaits, though shutdown can begin during one.
        return self._closing

    def _resume_run(self, record: RunRecord) -> None:
        assert self._nursery is not None
        workflow = self._workflows[record.workflow]
        run = WorkflowRun(self, workflow, json.loads(record.context), record.run_id, record)
        self._runs += 1
        self._active_runs[run.run_id] = run
        self._nursery.start_soon(run._coordinate)

    async def _close_store(self) -> None:
        """Write what is left and give up the lease (if nothing of ours is live).
        After a store failure the rest is still tried once (the failure may have
        passed: a lock held too long); a failure here is recorded like any other."""
        journal = self._journal
        assert journal is not None
        with trio.move_on_after(60, shield=True):
            try:
                await journal.write()
                if journal.failure is None and not self._live and not journal.changes:
                    await journal.call(journal.store.release_owner, self.owner)
            except Exception as exc:
                self._store_failed(exc)

    async def _recovery_loop(self, lease: float, max_recovery_attempts: int, more: bool) -> None:
        while True:
            if more:
                # The last pass filled the room: come back as soon as half of it frees.
                while self._queue + self._active + self._deferred > self._capacity // 2:
                    await self._space_freed.wait()
                    self._space_freed = trio.Event()
            else:
                await trio.sleep(lease)
            more = await self._recover(max_recovery_attempts)

    # ---------------------------------------------------------------- idle, stats, shutdown

    async def wait_for_idle(self) -> None:
        """Wait until nothing is pending, active or deferred. A checkpoint."""
        if self._is_idle():
            await trio.lowlevel.checkpoint()
            return
        while not self._is_idle() and self._failure is None:
            await self._idle_lot.park()

    def statistics(self) -> ExecutorMetrics:
        """A frozen `ExecutorMetrics` snapshot. Never blocks."""
        return ExecutorMetrics(
            submitted_count=self._submitted,
            queued_count=self._queued,
            active_count=self._active,
            deferred_count=self._deferred,
            completed_count=self._completed,
            failed_count=self._failed,
            cancelled_count=self._cancelled,
            rejected_count=self._rejected,
            dropped_count=self._dropped,
            timed_out_count=self._timed_out,
            deferral_count=self._deferrals,
            resumed_count=self._resumes,
            cancellation_requested_count=self._cancel_requests,
            cancellation_observed_count=self._cancels_observed,
            timeout_budget_exceeded_count=self._budget_exceeded,
            max_inflight_count=self._max_inflight,
            max_outstanding_count=self._max_outstanding,
            max_deferred_count=self._max_deferred,
            queue_depth=self._queue,
            events_dropped_count=self._events.dropped,
        )

    @property
    def events(self) -> EventStream:
        """The bounded `HealthEvent` stream: ``async for event in ex.events``.

        Buffers from the executor's start; when the reader lags, the oldest unread
        events are dropped and counted (``events_dropped_count``). Iteration ends
        after the executor has closed and the buffer is empty.
        """
        return self._events

    @property
    def metrics(self) -> ExecutorMetrics:
        """The same snapshot as `statistics`."""
        return self.statistics()

    async def shutdown(self, policy: ShutdownPolicy | None = None) -> None:
        """Stop accepting work and finish according to ``policy`` (default: the
        executor's ``shutdown_policy``); returns once nothing is outstanding.

        Called from one of this executor's own tasks, it begins the shutdown and
        returns at once (a task cannot wait for itself to end)."""
        policy = self._config.shutdown_policy if policy is None else ShutdownPolicy(policy)
        self._begin_shutdown(policy)
        caller = current_ref()
        if caller is not None and caller._executor is self:
            # Called by one of our own tasks: it cannot wait for itself to end.
            await trio.lowlevel.checkpoint()
            return
        await self.wait_for_idle()
        self._wake_idle_workers()
        if self._shared_poller is not None:
            self._shared_poller.close()

    def _begin_shutdown(self, policy: ShutdownPolicy) -> None:
        self._closing = True
        if policy is not ShutdownPolicy.DRAIN:
            self._drain_runs = False
        # BLOCKed submitters decide again: ExecutorClosed (or, fan-out under
        # DRAIN, back in line). A place handed to one is its own to give back.
        waiters, self._space_waiters = self._space_waiters, deque()
        for task in waiters:
            trio.lowlevel.reschedule(task, outcome.Value(False))
        if policy is not ShutdownPolicy.DRAIN:
            self.cancel_pending()
        if policy is ShutdownPolicy.CANCEL:
            for ref in list(self._taken):
                self._cancel_ref(ref)
        self._wake_idle_workers()


def _reraise_cancellation(ref: TaskRef, group: BaseExceptionGroup[BaseException]) -> NoReturn:
    """A task ended with a group holding a Cancelled: keep the whole group on
    record, and let only the cancellation travel on, so the task's own errors
    never escape into the executor's nursery."""
    ref._error = group
    cancelled, _ = group.split(trio.Cancelled)
    if cancelled is None:
        raise group
    raise cancelled from None


def _should_retry(spec: TaskSpec, ref: TaskRef, status: TaskStatus) -> bool:
    if status is not TaskStatus.FAILED and status is not TaskStatus.TIMED_OUT:
        return False
    if ref._attempts > spec.retries or ref._cancel_requested:
        return False
    error = ref._error
    return isinstance(error, spec.retry_on) and not isinstance(error, PermanentError)


def split_tasks(tasks: Iterable[object]) -> tuple[dict[str, TaskSpec], dict[str, Workflow]]:
    """``tasks=`` as specs by id and workflows by name (duplicates are errors)."""
    items = list(tasks)
    workflows: dict[str, Workflow] = {}
    for item in items:
        if isinstance(item, Workflow):
            if item.name in workflows:
                raise TaskDefinitionError(f"duplicate workflow name {item.name!r} in tasks=")
            workflows[item.name] = item
    return collect_specs(i for i in items if not isinstance(i, Workflow)), workflows


def _same_leaves(a: BaseException, b: BaseException) -> bool:
    """``a`` is ``b``, or a group derived from ``b`` with the same leaves."""
    if a is b:
        return True
    if not (isinstance(a, BaseExceptionGroup) and isinstance(b, BaseExceptionGroup)):
        return False
    return (
        type(a) is type(b)
        and a.message == b.message
        and len(a.exceptions) == len(b.exceptions)
        and all(_same_leaves(x, y) for x, y in zip(a.exceptions, b.exceptions, strict=True))
    )


@asynccontextmanager
async def open_executor(
    max_concurrent_tasks: int = 4,
    queue_capacity: int = 1024,
    overflow: Overflow = Overflow.BLOCK,
    shutdown_policy: ShutdownPolicy = ShutdownPolicy.DRAIN,
    thread_workers: int | None = None,
    store: Store | None = None,
    event_capacity: int = 1024,
    task_budget: float | None = None,
    tasks: Iterable[object] = (),
    recover: bool = False,
    lease: float = 30.0,
    max_recovery_attempts: int = 3,
) -> AsyncIterator[Executor]:
    """Open an executor whose tasks run in a nursery inside this block.

    On leaving the block normally, the executor shuts down with ``shutdown_policy``
    and waits for it; if the block raises, outstanding work is cancelled. No task
    outlives the block (the one exception: the thread of a sync task abandoned at
    its ``timeout`` runs on until its function returns, without a slot). Errors
    from the body propagate unwrapped (never inside an ExceptionGroup); a store
    failure ends the block as one `StoreError` naming the store.

    With a ``store``, every execution is recorded (group commit by one writer
    task); the executor holds one lease (``lease`` seconds, renewed at a third of
    it) for all its executions; ``recover=True`` re-runs the executions of
    executors whose lease expired (on entry, then every ``lease``), re-creating
    them from ``tasks``. See `Executor.flush` for what waits for durability.

    Example::

        async with trioexec.open_executor(max_concurrent_tasks=4) as ex:
            ref = await ex.submit(fetch, url)
            print((await ref.wait()).result)
    """
    config = ExecutorConfig(
        max_concurrent_tasks=max_concurrent_tasks,
        queue_capacity=queue_capacity,
        overflow=overflow,
        shutdown_policy=shutdown_policy,
        thread_workers=thread_workers,
        event_capacity=event_capacity,
        task_budget=task_budget,
        lease=lease,
        max_recovery_attempts=max_recovery_attempts,
    )
    specs, workflows = split_tasks(tasks)
    check_store(store)
    if recover and store is None:
        raise ValueError("recover=True needs a store to recover from")
    body_error: list[BaseException] = []  # what the body raised, if anything
    try:
        # Two nurseries: the workers in the inner one, the store's writer and the
        # heartbeat in the outer one, so the last completions are written after
        # the last worker has finished, whatever ended the block.
        async with trio.open_nursery() as infra:
            ex = Executor(None, config, store, specs, workflows)
            # The writer and the heartbeat keep going, whatever cancels the block,
            # until every task has ended and the rest is written: a lease must not
            # lapse while a task that cannot be interrupted (a thread) still runs.
            keepalive = trio.CancelScope(shield=True)
            if store is not None:
                assert ex._journal is not None
                await ex._journal.call(store.heartbeat, ex.owner, ex._wall() + lease)
                await infra.start(_store_services, ex, lease, keepalive)
            try:
                async with _one_level(body_error), trio.open_nursery() as nursery:
                    ex._nursery = nursery
                    if recover:
                        more = await ex._recover(max_recovery_attempts)
                        infra.start_soon(
                            ex._guarded, ex._recovery_loop, lease, max_recovery_attempts, more
                        )
                    try:
                        yield ex
                    except BaseException as exc:
                        body_error.append(exc)
                        ex._begin_shutdown(ShutdownPolicy.CANCEL)
                        raise
                    finally:
                        nursery.start_soon(_close_events_when_done, ex)
                    try:
                        await ex.shutdown()
                    except BaseException:  # e.g. cancelled from outside while draining
                        ex._begin_shutdown(ShutdownPolicy.CANCEL)
                        raise
            finally:
                try:
                    if store is not None:
                        await ex._close_store()
                finally:
                    keepalive.cancel()
                    infra.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        _raise_single(group, body_error)
        raise
    if ex._failure is not None:
        # Whatever the body was doing was cancelled by the failure: this is the error.
        raise ex._failure


async def _store_services(
    ex: Executor,
    lease: float,
    scope: trio.CancelScope,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with scope:
        async with trio.open_nursery() as services:
            assert ex._journal is not None
            services.start_soon(ex._guarded, ex._journal.run_writer)
            services.start_soon(ex._guarded, ex._heartbeat, lease)
            task_status.started()


async def _close_events_when_done(ex: Executor) -> None:
    # Runs last in the nursery: once nothing is outstanding, no event can come.
    try:
        await ex.wait_for_idle()
    finally:
        ex._events.close()


@asynccontextmanager
async def _one_level(body_error: list[BaseException]) -> AsyncIterator[None]:
    """Take away the one group layer the nursery inside this block adds around a
    lone exception (the body's, say), and no more: a user's own group passes."""
    try:
        yield
    except BaseExceptionGroup as group:
        _raise_single(group, body_error)
        raise


def _raise_single(
    group: BaseExceptionGroup[BaseException], body_error: list[BaseException]
) -> None:
    """Re-raise the only exception of ``group`` (one nursery's layer), with its
    own context kept; return if the group holds more than one.

    A group the body raised comes back from Trio's cancel scopes as a copy
    (``split`` derives a new group); the user gets their own object back.
    """
    if len(group.exceptions) != 1:
        return
    exc = group.exceptions[0]
    if body_error and _same_leaves(exc, body_error[0]):
        exc = body_error[0]
    context = exc.__context__
    try:
        raise exc
    finally:
        exc.__context__ = context
        del exc, context
