"""Workflow runs in a store: persisted steps and outputs, resumed by recovery."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from pg_server import STORE_KINDS

from trioexec import (
    RunStatus,
    TaskHandle,
    TaskStatus,
    Workflow,
    open_executor,
    task,
)
from trioexec.testing import FakeWallClock


@pytest.fixture(params=STORE_KINDS)
def store(request, store_maker):
    return store_maker(request.param)


def pipeline(calls, gate):
    @task(id="extract")
    async def extract(ctx):
        calls.append("extract")
        ctx["rows"] = [1, 2, 3]

    @task(id="wait", dependencies=["extract"])
    async def wait(ctx, handle: TaskHandle):
        calls.append("wait")
        await handle.defer_until(gate)
        ctx["landed"] = True

    @task(id="load", dependencies=["wait"])
    async def load(ctx):
        calls.append("load")
        ctx["total"] = sum(ctx["rows"])

    return Workflow("etl", [extract, wait, load])


async def test_run_and_steps_are_persisted(store, autojump_clock):
    calls: list[str] = []
    gate = trio.Event()
    gate.set()
    wf = pipeline(calls, gate)
    async with open_executor(store=store) as ex:
        result = await ex.run_workflow(wf, {"job": 1})
    assert result.ok
    rec = store.run(result.run_id)
    assert rec.workflow == "etl"
    assert rec.status == "completed"
    assert {sid: state for sid, (state, _) in rec.steps.items()} == dict.fromkeys(
        ["extract", "wait", "load"], "completed"
    )
    steps = store.executions(run_id=result.run_id)
    assert [s.name for s in steps] == ["extract", "wait", "load"]
    assert all(s.status is TaskStatus.COMPLETED for s in steps)


async def test_interrupted_run_resumes_without_redoing_finished_steps(store, autojump_clock):
    store.clock = FakeWallClock(start=0)
    calls: list[str] = []
    gate = trio.Event()
    wf = pipeline(calls, gate)

    with trio.move_on_after(5):  # the first executor is cut short while 'wait' defers
        async with open_executor(store=store, lease=3) as ex:
            run = await ex.start_workflow(wf, {"job": 1})
            await trio.sleep_forever()
    assert calls == ["extract", "wait"]
    assert store.run(run.run_id).status == "running"

    gate.set()
    async with open_executor(store=store, recover=True, tasks=[wf], lease=3) as ex2:
        await ex2.wait_for_idle()
        [resumed] = [r for r in store.runs() if r.run_id == run.run_id]
        del resumed
    assert calls == ["extract", "wait", "wait", "load"]  # extract not re-run
    rec = store.run(run.run_id)
    assert rec.status == "completed"
    assert rec.owner == ex2.owner
    # The interrupted execution of 'wait' was superseded, not resurrected.
    waits = [e for e in store.executions(run_id=run.run_id) if e.name == "wait"]
    assert [w.status for w in waits] == [TaskStatus.CANCELLED, TaskStatus.COMPLETED]


async def test_resumed_run_restores_outputs_into_the_context(store, autojump_clock):
    store.clock = FakeWallClock(start=0)
    calls: list[str] = []
    gate = trio.Event()
    wf = pipeline(calls, gate)
    with trio.move_on_after(5):
        async with open_executor(store=store, lease=3) as ex:
            await ex.start_workflow(wf, {"job": 1})
            await trio.sleep_forever()
    gate.set()
    results = []
    async with open_executor(store=store, recover=True, tasks=[wf], lease=3) as ex2:
        for run in list(ex2.workflow_runs.values()):
            results.append(await run.wait())
    [result] = results
    assert result.status is RunStatus.COMPLETED
    assert result.context == {"job": 1, "rows": [1, 2, 3], "landed": True, "total": 6}


async def test_a_run_of_an_unregistered_workflow_is_orphaned(store, autojump_clock):
    store.clock = FakeWallClock(start=0)
    calls: list[str] = []
    wf = pipeline(calls, trio.Event())
    with trio.move_on_after(5):
        async with open_executor(store=store, lease=3) as ex:
            run = await ex.start_workflow(wf, {"job": 1})
            await trio.sleep_forever()
    other = Workflow("other", [task(id="x")(lambda ctx: None)])
    async with open_executor(store=store, recover=True, tasks=[other], lease=3) as ex2:
        await trio.sleep(10)
        assert not ex2.workflow_runs
    rec = store.run(run.run_id)
    assert rec.status == "failed"
    live = [e for e in store.executions(run_id=run.run_id) if e.status is TaskStatus.RUNNING]
    assert live == []  # no step of it is left RUNNING


async def test_a_run_resumed_too_often_is_abandoned(store, autojump_clock):
    store.clock = FakeWallClock(start=0)
    calls: list[str] = []
    gate = trio.Event()
    wf = pipeline(calls, gate)
    with trio.move_on_after(5):
        async with open_executor(store=store, lease=3) as ex:
            run = await ex.start_workflow(wf, {"job": 1})
            await trio.sleep_forever()
    for _ in range(2):  # each resumer dies too
        with trio.move_on_after(10):
            async with open_executor(
                store=store, recover=True, tasks=[wf], lease=3, max_recovery_attempts=2
            ):
                await trio.sleep_forever()
    async with open_executor(
        store=store, recover=True, tasks=[wf], lease=3, max_recovery_attempts=2
    ) as ex3:
        await trio.sleep(10)
        events = []
        while (e := ex3.events.get_nowait()) is not None:
            events.append(e)
    rec = store.run(run.run_id)
    assert (rec.status, rec.recovery_attempts) == ("failed", 2)
    assert [e.attributes["run_id"] for e in events if e.kind == "task_abandoned"] == [run.run_id]
