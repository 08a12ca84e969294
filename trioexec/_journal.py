"""What goes to the store, and when: the executor's journal.

Transitions are appended on the hot path (a tuple each, see `trioexec._store`)
and one writer task hands whatever has accumulated to the store in one
transaction (group commit): whatever comes in while a batch is being written
goes into the next one. A completion is acknowledged (its ``wait()`` returns)
only once the batch holding it is durable. The backlog is bounded: past
`JOURNAL_LIMIT` unwritten changes the executor stops admitting work
(back-pressure). The first failure of the store is kept, and every later caller
learns of it as a `StoreError` naming the store.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, final

import trio

from ._errors import StoreError
from ._records import safe_repr

if TYPE_CHECKING:
    from ._store import Change, Store

# Back-pressure from the store: changes journaled but not yet written, beyond
# which submissions wait (BLOCK) or are refused. Tasks already accepted still
# journal their transitions, so the backlog stays within this plus a few
# changes per accepted task (~200 bytes each).
JOURNAL_LIMIT = 50_000


@final
class Journal:
    """The changes not yet in the store, the completions waiting on them, and the
    one lock that orders every call to the store from this executor.

    ``on_written(notify, fenced)`` is called after each batch is durable, with
    the batch's completions to acknowledge and the task ids the store fenced out.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.changes: list[Change] = []  # not yet handed to the store
        self.notify: list[Any] = []  # completions (TaskRefs) to acknowledge once durable
        self.failure: StoreError | None = None  # the store failed: nothing more is written
        self.limit = JOURNAL_LIMIT  # (tests lower it)
        self.on_written: Callable[[list[Any], list[str]], None] = lambda notify, fenced: None
        self._writer_idle = trio.lowlevel.ParkingLot()
        self._flushers = trio.lowlevel.ParkingLot()
        self._lock = trio.Lock()  # one call at a time: writer, heartbeat, recovery, close
        self._appended = 0  # changes appended so far
        self._durable = 0  # changes committed so far

    def append(self, change: Change) -> None:
        """Journal one change (never blocks)."""
        self.changes.append(change)
        self._appended += 1
        if self._writer_idle:
            self._writer_idle.unpark()

    @property
    def backlogged(self) -> bool:
        """True while the store is more than `JOURNAL_LIMIT` changes behind."""
        return len(self.changes) >= self.limit

    async def run_writer(self) -> None:
        """The writer task: write each accumulated batch, forever."""
        while True:
            if not self.changes:
                await self._writer_idle.park()
                continue
            await self.write()

    async def write(self) -> None:
        """Hand everything journaled so far to the store in one transaction."""
        store = self.store
        async with self._lock:
            batch, self.changes = self.changes, []
            notify, self.notify = self.notify, []
            if not batch:
                return
            try:
                if store.inline:
                    fenced = store.write(batch)
                else:
                    fenced = await trio.to_thread.run_sync(store.write, batch)
            except BaseException:
                # Nothing was written (one transaction): keep it all, in order.
                self.changes[:0] = batch
                self.notify[:0] = notify
                raise
            self._durable += len(batch)
        self._batch_written(notify, fenced)

    def write_inline(self) -> None:
        """`write` for callers that run everything in one task (the
        DeterministicExecutor, with an inline store)."""
        assert self.store.inline
        batch, self.changes = self.changes, []
        notify, self.notify = self.notify, []
        if batch:
            fenced = self.store.write(batch)
            self._durable += len(batch)
            self._batch_written(notify, fenced)

    def _batch_written(self, notify: list[Any], fenced: list[str]) -> None:
        self.on_written(notify, fenced)
        if self._flushers:
            self._flushers.unpark_all()

    async def flush(self) -> None:
        """Wait until every change appended so far is durable. A checkpoint.

        Raises:
          StoreError: the store failed before they were.
        """
        target = self._appended
        while self._durable < target:
            if self.failure is not None:
                raise self.failure_error()
            await self._flushers.park()
        await trio.lowlevel.checkpoint()

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call one of the store's operations, in order with the writes (in a
        worker thread unless the store is inline)."""
        async with self._lock:
            if self.store.inline:
                return fn(*args)
            return await trio.to_thread.run_sync(functools.partial(fn, *args))

    def fail(self, exc: Exception) -> StoreError | None:
        """Record that the store failed with ``exc``. Returns the `StoreError` the
        executor stops with, or None if it had failed already."""
        if self.failure is not None:
            return None
        if not isinstance(exc, StoreError):
            where = getattr(self.store, "path", None) or repr(self.store)
            wrapped = StoreError(f"{where}: {type(exc).__name__}: {safe_repr(exc)}")
            wrapped.__cause__ = exc
            exc = wrapped
        self.failure = exc
        self._flushers.unpark_all()
        return exc

    def failure_error(self) -> StoreError:
        """A fresh `StoreError` for one more caller (each gets its own traceback)."""
        failure = self.failure
        assert failure is not None
        error = StoreError(*failure.args)
        error.__cause__ = failure.__cause__
        return error
