"""`DeterministicExecutor`: the executor's semantics, one task at a time, in the caller's task.

For tests of code built on the executor: nothing runs until `run_ready` is
awaited, and then tasks run strictly in FIFO order. Admission, overflow
policies, key limits, retries, timeouts, budgets, metrics and events behave as in
`open_executor`; a task's `TaskHandle.defer_until` waits inline (a task that
defers or waits to retry keeps its key: the key's next tasks, which could only
run in the same task, run after it ends, in order). The background
tasks `open_executor` runs beside its workers (a key's refill timer) run during
`run_ready`, started from the same place (`Workers.start`).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Unpack, final, overload

import trio

from ._admission import Overflow
from ._core import ExecutorConfig, ExecutorCore, check_store
from ._events import EventStream
from ._executor import one_level, split_tasks
from ._handle import TaskHandle
from ._keys import KeyLimit
from ._metrics import ExecutorMetrics
from ._records import ShutdownPolicy, TaskCompletion
from ._store import Store
from ._taskref import (
    Job,
    R,
    SubmitOptions,
    TakesHandleKeyword,
    TakesTaskHandleKeyword,
    TaskRef,
    Ts,
)


@final
class DeterministicExecutor:
    """Queue with `submit_nowait`, run with ``await run_ready()``.

    Takes the same options as `open_executor` (keyword-only). A ``store`` must be
    inline (it is written in the caller's task after each task); ``recover`` is not
    supported and the lease options (and ``shutdown_policy``, ``shutdown_grace``: it has no
    shutdown of its own) are accepted for symmetry.

    Example::

        ex = DeterministicExecutor(max_concurrent_tasks=1)
        ref = ex.submit_nowait(job, 1)
        [completion] = await ex.run_ready()
    """

    def __init__(
        self,
        *,
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
        key_limits: KeyLimit | Mapping[str, KeyLimit] | None = None,
        priority_aging: float | None = 60.0,
        shutdown_grace: float | None = None,
        report_unread_failures: bool = True,
    ) -> None:
        # (report_unread_failures: taken as open_executor takes it; `run_ready`
        # returns every completion it makes, so none is ever left unread here)
        del report_unread_failures
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
            key_limits=key_limits,  # (its converter checks it)
            priority_aging=priority_aging,
            shutdown_grace=shutdown_grace,
        )
        check_store(store)
        if recover:
            raise ValueError("DeterministicExecutor does not recover; use open_executor")
        if store is not None and not store.inline:
            raise ValueError(
                "DeterministicExecutor writes in the caller's task: give it an inline store "
                "(MemoryStore, or SQLiteStore(path, inline=True))"
            )
        specs, _ = split_tasks(tasks)
        # The same parts as `open_executor`'s, with no nursery: jobs run in `run_ready`.
        # (inline: a key's room goes to the task that runs, in the caller's task)
        self._core = ExecutorCore(config, store, specs, share_keys=False, inline=True)
        if store is not None:
            store.heartbeat(self._core.owner_id, math.inf)  # never expires: nothing to recover

    if TYPE_CHECKING:  # its overloads (see `trioexec._taskref.Ts`)

        @overload
        def submit_nowait(
            self, fn: Callable[[*Ts], Awaitable[R]], *args: *Ts, **options: Unpack[SubmitOptions]
        ) -> TaskRef[R]: ...

        @overload
        def submit_nowait(
            self,
            fn: Callable[[*Ts, TaskHandle], Awaitable[R]],
            *args: *Ts,
            **options: Unpack[SubmitOptions],
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
            self,
            fn: TakesHandleKeyword[*Ts] | TakesTaskHandleKeyword[*Ts],
            *args: *Ts,
            **options: Unpack[SubmitOptions],
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
    ) -> TaskRef[Any]:
        """Queue ``fn(*args)``; never blocks (``Overflow.BLOCK`` acts as ``REJECT``)."""
        core = self._core
        job = core.new_job(
            fn, args, name, task_id, timeout, budget, correlation_id, None, key, priority
        )
        core.submit_nowait(job)
        return TaskRef(job)

    async def run_ready(
        self, max_tasks: int | None = None, cancel: trio.Event | None = None
    ) -> list[TaskCompletion[Any]]:
        """Run pending tasks one at a time, in the order they may start (oldest
        first, but higher priority first and keys honoured), in the calling task.
        A task held back by its key's rate is waited for (``trio.sleep_until``
        its next token: under a `trio.testing.MockClock`, no real time passes).

        Stops after ``max_tasks`` tasks (all pending ones by default). If ``cancel``
        is set before a task starts (or while a key's next token is waited for),
        every pending task is cancelled and the call returns. Returns the
        completions of the tasks that ended during the call, in order (cancelled
        ones included). A checkpoint.
        """
        if max_tasks is not None and max_tasks < 0:
            raise ValueError(f"max_tasks must be >= 0 or None, got {max_tasks!r}")
        core = self._core
        completions: list[TaskCompletion[Any]] = []
        body_error: list[BaseException] = []
        # The background tasks `open_executor` runs beside its workers (a key's
        # refill timer: a retry waits in the caller's task for its next token) run
        # in a nursery of this call's, from the same place (`Workers.start`).
        async with one_level(body_error), trio.open_nursery() as nursery:
            core.workers.start(nursery, inline=True)
            try:
                await self._run_ready(max_tasks, cancel, completions)
            except BaseException as exc:
                body_error.append(exc)
                raise
            finally:
                core.pending.close()  # (the timer task ends)
        return completions

    async def _run_ready(
        self,
        max_tasks: int | None,
        cancel: trio.Event | None,
        completions: list[TaskCompletion[Any]],
    ) -> None:
        core = self._core
        journal = core.journal
        ran = 0
        await trio.lowlevel.checkpoint()
        while max_tasks is None or ran < max_tasks:
            if cancel is not None and cancel.is_set():
                cancelled: list[Job] = []
                core.lifecycle.cancel_pending(cancelled)
                if journal is not None:
                    journal.write_inline()
                completions.extend(job.make_completion() for job in cancelled)
                break
            pending = core.pending
            pending.timers.fire()
            job = await core.workers.run_next()
            if job is None:
                if not pending.held or math.isinf(pending.timers.next()):
                    break
                with trio.move_on_at(pending.timers.next()):  # its key's next token...
                    if cancel is None:
                        await trio.sleep_forever()
                    await cancel.wait()  # ...or the cancel
                continue
            ran += 1
            if journal is not None:
                journal.write_inline()
            completions.append(job.make_completion())

    def pause(self, *, name: str | None = None, key: str | None = None) -> None:
        """`Executor.pause`, here only (never through the store)."""
        self._core.control.pause(name, key)

    def resume(self, *, name: str | None = None, key: str | None = None) -> None:
        """`Executor.resume`, here only."""
        self._core.control.resume(name, key)

    def cancel_pending(self) -> int:
        """End every queued task as ``CANCELLED``; return how many."""
        return self._core.lifecycle.cancel_pending()

    def statistics(self) -> ExecutorMetrics:
        """A frozen `ExecutorMetrics` snapshot."""
        return self._core.statistics()

    @property
    def metrics(self) -> ExecutorMetrics:
        """The same snapshot as `statistics`."""
        return self._core.statistics()

    @property
    def events(self) -> EventStream:
        """The bounded `HealthEvent` stream (read it with ``get_nowait`` in tests)."""
        return self._core.events

    @property
    def pending(self) -> int:
        """Tasks queued and not yet run."""
        return self._core.tally.queue_depth
