"""`DeterministicExecutor`: the executor's semantics, one task at a time, in the caller's task.

For tests of code built on the executor: nothing runs until `run_ready` is
awaited, and then tasks run strictly in FIFO order. Admission, overflow
policies, retries, timeouts, budgets, metrics and events behave as in
`open_executor`; a task's `TaskHandle.defer_until` waits inline.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, final

import trio

from ._admission import Overflow
from ._events import EventStream
from ._executor import (
    Executor,
    ExecutorConfig,
    check_store,
    split_tasks,
)
from ._metrics import ExecutorMetrics
from ._records import ShutdownPolicy, TaskCompletion, TaskStatus
from ._slots import SlotToken
from ._store import Store
from ._taskref import TaskRef


@final
class DeterministicExecutor:
    """Queue with `submit_nowait`, run with ``await run_ready()``.

    Takes the same options as `open_executor`. A ``store`` must be inline (it is
    written in the caller's task after each task); ``recover`` is not supported and
    the lease options are accepted for symmetry.

    Example::

        ex = DeterministicExecutor(max_concurrent_tasks=1)
        ref = ex.submit_nowait(job, 1)
        [completion] = await ex.run_ready()
    """

    def __init__(
        self,
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
    ) -> None:
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
        check_store(store)
        if recover:
            raise ValueError("DeterministicExecutor does not recover; use open_executor")
        if store is not None and not store.inline:
            raise ValueError(
                "DeterministicExecutor writes in the caller's task: give it an inline store "
                "(MemoryStore, or SQLiteStore(path, inline=True))"
            )
        self._ex = Executor(None, config, store, *split_tasks(tasks))
        if store is not None:
            store.heartbeat(self._ex.owner, math.inf)  # never expires: nothing to recover

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
        """Queue ``fn(*args)``; never blocks (``Overflow.BLOCK`` acts as ``REJECT``)."""
        return self._ex.submit_nowait(
            fn,
            *args,
            name=name,
            task_id=task_id,
            timeout=timeout,
            budget=budget,
            correlation_id=correlation_id,
        )

    async def run_ready(
        self, max_tasks: int | None = None, cancel: trio.Event | None = None
    ) -> list[TaskCompletion]:
        """Run pending tasks one at a time, oldest first, in the calling task.

        Stops after ``max_tasks`` tasks (all pending ones by default). If ``cancel``
        is set before a task starts, every pending task is cancelled and the call
        returns. Returns the completions of the tasks that ended during the call,
        in order (cancelled ones included). A checkpoint.
        """
        if max_tasks is not None and max_tasks < 0:
            raise ValueError(f"max_tasks must be >= 0 or None, got {max_tasks!r}")
        ex = self._ex
        completions: list[TaskCompletion] = []
        ran = 0
        await trio.lowlevel.checkpoint()
        while max_tasks is None or ran < max_tasks:
            if cancel is not None and cancel.is_set():
                cancelled = [r for r in ex._pending if r._status is TaskStatus.PENDING]
                ex.cancel_pending()
                if ex._journal is not None:
                    ex._journal.write_inline()
                completions.extend(r.completion for r in cancelled if r.completion)
                break
            if len(ex._pending) == ex._stale:
                break
            token = SlotToken(ex._pool)
            await token.reclaim()
            ref = ex._pop_pending()
            if ref is None:  # cancelled while we took the slot
                token.release()
                break
            scope = trio.CancelScope()
            ref._scope = scope
            ex._taken.add(ref)
            with token, scope:
                await ex._run(ref, token)
            ran += 1
            if ex._journal is not None:
                ex._journal.write_inline()
            completion = ref.completion
            assert completion is not None
            completions.append(completion)
        return completions

    def cancel_pending(self) -> int:
        """End every queued task as ``CANCELLED``; return how many."""
        return self._ex.cancel_pending()

    def statistics(self) -> ExecutorMetrics:
        """A frozen `ExecutorMetrics` snapshot."""
        return self._ex.statistics()

    @property
    def metrics(self) -> ExecutorMetrics:
        """The same snapshot as `statistics`."""
        return self._ex.statistics()

    @property
    def events(self) -> EventStream:
        """The bounded `HealthEvent` stream (read it with ``get_nowait`` in tests)."""
        return self._ex.events

    @property
    def pending(self) -> int:
        """Tasks queued and not yet run."""
        return self._ex._queue
