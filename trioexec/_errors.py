"""The error hierarchy. Everything trioexec raises on purpose derives from `TrioexecError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._durable_records import PromiseRecord


class TrioexecError(Exception):
    """Root of every error trioexec raises on purpose."""


class TaskDefinitionError(TrioexecError):
    """A task was declared wrongly: not callable, a bad option value, an unknown option."""


class WorkflowError(TaskDefinitionError, ValueError):
    """A workflow is malformed: unknown dependency, cycle, duplicate id, empty."""


class TaskRejected(TrioexecError):
    """The executor refused a submission (full queue under ``REJECT``, or a closed queue)."""


class CapacityExceeded(TaskRejected):
    """The executor refused a submission under ``FAIL_FAST``."""


class ExecutorClosed(TrioexecError):
    """A submission arrived after the executor began shutting down."""


class TaskTimeout(TrioexecError):
    """A task attempt ran past its hard ``timeout``."""


class TaskCancelled(TrioexecError):
    """A task was cancelled: `Executor.run` was asked for its value, or the
    thread of a sync task learns that its attempt is over."""


class TaskFailed(TrioexecError):
    """`trioexec.wait_result`: the execution ended other than ``COMPLETED``.
    ``task_id`` names it, ``status`` is how it ended (a `TaskStatus`) and
    ``error`` the error text its store recorded (None if none was)."""

    # (``status`` is typed as the str a `TaskStatus` is: the errors sit below the
    # records in the layers)
    def __init__(self, task_id: str, status: str, error: str | None) -> None:
        said = "" if error is None else f": {error}"
        super().__init__(f"task {task_id!r} ended {status}{said}")
        self.task_id = task_id
        self.status = status
        self.error = error

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.task_id, self.status, self.error))


class PermanentError(TrioexecError):
    """Raised by task code to say: this failure will not go away, do not retry."""


class StoreError(TrioexecError):
    """A store could not be opened or used (corrupt, foreign or newer-schema file, I/O)."""


# ---------------------------------------------------------------- trioexec.durable


class Conflict(TrioexecError):
    """The operation lost a race: a stale task version, a task or promise in the
    wrong state, or a different idempotency key on a settled promise (Resonate's 409)."""


class NotFound(TrioexecError, LookupError):
    """No promise or task with that id."""


class PromiseRejected(TrioexecError):
    """`DurableHandle.await_promise` on a promise that was rejected (or canceled, or
    timed out). ``record`` is the promise."""

    def __init__(self, record: PromiseRecord) -> None:
        super().__init__(f"promise {record.id!r} is {record.state.value}: {record.data}")
        self.record = record
