"""Hypothesis: random DAGs run through the coordinator (fresh MockClock per example),
and the pure `status()` / `ready()` functions over random step states."""

from __future__ import annotations

import itertools

import attrs
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from trioexec import (
    Backoff,
    Context,
    ExecutionStatus,
    PermanentError,
    RunStatus,
    StepState,
    TaskHandle,
    TaskStatus,
    Workflow,
    WorkflowError,
    open_executor,
    task,
)
from trioexec._workflow import ready, status


@attrs.frozen
class StepPlan:
    deps: tuple[int, ...]  # indices of earlier steps: the graph is acyclic by construction
    work: int  # virtual seconds before the deferral
    defer_at: int | None  # defer until this virtual time (None: no deferral)
    poll: float | Backoff
    after: int  # virtual seconds after resuming
    fails: bool = False


@st.composite
def plans(draw, *, failures: bool = False) -> list[StepPlan]:
    n = draw(st.integers(1, 8))
    out = []
    for i in range(n):
        deps = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=3)) if i else []
        out.append(
            StepPlan(
                deps=tuple(deps),
                work=draw(st.integers(0, 3)),
                defer_at=draw(st.none() | st.integers(0, 12)),
                poll=draw(st.sampled_from([0.5, 1.0, Backoff(initial=0.5, factor=2, max=4)])),
                after=draw(st.integers(0, 2)),
                fails=failures and draw(st.integers(0, 3)) == 0,
            )
        )
    return out


def ancestors(plan: list[StepPlan], i: int) -> set[int]:
    out: set[int] = set()
    frontier = list(plan[i].deps)
    while frontier:
        j = frontier.pop()
        if j not in out:
            out.add(j)
            frontier.extend(plan[j].deps)
    return out


class Meter:
    """Steps running non-deferred code now, checked against the slot bound."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)
        assert self.now <= self.bound


async def run_plan(plan: list[StepPlan], slots: int, listing: list[int]) -> None:
    t0 = trio.current_time()
    meter = Meter(slots)
    seq = iter(range(10**6))  # a total order of starts and ends, ties in time included
    starts: dict[int, tuple[int, float]] = {}
    ends: dict[int, tuple[int, float]] = {}
    runs = dict.fromkeys(range(len(plan)), 0)
    inputs: dict[int, dict] = {}
    errors: dict[int, PermanentError] = {}

    def make(i: int, p: StepPlan):
        async def body(context: Context, handle: TaskHandle) -> int:
            runs[i] += 1
            starts[i] = (next(seq), trio.current_time() - t0)
            inputs[i] = context.to_dict()
            meter.enter()
            try:
                await trio.sleep(p.work)
                if p.defer_at is not None:
                    meter.now -= 1
                    try:
                        await handle.defer_until(
                            lambda: trio.current_time() - t0 >= p.defer_at,
                            poll_interval=p.poll,
                        )
                    finally:
                        meter.enter()
                    assert handle.slot.is_held
                await trio.sleep(p.after)
                if p.fails:
                    errors[i] = PermanentError(f"s{i}")
                    raise errors[i]
                context[f"s{i}"] = i
                return i
            finally:
                meter.now -= 1
                ends[i] = (next(seq), trio.current_time() - t0)

        return task(id=f"s{i}", dependencies=[f"s{d}" for d in p.deps])(body)

    wf = Workflow("random", [make(i, plan[i]) for i in listing])
    async with open_executor(max_concurrent_tasks=slots) as ex:
        run = await ex.start_workflow(wf, context={"init": True})
        result = await run.wait()
        assert ex.slots.in_use == 0

    n = len(plan)
    blocked = {i for i in range(n) if any(plan[j].fails for j in ancestors(plan, i))}
    ran = set(range(n)) - blocked
    completed = {i for i in ran if not plan[i].fails}
    failed = ran - completed

    # Every step that could run ran exactly once; the others never ran.
    assert runs == {i: int(i in ran) for i in range(n)}
    assert set(result.steps) == {f"s{i}" for i in ran}
    for i in ran:
        c = result.steps[f"s{i}"]
        assert c.status is (TaskStatus.FAILED if plan[i].fails else TaskStatus.COMPLETED)
        assert c.attempts == 1
        # ... only after all of its dependencies had completed ...
        for d in plan[i].deps:
            assert ends[d][0] < starts[i][0]
            assert ends[d][1] <= starts[i][1]
        # ... seeing exactly its ancestors' writes (and the initial context).
        assert inputs[i] == {"init": True, **{f"s{j}": j for j in ancestors(plan, i)}}
    # The slot bound held throughout.
    assert meter.peak <= slots
    assert meter.now == 0
    # The final context holds every completed step's write.
    assert result.context == {"init": True, **{f"s{i}": i for i in completed}}

    st_ = run.status()
    assert (st_.completed_steps, st_.failed_steps, st_.skipped_steps) == (
        len(completed),
        len(failed),
        len(blocked),
    )
    assert st_.ready_steps == st_.in_progress_steps == st_.deferred_steps == 0
    if failed:
        assert result.status is RunStatus.FAILED
        first = next(int(sid[1:]) for sid in wf.order if int(sid[1:]) in failed)
        assert result.error is errors[first]
        assert st_.execution_status is ExecutionStatus.BLOCKED_BY_FAILURES
    else:
        assert result.ok
        assert result.error is None
        assert st_.execution_status is ExecutionStatus.COMPLETE
        assert st_.completion_percentage == 100.0
    m = ex.statistics()
    event(f"deferrals that released a slot: {'2+' if m.deferral_count >= 2 else m.deferral_count}")
    event(f"peak running steps: {meter.peak}")
    assert m.deferral_count == m.resumed_count
    assert (m.completed_count, m.failed_count) == (len(completed), len(failed))
    assert (m.active_count, m.deferred_count, m.queue_depth) == (0, 0, 0)


def _run(plan, slots, data) -> None:
    listing = data.draw(st.permutations(range(len(plan))), label="listing order")
    trio.run(run_plan, plan, slots, listing, clock=trio.testing.MockClock(autojump_threshold=0))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans(), slots=st.integers(1, 4), data=st.data())
def test_random_dag_runs_every_step_once_in_dependency_order_within_slots(plan, slots, data):
    _run(plan, slots, data)


@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans(failures=True), slots=st.integers(1, 4), data=st.data())
def test_random_dag_with_failures_skips_exactly_the_failed_steps_descendants(plan, slots, data):
    _run(plan, slots, data)


# ---------------------------------------------------------------- pure status()

_PRECEDENCE = [
    ExecutionStatus.READY_STEPS_AVAILABLE,
    ExecutionStatus.STEPS_IN_PROGRESS,
    ExecutionStatus.BLOCKED_BY_FAILURES,
    ExecutionStatus.COMPLETE,
    ExecutionStatus.AWAITING_DEPENDENCIES,
]
_ACTIONS = {
    ExecutionStatus.READY_STEPS_AVAILABLE: "execute_ready_steps",
    ExecutionStatus.STEPS_IN_PROGRESS: "wait_for_completion",
    ExecutionStatus.BLOCKED_BY_FAILURES: "handle_failures",
    ExecutionStatus.COMPLETE: "finalize_run",
    ExecutionStatus.AWAITING_DEPENDENCIES: "wait_for_dependencies",
}


async def _noop(context: Context) -> None:
    await trio.lowlevel.checkpoint()


@st.composite
def workflows_and_states(draw):
    n = draw(st.integers(1, 10))
    specs = []
    for i in range(n):
        deps = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=3)) if i else []
        specs.append(task(id=f"s{i}", dependencies=[f"s{d}" for d in deps])(_noop))
    wf = Workflow("pure", draw(st.permutations(specs)))
    states = {sid: draw(st.sampled_from(StepState)) for sid in wf.order}
    return wf, states


@given(wf_states=workflows_and_states(), deferred=st.integers(0, 3))
def test_status_follows_the_precedence_order_and_counts_states(wf_states, deferred):
    wf, states = wf_states
    before = dict(states)
    st_ = status("r", wf, states, deferred)
    assert states == before
    assert st_ == status("r", wf, states, deferred)  # pure

    offered = ready(wf, states)
    assert offered == [sid for sid in wf.order if sid in offered]  # in topological order
    for sid in wf.order:
        deps_done = all(states[d] is StepState.COMPLETED for d in wf.steps[sid].dependencies)
        assert (sid in offered) == (states[sid] is StepState.PENDING and deps_done)

    def count(state: StepState) -> int:
        return sum(s is state for s in states.values())

    assert st_.total_steps == len(states)
    assert st_.ready_steps == count(StepState.READY) + len(offered)
    assert st_.in_progress_steps == count(StepState.RUNNING)
    assert st_.completed_steps == count(StepState.COMPLETED)
    assert st_.failed_steps == count(StepState.FAILED)
    assert st_.skipped_steps == count(StepState.SKIPPED)
    assert st_.deferred_steps == deferred
    assert st_.completion_percentage == round(100 * st_.completed_steps / len(states), 2)
    assert 0 <= st_.completion_percentage <= 100

    finished = st_.completed_steps + st_.failed_steps + st_.skipped_steps == len(states)
    applies = {
        ExecutionStatus.READY_STEPS_AVAILABLE: st_.ready_steps > 0,
        ExecutionStatus.STEPS_IN_PROGRESS: st_.in_progress_steps > 0,
        ExecutionStatus.BLOCKED_BY_FAILURES: st_.failed_steps > 0,
        ExecutionStatus.COMPLETE: finished,
        ExecutionStatus.AWAITING_DEPENDENCIES: True,
    }
    assert st_.execution_status is next(e for e in _PRECEDENCE if applies[e])
    assert st_.recommended_action == _ACTIONS[st_.execution_status]
    if not st_.failed_steps:
        assert st_.health_status == "healthy"
    elif st_.execution_status is ExecutionStatus.BLOCKED_BY_FAILURES:
        assert st_.health_status == "blocked"
    else:
        assert st_.health_status == "degraded"


@st.composite
def any_graphs(draw) -> list[tuple[str, tuple[str, ...]]]:
    """Steps in a random listing order, each depending on any others: cycles too."""
    n = draw(st.integers(1, 8))
    names = draw(st.permutations([f"s{i}" for i in range(n)]))
    return [
        (name, tuple(draw(st.lists(st.sampled_from(names).filter(name.__ne__), unique=True))))
        if n > 1
        else (name, ())
        for name in names
    ]


@settings(max_examples=300)
@given(graph=any_graphs())
def test_order_is_the_given_order_within_dependencies_and_a_cycle_is_named_by_its_path(graph):
    def noop():
        pass

    deps = dict(graph)
    specs = [task(id=sid, dependencies=d)(noop) for sid, d in graph]
    # The expected order: at each turn, the first given of the steps whose
    # dependencies are all placed. Steps left over sit on or behind a cycle.
    placed: list[str] = []
    while runnable := [s for s, _ in graph if s not in placed and set(deps[s]) <= set(placed)]:
        placed.append(runnable[0])
    if len(placed) == len(graph):
        assert Workflow("wf", specs).order == tuple(placed)
        return
    with pytest.raises(WorkflowError, match=r"^workflow 'wf' has a cycle: ") as info:
        Workflow("wf", specs)
    path = str(info.value).split(": ", 1)[1].split(" -> ")
    # A real cycle among the left-over steps, each needing the next, none twice.
    assert path[0] == path[-1]
    assert len(set(path[:-1])) == len(path) - 1 >= 2
    assert set(path) <= set(deps) - set(placed)
    assert all(b in deps[a] for a, b in itertools.pairwise(path))
