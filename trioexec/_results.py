"""`wait_result`: a task's kept value, by id, from any process on its store
(`trioexec._remote.await_end` says how it waits)."""

from __future__ import annotations

from typing import Any

from ._core import check_store
from ._errors import TaskFailed
from ._records import TaskStatus, check_id
from ._remote import await_end
from ._store import Store


async def wait_result(store: Store, task_id: str) -> Any:
    """Wait until the execution ``task_id`` of ``store`` has ended, and return its
    kept value (decoded from its JSON: a tuple comes back as a list). Works from
    any process on the store; bound it with ``trio.fail_after``. Cancelling the
    wait does not touch the task.

    Example::

        store = trioexec.open_store("postgresql://app@db.internal/app")
        with trio.fail_after(60):
            charge = await trioexec.wait_result(store, f"charge-{order_id}")

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
    record = await await_end(store, task_id)
    if record is None:
        raise LookupError(f"no execution {task_id!r} in {store!r}")
    if record.status is not TaskStatus.COMPLETED:
        raise TaskFailed(task_id, record.status, record.error)
    if not record.result_kept:
        raise LookupError(
            f"execution {task_id!r} completed without a kept result"
            " (open_executor(keep_results=True), or keep_result=True on @task or submit)"
        )
    return record.result
