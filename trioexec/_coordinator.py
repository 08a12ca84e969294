"""The workflow coordinator: submits each step through the executor's slots as
soon as its dependencies are complete, passes contexts along, and finalizes the run.

One coordinator task per run, a child of the executor's nursery; one small task
per step in flight, which submits the step and waits for its completion.
`WorkflowRuns` keeps an executor's runs: it starts and resumes them, journals
their changes, and is what the executor's lifecycle and recovery tell about
steps and runs (built on the executor's parts, which never import it).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, final

import attrs
import trio

from ._errors import ExecutorClosed, TrioexecError
from ._events import EventStream, HealthEventKind
from ._records import SubStatus, TaskCompletion, TaskStatus, check_id
from ._spec import TaskSpec
from ._store import RunRecord
from ._taskref import Job, TaskRef
from ._workflow import (
    Context,
    RunStatus,
    StepState,
    Workflow,
    WorkflowStatus,
    count_states,
    is_finished,
    merged_input,
    summarize,
)

if TYPE_CHECKING:
    from ._journal import Journal
    from ._store import Change


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


@final
class WorkflowRun:
    """A run of a `Workflow` in an executor (from `Executor.start_workflow`)."""

    def __init__(
        self,
        runs: WorkflowRuns,
        workflow: Workflow,
        context: Mapping[str, Any] | None,
        run_id: str | None = None,
        restored: RunRecord | None = None,
    ) -> None:
        self.run_id = run_id or uuid.uuid4().hex
        self.workflow = workflow
        self._runs = runs
        self._initial = Context(context).to_dict()
        self._states = dict.fromkeys(workflow.order, StepState.PENDING)
        self._resumed = restored is not None
        self._jobs: dict[str, Job] = {}  # every step submitted
        self._started: dict[str, Job] = {}  # steps READY with a job: queued, running, retrying
        self._outputs: dict[str, dict[str, Any]] = {}
        self._completions: dict[str, TaskCompletion] = {}
        self._errors: dict[str, BaseException | None] = {}
        self._attempt_outputs: dict[str, dict[str, Any]] = {}  # set by a successful attempt
        self._last_published: WorkflowStatus | None = None
        self._is_lost = False
        self._nursery: trio.Nursery | None = None
        self._last_turn: trio.Event | None = None  # set once the last step is submitted
        self._done = trio.Event()
        self._result: WorkflowResult | None = None
        if restored is not None:
            # Completed steps keep their outputs and are not run again; failed and
            # skipped ones stay so; the rest (interrupted or not started) run.
            for sid, (state, output) in restored.steps.items():
                if sid not in self._states:
                    continue  # the workflow changed since: forget unknown steps
                step_state = StepState(state)
                if step_state is StepState.COMPLETED and output is not None:
                    self._outputs[sid] = json.loads(output)
                    self._states[sid] = step_state
                elif step_state in (StepState.FAILED, StepState.SKIPPED):
                    self._states[sid] = step_state
        # Kept as states change (`_set`), so neither publishing progress nor
        # finding the next steps scans the workflow.
        self._counts = count_states(self._states)
        self._blocked = {  # dependencies not completed yet
            sid: sum(self._states[d] is not StepState.COMPLETED for d in spec.dependencies)
            for sid, spec in workflow.steps.items()
        }
        self._unblocked = {  # PENDING steps whose dependencies have all completed
            sid
            for sid, n in self._blocked.items()
            if n == 0 and self._states[sid] is StepState.PENDING
        }

    # ------------------------------------------------------------------ public

    def status(self) -> WorkflowStatus:
        """The run's `WorkflowStatus` now. Never blocks."""
        counts = self._counts
        started = deferred = 0
        for job in self._started.values():
            # Started (running, deferred, or between retry attempts): in progress.
            if job.status is TaskStatus.RUNNING:
                started += 1
                if job.handle is not None and job.handle.sub_status is SubStatus.DEFERRED:
                    deferred += 1
            elif job.attempts > 0:
                started += 1
        ready_now = counts[StepState.READY] - started + len(self._unblocked)
        in_progress = counts[StepState.RUNNING] + started
        return summarize(self.run_id, self.workflow, counts, ready_now, in_progress, deferred)

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

    async def _coordinate(
        self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if not self._resumed:
            self._runs.log(("run", self.run_id, 0, self.workflow.name, json.dumps(self._initial)))
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                self._advance()
        finally:
            self._finalize()
            self._runs.finished(self)

    def _advance(self) -> None:
        assert self._nursery is not None
        for sid in sorted(self._unblocked, key=self.workflow.position):
            self._set(sid, StepState.READY)
            # Steps submit one after another, in the workflow's order (each waits
            # for the one before it to be submitted): Trio's scheduling order
            # never decides which ready step starts first.
            turn, self._last_turn = self._last_turn, trio.Event()
            self._nursery.start_soon(
                self._run_step, sid, turn, self._last_turn, name=f"{self.workflow.name}.{sid}"
            )
        self._publish()

    def _step_spec(self, sid: str) -> TaskSpec:
        """The step's spec with a function that runs each attempt on a fresh copy of
        the step's input and keeps the context it leaves as the step's output.

        So a failed attempt's writes never reach the next attempt, siblings never
        share nested values, and a context that is no longer JSON fails the step
        (inside the attempt, where retries apply) instead of the coordinator.
        """
        spec = self.workflow.steps[sid]
        fn = spec.fn
        outputs = self._attempt_outputs

        if spec.is_async:

            async def run_async(input_json: str, **handle: Any) -> Any:
                context = Context._trusted(json.loads(input_json))
                result = await fn(context, **handle)
                outputs[sid] = context.to_dict()
                return result

            return attrs.evolve(spec, fn=run_async)

        def run_sync(input_json: str, **handle: Any) -> Any:
            context = Context._trusted(json.loads(input_json))
            result = fn(context, **handle)
            outputs[sid] = context.to_dict()
            return result

        return attrs.evolve(spec, fn=run_sync)

    async def _run_step(self, sid: str, turn: trio.Event | None, submitted: trio.Event) -> None:
        try:
            if turn is not None:
                await turn.wait()
            step_input = json.dumps(merged_input(self.workflow, sid, self._initial, self._outputs))
            job = await self._runs.submit_step(self._step_spec(sid), (step_input,), self.run_id)
        except ExecutorClosed:  # shut down before it started: the run is cut short
            self._set(sid, StepState.PENDING)
            return
        except TrioexecError as exc:  # refused (full): the step fails
            self._errors.setdefault(sid, exc)
            self._step_failed(sid)
            return
        finally:
            submitted.set()
        self._jobs[sid] = self._started[sid] = job
        try:
            completion = await TaskRef(job).wait()
        finally:
            del self._started[sid]
        self._completions[sid] = completion
        if completion.ok:
            self._outputs[sid] = self._attempt_outputs.pop(sid)
            self._set(sid, StepState.COMPLETED)
            self._advance()
        else:
            self._errors.setdefault(sid, completion.error)
            self._step_failed(sid)

    def _record_completed_step(self, job: Job) -> None:
        """Journal a step's completion with its output (in the same batch as the
        step execution's own completion)."""
        sid = job.name
        output = self._attempt_outputs.get(sid)
        if output is not None:
            self._runs.log(
                ("step", self.run_id, 0, sid, StepState.COMPLETED, json.dumps(output), job.task_id)
            )

    def _set(self, sid: str, state: StepState) -> None:
        old = self._states[sid]
        counts = self._counts
        counts[old] -= 1
        counts[state] += 1
        self._states[sid] = state
        if old is StepState.PENDING:
            self._unblocked.discard(sid)
        elif state is StepState.PENDING and not self._blocked[sid]:
            self._unblocked.add(sid)  # (back from READY: shut down before it started)
        if state is StepState.COMPLETED:
            for child in self.workflow.children(sid):
                self._blocked[child] -= 1
                if not self._blocked[child] and self._states[child] is StepState.PENDING:
                    self._unblocked.add(child)

    def _step_failed(self, sid: str) -> None:
        self._set(sid, StepState.FAILED)
        job = self._jobs.get(sid)
        self._runs.log(("step", self.run_id, 0, sid, StepState.FAILED, None, job and job.task_id))
        for dependent in self.workflow.dependents(sid):
            if self._states[dependent] is StepState.PENDING:
                self._set(dependent, StepState.SKIPPED)
                self._runs.log(("step", self.run_id, 0, dependent, StepState.SKIPPED, None, None))
        self._advance()

    def _lost(self) -> None:
        """Another executor has taken this run over: stop coordinating it here,
        and write nothing more of it."""
        self._is_lost = True
        for job in self._jobs.values():
            job.owner.cancel(job)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _publish(self) -> None:
        """Publish a ``workflow_progress`` event if the status has changed."""
        st = self.status()
        if st == self._last_published:
            return
        self._last_published = st
        self._runs.events.publish(
            HealthEventKind.WORKFLOW_PROGRESS,
            None,
            reason=st.execution_status.value,
            attributes=st.as_attributes(),
        )

    def _finalize(self) -> None:
        completions = self._completions
        if not is_finished(self._states) or any(
            c.status is TaskStatus.CANCELLED for c in completions.values()
        ):
            run_status = RunStatus.CANCELLED
        elif any(state is StepState.FAILED for state in self._states.values()):
            run_status = RunStatus.FAILED
        else:
            run_status = RunStatus.COMPLETED
        final: dict[str, Any] = dict(self._initial)
        for sid in self.workflow.order:
            if sid in self._outputs:
                final.update(self._outputs[sid])
        error = next(
            (self._errors[sid] for sid in self.workflow.order if sid in self._errors), None
        )
        self._result = WorkflowResult(
            run_id=self.run_id,
            workflow=self.workflow.name,
            status=run_status,
            context=final,
            steps={sid: completions[sid] for sid in self.workflow.order if sid in completions},
            error=error,
        )
        if not self._is_lost and (
            run_status is not RunStatus.CANCELLED or is_finished(self._states)
        ):
            # A run cut short by a shutdown stays 'running' in the store, so that
            # recovery resumes it; one that ended is recorded as ended.
            self._runs.log(("run_end", self.run_id, 0, run_status, self._runs.wall()))
        self._done.set()


@final
class WorkflowRuns:
    """The workflow runs of one executor: started here or resumed by recovery.

    Built on the executor's parts through what it is handed (a step submitter,
    the journal, the event stream); the parts know it only as their ``Runs``
    protocols.
    """

    def __init__(
        self,
        workflows: dict[str, Workflow],
        submit_step: Callable[[TaskSpec, tuple[Any, ...], str], Awaitable[Job]],
        journal: Journal | None,
        events: EventStream,
        wall: Callable[[], float],
        owner_id: str,
        idle_changed: Callable[[], None],
    ) -> None:
        self.submit_step = submit_step
        self.events = events
        self.wall = wall
        self.active: dict[str, WorkflowRun] = {}
        self.nursery: trio.Nursery | None = None  # (coordinators run here once set)
        self._workflows = workflows
        self._journal = journal
        self._owner_id = owner_id
        self._idle_changed = idle_changed

    @property
    def open(self) -> int:
        """Runs not finished."""
        return len(self.active)

    async def start(
        self, workflow: Workflow, context: Mapping[str, Any] | None, run_id: str | None
    ) -> WorkflowRun:
        if self.nursery is None:
            raise TypeError("workflows need an executor from open_executor")
        if run_id is not None:
            check_id("run_id", run_id)
            if run_id in self.active:
                raise ValueError(f"run id {run_id!r} is already running in this executor")
            journal = self._journal
            if journal is not None and journal.store.run(run_id) is not None:
                raise ValueError(f"run id {run_id!r} is already recorded in the store")
        run = WorkflowRun(self, workflow, context, run_id)
        self.active[run.run_id] = run
        await self.nursery.start(run._coordinate)
        return run

    def names(self) -> list[str]:
        """The workflows recovery may resume runs of."""
        return list(self._workflows)

    def active_ids(self) -> list[str]:
        return list(self.active)

    def resume(self, record: RunRecord) -> None:
        """Resume a run recovery claimed."""
        assert self.nursery is not None
        workflow = self._workflows[record.workflow]
        run = WorkflowRun(self, workflow, json.loads(record.context), record.run_id, record)
        self.active[run.run_id] = run
        self.nursery.start_soon(run._coordinate)

    def finished(self, run: WorkflowRun) -> None:
        self.active.pop(run.run_id, None)
        self._idle_changed()

    def log(self, change: Change) -> None:
        """Journal a run's change (with a store). A 'run' change gets its owner and
        creation time here; the others are guarded by our ownership of the run."""
        journal = self._journal
        if journal is None:
            return
        if change[0] == "run":
            change = (*change, self._owner_id, self.wall())
        else:
            change = (change[0], change[1], self._owner_id, *change[3:])
        journal.append(change)

    # ------------------------------------------------------------ told by the executor

    def step_changed(self, run_id: str) -> None:
        """A step started, deferred or resumed: its run may publish."""
        run = self.active.get(run_id)
        if run is not None:
            run._publish()

    def step_completed(self, job: Job) -> None:
        run = self.active.get(job.run_id or "")
        if run is not None:
            run._record_completed_step(job)

    def lost(self, run_ids: Iterable[str]) -> None:
        """Another executor has taken these runs over."""
        for run_id in run_ids:
            run = self.active.get(run_id)
            if run is not None:
                run._lost()
