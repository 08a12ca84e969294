"""The error hierarchy. Everything trioexec raises on purpose derives from `TrioexecError`."""

from __future__ import annotations


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


class PermanentError(TrioexecError):
    """Raised by task code to say: this failure will not go away, do not retry."""


class StoreError(TrioexecError):
    """A store could not be opened or used (corrupt, foreign or newer-schema file, I/O)."""
