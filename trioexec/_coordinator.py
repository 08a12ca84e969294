"""The workflow coordinator: submits each step through the executor's slots as
soon as its dependencies are complete, passes contexts along, and finalizes the run.

One coordinator task per run, in the executor's nursery, and no task per step:
a step's job tells it when it ends (``on_done``). `WorkflowRuns` keeps an
executor's runs: it starts and resumes them, journals their changes, and is what
the lifecycle and recovery tell about steps and runs (the parts never import it).
"""

from __future__ import annotations

import functools
import itertools
import json
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import trio

from ._changes import RunCreated, RunEnded, StepRecorded
from ._errors import ExecutorClosed, TrioexecError
from ._records import (
    CANCELLED,
    COMPLETED,
    DEFERRED,
    RUNNING,
    HealthEventKind,
    TaskCompletion,
    check_id,
)
from ._spec import TaskSpec
from ._store import RunRecord
from ._taskref import Job
from ._workflow import (
    STEP_COMPLETED,
    STEP_FAILED,
    STEP_PENDING,
    STEP_READY,
    STEP_RUNNING,
    STEP_SKIPPED,
    Context,
    RunStatus,
    StepState,
    Workflow,
    WorkflowStatus,
    context_json,
    count_states,
    load_json,
    merged_input_json,
    progress_attributes,
    progress_status,
    run_spec,
    summarize,
)

if TYPE_CHECKING:
    from ._core import ExecutorCore


@attrs.frozen(kw_only=True)
class WorkflowResult:
    """How a run ended. A failed run is returned, not raised.

    ``context`` is the final merged context (every completed step's output,
    merged in topological order); ``steps`` maps each step that ran to its
    `TaskCompletion`; ``error`` is the first failing step's error.
    """

    run_id: str
    workflow: str
    status: RunStatus
    context: dict[str, Any]
    steps: dict[str, TaskCompletion]
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        """True when every step completed."""
        return self.status is RunStatus.COMPLETED


_PROGRESS: Final = HealthEventKind.WORKFLOW_PROGRESS  # (as `trioexec._records.RUNNING`)


@final
class WorkflowRun:
    """A run of a `Workflow` in an executor (from `Executor.start_workflow`)."""

    __slots__ = (
        "_blocked",
        "_closed",
        "_completions",
        "_counts",
        "_done",
        "_ended",
        "_errors",
        "_initial_json",
        "_is_lost",
        "_jobs",
        "_last_published",
        "_outputs",
        "_queue",
        "_result",
        "_runs",
        "_scope",
        "_started",
        "_states",
        "_unblocked",
        "_waiting",
        "run_id",
        "workflow",
    )

    def __init__(
        self,
        runs: WorkflowRuns,
        workflow: Workflow,
        context: Mapping[str, Any] | None,
        run_id: str | None = None,
        restored: RunRecord | None = None,
    ) -> None:
        self.run_id = run_id or runs.new_run_id()
        self.workflow = workflow
        self._runs = runs
        # Checked once; a root step starts from the text as it is.
        self._initial_json = context_json(Context(context)) if context else "{}"
        self._states = dict.fromkeys(workflow.order, STEP_PENDING)
        self._jobs: dict[str, Job] = {}  # every step submitted
        # Steps READY with a job whose end the coordinator has not taken yet:
        # queued, running, retrying, or ended a moment ago.
        self._started: dict[str, Job] = {}
        self._queue: deque[str] = deque()  # READY steps not submitted yet, in run order
        # Each completed step's output, as JSON text (passed on and stored as it is).
        self._outputs: dict[str, str] = {}
        self._completions: dict[str, TaskCompletion] = {}
        self._errors: dict[str, BaseException | None] = {}
        self._last_published: tuple[int, ...] | None = None
        self._is_lost = False
        self._closed = False  # the executor refused a step with ExecutorClosed
        # Step jobs that have ended (with a store: durably), told by `_step_ended`.
        self._ended: list[Job] = []
        # The coordinator's task while it is parked waiting for a step to end (a
        # trio.Event per wait cost more than the wait itself).
        self._waiting: trio.lowlevel.Task | None = None
        self._scope = trio.CancelScope()
        self._done = trio.Event()
        self._result: WorkflowResult | None = None
        if restored is not None:
            # Completed steps keep their outputs and are not run again; failed and
            # skipped ones stay so; the rest (interrupted or not started) run.
            for sid, (state, output) in restored.steps.items():
                if sid not in self._states:
                    continue  # the workflow changed since: forget unknown steps
                step_state = StepState(state)
                if step_state is STEP_COMPLETED and output is not None:
                    json.loads(output)  # (a record that is not JSON fails here, as before)
                    self._outputs[sid] = output
                    self._states[sid] = step_state
                elif step_state in (STEP_FAILED, STEP_SKIPPED):
                    self._states[sid] = step_state
        # Kept as states change (`_set`), so neither publishing progress nor
        # finding the next steps scans the workflow.
        self._blocked = workflow.dependency_counts()  # dependencies not completed yet
        if restored is None:
            self._counts = count_states({})
            self._counts[STEP_PENDING] = len(self._states)
            self._unblocked = set(workflow.roots)
        else:
            self._counts = count_states(self._states)
            for sid, spec in workflow.steps.items():
                self._blocked[sid] = sum(
                    self._states[d] is not STEP_COMPLETED for d in spec.dependencies
                )
            self._unblocked = {  # PENDING steps whose dependencies have all completed
                sid
                for sid, n in self._blocked.items()
                if n == 0 and self._states[sid] is STEP_PENDING
            }

    # ------------------------------------------------------------------ public

    def status(self) -> WorkflowStatus:
        """The run's `WorkflowStatus` now. Never blocks."""
        ready_now, in_progress, deferred = self._progress()
        return summarize(self.run_id, self.workflow, self._counts, ready_now, in_progress, deferred)

    async def wait(self) -> WorkflowResult:
        """Wait until the run has ended; return its `WorkflowResult`. A checkpoint."""
        await self._done.wait()
        assert self._result is not None
        return self._result

    @property
    def result(self) -> WorkflowResult | None:
        """The result once the run has ended, else None."""
        return self._result

    def __repr__(self) -> str:
        return f"<WorkflowRun {self.workflow.name!r} {self.run_id}>"

    # ------------------------------------------------------------------ coordinator

    def _begin(self, nursery: trio.Nursery, resumed: bool) -> None:
        """Start the run's coordinator in ``nursery``, record the run (if new) and
        make its first steps ready for the coordinator."""
        nursery.start_soon(self._coordinate)
        self._runs.active[self.run_id] = self
        if not resumed:
            self._runs.log_created(self)
        self._advance()

    async def _coordinate(self) -> None:
        """Submit ready steps one after another, in the workflow's order, and take
        each step's end as it comes (``on_done`` wakes this task), until nothing
        is left to run. Cancelled (the executor's nursery, or `_lost`), it stops
        where it is; the steps' jobs are the executor's.
        """
        try:
            with self._scope:
                while True:
                    if self._ended:
                        self._collect()
                    if self._queue:
                        await self._submit(self._queue.popleft())
                    elif self._started:
                        self._waiting = trio.lowlevel.current_task()
                        await trio.lowlevel.wait_task_rescheduled(self._stop_waiting)
                    else:
                        break
        finally:
            self._finalize()
            self._runs.finished(self)

    def _step_ended(self, job: Job) -> None:
        """A step job's `on_done`: it has ended (durably), or the store failed."""
        self._ended.append(job)
        task = self._waiting
        if task is not None:
            self._waiting = None
            trio.lowlevel.reschedule(task)

    def _stop_waiting(self, _: object) -> trio.lowlevel.Abort:
        """The parked coordinator is cancelled (`_lost`, or the executor's nursery)."""
        self._waiting = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _advance(self) -> None:
        """Make the unblocked steps READY (queued for the coordinator to submit,
        in the workflow's order, so Trio's scheduling never decides which ready
        step starts first) and publish the progress."""
        unblocked = self._unblocked
        if unblocked and not self._closed:
            if len(unblocked) == 1:
                ready = list(unblocked)
            else:
                ready = sorted(unblocked, key=self.workflow.position)
            for sid in ready:
                self._set(sid, STEP_READY)
            self._queue.extend(ready)
        self._publish()

    async def _submit(self, sid: str) -> None:
        """Submit one READY step (may wait for space, under ``BLOCK``)."""
        step_input = merged_input_json(self.workflow, sid, self._initial_json, self._outputs)
        await trio.lowlevel.checkpoint_if_cancelled()  # (cancelled: no step submitted)
        steps = self._runs.steps
        try:
            # Accepted at once when it fits: no task switch per step (the loop
            # checkpoints as it waits for the steps' ends).
            job, accepted = steps.new_step(
                run_spec(self.workflow, sid, wrap_step),
                (step_input,),
                self.run_id,
                self._step_ended,
            )
            if not accepted:
                await steps.submit(job, internal=True)
        except ExecutorClosed:  # shut down before it started: the run is cut short
            self._closed = True
            self._set(sid, STEP_PENDING)
            while self._queue:
                self._set(self._queue.popleft(), STEP_PENDING)
        except TrioexecError as exc:  # refused (full): the step fails
            self._errors.setdefault(sid, exc)
            self._step_failed(sid)
            self._advance()
        else:
            self._jobs[sid] = self._started[sid] = job

    def _collect(self) -> None:
        """Take the end of every step job that has told it ended (and, with a
        store, that its end is durable); then make what that unblocked ready."""
        ended = []
        told, self._ended = self._ended, []
        for job in told:
            if job.pending_ack or not job.ended:
                # The store failed before this end was durable: as `TaskRef.wait`.
                assert job.owner.failure is not None
                raise job.owner.failure_error()
            if self._started.get(job.name) is job:  # (told once more after a failure)
                ended.append((job.name, job))
        if not ended:
            return
        for sid, job in ended:
            del self._started[sid]
            # The run keeps the job, so the job must not keep the run: without
            # this cycle a finished run is freed at once, not by the cyclic GC.
            job.on_done = None
            if job.status is COMPLETED:
                # (`wrap_step`'s function returned (value, output): the completion,
                # made here first, gets the value)
                assert job.completion is None
                job.result, self._outputs[sid] = job.result
                self._completions[sid] = job.make_completion()
                self._set(sid, STEP_COMPLETED)
            else:
                completion = self._completions[sid] = job.make_completion()
                self._errors.setdefault(sid, completion.error)
                self._step_failed(sid)
        self._advance()

    def _set(self, sid: str, state: StepState) -> None:
        old = self._states[sid]
        counts = self._counts
        counts[old] -= 1
        counts[state] += 1
        self._states[sid] = state
        if old is STEP_PENDING:
            self._unblocked.discard(sid)
        elif state is STEP_PENDING and not self._blocked[sid]:
            self._unblocked.add(sid)  # (back from READY: shut down before it started)
        if state is STEP_COMPLETED:
            for child in self.workflow.children(sid):
                self._blocked[child] -= 1
                if not self._blocked[child] and self._states[child] is STEP_PENDING:
                    self._unblocked.add(child)

    def _step_failed(self, sid: str) -> None:
        self._set(sid, STEP_FAILED)
        runs = self._runs
        job = self._jobs.get(sid)
        runs.log_step(self.run_id, sid, STEP_FAILED, None, job and job.task_id)
        for dependent in self.workflow.dependents(sid):
            if self._states[dependent] is STEP_PENDING:
                self._set(dependent, STEP_SKIPPED)
                runs.log_step(self.run_id, dependent, STEP_SKIPPED, None, None)

    def _lost(self) -> None:
        """Another executor has taken this run over: stop here, writing nothing more."""
        self._is_lost = True
        for job in self._jobs.values():
            job.owner.cancel(job)
        self._scope.cancel()

    def _progress(self) -> tuple[int, int, int]:
        """Steps ready (queued for a slot included), in progress, and deferred."""
        started = deferred = 0
        for job in self._started.values():
            # Started (running, deferred, or between retry attempts): in progress.
            if job.status is RUNNING:
                started += 1
                if job.handle is not None and job.handle.sub_status is DEFERRED:
                    deferred += 1
            elif job.attempts > 0:
                started += 1
        counts = self._counts
        ready_now = counts[STEP_READY] - started + len(self._unblocked)
        return ready_now, counts[STEP_RUNNING] + started, deferred

    def _publish(self) -> None:
        """Publish a ``workflow_progress`` event if the status has changed."""
        counts = self._counts
        # (With the run and its workflow, these decide every field of the status.)
        key = (*self._progress(), counts[STEP_COMPLETED], counts[STEP_FAILED], counts[STEP_SKIPPED])
        if key == self._last_published:
            return
        self._last_published = key
        # (its attributes are made only if the event is read: most are not)
        self._runs.events.publish(
            _PROGRESS,
            None,
            reason=progress_status(self.workflow, key),
            attributes=functools.partial(progress_attributes, self.run_id, self.workflow, *key),
        )

    def _finalize(self) -> None:
        completions = self._completions
        counts = self._counts
        order = self.workflow.order
        failed = counts[STEP_FAILED]
        finished = counts[STEP_COMPLETED] + failed + counts[STEP_SKIPPED] == len(order)
        if not finished or any(c.status is CANCELLED for c in completions.values()):
            run_status = RunStatus.CANCELLED
        elif failed:
            run_status = RunStatus.FAILED
        else:
            run_status = RunStatus.COMPLETED
        final: dict[str, Any] = load_json(self._initial_json)
        outputs = self._outputs
        for sid in order:
            if sid in outputs:
                final.update(load_json(outputs[sid]))
        errors = self._errors
        error = next((errors[sid] for sid in order if sid in errors), None) if errors else None
        self._result = WorkflowResult(
            run_id=self.run_id,
            workflow=self.workflow.name,
            status=run_status,
            context=final,
            steps={sid: completions[sid] for sid in order if sid in completions},
            error=error,
        )
        if finished and not self._is_lost:
            # A run cut short by a shutdown stays 'running' in the store, so that
            # recovery resumes it; one that ended is recorded as ended.
            self._runs.log_end(self.run_id, run_status)
        self._done.set()


def wrap_step(spec: TaskSpec) -> TaskSpec:
    """The spec a run submits for a step (`run_spec` keeps it with the workflow):
    its function wrapped to run each attempt on a fresh copy of the step's input
    (JSON text) and to return, with its value, the context it leaves as JSON text
    (the step's output, which the coordinator takes back out of the job's result).

    So a failed attempt's writes never reach the next attempt, siblings never
    share nested values, and a context that is no longer JSON fails the step
    (inside the attempt, where retries apply) instead of the coordinator. The
    wrapper holds nothing of a run.
    """
    fn = spec.fn

    if spec.is_async:

        async def run_async(input_json: str, **handle: Any) -> tuple[Any, str]:
            context = Context._trusted(load_json(input_json))
            result = await fn(context, **handle)
            return result, context_json(context)

        return attrs.evolve(spec, fn=run_async)

    def run_sync(input_json: str, **handle: Any) -> tuple[Any, str]:
        context = Context._trusted(load_json(input_json))
        result = fn(context, **handle)
        return result, context_json(context)

    return attrs.evolve(spec, fn=run_sync)


@final
class WorkflowRuns:
    """The workflow runs of one executor, started here or resumed by recovery;
    built on its core, and known to the parts only as their ``Runs`` protocols."""

    def __init__(self, workflows: dict[str, Workflow], steps: ExecutorCore) -> None:
        self.steps = steps
        self.events = steps.events
        self.wall = steps.wall
        self.active: dict[str, WorkflowRun] = {}
        self._workflows = workflows
        self._journal = steps.journal
        self._owner_id = steps.owner_id
        # Run ids: 32 hex digits, random per executor, then counted (a uuid4 per
        # run cost as much as a step's bookkeeping).
        self._id_prefix = uuid.uuid4().hex[:20]
        self._ids = itertools.count(1)

    def new_run_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids):012x}"

    @property
    def open(self) -> int:
        return len(self.active)

    async def start(
        self, workflow: Workflow, context: Mapping[str, Any] | None, run_id: str | None
    ) -> WorkflowRun:
        nursery = self.steps.workers.nursery
        if nursery is None:
            raise TypeError("workflows need an executor from open_executor")
        if run_id is not None:
            check_id("run_id", run_id)
            if run_id in self.active:
                raise ValueError(f"run id {run_id!r} is already running in this executor")
            journal = self._journal
            if journal is not None and journal.store.run(run_id) is not None:
                raise ValueError(f"run id {run_id!r} is already recorded in the store")
        # Exactly one schedule point, as `Executor.submit`: cancelled here, no run.
        await trio.lowlevel.checkpoint_if_cancelled()
        run = WorkflowRun(self, workflow, context, run_id)
        run._begin(nursery, resumed=False)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return run

    def names(self) -> list[str]:
        """The workflows recovery may resume runs of."""
        return list(self._workflows)

    def active_ids(self) -> list[str]:
        return list(self.active)

    def resume(self, record: RunRecord) -> None:
        """Resume a run recovery claimed."""
        nursery = self.steps.workers.nursery
        assert nursery is not None
        workflow = self._workflows[record.workflow]
        run = WorkflowRun(self, workflow, json.loads(record.context), record.run_id, record)
        run._begin(nursery, resumed=True)

    def finished(self, run: WorkflowRun) -> None:
        self.active.pop(run.run_id, None)
        self.steps.run_ended()

    # Journaled with a store (the changes of a run are guarded by our ownership of it).

    def log_created(self, run: WorkflowRun) -> None:
        if self._journal is not None:
            wf = run.workflow
            graph = json.dumps({sid: list(wf.steps[sid].dependencies) for sid in wf.order})
            created = (run.run_id, self._owner_id, wf.name, run._initial_json, self.wall(), graph)
            self._journal.append(RunCreated(created))

    def log_step(
        self, run_id: str, step_id: str, state: StepState, output: str | None, task_id: str | None
    ) -> None:
        if self._journal is not None:
            step = (run_id, self._owner_id, step_id, state, output, task_id)
            self._journal.append(StepRecorded(step))

    def log_end(self, run_id: str, status: RunStatus) -> None:
        if self._journal is not None:
            self._journal.append(RunEnded((run_id, self._owner_id, status, self.wall())))

    # ------------------------------------------------------------ told by the executor

    def step_changed(self, run_id: str) -> None:
        """A step started, deferred or resumed: its run may publish."""
        run = self.active.get(run_id)
        if run is not None:
            run._publish()

    def step_completed(self, job: Job) -> None:
        """Journal a completed step with its output (in its execution's batch)."""
        run = self.active.get(job.run_id or "")
        if run is not None:  # (`wrap_step`'s function returned (value, output))
            self.log_step(run.run_id, job.name, STEP_COMPLETED, job.result[1], job.task_id)

    def lost(self, run_ids: Iterable[str]) -> None:
        """Another executor has taken these runs over."""
        for run_id in run_ids:
            run = self.active.get(run_id)
            if run is not None:
                run._lost()
