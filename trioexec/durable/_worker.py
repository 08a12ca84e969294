"""`open_worker`: claim a target's pending durable tasks and run them through an executor
(slots, deferral, metrics and events apply; a plain ``def`` handler runs in a worker
thread), one heartbeat renewing every lease held. What a worker promises is told in
`open_worker`, `Worker.drain` and docs/reference/durable.rst. Under it all: a lease this
worker cannot vouch for (not ours at that version, or run out on our clock: the heartbeat
may be stuck) is lost at once, its run cancelled and nothing it produces written, as
another worker may be running the task already; a fulfil not written in time is given up
(counted ``lost``), so the task runs again elsewhere, never twice at once.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, NoReturn, final

import attrs
import trio

from .._errors import TrioexecError
from .._executor import Executor, one_level, open_executor
from .._handle import TaskHandle
from .._records import ShutdownPolicy, check_number, safe_repr
from .._records import check_id as check_task_id
from .._spec import CallInfo, call_info
from .._taskref import TaskRef
from ._checks import check_id, check_seconds, encode
from ._records import Conflict, Suspend, TaskRecord
from ._store import DurableStore, Wakeup, claim_work, lost_leases, open_wakeup
from ._suspend import DurableHandle, leftover

#: A worker holds at most this many times its slots in tasks claimed ahead (held, not
#: started). It claims ahead as many as ran out during its last claim (what its slots
#: will take before the next claim is back): slow runs keep it to its slots (none
#: hoarded while other workers wait), quick ones let it grow (more claims and fulfils
#: per transaction).
AHEAD = 16


@attrs.define(eq=False)
class _Lease:
    """A task this worker holds: its version, the last moment (on Trio's clock) by
    which its lease is surely still ours, and its executor task."""

    version: int
    deadline: float
    ref: TaskRef | None = None
    started: bool = False  # its handler may have run: released only once it is over
    over: bool = False  # its run ended with no outcome recorded (cancelled): released
    settling: bool = False  # a fulfil or suspend is in flight: that call decides
    finished: bool = False  # the run is over, its fulfil in flight: no room taken


@final
class Worker:
    """The object `open_worker` yields.

    Counters: ``claimed`` (tasks acquired), ``fulfilled`` (promises settled from a
    handler's outcome), ``rejected`` (of those, with an error), ``suspended`` (runs
    that suspended on a pending promise), ``lost`` (runs cancelled or discarded as
    their lease was lost: outcome not recorded), ``cancelled`` (runs cancelled, while
    this worker still held their task, by the drain's grace or by leaving the block:
    outcome not recorded, task released), and ``running`` (handlers running now).
    """

    def __init__(
        self,
        ds: DurableStore,
        target: str,
        handlers: Callable[..., Any] | Mapping[str, Callable[..., Any]],
        ex: Executor,
        pid: str,
        lease: float,
        poll_interval: float,
        wakeup: Wakeup,
    ) -> None:
        self.ds = ds
        self.target = target
        self.pid = pid
        self.executor = ex
        self._handlers = handlers
        self._lease = lease
        self._poll_interval = poll_interval
        self._wakeup = wakeup
        self._held: dict[str, _Lease] = {}  # task id -> its lease, while this worker holds it
        self._finished = 0  # held leases whose run is over (their fulfil is in flight)
        self._ended = 0  # runs over (or given up) so far: what the claims ahead follow
        self._roomy = trio.Event()  # set when the room to claim may have grown
        # Where a finished run's fulfil goes on (None: closed; the run waits for it).
        self._settling: trio.Nursery | None = None
        self._stopping = False  # draining or leaving: no handler starts any more
        self._claiming = trio.CancelScope()  # the claim loop's (drain() cancels it)
        self._claims_over = trio.Event()
        self._run_ended = trio.Event()  # set (and replaced) when a handler's run ends
        self.claimed = 0
        self.fulfilled = 0
        self.rejected = 0
        self.suspended = 0
        self.lost = 0
        self.cancelled = 0
        self.running = 0

    async def drain(self, grace: float | None = None) -> bool:
        """Stop taking work and wait for the handlers running to end.

        From the call on, the worker claims nothing more and starts no handler; the
        tasks it claimed but has not started go back to pending (same version) at
        once. The runs going on finish, their outcomes recorded as usual (a
        suspension too; a handler whose promise settled before its suspension was
        written is called again at once). After ``grace`` seconds (None: no limit)
        those still going are cancelled, awaited a lease at most (a thread that
        ignores it keeps its task till its lease lapses), and their tasks released,
        but for a suspension or fulfil being written: that is written. The block
        can then be left without cancelling anything. Calling it again drains
        nothing more: it waits again.

        Blocks until no handler runs; a checkpoint. Returns True if every run
        ended by itself, False if the grace ran out. Cancelling it stops the
        wait only: the worker stays drained, and leaving the block cancels the
        runs still going and releases their tasks.

        Raises:
          ValueError: ``grace`` is not None nor a finite number of seconds >= 0.

        Example::

            async with open_worker(ds, "refunds", refund) as worker:
                await stop_requested.wait()
                await worker.drain(grace=30)
        """
        if grace is not None:
            must = "None or a finite number of seconds >= 0"
            check_number("grace", grace, float, must, ge=0, lt=math.inf)
        self._stopping = True
        self._claiming.cancel()
        await self._claims_over.wait()  # a claim under way is held once it is back
        for lease in list(self._held.values()):
            if not lease.started and lease.ref is not None:
                lease.ref.cancel()  # (it cannot start its handler any more anyway)
        await self._release_all()
        with trio.move_on_after(math.inf if grace is None else grace):
            while self.running:
                await self._run_ended.wait()
        by_themselves = not self.running
        if not by_themselves:
            # A run writing its suspension is cancelled too: the write completes
            # (shielded), and the run is not called again if the store refuses it.
            for lease in list(self._held.values()):
                if lease.started and not lease.finished and lease.ref is not None:
                    lease.ref.cancel()
            with trio.move_on_after(self._lease):  # (a thread may ignore it: see above)
                while self.running:
                    await self._run_ended.wait()
        await self._release_all()  # the cancelled runs' tasks
        return by_themselves

    # ------------------------------------------------------------ the loops

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
        if not isinstance(name, str) or name not in handlers:
            raise LookupError(f"no handler {name!r} (known: {sorted(handlers)})")
        return handlers[name], data.get("param")

    def _job(self, record: TaskRecord, data: str | None) -> tuple[Any, ...]:
        """What to submit for ``record``: the run (async, or a plain def for the
        executor to run in a thread) and its arguments."""
        try:
            handler, param = self._handler_for(None if data is None else json.loads(data))
            is_async = call_info(handler).is_async
        except Exception as exc:  # no such handler, or one that cannot be called
            error = exc

            async def fail(param: Any) -> NoReturn:
                raise error

            handler, param, is_async = fail, None, True
        return (self._run_async if is_async else self._run_sync), record, handler, param

    async def _claim_loop(self) -> None:
        try:
            with self._claiming:
                await self._claim_forever()
        finally:
            self._claims_over.set()

    async def _claim_forever(self) -> None:
        ex = self.executor
        idle = min(0.005, self._poll_interval)
        ended = self._ended  # when the last claim was sent
        while True:
            roomy = self._roomy = trio.Event()
            # The slots, plus as many as ran out since the last claim was sent, less
            # the runs not over (a finished run's task only waits for its fulfil).
            slots = ex.slots.total
            ahead = min(max(slots, self._ended - ended), slots * AHEAD)
            room = slots + ahead - (len(self._held) - self._finished)
            if room <= 0:
                await roomy.wait()
                continue
            ended = self._ended
            # One transaction claims a batch (with the fulfils and heartbeats queued
            # meanwhile: `DurableStore` groups them): workers never race for a task.
            self._wakeup.drain()
            sent = trio.current_time()
            batch = await claim_work(
                self.ds, self.target, pid=self.pid, ttl=self._lease, limit=room
            )
            # The whole batch is held before the first await: a cancellation there
            # (leaving, draining) then releases all of it, submitted or not.
            leases = []
            for record, *_ in batch:
                # The store's lease runs from a moment after ``sent``.
                leases.append(_Lease(record.version, sent + self._lease))
                self._held[record.id] = leases[-1]
            self.claimed += len(batch)
            for (record, data, trace), lease in zip(batch, leases, strict=True):
                # The name is a label of metrics and spans: the target's, never one
                # per task (the task is in the run's id); the executor bounds it.
                name = f"durable:{self.target}"[:200]
                with trace:  # (its creator's trace context, if the store carries it)
                    ref = await ex.submit(
                        *self._job(record, data), name=name, task_id=_run_id(record)
                    )
                if self._held.get(record.id) is lease:
                    lease.ref = ref
                else:  # lost while being submitted
                    ref.cancel()
            if batch:
                idle = min(0.005, self._poll_interval)
                await trio.lowlevel.checkpoint()
            elif self._wakeup.listening:  # none pending: a notification wakes it;
                await self._wakeup.wait(self._poll_interval)  # the poll is a backstop
            else:  # none pending: look again later, less often the longer it stays so
                await self._wakeup.wait(idle)
                idle = min(idle * 2, self._poll_interval)

    async def _heartbeat_loop(self) -> None:
        while True:
            await trio.sleep(self._lease / 3)
            if not self._held:
                continue
            sent = trio.current_time()
            pairs = [(id, lease.version) for id, lease in self._held.items()]
            renewed = await self.ds.tasks.heartbeat(self.pid, pairs)
            lost = set()
            if renewed < len(pairs):
                # Some are not ours any more (or were just settled here). A task that
                # is not acquired by this pid at this version never will be again.
                lost = set(await lost_leases(self.ds, self.pid, pairs))
            for id, version in pairs:
                lease = self._held.get(id)
                if lease is None or lease.version != version:
                    continue  # settled, suspended or lost meanwhile
                if (id, version) not in lost:
                    lease.deadline = max(lease.deadline, sent + self._lease)
                elif not lease.settling:  # a settling call finds out by itself
                    self._lose(id, version)

    async def _lease_watch(self) -> None:
        """Lose every lease that runs out on this worker's clock before the heartbeat
        renewed it: another worker may claim the task from then on."""
        while True:
            now = trio.current_time()
            soonest = now + self._lease  # no lease claimed from now on ends sooner
            for id, lease in list(self._held.items()):
                if lease.settling:
                    continue
                if lease.deadline <= now:
                    self._lose(id, lease.version)
                else:
                    soonest = min(soonest, lease.deadline)
            await trio.sleep_until(soonest)

    def _lose(self, id: str, version: int) -> None:
        """The lease of (``id``, ``version``) is lost: cancel the local run at once;
        nothing it produces is written."""
        lease = self._held.get(id)
        if lease is None or lease.version != version:
            return
        self._drop(id)
        self.lost += 1
        if lease.ref is not None:
            lease.ref.cancel()

    def _drop(self, id: str) -> None:
        """No longer hold ``id``: its room is free."""
        if self._held.pop(id).finished:
            self._finished -= 1
        else:
            self._ended += 1
        self._roomy.set()

    def _ours(self, record: TaskRecord) -> _Lease | None:
        lease = self._held.get(record.id)
        return lease if lease is not None and lease.version == record.version else None

    def _forget(self, id: str, lease: _Lease) -> None:
        if self._held.get(id) is lease:
            self._drop(id)

    # ------------------------------------------------------------ one run

    def _start(self, record: TaskRecord) -> bool:
        """Whether the run of ``record`` may start its handler (not once draining or
        leaving, nor once the lease is lost); counts it as running if so."""
        lease = self._ours(record)
        if lease is None or self._stopping:
            return False
        lease.started = True
        self.running += 1
        return True

    def _end(self, record: TaskRecord) -> None:
        """The run of ``record`` is over. If it recorded nothing (no fulfil, no
        suspension: it was cancelled) and its task is still ours, the task is to be
        released."""
        self.running -= 1
        lease = self._ours(record)
        if lease is not None and not lease.settling:
            lease.over = True
            self.cancelled += 1
        self._run_ended.set()
        self._run_ended = trio.Event()

    def _call(
        self, info: CallInfo, record: TaskRecord, handle: TaskHandle
    ) -> tuple[list[str], dict[str, DurableHandle]]:
        """For one call of the handler: the list of the pending promises it asks to
        suspend on (empty so far), and its keyword arguments (its handle, if it
        takes one)."""
        awaited: list[str] = []
        if info.handle_param is None:
            return awaited, {}
        return awaited, {
            info.handle_param: DurableHandle(self.ds.promises, record, handle, awaited)
        }

    async def _run_async(
        self, record: TaskRecord, handler: Callable[..., Any], param: Any, handle: TaskHandle
    ) -> Any:
        if not self._start(record):
            return None  # drained, leaving or lost: the task is released or someone else's
        try:
            info = call_info(handler)
            while True:
                awaited, kwargs = self._call(info, record, handle)
                try:
                    result = await handler(param, **kwargs)
                except BaseException as exc:
                    cancelled_here = trio.current_effective_deadline() == -math.inf
                    if not awaited:
                        # A cancelled run's error is not its outcome: it is released.
                        cancelled = cancelled_here or handle.cancel_requested
                        if isinstance(exc, Exception) and not cancelled:
                            await self._reject(record, exc)
                        raise
                    rest = leftover(exc, cancelled_here=cancelled_here)
                    if rest is not None:
                        raise rest from None
                else:
                    if not awaited:
                        return await self._complete(record, result)
                # It asked to suspend (even if it swallowed the signal): its outcome.
                if not await self._suspend(record, awaited):
                    return None
                # A promise settled before the suspension was written: the handler
                # runs again at once, unless the run is being cancelled (nothing was
                # recorded: its task is released).
                await trio.lowlevel.checkpoint_if_cancelled()
        finally:
            self._end(record)

    def _run_sync(
        self, record: TaskRecord, handler: Callable[..., Any], param: Any, handle: TaskHandle
    ) -> Any:
        # In a worker thread of the executor: the store is reached through
        # trio.from_thread (which raises Cancelled here once the run is cancelled).
        if not trio.from_thread.run_sync(self._start, record):
            return None
        try:
            info = call_info(handler)
            while True:
                awaited, kwargs = self._call(info, record, handle)
                try:
                    result = handler(param, **kwargs)
                    if inspect.isawaitable(result):
                        if inspect.iscoroutine(result):
                            result.close()
                        raise TypeError(
                            f"the handler of durable task {record.id!r} is a plain def that "
                            f"returned an awaitable ({type(result).__qualname__}); "
                            "make it an async def"
                        )
                except BaseException as exc:
                    if not awaited:
                        if isinstance(exc, Exception) and handle.cancel_requested:
                            # A thread is not cancelled: it learns of it and raises
                            # something. The run was cancelled: released, not rejected.
                            trio.from_thread.check_cancelled()
                        elif isinstance(exc, Exception):
                            trio.from_thread.run(self._reject, record, exc)
                        raise
                    # In a thread, a Cancelled can only come from this run being cancelled.
                    rest = leftover(exc, cancelled_here=True)
                    if rest is not None:
                        raise rest from None
                else:
                    if not awaited:
                        return trio.from_thread.run(self._complete, record, result)
                if not trio.from_thread.run(self._suspend, record, awaited):
                    return None
                trio.from_thread.check_cancelled()  # (see _run_async)
        finally:
            trio.from_thread.run_sync(self._end, record)

    async def _complete(self, record: TaskRecord, result: Any) -> Any:
        try:
            encode(result, "result")
        except ValueError as exc:
            # Rejected, not left to lapse: it would fail the same way on every worker.
            error = ValueError(f"durable task {record.id!r}: the handler's {exc}")
            await self._fulfill(record, {"error": repr(error)}, rejected=True)
            raise error from None
        await self._fulfill(record, result, rejected=False)
        return result

    async def _reject(self, record: TaskRecord, exc: BaseException) -> None:
        await self._fulfill(record, {"error": safe_repr(exc)}, rejected=True)

    async def _fulfill(self, record: TaskRecord, data: Any, *, rejected: bool) -> None:
        """Record the run's outcome. The run ends at once: the fulfil goes on in the
        worker (the task stays held, its lease renewed, until it is written), so
        the slot serves the next task while fulfils queue up for one transaction.
        Once the worker is closing, the run waits for its fulfil instead."""
        lease = self._ours(record)
        if lease is None:
            return  # lost: another worker's result counts
        lease.settling = True
        if self._settling is None:
            await self._write_fulfil(record, lease, data, rejected)
            return
        lease.finished = True
        self._finished += 1
        self._ended += 1
        self._roomy.set()
        self._settling.start_soon(self._fulfil_in_background, record, lease, data, rejected)

    async def _fulfil_in_background(
        self, record: TaskRecord, lease: _Lease, data: Any, rejected: bool
    ) -> None:
        # Shielded (the worker closing waits for it) and bounded: past the lease,
        # the task is no longer ours to fulfil anyway.
        with (
            trio.CancelScope(shield=True),
            trio.move_on_after(self._lease),
            contextlib.suppress(TrioexecError),  # the store failed
        ):
            await self._write_fulfil(record, lease, data, rejected)
        if self._held.get(record.id) is lease:  # not written (in time): give it up
            self._forget(record.id, lease)  # (its lease lapses; it runs elsewhere)
            self.lost += 1

    async def _write_fulfil(
        self, record: TaskRecord, lease: _Lease, data: Any, rejected: bool
    ) -> None:
        try:
            await self.ds.tasks.fulfill(record.id, record.version, data=data, rejected=rejected)
        except Conflict:
            self.lost += 1  # lost at the last moment: another worker's result counts
        except BaseException:
            lease.settling = False  # not done (cancelled, store error): still held
            raise
        else:
            self.fulfilled += 1
            self.rejected += rejected
        self._forget(record.id, lease)

    async def _suspend(self, record: TaskRecord, awaited: list[str]) -> bool:
        """Suspend the task on ``awaited``; True if one has settled meanwhile (the
        handler runs again at once). The run's outcome: written even if the run is
        being cancelled (shielded), bounded by the lease, past which the task is not
        surely ours: then given up (``lost``) to lapse."""
        lease = self._ours(record)
        if lease is None:
            return False
        lease.settling = True
        answer = None
        with trio.CancelScope(shield=True), trio.move_on_after(self._lease):
            try:
                with contextlib.suppress(Conflict):  # lost: given up below
                    answer = await self.ds.tasks.suspend(record.id, record.version, awaited)
            except BaseException:
                lease.settling = False  # not written (a store error): still held
                raise
        if answer is None:  # not written (in time): give it up
            self._forget(record.id, lease)
            self.lost += 1
            return False
        if answer is Suspend.SUSPENDED:
            self._forget(record.id, lease)  # the store holds it now, without a lease
            self.suspended += 1
            return False
        lease.settling = False
        return True

    async def _release_all(self) -> None:
        """Give back every held task whose handler has not started, or whose run
        ended with no outcome recorded. Never one whose run is still going (e.g. a
        thread: it keeps it until its lease lapses; releasing would run it twice),
        nor one whose fulfil or suspension is being written (that call decides)."""
        async with trio.open_nursery() as nursery:  # together: one transaction
            for id, lease in list(self._held.items()):
                if (not lease.started or lease.over) and not lease.settling:
                    nursery.start_soon(self._release, id, lease)

    async def _release(self, id: str, lease: _Lease) -> None:
        with contextlib.suppress(TrioexecError):  # someone else's; else: its lease lapses
            await self.ds.tasks.release(id, lease.version)
        self._forget(id, lease)


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

    ``handlers`` is one callable (it receives the promise's data as its param) or a
    mapping of names to callables (the data is then ``{"handler": name, "param": ...}``).
    A handler may take a ``handle`` (`DurableHandle`). An ``async def`` handler runs in
    the worker's Trio thread, a plain ``def`` one in a worker thread (using the
    handle's ``*_sync`` methods). Its return value (JSON) fulfils the task's promise;
    an exception rejects it with ``{"error": repr(exc)}``, and so does a return value
    that is not JSON (the error names the task and the type).

    Tasks are claimed in batches, ahead of the free slots (as many more as ran out
    during the last claim, between ``max_concurrent_tasks`` and 16 times that), each
    held like a running one (leased, renewed, released on leaving) till a slot takes it.

    One heartbeat every ``lease / 3`` renews the leases (``lease``: seconds). A lost
    lease (the task taken over, or not renewed in time) cancels the local run at once;
    its outcome is never recorded. ``poll_interval`` bounds the wait between looks for
    pending tasks; on PostgreSQL a notification (``LISTEN``) wakes an idle worker as
    soon as a task of ``target`` is claimable, and the poll is a backstop.

    Leaving the block, by any means (cancellation included), stops claiming, cancels
    running handlers and releases every task still held (back to pending, same
    version) for other workers to take at once, shielded and bounded by ``lease``; a
    fulfil or a suspension under way is written first (a suspended task stays
    suspended). A killed worker's tasks come back when their leases expire. To stop
    without cancelling the runs, call `Worker.drain` first.

    Raises:
      ValueError: ``lease`` or ``poll_interval`` is not a finite number > 0, or
        ``target``/``pid`` is not a usable id (naming the value).

    Example::

        async with open_worker(ds, "refunds", refund, lease=10) as worker:
            await trio.sleep_forever()
    """
    check_seconds(lease, "lease")
    check_seconds(poll_interval, "poll_interval")
    check_id(target, "target")
    if pid is None:
        pid = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    else:
        check_id(pid, "pid")
    if not callable(handlers) and not isinstance(handlers, Mapping):
        raise ValueError(f"handlers must be a callable or a mapping of them, got {handlers!r}")
    body_error: list[BaseException] = []  # what the body raised, if anything
    async with (
        open_wakeup(ds, target) as wakeup,
        open_executor(
            max_concurrent_tasks=max_concurrent_tasks,
            shutdown_policy=ShutdownPolicy.CANCEL,
            # (a handler's failure is the promise's rejection: read, not lost)
            report_unread_failures=False,
        ) as ex,
    ):
        worker = Worker(ds, target, handlers, ex, pid, lease, poll_interval, wakeup)
        try:
            # The fulfils of finished runs: each shielded and bounded by the lease,
            # so leaving waits for them (a fulfil lost here would run the task again).
            async with one_level(body_error), trio.open_nursery() as settling:
                worker._settling = settling
                try:
                    async with one_level(body_error), trio.open_nursery() as nursery:
                        nursery.start_soon(worker._claim_loop)
                        nursery.start_soon(worker._heartbeat_loop)
                        nursery.start_soon(worker._lease_watch)
                        try:
                            yield worker
                        except BaseException as exc:
                            body_error.append(exc)
                            raise
                        finally:
                            nursery.cancel_scope.cancel()
                finally:
                    worker._stopping = True  # a run that has not started never will
                    # Also when leaving by cancellation: shielded, and bounded by the
                    # lease (past it, whatever is still held has lapsed anyway).
                    with trio.move_on_after(lease, shield=True):
                        await ex.shutdown(ShutdownPolicy.CANCEL)
                    worker._settling = None  # a run ending from now on waits for its fulfil
        finally:
            with trio.move_on_after(lease, shield=True):
                await worker._release_all()


def _run_id(record: TaskRecord) -> str | None:
    """The executor task id of this claim's run of ``record``: ``<id>@<version>``
    (logs, events and a span's ``messaging.message.id`` show which task ran; a
    claim's version is new, so no two runs share one). None (a generated id) if
    an executor cannot take it (an id of over 1,000 characters, or with a NUL)."""
    run_id = f"{record.id}@{record.version}"
    try:
        return check_task_id("task_id", run_id)
    except ValueError:
        return None
