"""`Shutdown`: closing an executor under one of the three policies.

``DRAIN`` lets everything accepted finish (and started workflow runs, and the
executor's own running tasks, may still submit until the drain ends);
``CANCEL_PENDING`` also cancels what has not started; ``CANCEL`` also
cancels what is running. Whichever: new submissions raise `ExecutorClosed`, and
submitters blocked for space wake up to learn it.
"""

from __future__ import annotations

from typing import final

from ._admission import Gate
from ._causation import current_job
from ._errors import ExecutorClosed
from ._lifecycle import Lifecycle
from ._records import ShutdownPolicy
from ._workers import Workers


@final
class Shutdown:
    """Whether one executor is closing, and under which policy."""

    def __init__(self, gate: Gate, lifecycle: Lifecycle, workers: Workers) -> None:
        self.closing = False
        self._drain_runs = True  # under DRAIN, started runs and own tasks may still submit
        self._gate = gate
        self._lifecycle = lifecycle
        self._workers = workers

    def check_open(self, internal: bool = False) -> None:
        """Raise `ExecutorClosed` if a submission may not be accepted now.
        ``internal``: a workflow run's step."""
        if self.closing and not (self._drain_runs and (internal or self.called_by_own_task())):
            raise ExecutorClosed("the executor is shutting down; no new submissions")

    def called_by_own_task(self) -> bool:
        """The caller is (inside) one of this executor's running tasks."""
        caller = current_job()
        return caller is not None and caller.owner is self._lifecycle

    def begin(self, policy: ShutdownPolicy) -> None:
        """Stop accepting work and apply ``policy``. Never blocks; may be called
        again with a stricter policy."""
        self.closing = True
        if policy is not ShutdownPolicy.DRAIN:
            self._drain_runs = False
        # Blocked submitters decide again: ExecutorClosed (or, fan-out under
        # DRAIN, back in line).
        self._gate.wake_all()
        if policy is not ShutdownPolicy.DRAIN:
            self._lifecycle.cancel_pending()
        if policy is ShutdownPolicy.CANCEL:
            for job in list(self._workers.taken):
                self._lifecycle.cancel(job)
        self._workers.close()
