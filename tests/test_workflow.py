"""Workflows: validation at construction, `Context`, the pure `ready()`/`status()`
functions, and the coordinator running steps through an executor's slots."""

from __future__ import annotations

import re

import attrs
import pytest
import trio
import trio.testing
from workflow_model import status_from_scratch

from trioexec import (
    Backoff,
    Context,
    ExecutionStatus,
    ExecutorClosed,
    HealthEventKind,
    PermanentError,
    RunStatus,
    ShutdownPolicy,
    StepState,
    TaskDefinitionError,
    TaskHandle,
    TaskSpec,
    TaskStatus,
    TrioexecError,
    Workflow,
    WorkflowError,
    WorkflowStatus,
    open_executor,
    task,
)
from trioexec._workflow import ready, status

P, R, RUN, C, F, S = (
    StepState.PENDING,
    StepState.READY,
    StepState.RUNNING,
    StepState.COMPLETED,
    StepState.FAILED,
    StepState.SKIPPED,
)


async def _noop(context: Context) -> None:
    await trio.lowlevel.checkpoint()


def step(sid: str, *deps: str, fn=_noop, **options) -> TaskSpec:
    return task(id=sid, dependencies=deps, **options)(fn)


def workflow(graph: dict[str, list[str]], name: str = "wf") -> Workflow:
    return Workflow(name, [step(sid, *deps) for sid, deps in graph.items()])


def progress_events(ex) -> list:
    out = []
    while (event := ex.events.get_nowait()) is not None:
        if event.kind is HealthEventKind.WORKFLOW_PROGRESS:
            out.append(event)
    return out


# ---------------------------------------------------------------- validation


def test_workflow_error_is_a_value_error_and_a_definition_error():
    assert issubclass(WorkflowError, ValueError)
    assert issubclass(WorkflowError, TaskDefinitionError)
    assert issubclass(WorkflowError, TrioexecError)


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        pytest.param([], "workflow 'wf' is empty: it needs at least one step", id="empty"),
        pytest.param(
            [step("a"), step("b", "a"), step("a")],
            "workflow 'wf': duplicate step id 'a'",
            id="duplicate",
        ),
        pytest.param(
            [step("a"), step("b", "a", "nope")],
            "workflow 'wf': step 'b' depends on unknown step 'nope'",
            id="unknown-dependency",
        ),
        pytest.param(
            [step("a", "b"), step("b", "c"), step("c", "a")],
            "workflow 'wf' has a cycle: a -> b -> c -> a",
            id="cycle",
        ),
        pytest.param(
            # The path shows only the cycle, not the step that led into it.
            [step("s", "p"), step("p", "q"), step("q", "p")],
            "workflow 'wf' has a cycle: p -> q -> p",
            id="cycle-behind-a-step",
        ),
        pytest.param(
            [step("a"), "not a spec"],
            "workflow 'wf': steps must be TaskSpecs made with @task, got 'not a spec'",
            id="not-a-taskspec",
        ),
        pytest.param(
            [step("a"), _noop],
            "workflow 'wf': steps must be TaskSpecs made with @task, got <function _noop",
            id="undecorated-function",
        ),
    ],
)
def test_construction_rejects_malformed_workflows_naming_the_problem(specs, message):
    with pytest.raises(WorkflowError, match="^" + re.escape(message)) as info:
        Workflow("wf", specs)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, TaskDefinitionError)


@pytest.mark.parametrize("name", ["", None, 7, b"wf"])
def test_construction_rejects_a_bad_name(name):
    with pytest.raises(WorkflowError, match=re.escape(f"non-empty name, got {name!r}")):
        Workflow(name, [step("a")])


def _given_load_t1_t2_fetch() -> Workflow:
    specs = [step("load", "t2", "t1"), step("t1", "fetch"), step("t2", "fetch"), step("fetch")]
    return Workflow("wf", (s for s in specs))  # any iterable will do


def test_order_puts_dependencies_first_and_steps_keep_the_given_order():
    wf = _given_load_t1_t2_fetch()
    assert list(wf.steps) == ["load", "t1", "t2", "fetch"]  # as given
    assert set(wf.order) == set(wf.steps)
    for sid in wf.order:
        assert all(wf.order.index(d) < wf.order.index(sid) for d in wf.steps[sid].dependencies)
    assert (wf.order[0], wf.order[-1]) == ("fetch", "load")
    assert sorted(wf.dependents("fetch")) == ["load", "t1", "t2"]
    assert wf.dependents("t1") == ["load"]
    assert wf.dependents("load") == []
    assert repr(wf).startswith("<Workflow 'wf': fetch -> ")


def test_order_breaks_ties_in_the_given_order():
    assert _given_load_t1_t2_fetch().order == ("fetch", "t1", "t2", "load")


# ---------------------------------------------------------------- Context


def test_context_rejects_a_non_json_value_at_the_write_naming_the_key():
    ctx = Context({"ok": [1, "two", {"three": None}], "n": 1.5})
    with pytest.raises(TypeError, match=r"context\['tags'\] must be JSON-serialisable.*set"):
        ctx["tags"] = {"a", "b"}
    with pytest.raises(TypeError, match=r"context\['conn'\] must be JSON-serialisable.*object"):
        ctx["conn"] = object()
    with pytest.raises(TypeError, match=r"context\['deep'\].*set"):
        ctx.update(deep={"inner": [{1}]})  # MutableMapping.update goes through the check
    with pytest.raises(TypeError, match=r"context\['bad'\]"):
        Context({"fine": 1, "bad": object()})
    # A refused write leaves nothing behind.
    assert dict(ctx) == {"ok": [1, "two", {"three": None}], "n": 1.5}


@pytest.mark.parametrize("key", [1, None, ("a",), b"a"])
def test_context_keys_must_be_strings(key):
    ctx = Context()
    with pytest.raises(TypeError, match=re.escape(f"context keys must be strings, got {key!r}")):
        ctx[key] = "x"
    with pytest.raises(TypeError, match="context keys must be strings"):
        Context({key: "x"})
    assert len(ctx) == 0


def test_context_is_a_mutable_mapping():
    ctx = Context({"a": 1})
    ctx["b"] = [2]
    del ctx["a"]
    assert list(ctx) == ["b"]
    assert len(ctx) == 1
    assert "a" not in ctx
    assert ctx.get("a", "missing") == "missing"
    with pytest.raises(KeyError):
        ctx["a"]


def test_context_to_dict_is_a_detached_copy():
    ctx = Context({"rows": [1, 2], "meta": {"source": "db"}})
    out = ctx.to_dict()
    assert out == {"rows": [1, 2], "meta": {"source": "db"}}
    out["rows"].append(3)
    out["meta"]["source"] = "changed"
    out["new"] = True
    assert ctx.to_dict() == {"rows": [1, 2], "meta": {"source": "db"}}
    ctx["rows"].append(99)  # and the other way round
    assert out["rows"] == [1, 2, 3]


# ---------------------------------------------------------------- pure ready() and status()

DIAMOND = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}


def _states(*values: StepState) -> dict[str, StepState]:
    return dict(zip("abcd", values, strict=True))


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        (_states(P, P, P, P), ["a"]),
        (_states(R, P, P, P), []),  # READY is taken already: not offered twice
        (_states(C, P, P, P), ["b", "c"]),
        (_states(C, RUN, P, P), ["c"]),
        (_states(C, C, RUN, P), []),
        (_states(C, C, F, P), []),  # d needs every dependency COMPLETED
        (_states(C, C, C, P), ["d"]),
        (_states(C, C, C, C), []),
    ],
)
def test_ready_lists_pending_steps_whose_dependencies_completed(states, expected):
    wf = workflow(DIAMOND)
    before = dict(states)
    assert ready(wf, states) == expected
    assert states == before  # pure: nothing changed


_E = ExecutionStatus


@pytest.mark.parametrize(
    ("states", "execution", "health", "counts", "action"),
    [
        # counts: ready, in progress, completed, failed, skipped, percentage
        (_states(P, P, P, P), _E.READY_STEPS_AVAILABLE, "healthy", (1, 0, 0, 0, 0, 0.0),
         "execute_ready_steps"),
        (_states(RUN, P, P, P), _E.STEPS_IN_PROGRESS, "healthy", (0, 1, 0, 0, 0, 0.0),
         "wait_for_completion"),
        # ready steps beat steps in progress
        (_states(C, RUN, P, P), _E.READY_STEPS_AVAILABLE, "healthy", (1, 1, 1, 0, 0, 25.0),
         "execute_ready_steps"),
        # READY (queued for a slot) counts as ready
        (_states(C, R, RUN, P), _E.READY_STEPS_AVAILABLE, "healthy", (1, 1, 1, 0, 0, 25.0),
         "execute_ready_steps"),
        (_states(C, R, R, P), _E.READY_STEPS_AVAILABLE, "healthy", (2, 0, 1, 0, 0, 25.0),
         "execute_ready_steps"),
        # ready beats blocked by failures; a failure with work left is "degraded"
        (_states(C, F, P, S), _E.READY_STEPS_AVAILABLE, "degraded", (1, 0, 1, 1, 1, 25.0),
         "execute_ready_steps"),
        # in progress beats blocked by failures
        (_states(C, F, RUN, S), _E.STEPS_IN_PROGRESS, "degraded", (0, 1, 1, 1, 1, 25.0),
         "wait_for_completion"),
        # blocked by failures beats complete, although every step is finished
        (_states(C, F, C, S), _E.BLOCKED_BY_FAILURES, "blocked", (0, 0, 2, 1, 1, 50.0),
         "handle_failures"),
        (_states(F, S, S, S), _E.BLOCKED_BY_FAILURES, "blocked", (0, 0, 0, 1, 3, 0.0),
         "handle_failures"),
        (_states(C, C, C, C), _E.COMPLETE, "healthy", (0, 0, 4, 0, 0, 100.0), "finalize_run"),
        # complete beats awaiting dependencies: skipped steps are finished too
        (_states(C, C, S, S), _E.COMPLETE, "healthy", (0, 0, 2, 0, 2, 50.0), "finalize_run"),
        # nothing ready, running or failed, and not finished: awaiting dependencies
        (_states(C, C, S, P), _E.AWAITING_DEPENDENCIES, "healthy", (0, 0, 2, 0, 1, 50.0),
         "wait_for_dependencies"),
    ],
)  # fmt: skip
def test_status_precedence_health_and_counts(states, execution, health, counts, action):
    wf = workflow(DIAMOND, name="diamond")
    st = status("run-1", wf, states, deferred=0)
    assert isinstance(st, WorkflowStatus)
    assert st.execution_status is execution
    assert st.health_status == health
    assert (
        st.ready_steps,
        st.in_progress_steps,
        st.completed_steps,
        st.failed_steps,
        st.skipped_steps,
        st.completion_percentage,
    ) == counts
    assert st.recommended_action == action
    assert (st.run_id, st.workflow, st.total_steps, st.deferred_steps) == ("run-1", "diamond", 4, 0)


def test_status_percentage_is_rounded_and_deferred_passes_through():
    wf = workflow({"a": [], "b": ["a"], "c": ["b"]})
    st = status("r", wf, {"a": C, "b": RUN, "c": P}, deferred=1)
    assert st.completion_percentage == 33.33
    assert (st.in_progress_steps, st.deferred_steps) == (1, 1)
    assert st.execution_status is ExecutionStatus.STEPS_IN_PROGRESS


def test_status_as_attributes_is_plain_data_with_every_field():
    wf = workflow(DIAMOND)
    st = status("r", wf, _states(C, RUN, P, P), deferred=1)
    attributes = st.as_attributes()
    assert set(attributes) == set(attrs.fields_dict(WorkflowStatus))
    assert type(attributes["execution_status"]) is str
    assert attributes["execution_status"] == "ready_steps_available"
    assert attributes["deferred_steps"] == 1
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        st.ready_steps = 0


# ---------------------------------------------------------------- coordinator


async def test_diamond_runs_each_step_once_after_its_dependencies(autojump_clock):
    t0 = trio.current_time()
    log: list[tuple[str, float, float]] = []
    seen: dict[str, dict] = {}

    def timed(sid: str, seconds: float, key: str | None = None):
        async def fn(context: Context) -> str:
            start = trio.current_time() - t0
            seen[sid] = dict(context)
            await trio.sleep(seconds)
            if key is not None:
                context[key] = sid
            log.append((sid, start, trio.current_time() - t0))
            return sid.upper()

        return fn

    wf = Workflow(
        "diamond",
        [
            step("a", fn=timed("a", 1, "from_a")),
            step("b", "a", fn=timed("b", 2, "from_b")),
            step("c", "a", fn=timed("c", 3, "from_c")),
            step("d", "b", "c", fn=timed("d", 1, "from_d")),
        ],
    )
    async with open_executor(max_concurrent_tasks=2) as ex:
        result = await ex.run_workflow(wf, context={"job_id": 7})
    assert result.ok
    assert result.status is RunStatus.COMPLETED
    assert result.error is None
    assert result.workflow == "diamond"
    assert sorted(log) == [("a", 0, 1), ("b", 1, 3), ("c", 1, 4), ("d", 4, 5)]
    assert trio.current_time() - t0 == 5
    assert seen["a"] == {"job_id": 7}
    assert seen["b"] == seen["c"] == {"job_id": 7, "from_a": "a"}
    assert seen["d"] == {"job_id": 7, "from_a": "a", "from_b": "b", "from_c": "c"}
    assert result.context == {
        "job_id": 7,
        "from_a": "a",
        "from_b": "b",
        "from_c": "c",
        "from_d": "d",
    }
    assert list(result.steps) == ["a", "b", "c", "d"]
    assert {sid: c.result for sid, c in result.steps.items()} == {
        "a": "A",
        "b": "B",
        "c": "C",
        "d": "D",
    }
    assert all(c.status is TaskStatus.COMPLETED and c.attempts == 1 for c in result.steps.values())
    m = ex.statistics()
    assert (m.completed_count, m.queue_depth, m.active_count) == (4, 0, 0)


async def test_fan_out_fan_in_runs_branches_concurrently_within_the_slot_limit(autojump_clock):
    t0 = trio.current_time()
    starts: dict[str, float] = {}
    running = peak = 0

    def timed(sid: str, seconds: float):
        async def fn(context: Context) -> None:
            nonlocal running, peak
            starts[sid] = trio.current_time() - t0
            running += 1
            peak = max(peak, running)
            try:
                await trio.sleep(seconds)
            finally:
                running -= 1
            context[sid] = sorted(k for k in context if k.startswith("w"))

        return fn

    workers = [f"w{i}" for i in range(5)]
    wf = Workflow(
        "fan",
        [
            step("split", fn=timed("split", 1)),
            *[step(w, "split", fn=timed(w, 2)) for w in workers],
            step("join", *workers, fn=timed("join", 1)),
        ],
    )
    async with open_executor(max_concurrent_tasks=2) as ex:
        run = await ex.start_workflow(wf)
        await trio.sleep_until(t0 + 2)
        st = run.status()
        # Two branches hold the slots; three wait for one and count as ready.
        assert (st.ready_steps, st.in_progress_steps, st.completed_steps) == (3, 2, 1)
        assert st.execution_status is ExecutionStatus.READY_STEPS_AVAILABLE
        assert st.completion_percentage == round(100 / 7, 2)
        assert ex.slots.in_use == 2
        result = await run.wait()
    assert result.ok
    assert sorted(starts[w] for w in workers) == [1, 1, 3, 3, 5]
    assert (starts["split"], starts["join"]) == (0, 7)
    assert trio.current_time() - t0 == 8
    assert peak == 2
    # Fan-in: the join step saw every branch's write.
    assert result.context["join"] == workers
    assert all(result.context[w] == [] for w in workers)  # branches did not see each other
    st = run.status()
    assert st.execution_status is ExecutionStatus.COMPLETE
    assert (st.completed_steps, st.completion_percentage) == (7, 100.0)


async def test_deferred_step_frees_its_slot_and_its_writes_flow_downstream(autojump_clock):
    t0 = trio.current_time()
    data_ready = trio.Event()
    loaded = {}

    async def fetch(context: Context) -> None:
        await trio.sleep(1)
        context["source"] = "db"

    async def wait_for_data(context: Context, handle: TaskHandle) -> None:
        await handle.defer_until(data_ready)
        context["rows"] = 42  # written after resuming

    async def load(context: Context) -> None:
        loaded.update(context)
        await trio.sleep(1)

    async def elsewhere() -> float:
        await trio.sleep(2)
        return trio.current_time() - t0

    wf = Workflow(
        "etl",
        [
            step("fetch", fn=fetch),
            step("wait_for_data", "fetch", fn=wait_for_data),
            step("load", "wait_for_data", fn=load),
        ],
    )
    async with open_executor(max_concurrent_tasks=1) as ex:
        run = await ex.start_workflow(wf)
        await trio.sleep_until(t0 + 1.5)
        st = run.status()
        assert st.execution_status is ExecutionStatus.STEPS_IN_PROGRESS
        assert (st.deferred_steps, st.in_progress_steps, st.ready_steps) == (1, 1, 0)
        assert (st.completed_steps, st.health_status) == (1, "healthy")
        assert ex.slots.in_use == 0
        assert ex.statistics().deferred_count == 1
        # With one slot, this only runs because the deferred step gave it back.
        assert await ex.run(elsewhere) == 3.5
        assert run.status().deferred_steps == 1
        data_ready.set()
        result = await run.wait()
    assert result.ok
    assert trio.current_time() - t0 == 4.5
    assert loaded == {"source": "db", "rows": 42}
    assert result.context == {"source": "db", "rows": 42}
    assert result.steps["wait_for_data"].deferred_seconds == 2.5
    m = ex.statistics()
    assert (m.deferral_count, m.resumed_count, m.max_deferred_count) == (1, 1, 1)
    assert run.status().deferred_steps == 0


async def test_step_retries_then_succeeds(autojump_clock):
    t0 = trio.current_time()
    attempts: list[float] = []
    downstream: list[tuple[float, dict]] = []

    @task(id="flaky", retries=2, backoff=Backoff(initial=1))
    async def flaky(context: Context) -> str:
        attempts.append(trio.current_time() - t0)
        if len(attempts) < 3:
            raise ConnectionError(f"attempt {len(attempts)}")
        context["fetched"] = True
        return "ok"

    @task(id="then", dependencies=["flaky"])
    async def then(context: Context) -> None:
        downstream.append((trio.current_time() - t0, dict(context)))

    async with open_executor(max_concurrent_tasks=1) as ex:
        result = await ex.run_workflow(Workflow("retry", [flaky, then]))
        events = []
        while (event := ex.events.get_nowait()) is not None:
            events.append(event)
    assert result.ok
    assert attempts == [0, 1, 3]  # delays 1, then 2 (factor 2)
    assert downstream == [(3, {"fetched": True})]
    assert result.steps["flaky"].attempts == 3
    assert result.steps["flaky"].result == "ok"
    retries = [e for e in events if e.kind is HealthEventKind.TASK_RETRY_SCHEDULED]
    assert [(e.attributes["attempt"], e.attributes["delay"]) for e in retries] == [(1, 1), (2, 2)]
    assert not [e for e in events if e.kind is HealthEventKind.TASK_FAILED]


async def test_step_waiting_for_its_retry_is_in_progress_not_ready(autojump_clock):
    @task(id="flaky", retries=1, backoff=Backoff(initial=2))
    async def flaky(context: Context) -> None:
        if not context.get("retried"):
            context["retried"] = True
            raise ConnectionError("once")

    async with open_executor(max_concurrent_tasks=1) as ex:
        run = await ex.start_workflow(Workflow("retry", [flaky]))
        await trio.sleep(1)  # inside the 2 s backoff
        st = run.status()
        assert (st.ready_steps, st.in_progress_steps) == (0, 1)
        assert st.execution_status is ExecutionStatus.STEPS_IN_PROGRESS
        await run.wait()


async def test_each_attempt_starts_from_the_steps_input_context(autojump_clock):
    seen: list[dict] = []

    @task(id="flaky", retries=2, backoff=Backoff(initial=1))
    async def flaky(context: Context) -> None:
        seen.append(dict(context))
        context["partial"] = len(seen)
        if len(seen) < 3:
            raise ConnectionError("not yet")

    async with open_executor(max_concurrent_tasks=1) as ex:
        result = await ex.run_workflow(Workflow("retry", [flaky]), context={"job": 1})
    assert seen == [{"job": 1}] * 3
    assert result.context == {"job": 1, "partial": 3}


async def test_permanent_failure_skips_dependents_and_independent_branch_finishes(
    autojump_clock,
):
    t0 = trio.current_time()
    calls: list[str] = []
    boom = PermanentError("bad input")

    async def root(context: Context) -> None:
        calls.append("root")
        await trio.sleep(1)
        context["root"] = 1

    async def broken(context: Context) -> None:
        calls.append("broken")
        context["half"] = "written"  # a failed step's writes go nowhere
        raise boom

    async def independent(context: Context) -> None:
        calls.append("independent")
        await trio.sleep(2)
        context["independent"] = 1

    async def never(context: Context) -> None:
        calls.append("never")

    wf = Workflow(
        "branches",
        [
            step("root", fn=root),
            step("broken", "root", fn=broken, retries=3),
            step("independent", "root", fn=independent),
            step("after_broken", "broken", fn=never),
            step("converge", "independent", "after_broken", fn=never),
            step("tail", "converge", fn=never),
        ],
    )
    async with open_executor(max_concurrent_tasks=2) as ex:
        run = await ex.start_workflow(wf)
        await trio.sleep_until(t0 + 2)
        st = run.status()
        assert st.execution_status is ExecutionStatus.STEPS_IN_PROGRESS
        assert st.health_status == "degraded"
        assert (st.failed_steps, st.skipped_steps, st.in_progress_steps) == (1, 3, 1)
        result = await run.wait()
        events = progress_events(ex)
    assert sorted(calls) == ["broken", "independent", "root"]  # PermanentError: no retry
    assert trio.current_time() - t0 == 3
    assert result.status is RunStatus.FAILED
    assert not result.ok
    assert result.error is boom
    assert set(result.steps) == {"root", "broken", "independent"}
    assert result.steps["broken"].status is TaskStatus.FAILED
    assert result.steps["broken"].attempts == 1
    assert result.steps["independent"].status is TaskStatus.COMPLETED
    assert result.context == {"root": 1, "independent": 1}
    st = run.status()
    assert st.execution_status is ExecutionStatus.BLOCKED_BY_FAILURES
    assert (st.health_status, st.recommended_action) == ("blocked", "handle_failures")
    assert (st.completed_steps, st.failed_steps, st.skipped_steps) == (2, 1, 3)
    assert st.completion_percentage == round(100 * 2 / 6, 2)
    assert events[-1].reason == "blocked_by_failures"
    assert events[-1].attributes == st.as_attributes()


async def test_merge_conflict_later_listed_dependency_of_the_step_wins():
    seen: dict[str, dict] = {}

    def writer(value: str):
        async def fn(context: Context) -> None:
            context["winner"] = value
            context[value] = True

        return fn

    def reader(sid: str):
        async def fn(context: Context) -> None:
            seen[sid] = dict(context)

        return fn

    wf = Workflow(
        "merge",
        [
            # The workflow lists left before right; each join lists its own order.
            step("left", fn=writer("left")),
            step("right", fn=writer("right")),
            step("right_then_left", "right", "left", fn=reader("right_then_left")),
            step("left_then_right", "left", "right", fn=reader("left_then_right")),
        ],
    )
    async with open_executor(max_concurrent_tasks=2) as ex:
        result = await ex.run_workflow(wf, context={"job": 1})
    assert result.ok
    common = {"job": 1, "left": True, "right": True}
    assert seen["right_then_left"] == {**common, "winner": "left"}
    assert seen["left_then_right"] == {**common, "winner": "right"}


async def test_sibling_steps_do_not_see_each_others_in_place_mutations():
    mutated = trio.Event()
    seen = {}

    async def produce(context: Context) -> None:
        context["config"] = {"retries": 1}

    async def mutate(context: Context) -> None:
        context["config"]["retries"] = 99
        mutated.set()

    async def read(context: Context) -> None:
        await mutated.wait()
        seen["retries"] = context["config"]["retries"]

    wf = Workflow(
        "isolation",
        [
            step("produce", fn=produce),
            step("mutate", "produce", fn=mutate),
            step("read", "produce", fn=read),
        ],
    )
    async with open_executor(max_concurrent_tasks=2) as ex:
        await ex.run_workflow(wf)
    assert seen == {"retries": 1}


async def test_a_step_whose_context_became_non_json_fails_without_crashing_the_executor():
    async def sneaky(context: Context) -> None:
        context["items"] = []
        context["items"].append({"a", "set"})  # not checked: no __setitem__ on the context

    wf = Workflow("sneaky", [step("sneaky", fn=sneaky), step("after", "sneaky")])
    crash = None
    try:
        async with open_executor(max_concurrent_tasks=1) as ex:
            result = await ex.run_workflow(wf)
            assert await ex.run(lambda: "still alive") == "still alive"
    except TypeError as exc:
        crash = exc
    assert crash is None, f"a step's bad context crashed the executor: {crash!r}"
    assert result.status is RunStatus.FAILED
    assert isinstance(result.error, TypeError)
    assert "context['items']" in str(result.error)
    assert result.steps["sneaky"].status is TaskStatus.FAILED
    assert "after" not in result.steps


async def test_initial_context_is_checked_and_copied():
    initial = {"items": [1]}
    seen = []

    async def root(context: Context) -> None:
        seen.append(context.to_dict())
        context["items"].append(2)

    async with open_executor() as ex:
        with pytest.raises(TypeError, match=r"context\['bad'\]"):
            await ex.start_workflow(workflow({"a": []}), context={"bad": {1, 2}})
        result = await ex.run_workflow(Workflow("w", [step("root", fn=root)]), context=initial)
        empty = await ex.run_workflow(workflow({"a": []}))
    assert seen == [{"items": [1]}]
    assert initial == {"items": [1]}  # the caller's dict is untouched
    assert result.context == {"items": [1, 2]}
    assert empty.context == {}
    assert empty.ok


async def test_workflow_progress_events_carry_the_status_fields(autojump_clock):
    async def slow(context: Context) -> None:
        await trio.sleep(1)

    wf = Workflow("chain", [step("a", fn=slow), step("b", "a", fn=slow)])
    async with open_executor(max_concurrent_tasks=1) as ex:
        run = await ex.start_workflow(wf, run_id="run-42")
        result = await run.wait()
        events = progress_events(ex)
    assert result.run_id == run.run_id == "run-42"
    assert len(events) >= 3
    fields = set(attrs.fields_dict(WorkflowStatus))
    for event in events:
        assert event.task_id is None
        assert set(event.attributes) == fields
        assert event.reason == event.attributes["execution_status"]
        assert event.attributes["run_id"] == "run-42"
        assert event.attributes["workflow"] == "chain"
        assert event.attributes["total_steps"] == 2
        assert event.attributes["health_status"] == "healthy"
        assert (
            event.attributes["recommended_action"]
            == {
                "ready_steps_available": "execute_ready_steps",
                "steps_in_progress": "wait_for_completion",
                "complete": "finalize_run",
            }[event.reason]
        )
    completed = [e.attributes["completed_steps"] for e in events]
    assert completed == sorted(completed)
    assert events[0].attributes["execution_status"] == "ready_steps_available"
    assert (events[0].attributes["ready_steps"], completed[0]) == (1, 0)
    assert events[-1].reason == "complete"
    assert events[-1].attributes == run.status().as_attributes()
    assert events[-1].attributes["completion_percentage"] == 100.0
    # Between the steps: a completed, b ready.
    assert any(
        e.attributes["completed_steps"] == 1 and e.attributes["ready_steps"] == 1 for e in events
    )


async def test_deferral_and_resume_are_published(autojump_clock):
    t0 = trio.current_time()

    async def waits(context: Context, handle: TaskHandle) -> None:
        await trio.sleep(1)
        await handle.defer_until(lambda: trio.current_time() - t0 >= 3, poll_interval=1)
        await trio.sleep(1)

    async with open_executor(max_concurrent_tasks=1) as ex:
        await ex.run_workflow(Workflow("defer", [step("waits", fn=waits)]))
        events = progress_events(ex)
    deferred = [e.attributes["deferred_steps"] for e in events]
    assert 1 in deferred
    resumed = deferred.index(1) + 1
    assert any(
        e.attributes["in_progress_steps"] == 1 and e.attributes["deferred_steps"] == 0
        for e in events[resumed:]
    )


async def test_drain_lets_a_started_run_finish(autojump_clock):
    t0 = trio.current_time()

    async def slow(context: Context) -> None:
        await trio.sleep(1)
        context[f"t{trio.current_time() - t0:g}"] = True

    async def deferring(context: Context, handle: TaskHandle) -> None:
        await handle.defer_until(lambda: trio.current_time() - t0 >= 2, poll_interval=0.5)
        context["deferred"] = True

    wf = Workflow(
        "drain",
        [step("a", fn=slow), step("b", "a", fn=deferring), step("c", "b", fn=slow)],
    )
    async with open_executor(max_concurrent_tasks=1, shutdown_policy=ShutdownPolicy.DRAIN) as ex:
        run = await ex.start_workflow(wf)
    # b and c were submitted after shutdown began.
    assert ex.closed
    assert trio.current_time() - t0 == 3
    result = await run.wait()
    assert result.status is RunStatus.COMPLETED
    assert result.context == {"t1": True, "deferred": True, "t3": True}
    assert [c.status for c in result.steps.values()] == [TaskStatus.COMPLETED] * 3
    with pytest.raises(ExecutorClosed):
        await ex.start_workflow(wf)


async def test_cancel_policy_ends_the_run_cancelled(autojump_clock):
    t0 = trio.current_time()
    cancelled: list[str] = []

    def long(sid: str):
        async def fn(context: Context) -> None:
            try:
                await trio.sleep(10)
            except trio.Cancelled:
                cancelled.append(sid)
                raise

        return fn

    async def forever(context: Context, handle: TaskHandle) -> None:
        try:
            await handle.defer_until(trio.Event())
        except trio.Cancelled:
            cancelled.append("forever")
            raise

    wf = Workflow(
        "cancel",
        [
            step("forever", fn=forever),
            step("gate"),
            # Three long steps for the two slots the deferred step leaves: one waits.
            *[step(sid, "gate", fn=long(sid)) for sid in ("l1", "l2", "l3")],
            step("after", "forever", "l1"),
        ],
    )
    async with open_executor(max_concurrent_tasks=2, shutdown_policy=ShutdownPolicy.CANCEL) as ex:
        run = await ex.start_workflow(wf)
        await trio.sleep(1)
        st = run.status()
        assert (st.in_progress_steps, st.deferred_steps, st.ready_steps) == (3, 1, 1)
    assert trio.current_time() - t0 == 1
    result = run.result
    assert result is not None
    assert result == await run.wait()
    assert result.status is RunStatus.CANCELLED
    assert not result.ok
    assert set(result.steps) == {"forever", "gate", "l1", "l2", "l3"}  # "after" never ran
    assert {sid: c.status for sid, c in result.steps.items() if sid != "gate"} == dict.fromkeys(
        ["forever", "l1", "l2", "l3"], TaskStatus.CANCELLED
    )
    assert result.steps["gate"].status is TaskStatus.COMPLETED
    # The deferred step and the two running ones were cancelled where they were.
    assert len(cancelled) == 3
    assert "forever" in cancelled
    assert run.status().skipped_steps == 1
    m = ex.statistics()
    assert (m.active_count, m.deferred_count, m.queue_depth) == (0, 0, 0)


async def test_body_raising_cancels_the_run_and_propagates_unwrapped(autojump_clock):
    async def long(context: Context) -> None:
        await trio.sleep(10)

    with pytest.raises(KeyError, match="oops"):
        async with open_executor(max_concurrent_tasks=1) as ex:
            run = await ex.start_workflow(Workflow("w", [step("a", fn=long), step("b", "a")]))
            await trio.sleep(1)
            raise KeyError("oops")
    result = await run.wait()
    assert result.status is RunStatus.CANCELLED
    assert not result.ok
    assert "b" not in result.steps
    assert trio.current_time() == 1


async def test_a_runs_kept_counts_match_its_status_from_scratch_at_every_step(autojump_clock):
    gate = trio.Event()
    tries = []

    async def waits(context: Context, handle: TaskHandle) -> None:
        await handle.defer_until(gate)

    async def flaky(context: Context) -> None:
        tries.append(1)
        if len(tries) < 3:
            raise RuntimeError("not yet")

    async def fails(context: Context) -> None:
        raise PermanentError("no")

    async def quick(context: Context) -> None:
        await trio.sleep(1)

    wf = Workflow(
        "mixed",
        [
            step("root", fn=quick),
            step("waits", "root", fn=waits),
            step("flaky", "root", fn=flaky, retries=3, backoff=Backoff(initial=1)),
            step("fails", "root", fn=fails),
            step("after_fail", "fails", fn=quick),
            step("join", "waits", "flaky", fn=quick),
        ],
    )
    seen = 0
    async with open_executor(max_concurrent_tasks=2) as ex:
        run = await ex.start_workflow(wf)
        for _ in range(12):
            assert run.status() == status_from_scratch(run)
            seen += 1
            await trio.sleep(0.5)
            if trio.current_time() > 4:
                gate.set()
        result = await run.wait()
        assert run.status() == status_from_scratch(run)
    assert result.status is RunStatus.FAILED
    assert len(tries) == 3
    assert seen == 12
