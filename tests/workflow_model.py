"""What a workflow run's status must say, recomputed from scratch (shared by the
workflow tests: the run keeps its counts as states change instead)."""

from __future__ import annotations

from typing import Any

from trioexec import StepState, WorkflowStatus
from trioexec._records import TaskStatus
from trioexec._workflow import status


def status_from_scratch(run: Any) -> WorkflowStatus:
    """What `run.status()` must say: recomputed from every step's state and job."""
    states = dict(run._states)
    deferred = 0
    for sid, job in run._jobs.items():
        if states[sid] is StepState.READY and (job.status is TaskStatus.RUNNING or job.attempts):
            states[sid] = StepState.RUNNING
        if (
            job.status is TaskStatus.RUNNING
            and job.handle
            and job.handle.sub_status.value == "deferred"
        ):
            deferred += 1
    return status(run.run_id, run.workflow, states, deferred)
