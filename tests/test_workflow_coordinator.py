"""The coordinator's own machinery: one task per run (a step's job wakes it), the
counts a run keeps against a recount from scratch, runs cut short (lost, store
failure, refused or dropped steps) and the step specs a workflow keeps."""

from __future__ import annotations

import gc
import json
import re
import weakref

import attrs
import pytest
import trio
import trio.testing
from faults import FaultyStore
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from workflow_model import status_from_scratch

from trioexec import (
    Context,
    MemoryStore,
    Overflow,
    PermanentError,
    RunStatus,
    StepState,
    StoreError,
    TaskHandle,
    TaskRejected,
    TaskStatus,
    Workflow,
    open_executor,
    task,
)
from trioexec._coordinator import WorkflowRun, wrap_step
from trioexec._records import HealthEventKind
from trioexec._workflow import (
    load_json,
    progress_attributes,
    run_spec,
    summarize,
)


def step(sid: str, *deps: str, fn=None, **options):
    async def noop(context: Context) -> None:
        pass

    return task(id=sid, dependencies=list(deps), **options)(fn or noop)


def coordinators(ex) -> list[trio.lowlevel.Task]:
    """The executor's tasks that are not its own (workers, poller): the runs'."""
    own = ("trioexec worker", "trioexec._poller.Poller.run")
    tasks = [t for t in ex._core.workers.nursery.child_tasks if t.name not in own]
    assert all(t.coro.cr_code is WorkflowRun._coordinate.__code__ for t in tasks)
    return tasks


# ---------------------------------------------------------------- one task per run


async def test_a_run_has_one_task_however_many_steps_are_in_flight(autojump_clock):
    gate = trio.Event()

    async def waits(context: Context, handle: TaskHandle) -> None:
        await handle.defer_until(gate)

    wf = Workflow(
        "wide", [step("root"), *[step(f"w{i}", "root", fn=waits) for i in range(6)], step("end")]
    )
    async with open_executor(max_concurrent_tasks=2) as ex:
        assert coordinators(ex) == []
        run = await ex.start_workflow(wf)
        await trio.testing.wait_all_tasks_blocked()
        assert run.status().deferred_steps == 6
        assert len(run._started) == 6
        assert len(coordinators(ex)) == 1
        gate.set()
        with trio.fail_after(10):  # (each step's end wakes the coordinator)
            result = await run.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert coordinators(ex) == []  # it ended with the run
    assert result.ok
    assert (run._started, list(run._queue)) == ({}, [])


async def test_a_lost_run_cancels_its_steps_and_leaves_no_task(autojump_clock):
    cancelled = []

    async def long(context: Context) -> None:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            cancelled.append(trio.current_time())
            raise

    wf = Workflow("lost", [step("a", fn=long), step("b", fn=long), step("c", "a", "b")])
    async with open_executor(max_concurrent_tasks=2) as ex:
        run = await ex.start_workflow(wf)
        await trio.sleep(1)
        assert len(coordinators(ex)) == 1
        run._lost()  # (what the lifecycle does when another executor takes the run over)
        result = await run.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert coordinators(ex) == []
        assert ex.workflow_runs == {}
        m = ex.statistics()
        assert (m.active_count, m.queue_depth, m.cancelled_count) == (0, 0, 2)
    assert cancelled == [1, 1]
    assert result.status is RunStatus.CANCELLED
    assert "c" not in result.steps


async def test_a_run_cancelled_from_outside_mid_step_leaves_no_task(autojump_clock):
    async def long(context: Context) -> None:
        await trio.sleep(100)

    wf = Workflow("outside", [step("a", fn=long), step("b", "a")])
    with trio.move_on_after(5):
        async with open_executor(max_concurrent_tasks=1) as ex:
            run = await ex.start_workflow(wf)
            await trio.sleep_forever()
    assert trio.current_time() == 5
    result = await run.wait()
    assert result.status is RunStatus.CANCELLED
    assert set(result.steps) <= {"a"}
    assert run._started.keys() <= {"a"}
    assert not run._queue
    assert run._states["b"] is StepState.PENDING


async def test_a_store_failure_mid_run_ends_the_block_with_one_store_error(autojump_clock):
    gate = trio.Event()
    store = FaultyStore(MemoryStore())

    async def first(context: Context) -> None:
        await gate.wait()

    wf = Workflow("failing", [step("a", fn=first), step("b", "a")])
    with pytest.raises(StoreError, match="injected failure in write"):
        async with open_executor(store=store) as ex:
            run = await ex.start_workflow(wf)
            await ex.flush()
            store.fail_on.add("write")
            gate.set()  # a's end is never durable
            await run.wait()
    result = run.result
    assert result is not None
    assert result.status is RunStatus.CANCELLED  # left 'running' in the store
    assert "a" not in result.steps  # its completion never became durable
    assert "b" not in result.steps


@pytest.mark.parametrize("overflow", [Overflow.REJECT, Overflow.DROP_NEWEST])
async def test_a_step_refused_or_dropped_on_arrival_fails_the_step(overflow, autojump_clock):
    async def hold(context: Context) -> None:
        await trio.sleep(1)

    wf = Workflow("full", [step("a"), step("b"), step("c", "a")])
    async with open_executor(max_concurrent_tasks=1, queue_capacity=0, overflow=overflow) as ex:
        blocker = await ex.submit(hold, None)
        run = await ex.start_workflow(wf)
        result = await run.wait()
        await blocker.wait()
    assert result.status is RunStatus.FAILED
    # Whichever way a step was refused, the run does not wait for it: it failed,
    # and its dependent is skipped.
    assert {sid: state.value for sid, state in run._states.items()} == {
        "a": "failed",
        "b": "failed",
        "c": "skipped",
    }
    if overflow is Overflow.REJECT:  # refused: no execution
        assert result.steps == {}
        assert isinstance(result.error, TaskRejected)
        assert "task 'a' not accepted" in str(result.error)
    else:  # accepted and dropped at once: an execution that ended DROPPED
        assert {sid: c.status for sid, c in result.steps.items()} == {
            "a": TaskStatus.DROPPED,
            "b": TaskStatus.DROPPED,
        }
        assert result.error is None


async def test_steps_wait_for_space_under_block_and_the_run_completes(autojump_clock):
    async def slow(context: Context) -> None:
        await trio.sleep(1)

    wf = Workflow("blocked", [step(f"s{i}", fn=slow) for i in range(5)])
    async with open_executor(max_concurrent_tasks=1, queue_capacity=1) as ex:
        run = await ex.start_workflow(wf)
        await trio.testing.wait_all_tasks_blocked()
        # One running, one queued, the coordinator waits for space with the third.
        assert [run._states[f"s{i}"] for i in range(5)] == [StepState.READY] * 5
        assert len(run._started) == 2
        assert list(run._queue) == ["s3", "s4"]
        assert run.status() == status_from_scratch(run)
        with trio.fail_after(10):
            result = await run.wait()
    assert result.ok
    assert trio.current_time() == 5


# ---------------------------------------------------------------- the step specs


def test_a_workflow_makes_each_steps_run_spec_once_and_keeps_its_options():
    s = step("a", retries=2, timeout=5)
    wf = Workflow("w", [s])
    spec = run_spec(wf, "a", wrap_step)
    assert run_spec(wf, "a", wrap_step) is spec
    assert (spec.id, spec.retries, spec.timeout, spec.is_async) == ("a", 2, 5, True)
    assert spec.fn is not s.fn
    other = Workflow("w", [s])  # kept per workflow, not per spec
    assert run_spec(other, "a", wrap_step) is not spec


async def test_two_runs_of_one_workflow_keep_their_outputs_apart(autojump_clock):
    async def write(context: Context) -> str:
        await trio.sleep(context["n"])
        context["seen"] = context["n"] * 10
        return f"n={context['n']}"

    wf = Workflow("pair", [step("w", fn=write), step("x", "w")])
    async with open_executor(max_concurrent_tasks=4) as ex:
        one = await ex.start_workflow(wf, {"n": 2})
        two = await ex.start_workflow(wf, {"n": 1})
        with trio.fail_after(10):
            r1, r2 = await one.wait(), await two.wait()
    assert r1.context == {"n": 2, "seen": 20}
    assert r2.context == {"n": 1, "seen": 10}
    assert (r1.steps["w"].result, r2.steps["w"].result) == ("n=2", "n=1")


async def test_a_finished_run_is_freed_without_the_cyclic_gc():
    # A run keeps its step jobs; were a job to keep the run (its on_done), every
    # finished run would wait for the cyclic GC, which then took a large share of a
    # chain's time (issue 15, scenario 9).
    wf = Workflow("w", [step("a"), step("b", "a"), step("c", "a")])
    gc.collect()
    gc.disable()
    try:
        async with open_executor(max_concurrent_tasks=2) as ex:
            run = await ex.start_workflow(wf, {"n": 1})
            result = await run.wait()
            assert result.ok
            alive = weakref.ref(result)  # (the run holds it)
            del run, result
            assert alive() is None
    finally:
        gc.enable()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(
    value=_JSON, before=st.sampled_from(["", " ", "\n"]), after=st.sampled_from(["", " ", "x", "]"])
)
def test_load_json_is_json_loads(value, before, after):
    text = before + json.dumps(value) + after
    try:
        expected: object = json.loads(text)
    except json.JSONDecodeError as exc:
        expected = exc
    if isinstance(expected, json.JSONDecodeError):
        with pytest.raises(json.JSONDecodeError, match=re.escape(str(expected))):
            load_json(text)
    else:  # (compared as text: NaN != NaN)
        assert json.dumps(load_json(text)) == json.dumps(expected)


# ---------------------------------------------------------------- progress attributes


@given(
    ready=st.integers(0, 5),
    in_progress=st.integers(0, 5),
    deferred=st.integers(0, 5),
    done=st.lists(st.sampled_from(["c", "f", "s", "p"]), min_size=1, max_size=12),
)
def test_progress_attributes_are_the_summarys_attributes(ready, in_progress, deferred, done):
    wf = Workflow("w", [step(f"s{i}") for i in range(len(done))])
    counts = dict.fromkeys(StepState, 0)
    for d in done:
        counts[
            {"c": StepState.COMPLETED, "f": StepState.FAILED, "s": StepState.SKIPPED}.get(
                d, StepState.PENDING
            )
        ] += 1
    expected = summarize("r", wf, counts, ready, in_progress, deferred).as_attributes()
    got = progress_attributes(
        "r",
        wf,
        ready,
        in_progress,
        deferred,
        counts[StepState.COMPLETED],
        counts[StepState.FAILED],
        counts[StepState.SKIPPED],
    )
    assert got == expected
    assert list(got) == list(expected)
    assert type(got["execution_status"]) is str


# ---------------------------------------------------------------- kept counts, random runs


@attrs.frozen
class Plan:
    deps: tuple[int, ...]
    outcome: str  # ok, fail, flaky (fails once, retried), defer, nonjson
    seconds: int


@st.composite
def plans(draw) -> list[Plan]:
    n = draw(st.integers(1, 7))
    return [
        Plan(
            deps=tuple(draw(st.lists(st.integers(0, i - 1), unique=True, max_size=2)) if i else ()),
            outcome=draw(st.sampled_from(["ok", "ok", "fail", "flaky", "defer", "nonjson"])),
            seconds=draw(st.integers(0, 2)),
        )
        for i in range(n)
    ]


class CheckedEvents:
    """Stands in for the runs' event stream: every ``workflow_progress`` event
    must equal the run's status recounted from scratch at that moment."""

    def __init__(self, inner, runs: dict) -> None:
        self.inner = inner
        self.runs = runs
        self.checked = 0

    def publish(self, kind, task_id=None, **kwargs) -> None:
        if kind is HealthEventKind.WORKFLOW_PROGRESS:
            attributes = kwargs["attributes"]()  # (made when the event is read)
            run = self.runs[attributes["run_id"]]
            assert attributes == status_from_scratch(run).as_attributes()
            assert kwargs["reason"] == attributes["execution_status"]
            self.checked += 1
        self.inner.publish(kind, task_id, **kwargs)


async def run_checked(plan: list[Plan], slots: int, capacity: int, overflow: Overflow) -> None:
    t0 = trio.current_time()
    tries: dict[int, int] = {}

    def make(i: int, p: Plan):
        async def body(context: Context, handle: TaskHandle) -> None:
            tries[i] = tries.get(i, 0) + 1
            await trio.sleep(p.seconds)
            if p.outcome == "fail":
                raise PermanentError(f"s{i}")
            if p.outcome == "flaky" and tries[i] == 1:
                raise RuntimeError(f"s{i} once")
            if p.outcome == "defer":
                await handle.defer_until(lambda: trio.current_time() - t0 >= 3, poll_interval=1)
            context[f"s{i}"] = [i]
            if p.outcome == "nonjson":
                context[f"s{i}"].append({1})  # in place: the step fails at its end

        return task(id=f"s{i}", dependencies=[f"s{d}" for d in p.deps], retries=1)(body)

    wf = Workflow("checked", [make(i, p) for i, p in enumerate(plan)])
    # (Virtual time: a run that never wakes again fails here instead of hanging.)
    with trio.fail_after(100):
        async with open_executor(
            max_concurrent_tasks=slots, queue_capacity=capacity, overflow=overflow
        ) as ex:
            checked = CheckedEvents(ex._runs.events, ex._runs.active)
            ex._runs.events = checked
            runs = [await ex.start_workflow(wf, {"n": n}) for n in range(2)]
            while not all(r.result for r in runs):
                for r in runs:
                    assert r.status() == status_from_scratch(r)
                await trio.sleep(0.5)
            for r in runs:
                assert r.status() == status_from_scratch(r)
                result = r.result
                assert (r._started, list(r._queue)) == ({}, [])
                assert set(result.steps) == set(r._completions)
                states = r._states
                for sid, c in result.steps.items():
                    assert states[sid] is (StepState.COMPLETED if c.ok else StepState.FAILED)
                for sid, state in states.items():
                    if state is StepState.SKIPPED:
                        assert sid not in result.steps
                assert (result.status is RunStatus.COMPLETED) == all(
                    s is StepState.COMPLETED for s in states.values()
                )
            await trio.testing.wait_all_tasks_blocked()
            assert coordinators(ex) == []
            assert checked.checked >= 2
    m = ex.statistics()
    assert (m.active_count, m.deferred_count, m.queue_depth) == (0, 0, 0)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=plans(),
    slots=st.integers(1, 3),
    capacity=st.integers(0, 3),
    overflow=st.sampled_from([Overflow.BLOCK, Overflow.DROP_NEWEST, Overflow.DROP_OLDEST]),
)
def test_kept_counts_match_a_recount_at_every_event_under_random_outcomes(
    plan, slots, capacity, overflow
):
    trio.run(
        run_checked,
        plan,
        slots,
        capacity,
        overflow,
        clock=trio.testing.MockClock(autojump_threshold=0),
    )
