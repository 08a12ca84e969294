"""`DurableStore`: durable promises and leased tasks, async, on a trioexec store."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from typing import Any, Protocol, TypeVar, cast, final

import attrs
import trio

from .._errors import NotFound, StoreError
from .._records import check_number, stored_int
from .._store import MemoryStore, PostgresStore, SQLiteStore
from .._store._durable_pg import Listener, PostgresTables
from .._store._durable_rows import TransactionAborted
from .._store._durable_tables import SQLiteTables
from .._store._open import open_store
from .._store._pg_conn import reconnect_delay
from ._checks import check_seconds
from ._protocol import Core, claim_tagged
from ._records import (
    PromiseCreate,
    PromiseRecord,
    PromiseSettle,
    PromiseState,
    Suspend,
    TaskRecord,
    TaskState,
)

T = TypeVar("T")

#: How many times a transaction the database aborted for a concurrent one (a
#: deadlock, a row inserted meanwhile: PostgreSQL) is run again before its
#: operations fail with that error.
RETRIES = 5


@attrs.define(eq=False)
class _Call:
    """One queued operation and, once its transaction ended, its result."""

    fn: Callable[[], Any]
    taken: bool = False  # in a transaction under way: it will complete
    result: tuple[bool, Any] | None = None


@final
class DurableStore:
    """Durable promises (``ds.promises``) and leased tasks (``ds.tasks``).

    Args:
      path_or_store: a SQLite file path (shared safely by many processes), a
        PostgreSQL URL (``"postgresql://..."``: shared by many hosts), a
        `SQLiteStore` or `PostgresStore` (its database is used, on a connection of
        this object's own), or a `MemoryStore` (for tests: in memory, calls run
        inline, its clock is used unless ``clock`` is given).
      clock: the wall clock for timeouts and leases.
      retry_timeout: how long a pending task waits to be claimed before it is
        offered again.

    Every operation is async and atomic. Operations called concurrently (several
    tasks of one Trio run on this object) share a transaction: while one is being
    written, the next ones queue, and then go in one transaction together (a group
    commit: a worker's fulfils, claims and heartbeats cost one commit, not one
    each). Each still acts alone: it is undone if it fails, and answers what it
    would have alone. An operation is cancellable until its transaction begins;
    from then on it completes, like a call in a thread (the cancellation is
    delivered at the caller's next checkpoint).

    Example::

        ds = DurableStore("app.db")
        await ds.promises.create("approval-7", timeout=3600)
        await ds.promises.resolve("approval-7", data={"approved": True})
    """

    def __init__(
        self,
        path_or_store: str | os.PathLike[str] | SQLiteStore | PostgresStore | MemoryStore,
        *,
        clock: Callable[[], float] | None = None,
        retry_timeout: float = 30.0,
    ) -> None:
        check_seconds(retry_timeout, "retry_timeout")
        self._owned: SQLiteStore | PostgresStore | None = None
        self._limiter = trio.CapacityLimiter(1)  # one connection: one call at a time
        self._queue: list[_Call] = []  # operations waiting for the next transaction
        self._queue_lock = threading.Lock()  # taken from the queue in the writing thread
        self._writing = False  # a transaction of queued operations is under way
        self._written = trio.Event()  # set (and replaced) when it ends
        self._tables: SQLiteTables | PostgresTables | None = None  # closed by close()
        self._tracing: Tracing | None = None  # (`trace_with`)
        store: SQLiteStore | PostgresStore | MemoryStore
        if isinstance(path_or_store, SQLiteStore | PostgresStore | MemoryStore):
            store = path_or_store
        else:  # (a URL of another kind is refused there, its password masked)
            store = self._owned = open_store(path_or_store, clock=clock or time.time)
        self.inline = store.inline
        try:
            tables = self._tables = store.durable_tables()
        except BaseException:
            self.close()
            raise
        self.clock = clock or store.clock
        self._core = Core(tables, self.clock, retry_timeout)
        self.promises = Promises(self)
        self.tasks = Tasks(self)

    async def _call(self, fn: Callable[[], T]) -> T:
        if self.inline:
            await trio.lowlevel.checkpoint()
            return fn()
        return await trio.to_thread.run_sync(fn, limiter=self._limiter)

    async def _op(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` (an operation of the protocol core), in the next
        transaction, with every other operation queued by the time it holds the
        write lock."""
        await trio.lowlevel.checkpoint_if_cancelled()
        call = _Call(functools.partial(fn, *args, **kwargs))
        with self._queue_lock:
            self._queue.append(call)
        try:
            while call.result is None:
                if self._writing:
                    await self._written.wait()
                else:
                    await self._write_queued()
        except trio.Cancelled:
            with self._queue_lock:
                taken = call.taken
                if not taken:
                    self._queue.remove(call)  # never written: nothing happened
            if not taken:
                raise
            # Its transaction has begun: it completes, and its caller learns the
            # result (a claim's tasks are then held, not lost until their leases
            # lapse); the cancellation comes at the caller's next checkpoint.
            with trio.CancelScope(shield=True):
                while call.result is None:
                    await self._written.wait()
        ok, value = cast("tuple[bool, Any]", call.result)
        if ok:
            return cast("T", value)
        raise value

    def _take(self) -> list[_Call]:
        """Every queued operation, for the transaction that has just begun (called
        in the thread that writes, once it holds the write lock: whatever was
        queued while it waited for the lock goes in too)."""
        with self._queue_lock:
            batch, self._queue = self._queue, []
            for call in batch:
                call.taken = True
        return batch

    def _write(self) -> list[tuple[_Call, tuple[bool, Any]]]:
        taken: list[_Call] = []

        def take() -> list[Callable[[], Any]]:
            taken.extend(self._take())  # (run again: with what was queued meanwhile)
            return [call.fn for call in taken]

        retries = RETRIES
        while True:
            try:
                return list(zip(taken, self._core.run(take), strict=True))
            except TransactionAborted as exc:
                if retries:  # nothing was written: run it again
                    retries -= 1
                    continue
                failure: BaseException = exc
            except BaseException as exc:
                failure = exc
            # Nothing was written: every operation fails so.
            if not taken:
                taken.extend(self._take())
            return [(call, (False, failure)) for call in taken]

    async def _write_queued(self) -> None:
        """Write the queued operations in one transaction (shielded: a transaction
        that has begun completes; it is bounded like any store call)."""
        self._writing = True
        try:
            with trio.CancelScope(shield=True):
                written = await self._call(self._write)
            for call, result in written:
                call.result = result
            ok, value = written[0][1]  # (every batch holds this task's own operation)
            if not ok and not isinstance(value, Exception):
                raise value  # KeyboardInterrupt and the like: not the store's answer
        finally:
            self._writing = False
            event, self._written = self._written, trio.Event()
            event.set()

    async def check_invariants(self) -> list[str]:
        """Names of the seed's store invariants that are violated (empty: healthy)."""
        return await self._call(self._core.check_invariants)

    def close(self) -> None:
        """Close the connection (and the store this object opened); idempotent."""
        if self._tables is not None:
            self._tables.close()
            self._tables = None
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self) -> DurableStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@final
class Promises:
    """``ds.promises``: create, settle, get and search durable promises."""

    def __init__(self, ds: DurableStore) -> None:
        self._ds = ds
        self._core = ds._core

    async def create(
        self,
        id: str,
        timeout: float,
        *,
        idempotency_key: str | None = None,
        data: Any = None,
        tags: dict[str, str] | None = None,
        target: str | None = None,
    ) -> PromiseRecord:
        """Create a pending promise settling as rejected-timed-out ``timeout`` seconds
        from now. With ``target``, its task is created pending for that target.
        Repeating it with the same ``idempotency_key`` returns the same promise;
        otherwise an existing id raises `Conflict`."""
        tracing = self._ds._tracing
        if tracing is not None and target is not None:  # (a task: the creator's trace goes)
            tags = tracing.inject(tags)
        return await self._ds._op(
            self._core.create_promise,
            id,
            timeout,
            idempotency_key=idempotency_key,
            data=data,
            tags=tags,
            target=target,
        )

    async def _settle(
        self, id: str, state: PromiseState, idempotency_key: str | None, data: Any
    ) -> PromiseRecord:
        return await self._ds._op(
            self._core.settle_promise, id, state, idempotency_key=idempotency_key, data=data
        )

    async def resolve(
        self, id: str, *, idempotency_key: str | None = None, data: Any = None
    ) -> PromiseRecord:
        """Resolve a pending promise (tasks suspended on it become pending).
        Repeating with the same key returns the same; otherwise a settled promise
        raises `Conflict`."""
        return await self._settle(id, PromiseState.RESOLVED, idempotency_key, data)

    async def reject(
        self, id: str, *, idempotency_key: str | None = None, data: Any = None
    ) -> PromiseRecord:
        """Reject a pending promise; see `resolve`."""
        return await self._settle(id, PromiseState.REJECTED, idempotency_key, data)

    async def cancel(
        self, id: str, *, idempotency_key: str | None = None, data: Any = None
    ) -> PromiseRecord:
        """Cancel a pending promise (rejected-canceled); see `resolve`."""
        return await self._settle(id, PromiseState.REJECTED_CANCELED, idempotency_key, data)

    async def get(self, id: str) -> PromiseRecord | None:
        """The promise, or None."""
        return await self._ds._op(self._core.get_promise, id)

    def settled(self, id: str, *, poll: float = 1.0) -> PromiseSettled:
        """A condition for `~trioexec.TaskHandle.defer_until`: the promise ``id``
        is settled. The task gives its slot back meanwhile, says it waits on
        ``"promise <id>"`` (`trioexec.TaskRef.waiting_on`, the stores, ``trioexec
        status``), and looks every ``poll`` seconds. Then read the promise with
        `get`::

            await handle.defer_until(ds.promises.settled("approval-42"))
            record = await ds.promises.get("approval-42")

        The wait raises `NotFound` if there is no such promise."""
        must = "a positive number of seconds"
        poll = check_number("poll", poll, float, must, gt=0, lt=math.inf, stored=True)
        return PromiseSettled(self, id, poll)

    async def search(
        self,
        *,
        state: PromiseState | str | None = None,
        tag: tuple[str, str] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> tuple[list[PromiseRecord], str | None]:
        """A page of promises by id, and the cursor for the next page (None: last)."""
        return await self._ds._op(
            self._core.search_promises, state=state, tag=tag, limit=limit, cursor=cursor
        )


@final
class PromiseSettled:
    """``ds.promises.settled(id)``: waits (polling) until a promise is settled."""

    def __init__(self, promises: Promises, id: str, poll: float) -> None:
        self._promises = promises
        self.id = id
        self.poll = poll
        self.__trioexec_waiting_on__ = f"promise {id}"  # (`TaskHandle.waiting_on`)

    async def wait(self) -> None:
        """Return once the promise is settled (resolved, rejected, cancelled or
        timed out). Raises `NotFound` if there is no such promise."""
        while True:
            record = await self._promises.get(self.id)
            if record is None:
                raise NotFound(f"no promise {self.id!r}")
            if record.state is not PromiseState.PENDING:
                return
            await trio.sleep(self.poll)

    def __repr__(self) -> str:
        return f"<PromiseSettled {self.id!r}, polled every {self.poll}s>"


@final
class Tasks:
    """``ds.tasks``: the leased-task protocol. Mutating calls present ``(id, version)``;
    a stale version raises `Conflict`."""

    def __init__(self, ds: DurableStore) -> None:
        self._ds = ds
        self._core = ds._core

    async def create(
        self, id: str, *, pid: str, ttl: float, timeout: float, data: Any = None, target: str
    ) -> TaskRecord:
        """Create a promise and its task, the task already acquired by ``pid``."""
        return await self._ds._op(
            self._core.create_task, id, pid=pid, ttl=ttl, timeout=timeout, data=data, target=target
        )

    async def acquire(self, id: str, version: int, *, pid: str, ttl: float) -> TaskRecord:
        """Claim a pending task: version + 1, a lease of ``ttl`` seconds."""
        stored_int("version", version)
        return await self._ds._op(self._core.acquire, id, version, pid=pid, ttl=ttl)

    async def claim(self, target: str, *, pid: str, ttl: float, limit: int) -> list[TaskRecord]:
        """Acquire up to ``limit`` pending tasks of ``target`` at once (a worker's
        batched `acquire`)."""
        claimed = await self._ds._op(self._core.claim_work, target, pid=pid, ttl=ttl, limit=limit)
        return [task for task, _ in claimed]

    async def heartbeat(self, pid: str, tasks: Sequence[tuple[str, int]]) -> int:
        """Renew the leases of all the (id, version) this pid holds, in one call."""
        for _, version in tasks:
            stored_int("version", version)
        return await self._ds._op(self._core.heartbeat, pid, list(tasks))

    async def suspend(self, id: str, version: int, awaited: Sequence[str]) -> Suspend:
        """Wait (without a lease) for any of ``awaited`` to settle; returns
        `Suspend.ALREADY_SETTLED` without suspending if one already has."""
        awaited = awaited if isinstance(awaited, str) else list(awaited)  # a str: ValueError
        stored_int("version", version)
        return await self._ds._op(self._core.suspend, id, version, awaited)

    async def resume(self, id: str, version: int) -> TaskRecord:
        """Move a suspended task back to pending by hand (settling an awaited
        promise does it by itself)."""
        stored_int("version", version)
        return await self._ds._op(self._core.resume, id, version)

    async def release(self, id: str, version: int) -> TaskRecord:
        """Give up the claim: back to pending, same version."""
        stored_int("version", version)
        return await self._ds._op(self._core.release, id, version)

    async def fulfill(
        self, id: str, version: int, *, data: Any = None, rejected: bool = False
    ) -> PromiseRecord:
        """Settle the task's promise (resolved, or rejected) and finish the task."""
        stored_int("version", version)
        return await self._ds._op(self._core.fulfill, id, version, data=data, rejected=rejected)

    async def fence(
        self, id: str, version: int, action: PromiseCreate | PromiseSettle
    ) -> PromiseRecord:
        """Create or settle a promise only if this task is still acquired at ``version``
        and its own promise is pending."""
        stored_int("version", version)
        return await self._ds._op(self._core.fence, id, version, action)

    async def halt(self, id: str) -> TaskRecord:
        """Block the task from being claimed or resumed."""
        return await self._ds._op(self._core.halt, id)

    async def continue_(self, id: str) -> TaskRecord:
        """Undo `halt`: back to pending."""
        return await self._ds._op(self._core.continue_, id)

    async def get(self, id: str) -> TaskRecord | None:
        """The task, or None."""
        return await self._ds._op(self._core.get_task, id)

    async def search(
        self,
        *,
        state: TaskState | str | None = None,
        target: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> tuple[list[TaskRecord], str | None]:
        """A page of tasks by id, and the cursor for the next page (None: last)."""
        return await self._ds._op(
            self._core.search_tasks, state=state, target=target, limit=limit, cursor=cursor
        )


# What a worker asks beyond the public calls (functions here, not methods of
# `Tasks`: they are not part of ``ds.tasks``).


async def claim_work(
    ds: DurableStore, target: str, *, pid: str, ttl: float, limit: int
) -> list[tuple[TaskRecord, str | None, AbstractContextManager[object]]]:
    """``ds.tasks.claim``, each task with its promise's data (JSON text) and the
    context to submit its run in (`trace_with`; else one that does nothing): all a
    worker needs to start the work, in one transaction."""
    tracing = ds._tracing
    if tracing is None:
        claimed = await ds._op(ds._core.claim_work, target, pid=pid, ttl=ttl, limit=limit)
        return [(task, data, UNTRACED) for task, data in claimed]
    tagged = await ds._op(claim_tagged, ds._core, target, pid=pid, ttl=ttl, limit=limit)
    return [(task, data, tracing.extract(tags)) for task, data, tags in tagged]


#: The context a task's run is submitted in when its store carries no trace.
UNTRACED: AbstractContextManager[object] = contextlib.nullcontext()


class Tracing(Protocol):
    """How a trace context crosses the store (`trioexec.contrib.otel.instrument_durable`
    gives one): in the tags of the promise of each task created, from the
    creator to the worker that claims it. Neither may raise."""

    def inject(self, tags: dict[str, str] | None) -> dict[str, str] | None:
        """``tags`` (the creator's own), with the current trace context added."""

    def extract(self, tags: Mapping[str, str]) -> AbstractContextManager[object]:
        """The context to submit a claimed task's run in: its creator's trace."""


def trace_with(ds: DurableStore, tracing: Tracing) -> None:
    """From now on, ``ds`` carries a trace context through the store with
    ``tracing``: tasks created (``promises.create(..., target=...)``) get the
    creator's in their promise's tags, and a worker on ``ds`` submits each task it
    claims in the context taken from them (ValueError if ``ds`` carries one already)."""
    if ds._tracing is not None:
        raise ValueError(f"this DurableStore carries a trace context already ({ds._tracing!r})")
    ds._tracing = tracing


async def lost_leases(
    ds: DurableStore, pid: str, tasks: Sequence[tuple[str, int]]
) -> list[tuple[str, int]]:
    """Which of ``tasks`` (id, version) ``pid`` no longer holds: the worker's question
    after a heartbeat renewed fewer than it sent."""
    return await ds._op(ds._core.lost_leases, pid, list(tasks))


@final
class Wakeup:
    """What an idle worker waits on: a notification that tasks of its target became
    claimable (PostgreSQL: ``LISTEN``), or its poll interval, whichever comes first.
    ``listening``: notifications can wake it (the poll is only a backstop). A
    listening connection lost (the server restarted) is opened again by a later
    wait, backing off while the server is away; until then the worker polls."""

    def __init__(
        self,
        target: str,
        listener: Listener | None,
        listen: Callable[[], Listener] | None = None,
        inline: bool = False,
    ) -> None:
        self._target = target
        self._listener = listener
        self.listening = listener is not None
        self._listen = listen  # opens a listener again (None: never listens)
        self._inline = inline
        self._failures = 0  # attempts to listen again that failed in a row
        self._again_at = -math.inf  # (Trio's clock) when to try again

    async def wait(self, timeout: float) -> None:
        """Return after ``timeout`` seconds, or sooner when notified (or when
        listening again: tasks may have come unheard meanwhile)."""
        with trio.move_on_after(timeout):
            ready = self._listener is None and trio.current_time() >= self._again_at
            if ready and await self._listen_again():
                return
            while self._listener is not None:
                got = self._listener.received()
                if got is None:  # the connection is lost: poll until listening again
                    self._lost()
                    return
                if self._target in got or "" in got:
                    return
                await trio.lowlevel.wait_readable(self._listener.fileno())
            await trio.sleep_forever()

    async def _listen_again(self) -> bool:
        listen = self._listen
        if listen is None:
            return False
        try:
            # (shielded: a connection opened meanwhile is not left unclosed)
            with trio.CancelScope(shield=True):
                listener = listen() if self._inline else await trio.to_thread.run_sync(listen)
        except StoreError:
            self._failures += 1
            self._again_at = trio.current_time() + reconnect_delay(self._failures)
            return False
        self._listener, self.listening, self._failures = listener, True, 0
        return True

    def drain(self) -> None:
        """Read (and drop) the notifications that came: the claim about to run sees
        those tasks anyway. A busy worker calls it before each claim, so that its
        listening connection never backs up (the server would hold every later
        notification of the database for it)."""
        if self._listener is not None and self._listener.received() is None:
            self._lost()

    def _lost(self) -> None:
        listener, self._listener = self._listener, None
        self.listening = False
        self._again_at = trio.current_time() + reconnect_delay(1)
        if listener is not None:
            listener.close()

    def close(self) -> None:
        self._listen = None  # (never listens again)
        self._lost()


@asynccontextmanager
async def open_wakeup(ds: DurableStore, target: str) -> AsyncIterator[Wakeup]:
    """A `Wakeup` for ``target``'s idle worker on ``ds`` (listening on a connection
    of its own when the database can notify; closed at the end of the block)."""
    listener = listen = None
    tables = ds._tables
    if isinstance(tables, PostgresTables):
        listen = functools.partial(Listener, tables.db, tables.channel)
        listener = listen() if ds.inline else await trio.to_thread.run_sync(listen)
    wakeup = Wakeup(target, listener, listen, ds.inline)
    try:
        yield wakeup
    finally:
        wakeup.close()
