"""`open_worker`: claim a target's pending durable tasks and run them through an executor.

Each claimed task runs as an executor task (slots, deferral, metrics, events all
apply). One heartbeat per worker renews every lease it holds. A handler that awaits
a still-pending durable promise suspends its task: the handler is abandoned, its
slot and lease are given up, and the task is delivered again, from the top, once
the promise settles (handlers are written to be re-entrant).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, final

import trio

from .._errors import TrioexecError
from .._executor import Executor, ShutdownPolicy, open_executor
from .._handle import TaskHandle
from .._spec import call_info
from ._records import Conflict, NotFound, PromiseRecord, PromiseState, Suspend, TaskRecord
from ._store import DurableStore


class PromiseRejected(TrioexecError):
    """`DurableHandle.await_promise` on a promise that was rejected (or canceled, or
    timed out). ``record`` is the promise."""

    def __init__(self, record: PromiseRecord) -> None:
        super().__init__(f"promise {record.id!r} is {record.state.value}: {record.data}")
        self.record = record


class _Suspended(BaseException):
    """Unwinds a handler whose task was suspended (not an error; never seen outside)."""


def _value(record: PromiseRecord) -> Any:
    if record.state is PromiseState.RESOLVED:
        return None if record.data is None else json.loads(record.data)
    raise PromiseRejected(record)


@final
class DurableHandle:
    """What a worker's handler gets as ``handle``: the executor's `TaskHandle`
    features (``defer_until`` ...) plus `await_promise`."""

    def __init__(self, worker: Worker, record: TaskRecord, task: TaskHandle) -> None:
        self._worker = worker
        self.task_id = record.id
        self.version = record.version
        self.task = task

    async def defer_until(self, condition: Any, poll_interval: Any = 1.0) -> None:
        """`TaskHandle.defer_until`: give the slot back while waiting in-process.
        The lease is kept (the heartbeat renews it)."""
        await self.task.defer_until(condition, poll_interval)

    async def await_promise(self, id: str) -> Any:
        """The value of durable promise ``id``.

        If it is settled, returns its value at once (or raises `PromiseRejected`).
        If it is pending, the task suspends: this call never returns, the handler
        is abandoned, and the task is delivered again from the top once the
        promise settles.
        """
        ds = self._worker.ds
        record = await ds.promises.get(id)
        if record is None:
            raise NotFound(f"no promise {id!r}")
        if record.pending:
            answer = await ds.tasks.suspend(self.task_id, self.version, [id])
            if answer is Suspend.SUSPENDED:
                raise _Suspended
            record = await ds.promises.get(id)
            assert record is not None
        return _value(record)


@final
class Worker:
    """The object `open_worker` yields."""

    def __init__(
        self,
        ds: DurableStore,
        target: str,
        handlers: Callable[..., Any] | Mapping[str, Callable[..., Any]],
        ex: Executor,
        pid: str,
        lease: float,
        poll_interval: float,
    ) -> None:
        self.ds = ds
        self.target = target
        self.pid = pid
        self.executor = ex
        self._handlers = handlers
        self._lease = lease
        self._poll_interval = poll_interval
        self._held: dict[str, int] = {}  # task id -> version, while this worker holds it
        self.claimed = 0
        self.fulfilled = 0
        self.suspended = 0

    def _handler_for(self, data: Any) -> tuple[Callable[..., Any], Any]:
        handlers = self._handlers
        if callable(handlers):
            return handlers, data
        if not isinstance(data, dict) or "handler" not in data:
            raise LookupError(
                "the task's promise data must be {'handler': name, 'param': ...} "
                f"when the worker has several handlers; got {data!r}"
            )
        name = data["handler"]
        if name not in handlers:
            raise LookupError(f"no handler {name!r} (known: {sorted(handlers)})")
        return handlers[name], data.get("param")

    async def _claim_loop(self) -> None:
        ex = self.executor
        idle = 0.005
        while True:
            room = ex.slots.total * 2 - len(self._held)
            claimed = 0
            if room > 0:
                # One transaction claims a batch: workers never race for a task.
                batch = await self.ds.tasks.claim(
                    self.target, pid=self.pid, ttl=self._lease, limit=room
                )
                for record in batch:
                    self._held[record.id] = record.version
                    self.claimed += 1
                    claimed += 1
                    await ex.submit(self._run, record, name=f"durable:{record.id}")
            if claimed:
                idle = 0.005
                await trio.lowlevel.checkpoint()
            else:
                await trio.sleep(idle)
                idle = min(idle * 2, self._poll_interval)

    async def _heartbeat_loop(self) -> None:
        while True:
            await trio.sleep(self._lease / 3)
            if self._held:
                await self.ds.tasks.heartbeat(self.pid, list(self._held.items()))

    async def _run(self, record: TaskRecord, handle: TaskHandle) -> Any:
        # Cancelled (the worker is closing): the task stays held, and is released.
        promise = await self.ds.promises.get(record.id)
        data = None if promise is None or promise.data is None else json.loads(promise.data)
        try:
            handler, param = self._handler_for(data)
            kwargs = {}
            info = call_info(handler)
            if info.handle_param is not None:
                kwargs[info.handle_param] = DurableHandle(self, record, handle)
            result = handler(param, **kwargs)
            if info.is_async:
                result = await result
        except _Suspended:
            self._held.pop(record.id, None)  # the store holds it now, without a lease
            self.suspended += 1
            return None
        except Exception as exc:
            await self._fulfill(record, {"error": repr(exc)}, rejected=True)
            raise
        await self._fulfill(record, result, rejected=False)
        return result

    async def _fulfill(self, record: TaskRecord, data: Any, *, rejected: bool) -> None:
        try:
            await self.ds.tasks.fulfill(record.id, record.version, data=data, rejected=rejected)
            self.fulfilled += 1
        except Conflict:
            pass  # the lease was lost and someone else has it now: their result counts
        finally:
            self._held.pop(record.id, None)

    async def _release_all(self) -> None:
        for id, version in list(self._held.items()):
            with contextlib.suppress(Conflict, NotFound):  # already someone else's
                await self.ds.tasks.release(id, version)
        self._held.clear()


@asynccontextmanager
async def open_worker(
    ds: DurableStore,
    target: str,
    handlers: Callable[..., Any] | Mapping[str, Callable[..., Any]],
    *,
    lease: float = 30.0,
    max_concurrent_tasks: int = 4,
    poll_interval: float = 0.5,
    pid: str | None = None,
) -> AsyncIterator[Worker]:
    """Run the pending durable tasks of ``target`` in this block.

    ``handlers`` is one callable (it receives the promise's data as its param) or
    a mapping of names to callables (the promise's data is then
    ``{"handler": name, "param": ...}``). A handler may take a ``handle``
    (`DurableHandle`). Its return value fulfils the task's promise; an exception
    rejects it with ``{"error": repr(exc)}``.

    Leaving the block stops claiming, cancels running handlers and releases every
    task this worker still holds (back to pending, same version), so other workers
    take them. A killed worker's tasks come back when their leases expire.
    """
    pid = pid or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    async with open_executor(
        max_concurrent_tasks=max_concurrent_tasks, shutdown_policy=ShutdownPolicy.CANCEL
    ) as ex:
        worker = Worker(ds, target, handlers, ex, pid, lease, poll_interval)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker._claim_loop)
                nursery.start_soon(worker._heartbeat_loop)
                try:
                    yield worker
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            await ex.shutdown(ShutdownPolicy.CANCEL)
            with trio.move_on_after(30, shield=True):
                await worker._release_all()
