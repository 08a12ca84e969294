"""`wait_result`: a task's kept value, by id, from any process on its store.

It reads the execution's record until it has ended. On PostgreSQL a write that
ends executions notifies the store's listeners (`PostgresStore.wait_for_end`),
so a waiter wakes when it commits; elsewhere it polls, ever less often, up to
`POLL` apart (and PostgreSQL falls back to that poll for what ends without a
notification: a recovery's verdict)."""

from __future__ import annotations

from typing import Any

import trio

from ._core import check_store
from ._errors import TaskFailed
from ._journal import Journal
from ._records import TaskStatus, check_id
from ._store import Store
from ._store._base import LIVE

#: The longest a waiter goes without reading the record again.
POLL = 1.0
_FIRST_POLL = 0.01


async def wait_result(store: Store, task_id: str) -> Any:
    """Wait until the execution ``task_id`` of ``store`` has ended, and return its
    kept value (decoded from its JSON: a tuple comes back as a list). Works from
    any process on the store; bound it with ``trio.fail_after``. Cancelling the
    wait does not touch the task.

    Raises:
      TaskFailed: the execution ended other than ``COMPLETED`` (its ``status``
        and recorded ``error`` say how).
      LookupError: no execution ``task_id`` in ``store``, or it completed
        without a kept result (``keep_results`` / ``keep_result`` was off).
      StoreError: the store failed or is closed.
      TypeError, ValueError: ``store`` is not a store; ``task_id`` is not a
        non-empty str of at most 1,000 characters.
    """
    if store is None:
        raise TypeError("wait_result needs a store, got None")
    check_store(store)
    check_id("task_id", task_id)
    listen = getattr(store, "wait_for_end", None)  # PostgreSQL: woken by its notify
    pause = _FIRST_POLL
    flushed = False
    while True:
        seen = store.ends_heard if listen is not None else 0  # type: ignore[attr-defined]
        record = await trio.to_thread.run_sync(store.execution, task_id)
        if record is None:
            # An executor of this process may have accepted it and not written it yet.
            if not flushed and await Journal.flush_all(store):
                flushed = True
                continue
            raise LookupError(f"no execution {task_id!r} in {store!r}")
        if record.status not in LIVE:
            break
        if listen is not None:
            await trio.to_thread.run_sync(listen, seen, POLL, abandon_on_cancel=True)
        else:
            await trio.sleep(pause)
            pause = min(pause * 2, POLL)
    if record.status is not TaskStatus.COMPLETED:
        raise TaskFailed(task_id, record.status, record.error)
    if not record.result_kept:
        raise LookupError(
            f"execution {task_id!r} completed without a kept result"
            " (open_executor(keep_results=True), or keep_result=True on @task or submit)"
        )
    return record.result
