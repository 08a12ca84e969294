"""Executions of other executors, read from their store: waiting until one has
ended (`await_end`: `trioexec.wait_result`, a deduplicated ref's ``wait()``), and
the `Job` a `TaskRef` wraps for one (`remote_job`).

On PostgreSQL a write that ends executions notifies the store's listeners
(`PostgresStore.wait_for_end`), so a waiter wakes when it commits; elsewhere it
polls, ever less often, up to `POLL` apart (and PostgreSQL falls back to that
poll for what ends without a notification: a recovery's verdict)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import trio

from ._errors import StoreError, TaskFailed
from ._journal import Journal
from ._records import ExecutionRecord, TaskStatus
from ._spec import CallInfo
from ._store._base import LIVE
from ._taskref import Extras, Job

if TYPE_CHECKING:
    from ._store import Store

#: The longest a waiter goes without reading the record again.
POLL = 1.0
_FIRST_POLL = 0.01
#: Threads that wait for a notification at once, in one Trio run: the others
#: wait for one of them in Trio (they all wake on the same notification), and
#: the executors' own store calls never queue behind them.
_LISTENERS = 4
_LISTENING: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("trioexec_ends")


def _listening() -> trio.CapacityLimiter:
    try:
        return _LISTENING.get()
    except LookupError:
        limiter = trio.CapacityLimiter(_LISTENERS)
        _LISTENING.set(limiter)
        return limiter


async def await_end(store: Store, task_id: str) -> ExecutionRecord | None:
    """The record of execution ``task_id`` once it has ended; None if ``store``
    has none (after the executors of this Trio run on it wrote what they
    accepted: their journals may hold it)."""
    listen = getattr(store, "wait_for_end", None)  # PostgreSQL: woken by its notify
    pause = _FIRST_POLL
    flushed = False
    while True:
        seen = store.ends_heard if listen is not None else 0  # type: ignore[attr-defined]
        record = await trio.to_thread.run_sync(store.execution, task_id)
        if record is None:
            if not flushed and await Journal.flush_all(store):
                flushed = True
                continue
            return None
        if record.status not in LIVE:
            return record
        if listen is not None:
            await trio.to_thread.run_sync(
                listen, seen, POLL, abandon_on_cancel=True, limiter=_listening()
            )
        else:
            await trio.sleep(pause)
            pause = min(pause * 2, POLL)


class _Unread:
    def read(self) -> None:
        """(another executor's failures are its to report)"""


@final
class RemoteOwner:
    """The `trioexec._taskref.Owner` of a `remote_job`: its store."""

    remote = True
    failure: StoreError | None = None
    unread = _Unread()

    def __init__(self, store: Store, record: ExecutionRecord, who: str) -> None:
        self._store = store
        self._waiting_on = record.waiting_on
        self._who = who  # (who its cancel command names)

    async def wait_remote(self, job: Job) -> None:
        record = await await_end(self._store, job.task_id)
        if record is None:  # (deleted meanwhile: an operator's hand)
            raise StoreError(f"{self._store!r}: execution {job.task_id!r} is gone from the store")
        fill(job, record)

    def cancel(self, job: Job) -> None:
        """A cancel command, as ``trioexec cancel`` sends it (a call to the store)."""
        if not job.ended:
            self._store.command("cancel", task_id=job.task_id, who=self._who)

    def waiting_on(self, job: Job) -> str | None:
        return None if job.ended else self._waiting_on

    def failure_error(self) -> StoreError:  # pragma: no cover - failure is never set
        raise AssertionError("a remote job's store does not fail its owner")

    def hurry(self) -> None:
        """(nothing to hurry: its writer is another process's)"""


def remote_job(store: Store, record: ExecutionRecord, who: str) -> Job:
    """A `Job` for ``record``'s execution (another executor's), for a `TaskRef`:
    its fields as the record has them; ``wait()`` reads its end from ``store``."""
    job = Job(
        RemoteOwner(store, record, who),
        _not_here,
        (),
        CallInfo(True, None),
        record.task_id,
        record.name,
        None,
        None,
        None,
        None,
        record.submitted_at or 0.0,
        False,
        False,
        record.run_id,
        record.key,
        record.priority,
        extras=Extras(dedupe_key=record.dedupe_key, parent_id=record.parent_id),
    )
    fill(job, record)
    return job


def fill(job: Job, record: ExecutionRecord) -> None:
    """``job`` as ``record`` has its execution (an ended one: with its completion's fields)."""
    job.status, job.attempts, job.started_at = record.status, record.attempt, record.started_at
    if record.status in LIVE:
        return
    job.finished_at = record.finished_at or 0.0
    job.result = record.result
    if record.status is not TaskStatus.COMPLETED:
        job.error = TaskFailed(record.task_id, record.status, record.error)


async def _not_here(*args: Any) -> None:  # pragma: no cover - never called
    raise AssertionError("another executor's execution is never run here")
