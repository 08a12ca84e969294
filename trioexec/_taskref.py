"""`TaskRef`: one submission as its submitter sees it, and the per-task record
the executor's parts share (status, attempts, result, the running attempt's
scope and deadline, whether its completion is durable yet).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, final

import trio

from ._errors import StoreError, TaskCancelled, TaskRejected
from ._records import SubStatus, TaskCompletion, TaskStatus
from ._spec import CallInfo, TaskSpec

if TYPE_CHECKING:
    from ._handle import TaskHandle


class _Owner(Protocol):
    """What a TaskRef asks of its executor."""

    def _cancel_ref(self, ref: TaskRef) -> None: ...
    @property
    def _failure(self) -> StoreError | None: ...
    def _failure_error(self) -> StoreError: ...


@final
class TaskRef:
    """One accepted (or refused) submission: its status now, and its completion later."""

    __slots__ = (
        "_active_seconds",
        "_args",
        "_attempts",
        "_budget",
        "_budget_exceeded",
        "_cancel_requested",
        "_causation_id",
        "_completion",
        "_correlation_id",
        "_deadline",
        "_done",
        "_error",
        "_executor",
        "_finished_at",
        "_fn",
        "_handle",
        "_info",
        "_pending_ack",
        "_result",
        "_run_id",
        "_scope",
        "_simple",
        "_started_at",
        "_status",
        "_submitted_at",
        "_timeout",
        "_version",
        "name",
        "task_id",
    )

    def __init__(
        self,
        executor: _Owner,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        info: CallInfo,
        task_id: str,
        name: str,
        timeout: float | None,
        budget: float | None,
        correlation_id: str | None,
        causation_id: str | None,
        submitted_at: float,
        durable: bool,
    ) -> None:
        self.task_id = task_id
        self.name = name
        self._executor = executor
        self._fn = fn
        self._args = args
        self._info = info
        self._timeout = timeout
        self._budget = budget
        # One plain async call (no retries, timeout or budget): the worker's fast path.
        self._simple = (
            info.is_async and timeout is None and budget is None and not isinstance(fn, TaskSpec)
        )
        self._correlation_id = correlation_id
        self._causation_id = causation_id
        self._status = TaskStatus.PENDING
        self._attempts = 0
        self._active_seconds = 0.0
        self._budget_exceeded = False
        self._cancel_requested = False
        self._deadline = math.inf  # the running attempt's timeout, on Trio's clock
        self._handle: TaskHandle | None = None
        self._scope: trio.CancelScope | None = None
        self._done: trio.Event | None = None
        self._pending_ack = durable  # (with a store) until its completion is durable
        self._completion: TaskCompletion | None = None
        self._result: Any = None
        self._error: BaseException | None = None
        self._submitted_at = submitted_at
        self._version = 1
        self._run_id: str | None = None
        self._started_at: float | None = None
        self._finished_at = 0.0

    @property
    def status(self) -> TaskStatus:
        """The execution's `TaskStatus` now."""
        return self._status

    @property
    def sub_status(self) -> SubStatus | None:
        """`SubStatus.ACTIVE` or `SubStatus.DEFERRED` while RUNNING, else None."""
        if self._status is not TaskStatus.RUNNING:
            return None
        handle = self._handle
        return SubStatus.ACTIVE if handle is None else handle.sub_status

    @property
    def done(self) -> bool:
        """True once the execution has its completion."""
        return self._status not in (TaskStatus.PENDING, TaskStatus.RUNNING)

    @property
    def completion(self) -> TaskCompletion | None:
        """The `TaskCompletion`, or None while the task has not finished."""
        if self._completion is None and self.done:
            self._completion = TaskCompletion(
                task_id=self.task_id,
                name=self.name,
                status=self._status,
                result=self._result,
                error=self._error,
                attempts=self._attempts,
                submitted_at=self._submitted_at,
                started_at=self._started_at,
                finished_at=self._finished_at,
                deferred_seconds=0.0 if self._handle is None else self._handle.deferred_seconds,
                budget_exceeded=self._budget_exceeded,
                correlation_id=self._correlation_id,
                causation_id=self._causation_id,
            )
            # The completion holds what a waiter needs; drop the call itself.
            self._fn = self._args = None  # type: ignore[assignment]
        return self._completion

    async def wait(self) -> TaskCompletion:
        """Wait until the task ends and return its `TaskCompletion`. A checkpoint.

        Cancelling the wait does not cancel the task (use `cancel`).

        Raises:
          StoreError: the executor's store failed before this completion was
            durable (the executor has stopped; the wait never hangs).
        """
        if not self.done or self._pending_ack:
            if self._executor._failure is None:
                if self._done is None:
                    self._done = trio.Event()
                await self._done.wait()
            else:
                await trio.lowlevel.checkpoint()
            if self._executor._failure is not None and (not self.done or self._pending_ack):
                # The store failed before this completion was durable.
                raise self._executor._failure_error()
        else:
            await trio.lowlevel.checkpoint()
        completion = self.completion
        assert completion is not None
        return completion

    def cancel(self) -> None:
        """Ask the task to stop: a pending task ends ``CANCELLED`` at once; a running
        or deferred one has ``handle.cancelled()`` fire and its scope cancelled.
        Never blocks; does nothing if the task already ended."""
        self._executor._cancel_ref(self)

    def __repr__(self) -> str:
        return f"<TaskRef {self.task_id!r} {self.name!r} {self._status.value}>"


def unwrap(completion: TaskCompletion) -> Any:
    """The task's value, or its error raised (`Executor.run`)."""
    status = completion.status
    if status is TaskStatus.COMPLETED:
        return completion.result
    if completion.error is not None:
        raise completion.error
    if status is TaskStatus.CANCELLED:
        raise TaskCancelled(f"task {completion.name!r} ({completion.task_id}) was cancelled")
    raise TaskRejected(f"task {completion.name!r} ({completion.task_id}) was {status.value}")
