"""`open_executor`, and `Executor`: the object it yields.

`Executor` is a facade: its public methods check their arguments and delegate
to the parts `ExecutorCore` wires together (`trioexec._core`); workflow runs are
kept by `WorkflowRuns` (`trioexec._coordinator`). `open_executor` runs the parts'
tasks in two nurseries, and takes the block's errors down to the one that ended it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypedDict, Unpack, final, overload

import attrs
import trio
from trio.lowlevel import cancel_shielded_checkpoint, checkpoint_if_cancelled

from ._coordinator import WorkflowResult, WorkflowRun, WorkflowRuns
from ._core import ExecutorConfig, ExecutorCore, check_grace, check_store
from ._errors import ExecutorClosed, StoreError, TaskDefinitionError
from ._events import EventStream
from ._handle import TaskHandle
from ._machine._keys import KeyLimit, KeyStatistics, check_key
from ._metrics import ExecutorMetrics
from ._records import Overflow, ShutdownPolicy
from ._schedule import Schedule, Schedules
from ._slots import SlotPool
from ._spec import TaskSpec, collect_specs
from ._store import Store
from ._taskref import (
    R,
    RunOptions,
    SubmitOptions,
    TakesHandleKeyword,
    TakesTaskHandleKeyword,
    TaskRef,
    Ts,
)
from ._workflow import Workflow

__all__ = ["Executor", "ExecutorConfig", "open_executor", "split_tasks"]

# Two parameter types of the overloads of `submit_nowait`, `submit` and `run` (made at
# run time too: the signatures the docs render show what they stand for).
AsyncWithHandle = Callable[[*Ts, TaskHandle], Awaitable[R]]
KeywordHandle = TakesHandleKeyword[*Ts] | TakesTaskHandleKeyword[*Ts]


class ExecutorOptions(TypedDict, total=False):
    """The options of `open_executor` and `DeterministicExecutor`, keyword-only (their
    one list), read by `Setup.read`; `ExecutorConfig` checks most and holds their defaults."""

    max_concurrent_tasks: int
    queue_capacity: int
    overflow: Overflow
    shutdown_policy: ShutdownPolicy
    thread_workers: int | None
    store: Store | None
    event_capacity: int
    task_budget: float | None
    tasks: Iterable[object]
    recover: bool
    lease: float
    max_recovery_attempts: int
    key_limits: KeyLimit | Mapping[str, KeyLimit] | None
    priority_aging: float | None
    shutdown_grace: float | None
    fairness: str | None
    keep_results: bool
    report_unread_failures: bool


@final
@attrs.frozen
class Setup:
    """`ExecutorOptions` read and checked: what a facade builds its parts from."""

    config: ExecutorConfig
    store: Store | None
    specs: dict[str, TaskSpec]
    workflows: dict[str, Workflow]
    recover: bool
    report_unread_failures: bool

    @classmethod
    def read(cls, options: ExecutorOptions, caller: str) -> Setup:
        """Raises TypeError naming ``caller`` for an option it does not take, and
        what `ExecutorConfig`, `split_tasks` and `check_store` raise."""
        unknown = sorted(set(options) - set(ExecutorOptions.__annotations__))
        if unknown:
            known = ", ".join(ExecutorOptions.__annotations__)
            raise TypeError(f"{caller} got an unexpected option {unknown[0]!r} (it takes {known})")
        rest: dict[str, Any] = dict(options)
        store = rest.pop("store", None)
        tasks = rest.pop("tasks", ())
        recover = rest.pop("recover", False)
        report = rest.pop("report_unread_failures", True)
        config = ExecutorConfig(**rest)
        specs, workflows = split_tasks(tasks)
        check_store(store)
        return cls(config, store, specs, workflows, recover, report)


class Facade:
    """What `Executor` and `DeterministicExecutor` share, delegated to their `ExecutorCore`."""

    _core: ExecutorCore

    if TYPE_CHECKING:  # its overloads (see `trioexec._taskref.Ts`)

        @overload
        def submit_nowait(
            self, fn: Callable[[*Ts], Awaitable[R]], *args: *Ts, **options: Unpack[SubmitOptions]
        ) -> TaskRef[R]: ...

        @overload
        def submit_nowait(
            self, fn: AsyncWithHandle[*Ts, R], *args: *Ts, **options: Unpack[SubmitOptions]
        ) -> TaskRef[R]: ...

        @overload
        def submit_nowait(
            self, fn: Callable[[*Ts], R], *args: *Ts, **options: Unpack[SubmitOptions]
        ) -> TaskRef[R]: ...

        @overload
        def submit_nowait(
            self, fn: Callable[[*Ts, TaskHandle], R], *args: *Ts, **options: Unpack[SubmitOptions]
        ) -> TaskRef[R]: ...

        @overload
        def submit_nowait(
            self, fn: KeywordHandle[*Ts], *args: *Ts, **options: Unpack[SubmitOptions]
        ) -> TaskRef[Any]: ...

    def submit_nowait(
        self,
        fn: Callable[..., Any],
        *args: object,
        name: str | None = None,
        task_id: str | None = None,
        timeout: float | None = None,
        budget: float | None = None,
        correlation_id: str | None = None,
        key: str | None = None,
        priority: int | None = None,
        keep_result: bool | None = None,
        dedupe_key: str | None = None,
        dedupe_window: float | None = None,
        detached: bool = False,
    ) -> TaskRef[Any]:
        """Submit ``fn(*args)`` and return its `TaskRef` at once: like `Executor.submit`
        (the same options and errors), but never blocks, so under ``Overflow.BLOCK``
        a full executor raises `TaskRejected` (as under ``REJECT``). With a store,
        a ``dedupe_key`` is looked up in it from the calling thread (a short
        transaction)."""
        core = self._core
        job = core.new_job(
            fn,
            args,
            name,
            task_id,
            timeout,
            budget,
            correlation_id,
            None,
            key,
            priority,
            keep_result,
            detached,
            dedupe_key,
        )
        if dedupe_key is not None or dedupe_window is not None:
            found = core.dedupes.submit_nowait(job, dedupe_key, dedupe_window, task_id is not None)
            if found is not None:
                return found
        core.submit_nowait(job)
        return TaskRef(job)

    def pause(self, *, name: str | None = None, key: str | None = None) -> None:
        """Pause the tasks named ``name`` and those of admission key ``key``:
        those that have not started wait (`TaskRef.waiting_on` ``"paused"``) until
        they are resumed; running and deferred ones go on. Takes effect at once.
        Never blocks; pausing twice is pausing once.

        With a store, what is paused is the store's: every executor on it
        pauses within a second (as for ``trioexec pause DB --name N``), and the
        command is recorded with who sent it and when (a `DeterministicExecutor`'s
        pauses are its own, never the store's).

        A shutdown cancels paused tasks (they would never start); with a store
        and a registered spec, ``trioexec retry`` can requeue them.

        Raises:
          ValueError: neither ``name`` nor ``key`` given, or one that is not a
            valid name (an empty or over-long str).
          ExecutorClosed: the executor has closed (its ``async with`` block ended).
        """
        self._core.control.pause(name, key)

    def resume(self, *, name: str | None = None, key: str | None = None) -> None:
        """Undo `pause` for ``name`` and ``key``: their waiting tasks go back to
        their place in the queue. Resuming what is not paused does nothing."""
        self._core.control.resume(name, key)

    def cancel_pending(self) -> int:
        """End every task that has not started yet as ``CANCELLED``; return how many.
        Never blocks; running and deferred tasks, and those between attempts, go on."""
        return self._core.lifecycle.cancel_pending()

    def statistics(self) -> ExecutorMetrics:
        """A frozen `ExecutorMetrics` snapshot. Never blocks."""
        return self._core.statistics()

    @property
    def metrics(self) -> ExecutorMetrics:
        """The snapshot `statistics` returns, as a property (API.md §3 names both)."""
        return self.statistics()

    @property
    def events(self) -> EventStream:
        """The bounded `HealthEvent` stream, read with ``async for event in
        ex.events`` (or ``get_nowait``, in a test of a `DeterministicExecutor`).
        Buffers from the executor's start; when the reader lags, the oldest unread
        events are dropped and counted (``events_dropped_count``). Iteration ends
        after the executor has closed and the buffer is empty."""
        return self._core.events


@final
class Executor(Facade):
    """The object `open_executor` yields. See `open_executor` for the options."""

    def __init__(self, setup: Setup) -> None:
        runs = functools.partial(WorkflowRuns, setup.workflows)
        self._core = core = ExecutorCore(setup.config, setup.store, setup.specs, runs=runs)
        assert isinstance(core.runs, WorkflowRuns)
        self._runs = core.runs

    @property
    def owner(self) -> str:
        """The id this executor's executions are recorded under in its store."""
        return self._core.owner_id

    @property
    def slots(self) -> SlotPool:
        """The executor's `SlotPool` (``max_concurrent_tasks`` slots)."""
        return self._core.slots

    @property
    def closed(self) -> bool:
        """True once shutdown has begun; submissions raise `ExecutorClosed`."""
        return self._core.shutdown.closing

    # ---------------------------------------------------------------- submission

    if TYPE_CHECKING:  # its overloads (see `trioexec._taskref.Ts`)

        @overload
        async def submit(
            self, fn: Callable[[*Ts], Awaitable[R]], *args: *Ts, **options: Unpack[SubmitOptions]
        ) -> TaskRef[R]: ...

        @overload
        async def submit(
            self, fn: AsyncWithHandle[*Ts, R], *args: *Ts, **options: Unpack[SubmitOptions]
        ) -> TaskRef[R]: ...

        @overload
        async def submit(
            self, fn: Callable[[*Ts], R], *args: *Ts, **options: Unpack[SubmitOptions]
        ) -> TaskRef[R]: ...

        @overload
        async def submit(
            self, fn: Callable[[*Ts, TaskHandle], R], *args: *Ts, **options: Unpack[SubmitOptions]
        ) -> TaskRef[R]: ...

        @overload
        async def submit(
            self, fn: KeywordHandle[*Ts], *args: *Ts, **options: Unpack[SubmitOptions]
        ) -> TaskRef[Any]: ...

    async def submit(
        self,
        fn: Callable[..., Any],
        *args: object,
        name: str | None = None,
        task_id: str | None = None,
        timeout: float | None = None,
        budget: float | None = None,
        correlation_id: str | None = None,
        key: str | None = None,
        priority: int | None = None,
        keep_result: bool | None = None,
        dedupe_key: str | None = None,
        dedupe_window: float | None = None,
        detached: bool = False,
    ) -> TaskRef[Any]:
        """Submit ``fn(*args)`` and return its `TaskRef` once it is accepted.

        A checkpoint. Under ``Overflow.BLOCK`` waits for space when the executor is
        at capacity; if cancelled while waiting, nothing was submitted. With a store,
        while its writer is more than ``JOURNAL_LIMIT`` changes behind, ``BLOCK``
        waits too and every other policy refuses (reason ``store_backlog``).

        ``key`` puts the task under that key's `KeyLimit` (``key_limits``);
        ``priority`` (an int, higher first) orders it among the tasks that may
        start. Both default to the `TaskSpec`'s (its ``key`` may be a function of
        the arguments), else no key and priority 0.

        ``dedupe_key``: if an execution submitted with this key is live (pending,
        running or deferred), or completed less than ``dedupe_window`` seconds
        ago (None: while its record is kept; without a store, while this
        executor is open), no new one is made: the `TaskRef` returned is that
        execution's, with ``deduplicated`` True, and its ``wait()`` returns that
        execution's completion (from the store, if another executor runs it).
        Executors sharing a store make one execution per key, even submitting
        it at the same instant: the store decides (a call to it at submission).
        A failed, timed-out, cancelled or dropped execution does not hold its key.

        Submitted from inside a task of this executor, the task is its child
        (`TaskRef.parent_id`): its deadline is never later than its ancestors'
        (when an ancestor's deadline passes, it ends ``TIMED_OUT`` too, deferred
        or not), and cancelling an ancestor (`TaskRef.cancel`, ``trioexec
        cancel``, a shutdown's cancel, its timeout) ends it ``CANCELLED`` (or
        ``TIMED_OUT``), pending ones without running, with an error naming the
        ancestor. A parent that completes or fails leaves its children be.
        ``detached=True`` makes it a root instead.

        ``keep_result``: store the task's value as JSON with its completion
        (`ExecutionRecord.result`, `trioexec.wait_result`); None: the `TaskSpec`'s
        ``keep_result``, else the executor's ``keep_results``. A value
        ``json.dumps`` refuses ends the task ``FAILED`` (a `TypeError` naming its
        type; no retry).

        Raises:
          ExecutorClosed: if shutdown has begun (also while waiting for space);
            under ``DRAIN``, the executor's own running tasks may still submit.
          TaskRejected: under ``REJECT`` (or ``DROP_OLDEST`` with nothing to drop).
          CapacityExceeded: under ``FAIL_FAST``.
          ValueError: a ``task_id``, ``name`` or ``correlation_id`` that is not a
            non-empty str of at most 1,000 characters a store can hold; a
            ``task_id`` live in this executor or recorded in its store; a
            ``timeout``, ``budget`` or ``dedupe_window`` that is not a finite
            number > 0; a ``key`` that is not such a str (or a spec's key
            function that raised); a ``dedupe_key`` that is not one (as a
            ``task_id``); a ``dedupe_window`` without a ``dedupe_key``.
          TypeError: ``fn`` is not callable; a ``priority`` that is not an int;
            a ``key`` that is not a str (the error is a ValueError too); a
            ``keep_result`` that is not a bool or None.
        """
        # Exactly one schedule point: parking for space is one; otherwise a
        # cancel-shielded checkpoint after the (then certain) acceptance.
        await checkpoint_if_cancelled()
        core = self._core
        job = core.new_job(
            fn,
            args,
            name,
            task_id,
            timeout,
            budget,
            correlation_id,
            None,
            key,
            priority,
            keep_result,
            detached,
            dedupe_key,
        )
        if dedupe_key is not None or dedupe_window is not None:
            found = await core.dedupes.submit(job, dedupe_key, dedupe_window, task_id is not None)
            if found is not None:
                return found
        if core.accept_if_fits(job):  # (no coroutine of ours on the common path)
            await cancel_shielded_checkpoint()
        else:
            await core.submit(job)
        return TaskRef(job)

    if TYPE_CHECKING:  # its overloads (see `trioexec._taskref.Ts`)

        @overload
        async def run(
            self, fn: Callable[[*Ts], Awaitable[R]], *args: *Ts, **options: Unpack[RunOptions]
        ) -> R: ...

        @overload
        async def run(
            self, fn: AsyncWithHandle[*Ts, R], *args: *Ts, **options: Unpack[RunOptions]
        ) -> R: ...

        @overload
        async def run(
            self, fn: Callable[[*Ts], R], *args: *Ts, **options: Unpack[RunOptions]
        ) -> R: ...

        @overload
        async def run(
            self, fn: Callable[[*Ts, TaskHandle], R], *args: *Ts, **options: Unpack[RunOptions]
        ) -> R: ...

        @overload
        async def run(
            self, fn: KeywordHandle[*Ts], *args: *Ts, **options: Unpack[RunOptions]
        ) -> Any: ...

    async def run(
        self,
        fn: Callable[..., Any],
        *args: object,
        keep_result: bool | None = None,
        dedupe_key: str | None = None,
        dedupe_window: float | None = None,
        detached: bool = False,
    ) -> Any:
        """Submit ``fn(*args)``, wait for it, and return its value or raise its error
        (`TaskCompletion.unwrap`). ``keep_result``, ``dedupe_key``,
        ``dedupe_window`` and ``detached`` as for `submit` (a duplicate's value is
        its execution's: with a store, the kept result of another executor's).

        Raises:
          Exception: the task's own exception, as it is, if it failed.
          TaskTimeout: if it timed out.
          TaskCancelled: if it was cancelled.
          TaskRejected: if it was dropped.
        """
        ref = await self.submit(
            fn,
            *args,
            keep_result=keep_result,
            dedupe_key=dedupe_key,
            dedupe_window=dedupe_window,
            detached=detached,
        )
        completion = await ref.wait()
        return completion.unwrap()

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
          ValueError: a ``run_id`` that is not a non-empty str of at most 1,000
            characters a store can hold, or one running in this executor or
            recorded in its store.
        """
        if self.closed:
            raise ExecutorClosed("the executor is shutting down; no new workflow runs")
        return await self._runs.start(workflow, context, run_id)

    @property
    def workflow_runs(self) -> Mapping[str, WorkflowRun]:
        """The runs in progress here (started here or resumed by recovery), by run id."""
        return self._runs.active

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

    # ---------------------------------------------------------------- schedules

    _schedules: Schedules | None = None  # (made by the first `schedule`)

    def schedule(
        self,
        spec: Callable[..., Any],
        *,
        cron: str,
        schedule_id: str,
        tz: str = "UTC",
        catch_up: bool = False,
        args: Iterable[Any] = (),
    ) -> Schedule:
        """Submit ``spec(*args)`` at every occurrence of ``cron`` (read in time zone
        ``tz``) until the executor shuts down or the schedule is cancelled; return
        the `Schedule` at once. Never blocks.

        Each occurrence's task has the id ``"<schedule_id>@<its time, UTC, ISO
        8601>"``. With a store, every executor on it that schedules ``schedule_id``
        claims each occurrence in the store first: one of them runs it. With
        ``catch_up``, a schedule that missed occurrences since its last run the
        store recorded (its executors were down) runs the latest of them once at
        start. An occurrence that passes while the schedule waits for room is run
        late, once. See ``docs/howto/schedules.rst``.

        Example::

            ex.schedule(report, cron="0 2 * * *", schedule_id="nightly", tz="Europe/Berlin")

        Raises:
          ValueError: a cron expression cronsim refuses (or that never occurs), an
            unknown time zone, a bad ``schedule_id`` or one already running here.
          TypeError: ``spec`` is not callable, ``cron`` or ``tz`` not a str.
          ExecutorClosed: if shutdown has begun.
        """
        if self._schedules is None:
            self._schedules = Schedules(self._core, self.submit)
        return self._schedules.add(spec, cron, schedule_id, tz, catch_up, args)

    def unschedule(self, schedule_id: str) -> bool:
        """Cancel the schedule ``schedule_id`` (`Schedule.cancel`); False if it is
        not running in this executor. Never blocks."""
        return self._schedules is not None and self._schedules.remove(schedule_id)

    def paused(self) -> tuple[frozenset[str], frozenset[str]]:
        """What is paused now, here or in the store for every executor on it: ``(names, keys)``."""
        control = self._core.control
        return frozenset(control.names), frozenset(control.keys)

    # ---------------------------------------------------------------- store, idle, stats

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
        journal = self._core.journal
        if journal is None:
            await trio.lowlevel.checkpoint()
            return
        await journal.flush()

    async def wait_for_idle(self) -> None:
        """Wait until nothing is pending, active or deferred. A checkpoint."""
        await self._core.waits.wait_for_idle()

    def key_statistics(self, key: str) -> KeyStatistics:
        """A `KeyStatistics` snapshot of ``key``'s tasks now (all zero for a key
        with none). Never blocks.

        Raises:
          TypeError: ``key`` is not a str; ValueError: not one ``submit`` takes.
        """
        return self._core.pending.keys.statistics(check_key(key))

    async def shutdown(
        self, policy: ShutdownPolicy | None = None, *, grace: float | None = None
    ) -> None:
        """Stop accepting work and finish according to ``policy`` (default: the
        executor's ``shutdown_policy``); returns once nothing is outstanding.

        ``grace`` (default: the executor's ``shutdown_grace``; None there means no
        limit) bounds a ``DRAIN`` or ``CANCEL_PENDING``: what is still pending,
        running, deferred or waiting to retry ``grace`` seconds after this call is
        cancelled as under ``CANCEL`` (and a ``shutdown_grace_expired`` health event
        says how much was left). A second call may shorten the grace, never extend it.
        The grace cannot interrupt the thread of a plain ``def`` task without a
        ``timeout=``: the task is cancelled (its thread sees that only through
        ``trio.from_thread.check_cancelled()`` or ``defer_until_sync``) and the
        shutdown waits for the thread to return. Give sync tasks a ``timeout=``
        (their thread is then abandoned when cancelled) if the grace must bound it.

        Called from one of this executor's own tasks, it begins the shutdown and
        returns at once (a task cannot wait for itself to end); the grace still
        holds. If the caller is cancelled while waiting, the shutdown goes on.

        Example::

            await ex.shutdown(ShutdownPolicy.DRAIN, grace=30.0)

        Raises:
          ValueError: ``policy`` is not a `ShutdownPolicy`; ``grace`` is negative,
            NaN or infinite.
          TypeError: ``grace`` is not a number (or None).
        """
        core = self._core
        policy = core.config.shutdown_policy if policy is None else ShutdownPolicy(policy)
        if grace is None:
            grace = core.config.shutdown_grace
        else:
            check_grace("grace", grace)
        core.shutdown.begin(policy, grace)
        if self._schedules is not None:
            self._schedules.close()  # (no occurrence is submitted from now on)
        if core.shutdown.called_by_own_task():
            await trio.lowlevel.checkpoint()
            return
        await core.waits.wait_for_idle()
        core.key_timer.close()
        core.deadline_timer.close()
        core.workers.wake_idle()
        if core.workers.shared_poller is not None:
            core.workers.shared_poller.close()


async def wait_closed(ex: Executor) -> None:
    """Wait until ``ex``'s shutdown has begun, by whatever means (`Executor.shutdown`
    from anywhere, the block's end, an error, a store failure), and nothing is
    outstanding (`serve_until_signal` stops waiting for a signal then)."""
    await ex._core.shutdown.wait_closed()


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
    return (
        isinstance(a, BaseExceptionGroup)
        and type(a) is type(b)
        and a.message == b.message
        and len(a.exceptions) == len(b.exceptions)
        and all(_same_leaves(x, y) for x, y in zip(a.exceptions, b.exceptions, strict=True))
    )


@asynccontextmanager
async def open_executor(**options: Unpack[ExecutorOptions]) -> AsyncIterator[Executor]:
    """Open an executor whose tasks run in a nursery inside this block. Every
    option is keyword-only.

    On leaving the block normally, the executor shuts down with ``shutdown_policy``
    and waits for it, for at most ``shutdown_grace`` seconds (None: no limit)
    before what is left is cancelled (see `Executor.shutdown`: the thread of a
    sync task without a ``timeout=`` is waited for even then); if the block
    raises, outstanding work is cancelled. No task outlives the block, but for the
    thread of a sync task abandoned at its ``timeout``: it runs on, without a slot,
    until its function returns. Errors from the body propagate unwrapped (never
    inside an ExceptionGroup); a store failure ends it as one `StoreError` naming the store.

    Failures are captured, not raised: a task's error is in its completion. So
    that none goes unseen, the executor says on stderr as it closes how many
    failed tasks (FAILED or TIMED_OUT) nobody read the completion of (with
    `TaskRef.wait`, `TaskRef.completion` or `Executor.run`), with the first one's
    error and traceback; ``report_unread_failures=False`` keeps it quiet (a
    workflow's failed steps are read by its run and never counted).

    With a ``store``, every execution is recorded (group commit by one writer
    task); the executor holds one lease (``lease`` seconds, renewed at a third of
    it) for all its executions; ``recover=True`` re-runs the executions of
    executors whose lease expired (on entry, then every ``lease``), re-creating
    them from ``tasks``. See `Executor.flush` for what waits for durability.

    Args:
      max_concurrent_tasks: how many tasks hold a slot at once (>= 1; default 4).
      queue_capacity: how many accepted tasks may wait beyond the slots (>= 0;
        default 1024); admission is bounded by ``max_concurrent_tasks +
        queue_capacity`` over pending, active and deferred tasks.
      overflow: what a submission does at that bound (`Overflow`; default ``BLOCK``).
      shutdown_policy: how leaving the block ends the work (`ShutdownPolicy`; default ``DRAIN``).
      thread_workers: how many plain ``def`` tasks run in threads at once (default
        None: ``max_concurrent_tasks``).
      store: where every execution is recorded (`SQLiteStore`, `PostgresStore`,
        `MemoryStore`; default None: nowhere). The caller closes it.
      event_capacity: how many unread `HealthEvent` values ``ex.events`` keeps;
        past it the oldest are dropped and counted (default 1024).
      task_budget: the cooperative budget, in seconds of active (slot-holding)
        time, of a task with no ``budget`` of its own (on `Executor.submit` or its
        `TaskSpec`; default None: none). A task over it is not interrupted: its
        completion says ``budget_exceeded=True``; ``timeout_budget_exceeded_count`` counts it.
      tasks: the `TaskSpec` values and `Workflow` objects that recovery and
        ``trioexec retry`` may re-create executions from, by id (default none).
      recover: re-run the executions whose owner's lease expired (default False).
      lease: seconds of the executor's lease on its executions (default 30).
      max_recovery_attempts: how many times one execution may be recovered
        before it is failed as ``abandoned`` (default 3).
      key_limits: one `KeyLimit` for every admission key, or a mapping from key
        to `KeyLimit` (``"*"``: every key not listed); default None: no limits.
      priority_aging: a pending task's priority rises by 1 for every that many
        seconds it has waited (default 60; None: no aging).
      shutdown_grace: how long a shutdown may drain before what is left is
        cancelled (default None: no limit).
      fairness: ``"keys"``: among startable tasks of equal priority (after aging),
        pending tasks start round-robin over their admission keys (tasks without a
        key are one group), each key's own in submission order: submitting A1 A2
        A3 B1 B2 starts A1 B1 A2 B2 A3. Default None: submission order.
      keep_results: keep every task's value in the store as JSON with its
        completion (`ExecutionRecord.result`, `trioexec.wait_result`); a task's
        ``@task(keep_result=...)`` and ``submit(keep_result=...)`` override it.
        Default False.
      report_unread_failures: say which failures nobody read (default True).

    Example::

        async with trioexec.open_executor(max_concurrent_tasks=4) as ex:
            ref = await ex.submit(fetch, url)
            print((await ref.wait()).result)
    """
    setup = Setup.read(options, "open_executor()")
    store, recover = setup.store, setup.recover
    lease, attempts = setup.config.lease, setup.config.max_recovery_attempts
    if recover and store is None:
        raise ValueError("recover=True needs a store to recover from")
    body_error: list[BaseException] = []  # what the body raised, if anything
    core: ExecutorCore | None = None
    try:
        # Two nurseries: the workers in the inner one, the writer and the heartbeat in
        # the outer, so the last completions are written after the last worker ends,
        # whatever ended the block.
        async with one_level(body_error), trio.open_nursery() as infra:
            ex = Executor(setup)
            core = ex._core
            # The writer and the heartbeat keep going, whatever cancels the block,
            # until every task has ended and the rest is written: a lease must not
            # lapse while a task that cannot be interrupted (a thread) still runs.
            keepalive = trio.CancelScope(shield=True)
            if core.recovery is not None:
                await core.recovery.take_lease(lease)
                await core.control.load()
                await infra.start(_store_services, core, lease, keepalive)
            try:
                async with one_level(body_error), trio.open_nursery() as nursery:
                    core.workers.start(nursery)
                    if recover:
                        assert core.recovery is not None
                        more = await core.recovery.recover(attempts)
                        infra.start_soon(core.guarded, core.recovery.run, lease, attempts, more)
                    try:
                        yield ex
                    except BaseException as exc:
                        body_error.append(exc)
                        core.shutdown.begin(ShutdownPolicy.CANCEL, reason=_interrupted(exc))
                        raise
                    finally:
                        nursery.start_soon(_close_events_when_done, core)
                    try:
                        await ex.shutdown()
                    except BaseException as exc:  # e.g. cancelled from outside while draining
                        core.shutdown.begin(ShutdownPolicy.CANCEL, reason=_interrupted(exc))
                        raise
            finally:
                core.control.close()
                try:
                    if store is not None:
                        await core.close_store()
                finally:
                    keepalive.cancel()
                    infra.cancel_scope.cancel()
    finally:  # (say once, on stderr, which failures nobody read: `UnreadFailures`)
        if setup.report_unread_failures and core is not None:
            report = core.lifecycle.unread.report()
            if report is not None and sys.stderr is not None:
                print(report, file=sys.stderr, flush=True)
    if core.lifecycle.failure is not None:
        # Whatever the body was doing was cancelled by the failure: this is the error.
        raise core.lifecycle.failure


def _interrupted(exc: BaseException) -> str:
    """The cancel reason stored for the tasks ended because the block raised ``exc``."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (KeyboardInterrupt: Ctrl-C)"
    if isinstance(exc, trio.Cancelled):
        return "interrupted: the executor's block was cancelled"
    return f"interrupted: the executor's block raised {type(exc).__name__}"


async def _store_services(
    core: ExecutorCore,
    lease: float,
    scope: trio.CancelScope,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    assert core.journal is not None
    assert core.recovery is not None
    with scope:
        async with trio.open_nursery() as services:
            services.start_soon(core.guarded, core.journal.run_writer)
            services.start_soon(core.guarded, core.recovery.heartbeat, lease)
            services.start_soon(core.guarded, core.control.run)
            if core.keyshare is not None:
                services.start_soon(core.guarded, core.keyshare.run)
            task_status.started()


async def _close_events_when_done(core: ExecutorCore) -> None:
    # Runs last in the nursery: once nothing is outstanding, no event can come.
    try:
        await core.waits.wait_for_idle()
    finally:
        core.events.close()


@asynccontextmanager
async def one_level(body_error: list[BaseException]) -> AsyncIterator[None]:
    """Take away the one group layer the nursery inside this block adds around a
    lone exception (the body's, say), and no more: a user's own group passes.

    The group's only exception is re-raised with its own context kept; a group of
    more than one passes, unless the body raised nothing and they are all
    `StoreError`s (one failure of the store, met by several tasks at once): then
    the first is raised. A group the body raised comes back from Trio's cancel
    scopes as a copy (``split`` derives a new group); the user gets their own
    object back.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            exc = group.exceptions[0]
            if body_error and _same_leaves(exc, body_error[0]):
                exc = body_error[0]
        elif not body_error and group.split(StoreError)[1] is None:
            exc = group
            while isinstance(exc, BaseExceptionGroup):
                exc = exc.exceptions[0]
        else:
            raise
        context = exc.__context__
        try:
            raise exc
        finally:
            exc.__context__ = context
            del exc, context
