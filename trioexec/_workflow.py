"""Workflows: a DAG of `TaskSpec` steps, the `Context` that flows along it, and the
pure functions (readiness, status) the coordinator is built on.

The coordinator itself lives in ``_coordinator.py``; nothing here awaits.
"""

from __future__ import annotations

import enum
import graphlib
import heapq
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Any, final

import attrs

from ._errors import WorkflowError
from ._records import check_id
from ._spec import TaskSpec


class StepState(enum.StrEnum):
    """Where one step of a run is."""

    PENDING = "pending"  #: dependencies not complete yet
    READY = "ready"  #: dependencies complete; submitted or about to be (may wait for a slot)
    RUNNING = "running"  #: started (active or deferred)
    COMPLETED = "completed"
    FAILED = "failed"  #: failed after its retries (or timed out, or was cancelled)
    SKIPPED = "skipped"  #: a dependency failed, so it will not run


class RunProgress(enum.StrEnum):
    """What a workflow run as a whole is doing now (`WorkflowStatus.execution_status`),
    derived in this order of precedence. Not an execution's status: that is a
    `TaskStatus` (`ExecutionRecord.status`)."""

    READY_STEPS_AVAILABLE = "ready_steps_available"
    STEPS_IN_PROGRESS = "steps_in_progress"
    BLOCKED_BY_FAILURES = "blocked_by_failures"
    COMPLETE = "complete"
    AWAITING_DEPENDENCIES = "awaiting_dependencies"


# The members as module constants, for the hot path (see `trioexec._records.RUNNING`).
STEP_PENDING, STEP_READY, STEP_RUNNING, STEP_COMPLETED, STEP_FAILED, STEP_SKIPPED = StepState
_READY_STEPS, _IN_PROGRESS, _BLOCKED, _COMPLETE, _AWAITING = RunProgress

#: The name `RunProgress` had first (API §5, kept: it reads as an execution's status,
#: which is a `TaskStatus`).
ExecutionStatus = RunProgress


class RunStatus(enum.StrEnum):
    """How a run ended (or that it has not yet)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


_RECOMMENDED = {
    RunProgress.READY_STEPS_AVAILABLE: "execute_ready_steps",
    RunProgress.STEPS_IN_PROGRESS: "wait_for_completion",
    RunProgress.BLOCKED_BY_FAILURES: "handle_failures",
    RunProgress.COMPLETE: "finalize_run",
    RunProgress.AWAITING_DEPENDENCIES: "wait_for_dependencies",
}

_STEP_STATES = tuple(StepState)


@final
class Workflow:
    """A named DAG of steps, validated when it is made.

    Args:
      name: the workflow's name (also what recovery matches persisted runs by).
      specs: the steps, `TaskSpec` values made with `task`; their
        ``dependencies`` name other steps of this workflow.

    Raises:
      WorkflowError: for an empty workflow, a duplicate step id, a dependency on
        an unknown step, or a cycle (the message shows the cycle's path).

    Example::

        wf = Workflow("etl", [fetch, wait_for_data, transform, load])
    """

    __slots__ = (
        "_children",
        "_dependency_counts",
        "_order",
        "_position",
        "_roots",
        "_run_specs",
        "_specs",
        "name",
    )

    def __init__(self, name: str, specs: Iterable[TaskSpec]) -> None:
        if not isinstance(name, str) or not name:
            raise WorkflowError(f"a workflow needs a non-empty name, got {name!r}")
        try:
            check_id("workflow name", name)
        except ValueError as exc:
            raise WorkflowError(str(exc)) from None
        self.name = name
        steps: dict[str, TaskSpec] = {}
        for spec in specs:
            if not isinstance(spec, TaskSpec):
                raise WorkflowError(
                    f"workflow {name!r}: steps must be TaskSpecs made with @task, got {spec!r}"
                )
            if spec.id in steps:
                raise WorkflowError(f"workflow {name!r}: duplicate step id {spec.id!r}")
            steps[spec.id] = spec
        if not steps:
            raise WorkflowError(f"workflow {name!r} is empty: it needs at least one step")
        for spec in steps.values():
            for dep in spec.dependencies:
                if dep not in steps:
                    raise WorkflowError(
                        f"workflow {name!r}: step {spec.id!r} depends on unknown step {dep!r}"
                    )
        self._specs = steps
        self._order = _topological_order(name, steps)
        self._position = {sid: i for i, sid in enumerate(self._order)}
        children: dict[str, list[str]] = {sid: [] for sid in self._order}
        for sid in self._order:
            for dep in steps[sid].dependencies:
                children[dep].append(sid)
        self._children = {sid: tuple(c) for sid, c in children.items()}
        self._dependency_counts = {sid: len(steps[sid].dependencies) for sid in self._order}
        self._roots = tuple(sid for sid in self._order if not steps[sid].dependencies)
        # `run_spec`'s cache: each step's spec as the coordinator wraps it.
        self._run_specs: dict[str, TaskSpec] = {}

    @property
    def steps(self) -> Mapping[str, TaskSpec]:
        """Step id -> spec, in the order given."""
        return self._specs

    @property
    def order(self) -> tuple[str, ...]:
        """The step ids in a topological order (dependencies first, ties as given)."""
        return self._order

    def children(self, step_id: str) -> tuple[str, ...]:
        """The steps that depend on ``step_id`` directly, in run order."""
        return self._children[step_id]

    @property
    def roots(self) -> tuple[str, ...]:
        """The steps without dependencies, in run order."""
        return self._roots

    def dependency_counts(self) -> dict[str, int]:
        """Step id -> how many dependencies it has, in run order (a fresh dict: a
        run counts them down as its steps complete)."""
        return dict(self._dependency_counts)

    def position(self, step_id: str) -> int:
        """Where ``step_id`` is in `order`."""
        return self._position[step_id]

    def dependents(self, step_id: str) -> list[str]:
        """Every step that depends on ``step_id``, directly or not."""
        out: list[str] = []
        seen = {step_id}
        frontier = [step_id]
        while frontier:
            current = frontier.pop()
            for sid, spec in self._specs.items():
                if current in spec.dependencies and sid not in seen:
                    seen.add(sid)
                    out.append(sid)
                    frontier.append(sid)
        return out

    def __repr__(self) -> str:
        return f"<Workflow {self.name!r}: {' -> '.join(self._order)}>"


def _topological_order(name: str, steps: Mapping[str, TaskSpec]) -> tuple[str, ...]:
    """The run order (dependencies first, ties broken by the order the steps were
    given in), or a `WorkflowError` showing the first cycle found."""
    # graphlib reports a cycle as a path found depth-first from the nodes in the
    # order they were added: with an edge from each step to its dependencies, it
    # reads "a needs b needs c needs a", from the steps in the order given.
    needs: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for sid in steps:
        needs.add(sid)
    for sid, spec in steps.items():
        for dep in spec.dependencies:
            needs.add(dep, sid)
    try:
        needs.prepare()
    except graphlib.CycleError as exc:
        cycle: list[str] = exc.args[1]
        raise WorkflowError(f"workflow {name!r} has a cycle: {' -> '.join(cycle)}") from None

    sorter = graphlib.TopologicalSorter({sid: spec.dependencies for sid, spec in steps.items()})
    sorter.prepare()
    position = {sid: i for i, sid in enumerate(steps)}
    ready: list[tuple[int, str]] = []
    order: list[str] = []
    while sorter.is_active():
        for sid in sorter.get_ready():
            heapq.heappush(ready, (position[sid], sid))
        _, sid = heapq.heappop(ready)
        order.append(sid)
        sorter.done(sid)
    return tuple(order)


def _check_json(key: str, value: object) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"context[{key!r}] must be JSON-serialisable, got {type(value).__name__}: {exc}"
        ) from None


@final
class Context(MutableMapping[str, Any]):
    """The mapping a step reads its inputs from and writes its outputs to.

    Values must be JSON-serialisable (a bad value raises `TypeError` at the
    write, naming the key). A step sees the merge of its dependencies' contexts
    (for a key two dependencies both set, the one listed later in the step's
    ``dependencies`` wins); what it writes flows to its dependents.
    """

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = {}
        if data:
            self.update(data)  # (each value checked by `__setitem__`)

    @classmethod
    def _trusted(cls, data: dict[str, Any]) -> Context:
        """Wrap ``data`` (already JSON, e.g. just decoded) without checking it again."""
        context = cls.__new__(cls)
        context._data = data
        return context

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"context keys must be strings, got {key!r}")
        _check_json(key, value)
        self._data[key] = value

    def __delitem__(self, key: str) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def to_dict(self) -> dict[str, Any]:
        """A plain copy, detached from this context.

        Raises:
          TypeError: naming the key, if a value was made non-JSON in place
            (``context["items"].append({1})``), which the write check cannot see.
        """
        return json.loads(context_json(self))  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"Context({self._data!r})"


def context_json(context: Context) -> str:
    """``context`` as JSON text (what a run passes along and stores); raises
    TypeError as `Context.to_dict` does."""
    data = context._data
    try:
        return json.dumps(data)
    except (TypeError, ValueError):
        for key, value in data.items():
            _check_json(key, value)
        raise


# The default decoder's scanner, without the layers of `json.loads` around it
# (they cost twice the scan of a small context); every JSONDecoder has had it
# since Python 2.6 (typeshed leaves it out).
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def load_json(text: str) -> Any:
    """``json.loads(text)``, faster for text `context_json` wrote (nothing around
    the value); any other text, or a bad one, goes through `json.loads` (the same
    value, or the same error)."""
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def run_spec(workflow: Workflow, step_id: str, wrap: Callable[[TaskSpec], TaskSpec]) -> TaskSpec:
    """The spec a run submits for ``step_id``: ``wrap(spec)``, made once per step
    of ``workflow`` and kept with it (so what ``wrap`` makes must hold nothing of
    one run)."""
    specs = workflow._run_specs
    spec = specs.get(step_id)
    if spec is None:
        spec = specs[step_id] = wrap(workflow._specs[step_id])
    return spec


def merged_input_json(
    workflow: Workflow, step_id: str, initial: str, outputs: Mapping[str, str]
) -> str:
    """What ``step_id`` starts from, as JSON text: the run's initial context for a
    root step, that step's output as it is for a step with one dependency, else
    its dependencies' outputs merged in ``dependencies`` order."""
    deps = workflow.steps[step_id].dependencies
    if not deps:
        return initial
    if len(deps) == 1:
        return outputs[deps[0]]
    merged: dict[str, Any] = {}
    for dep in deps:
        merged.update(load_json(outputs[dep]))
    return json.dumps(merged)


def ready(workflow: Workflow, states: Mapping[str, StepState]) -> list[str]:
    """Steps that can start now: PENDING, with every dependency COMPLETED."""
    return [
        sid
        for sid in workflow.order
        if states[sid] is STEP_PENDING
        and all(states[d] is STEP_COMPLETED for d in workflow.steps[sid].dependencies)
    ]


@attrs.frozen(kw_only=True)
class WorkflowStatus:
    """A run's progress, as published in ``workflow_progress`` events."""

    run_id: str
    workflow: str
    execution_status: RunProgress
    health_status: str  #: "healthy", "degraded" (a failure, others still going), "blocked"
    total_steps: int
    completed_steps: int
    ready_steps: int  #: dependencies complete, not started (queued for a slot included)
    in_progress_steps: int  #: started and not finished (deferred ones included)
    deferred_steps: int
    failed_steps: int
    skipped_steps: int
    completion_percentage: float  #: completed steps over all steps, from 0 to 100
    recommended_action: str

    def as_attributes(self) -> dict[str, Any]:
        """The fields as a plain dict (what a ``workflow_progress`` event carries)."""
        return {**attrs.asdict(self), "execution_status": self.execution_status.value}


def count_states(states: Mapping[str, StepState]) -> dict[StepState, int]:
    """How many steps are in each state (every state present)."""
    counts = dict.fromkeys(_STEP_STATES, 0)  # (iterating the enum itself is slow)
    for state in states.values():
        counts[state] += 1
    return counts


def status(
    run_id: str, workflow: Workflow, states: Mapping[str, StepState], deferred: int = 0
) -> WorkflowStatus:
    """Derive a run's `WorkflowStatus` from its step states (pure); its
    ``execution_status`` is the first that applies, in `RunProgress`'s order."""
    counts = count_states(states)
    ready_now = counts[STEP_READY]
    if counts[STEP_PENDING]:
        ready_now += len(ready(workflow, states))
    return summarize(run_id, workflow, counts, ready_now, counts[STEP_RUNNING], deferred)


def summarize(
    run_id: str,
    workflow: Workflow,
    counts: Mapping[StepState, int],
    ready_now: int,
    in_progress: int,
    deferred: int,
) -> WorkflowStatus:
    """The `WorkflowStatus` of a run with ``counts`` steps in each state, of
    which ``ready_now`` can start (or wait for a slot) and ``in_progress`` have
    started (`status` derives them from the states; a running run keeps them
    as its steps change)."""
    ended = (counts[STEP_COMPLETED], counts[STEP_FAILED], counts[STEP_SKIPPED])
    attributes = progress_attributes(run_id, workflow, ready_now, in_progress, deferred, *ended)
    attributes["execution_status"] = RunProgress(attributes["execution_status"])
    return WorkflowStatus(**attributes)


def progress_attributes(
    run_id: str,
    workflow: Workflow,
    ready_now: int,
    in_progress: int,
    deferred: int,
    completed: int,
    failed: int,
    skipped: int,
) -> dict[str, Any]:
    """``summarize(...).as_attributes()`` of a run with these numbers of steps,
    without making the `WorkflowStatus` (what a ``workflow_progress`` event
    carries; a run publishes a few per step)."""
    total = len(workflow._order)
    execution, health = _judge(total, ready_now, in_progress, completed, failed, skipped)
    return {
        "run_id": run_id,
        "workflow": workflow.name,
        "execution_status": _VALUE[execution],
        "health_status": health,
        "total_steps": total,
        "completed_steps": completed,
        "ready_steps": ready_now,
        "in_progress_steps": in_progress,
        "deferred_steps": deferred,
        "failed_steps": failed,
        "skipped_steps": skipped,
        "completion_percentage": round(100.0 * completed / total, 2),
        "recommended_action": _RECOMMENDED[execution],
    }


def progress_status(workflow: Workflow, counts: tuple[int, int, int, int, int, int]) -> str:
    """``progress_attributes(run_id, workflow, *counts)["execution_status"]``, alone."""
    ready_now, in_progress, _, completed, failed, skipped = counts
    total = len(workflow._order)
    return _VALUE[_judge(total, ready_now, in_progress, completed, failed, skipped)[0]]


_VALUE = {status: status.value for status in RunProgress}


def _judge(
    total: int, ready_now: int, in_progress: int, completed: int, failed: int, skipped: int
) -> tuple[RunProgress, str]:
    """A run's execution status (the first that applies) and health."""
    if ready_now:
        execution = _READY_STEPS
    elif in_progress:
        execution = _IN_PROGRESS
    elif failed:
        return _BLOCKED, "blocked"
    elif completed + failed + skipped == total:
        execution = _COMPLETE
    else:
        execution = _AWAITING
    return execution, "degraded" if failed else "healthy"
