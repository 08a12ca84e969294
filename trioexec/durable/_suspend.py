"""`DurableHandle`: what a durable worker's handler gets, and how a handler that
awaits a pending promise is unwound (the worker, `open_worker`, suspends its task)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, final

import trio

from .._errors import PromiseRejected
from .._handle import TaskHandle
from ._checks import check_id
from ._records import NotFound, PromiseState, TaskRecord

if TYPE_CHECKING:
    from ._store import Promises


class _Suspended(BaseException):
    """Unwinds a handler that awaits a pending promise (not an error; the worker
    catches it, at any depth of the handler's task tree, and never lets it out)."""


def leftover(exc: BaseException, *, cancelled_here: bool) -> BaseException | None:
    """A handler that asked to suspend ended with ``exc``: what of it must still
    propagate (None: nothing). Dropped: the suspension signals, the `trio.Cancelled`
    of the siblings they cancelled, and errors raised while unwinding (a re-run
    meets a real one again). Kept: a Cancelled when the task itself is being
    cancelled (``cancelled_here``), and KeyboardInterrupt and the like."""

    def keep(e: BaseException) -> bool:
        if isinstance(e, BaseExceptionGroup | _Suspended | Exception):
            return False  # a group: look inside it
        if isinstance(e, trio.Cancelled):
            return cancelled_here
        return True

    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(keep)
    return exc if keep(exc) else None


@final
class DurableHandle:
    """What a worker's handler gets as ``handle``: the executor's `TaskHandle`
    features (``defer_until`` ...) plus `await_promise`.

    A plain ``def`` handler runs in a worker thread: it uses the blocking
    ``*_sync`` methods (`await_promise_sync`, `defer_until_sync`), which block only
    its thread.
    """

    def __init__(
        self, promises: Promises, record: TaskRecord, task: TaskHandle, awaited: list[str]
    ) -> None:
        self._promises = promises
        self.task_id = record.id
        self.version = record.version
        self.task = task
        self._awaited = awaited  # pending promises this run asked to suspend on

    @property
    def cancel_requested(self) -> bool:
        """True once the worker has asked this run to stop (its lease was lost, or
        the worker is closing). A thread can poll it."""
        return self.task.cancel_requested

    async def defer_until(self, condition: Any, poll_interval: Any = 1.0) -> None:
        """`TaskHandle.defer_until`: give the slot back while waiting in-process.
        The lease is kept (the heartbeat renews it)."""
        await self.task.defer_until(condition, poll_interval)

    def defer_until_sync(self, condition: Any, poll_interval: Any = 1.0) -> None:
        """`defer_until` for a ``def`` handler: blocks only its thread."""
        self.task.defer_until_sync(condition, poll_interval)

    async def await_promise(self, id: str) -> Any:
        """The value of durable promise ``id``.

        If it is settled, returns its value at once (or raises `PromiseRejected`).
        If it is pending, the task suspends: this call never returns, the handler
        is unwound (from any depth: a child task of a nursery in the handler
        suspends the whole handler; siblings are cancelled), and the task is
        delivered again from the top once the promise settles. Several children
        awaiting pending promises suspend the task on all those that were reached
        before the unwinding cancelled the rest; any of them settling re-delivers it.

        Raises:
          NotFound: there is no promise ``id``.
          PromiseRejected: the promise was rejected, canceled or timed out.
          ValueError: ``id`` is not a usable id.
        """
        check_id(id, "promise id")
        record = await self._promises.get(id)
        if record is None:
            raise NotFound(f"no promise {id!r}")
        if record.pending:
            self._awaited.append(id)  # the worker suspends on it once the handler unwound
            raise _Suspended(id)
        if record.state is PromiseState.RESOLVED:
            return None if record.data is None else json.loads(record.data)
        raise PromiseRejected(record)

    def await_promise_sync(self, id: str) -> Any:
        """`await_promise` for a ``def`` handler (in its worker thread): blocks only
        the thread; on a pending promise it raises the suspension signal, which
        the handler must let through (like `await_promise`, it never returns then)."""
        return trio.from_thread.run(self.await_promise, id)
