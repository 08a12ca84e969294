"""What goes to the store, and when: the executor's journal.

Transitions are appended on the hot path (a tuple each, `trioexec._changes`) and
one writer task hands whatever has accumulated to the store in one transaction
(group commit); a completion is acknowledged only once its batch is durable.
docs/design.rst ("Store consistency") gives the rules: the gathering, the
back-pressure, what the store's first failure ends and what is still written.
"""

from __future__ import annotations

import json
import traceback
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, final

import trio

from ._changes import R_PARENT, R_VERSION, ExecutionRow, Transition, submitted, widen
from ._errors import StoreError
from ._records import safe_repr, storable_text
from ._spec import TaskSpec
from ._store._base import ROW_FOLDS

if TYPE_CHECKING:
    from ._store import Change, Store
    from ._taskref import Job

# Back-pressure: changes journaled but not yet written, beyond which submissions
# wait (BLOCK) or are refused (a change is ~200 bytes).
JOURNAL_LIMIT = 50_000

# While nobody waits for durability (`hurry`), the writer gathers this long (or
# this many) before a transaction: each is a round trip to a worker thread.
GATHER_SECONDS = 0.005
GATHER_CHANGES = 4096
_NEVER = 1 << 62
#: The journals whose writer runs, and its Trio run (`Journal.flush_all`).
_WRITING: weakref.WeakKeyDictionary[Journal, trio.lowlevel.TrioToken] = weakref.WeakKeyDictionary()


@final
class Journal:
    """The changes not yet in the store, the completions waiting on them, and the
    one lock that orders every call to the store from this executor.
    ``on_written(notify, fenced)`` is called after each batch is durable, with its
    completions to acknowledge and the task ids the store fenced out."""

    def __init__(self, store: Store, on_written: Callable[[list[Any], list[str]], None]) -> None:
        self.store = store
        self.changes: list[Change] = []  # not yet handed to the store
        self.notify: list[Any] = []  # completions (TaskRefs) to acknowledge once durable
        self.failure: StoreError | None = None  # the store failed: nothing more is written
        # What was journaled before the failure, to write once more (`write`).
        self._before_failure: tuple[list[Change], list[Any]] = ([], [])
        self.limit = JOURNAL_LIMIT  # (tests lower it)
        self._on_written = on_written
        self._writer_lot = trio.lowlevel.ParkingLot()
        # `append` wakes the parked writer once this many changes wait: 1 while it
        # is idle, a full batch while it gathers, never while it writes.
        self._wake_at = _NEVER
        self._hurry = False  # someone waits for a change to be durable
        self._flushers = trio.lowlevel.ParkingLot()
        self._lock = trio.Lock()  # one call at a time: writer, heartbeat, recovery, close
        # Batches taken so far: a "row" change journaled in the current one may
        # still have the execution's next changes folded into it (`fold`).
        self.batch = 0
        self._appended = 0  # changes appended so far
        self._durable = 0  # changes committed so far

    def append(self, change: Change) -> None:
        """Journal one change (never blocks)."""
        changes = self.changes
        changes.append(change)
        self._appended += 1
        if len(changes) >= self._wake_at:
            self._wake_at = _NEVER
            self._writer_lot.unpark()

    def new_row(self, job: Job, owner_id: str) -> ExecutionRow | None:
        """The store's row of a new execution of ``owner_id``'s, not journaled yet:
        the part of a submission that may raise (its arguments as JSON), made first.
        None for one that holds a dedupe key: its row was stored as it took it."""
        fn = job.fn
        spec_id = fn.id if isinstance(fn, TaskSpec) else None
        try:
            args = json.dumps(job.args) if spec_id is not None else None
        except (TypeError, ValueError):
            args = None  # not JSON: recorded, but recovery cannot re-create it
        row = submitted(
            job.task_id,
            job.version,
            job.name,
            job.run_id,
            spec_id,
            args,
            owner_id,
            job.submitted_at,
            job.key,
            job.priority,
        )
        if job.extras is None:
            return row
        if job.extras.dedupe_key is not None:
            return None
        if job.extras.parent_id is not None:
            widen(row)[R_PARENT] = job.extras.parent_id
        return row

    def dead_letter(self, job: Job) -> tuple[str | None, str | None]:
        """The traceback text of ``job``'s error and its arguments as JSON (None if
        they are not JSON), for the store to keep with a failed execution."""
        error = job.error
        assert error is not None
        try:
            text = traceback_text(error)
        except Exception:  # (a broken __str__ in the chain)
            text = f"{type(error).__name__} (its traceback could not be formatted)"
        args: str | None = None
        if not isinstance(job.fn, TaskSpec):  # (a spec's were recorded at submission, if JSON)
            try:
                args = json.dumps(job.args)
            except (TypeError, ValueError, RecursionError):
                args = None
        if args is not None and len(args) > _DEAD_ARGS_MAX:
            args = None  # (shown to people only: not worth a huge row)
        return storable_text(text), args

    def fold(self, job: Job, change: Transition) -> None:
        """Journal ``change``, folded into ``job``'s row if this journal has not
        taken it yet and it is still the row of this version."""
        row = job.row
        if row is not None:
            if job.row_batch == self.batch and row[R_VERSION] == job.version:
                if ROW_FOLDS[change.kind](row, change):
                    return
                # (else a change the row refuses: the store fences it too)
            else:
                job.row = None  # (taken: written, or being written)
        self.append(change)

    def hurry(self) -> None:
        """Someone waits for what is journaled to be durable: write it now."""
        if not self._hurry:
            self._hurry = True
            if self._wake_at != _NEVER:
                self._wake_at = _NEVER
                self._writer_lot.unpark()

    @property
    def backlogged(self) -> bool:
        """True while the store is more than `JOURNAL_LIMIT` changes behind."""
        return len(self.changes) >= self.limit

    async def run_writer(self) -> None:
        """The writer task: write each accumulated batch, forever."""
        _WRITING[self] = trio.lowlevel.current_trio_token()
        try:
            while True:
                if not self.changes:
                    await self._park_writer(1)
                    continue
                if not self._hurry and len(self.changes) < GATHER_CHANGES and not self.backlogged:
                    with trio.move_on_after(GATHER_SECONDS):
                        await self._park_writer(min(GATHER_CHANGES, max(1, self.limit // 2)))
                await self.write()
        finally:
            del _WRITING[self]

    async def _park_writer(self, wake_at: int) -> None:
        self._wake_at = wake_at
        try:
            await self._writer_lot.park()
        finally:
            self._wake_at = _NEVER

    async def write(self) -> None:
        """Hand everything journaled so far to the store in one transaction."""
        store = self.store
        async with self._lock:
            batch, self.changes = self.changes, []
            notify, self.notify = self.notify, []
            self.batch += 1
            if self.failure is not None:
                # Only what was journaled before the failure (once); what came
                # after (the cancellations it caused) is dropped.
                (batch, notify), self._before_failure = self._before_failure, ([], [])
            self._hurry = False
            if not batch:
                return
            try:
                if store.inline:
                    fenced = store.write(batch)
                else:
                    fenced = await trio.to_thread.run_sync(store.write, batch)
            except BaseException:
                # Nothing was written (one transaction): keep it all, in order
                # (for the close, if the store has failed meanwhile).
                changes, waiting = (
                    (self.changes, self.notify) if self.failure is None else self._before_failure
                )
                changes[:0] = batch
                waiting[:0] = notify
                raise
            self._durable += len(batch)
        self._batch_written(notify, fenced)

    def write_inline(self) -> None:
        """`write` in the caller's task (`DeterministicExecutor`, an inline store)."""
        assert self.store.inline
        batch, self.changes = self.changes, []
        notify, self.notify = self.notify, []
        self.batch += 1
        if batch:
            fenced = self.store.write(batch)
            self._durable += len(batch)
            self._batch_written(notify, fenced)

    def _batch_written(self, notify: list[Any], fenced: list[str]) -> None:
        self._on_written(notify, fenced)
        if self._flushers:
            self._flushers.unpark_all()

    async def flush(self) -> None:
        """Wait until every change appended so far is durable. A checkpoint.
        Raises `StoreError` if the store failed before they were."""
        target = self._appended
        while self._durable < target:
            if self.failure is not None:
                raise self.failure_error()
            self.hurry()
            await self._flushers.park()
        await trio.lowlevel.checkpoint()

    @staticmethod
    async def flush_all(store: Store) -> bool:
        """`flush` the journals of this Trio run's executors on ``store`` (what
        they accepted may not be in it yet); False if there are none."""
        token = trio.lowlevel.current_trio_token()
        journals = [j for j, t in _WRITING.items() if j.store is store and t is token]
        for journal in journals:
            await journal.flush()
        return bool(journals)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call one of the store's operations, in order with the writes (in a
        worker thread unless the store is inline)."""
        async with self._lock:
            if self.store.inline:
                return fn(*args)
            return await trio.to_thread.run_sync(fn, *args)

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
        # Set aside what was journaled so far; from now on nothing more is
        # written, nor folded into a row set aside (a new batch number).
        self._before_failure = (self.changes, self.notify)
        self.changes, self.notify = [], []
        self.batch += 1
        self._flushers.unpark_all()
        return exc

    def failure_error(self) -> StoreError:
        """A fresh `StoreError` for one more caller (each gets its own traceback)."""
        failure = self.failure
        assert failure is not None
        error = StoreError(*failure.args)
        error.__cause__ = failure.__cause__
        return error


_DEAD_ARGS_MAX = 65_536


def traceback_text(error: BaseException) -> str:
    """``error``'s traceback as Python prints it, its causes and contexts first,
    but without the source lines: reading them (and, since 3.11, parsing them for
    the ``^^^`` marks) costs ~90 µs a failure on the Trio thread."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    exc: BaseException | None = error
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    parts: list[str] = []
    for i, exc in enumerate(reversed(chain)):
        if i:
            parts.append(_CAUSED if exc.__cause__ is chain[len(chain) - i] else _DURING)
        if exc.__traceback__ is not None:
            parts.append("Traceback (most recent call last):\n")
            for frame, line in traceback.walk_tb(exc.__traceback__):
                code = frame.f_code
                parts.append(f'  File "{code.co_filename}", line {line}, in {code.co_name}\n')
        parts.extend(traceback.format_exception_only(exc))
    return "".join(parts)


_CAUSED = "\nThe above exception was the direct cause of the following exception:\n\n"
_DURING = "\nDuring handling of the above exception, another exception occurred:\n\n"
