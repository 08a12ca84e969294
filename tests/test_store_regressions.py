"""One test per persistence/workflow bug found in review; each failed before its fix."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from pg_server import STORE_KINDS

from trioexec import (
    MemoryStore,
    StoreError,
    TaskStatus,
    Workflow,
    open_executor,
    task,
)
from trioexec._changes import StepRecorded
from trioexec.testing import FakeWallClock


@pytest.fixture(params=STORE_KINDS)
def store(request, store_maker):
    return store_maker(request.param)


async def test_a_fenced_completion_is_not_acknowledged_as_completed(store, autojump_clock):
    store.clock = FakeWallClock(start=0)

    @task(id="work")
    async def work():
        await trio.sleep(1)
        return "done"

    async with open_executor(store=store, lease=30, tasks=[work]) as ex:
        ref = await ex.submit(work)
        await ex.flush()
        claimed = store.recover("B", 10**6, lambda r: True, 3).claimed  # B takes it over
        assert [r.task_id for r in claimed] == [ref.task_id]
        c = await ref.wait()
    assert c.status is TaskStatus.CANCELLED
    assert "lease_lost" in str(c.error)
    assert c.result is None
    row = store.execution(ref.task_id)
    assert (row.owner, row.status, row.version) == ("B", TaskStatus.PENDING, 2)
    m = ex.statistics()
    assert (m.completed_count, m.cancelled_count) == (0, 1)


async def test_an_overruled_failure_is_not_reported_as_unread(store, autojump_clock, capsys):
    """A task that failed here after another executor took it over ends CANCELLED
    (its failure was never recorded): the close does not report it as a failure
    nobody read (issue 31: found by the lifecycle's model in tests/test_machine.py)."""
    store.clock = FakeWallClock(start=0)

    @task(id="work")
    async def work():
        await trio.sleep(1)
        raise ValueError("boom")

    async with open_executor(store=store, lease=30, tasks=[work]) as ex:
        ref = await ex.submit(work)
        await ex.flush()
        store.recover("B", 10**6, lambda r: True, 3)  # B takes it over
        c = await ref.wait()
    assert c.status is TaskStatus.CANCELLED
    assert "lease_lost" in str(c.error)
    assert (ex.statistics().failed_count, ex.statistics().cancelled_count) == (0, 1)
    assert "whose completion nobody read" not in capsys.readouterr().err


async def test_a_specs_arguments_not_json_at_submission_stay_unrecorded(store, autojump_clock):
    """Issue 31 review: a spec task's arguments that were not JSON when it was
    submitted are not recorded; its dead letter does not record them later,
    changed since into JSON (it would make the dead letter re-creatable)."""
    store.clock = FakeWallClock(start=0)

    @task(id="mutates")
    async def mutates(box: dict) -> None:
        box["tags"] = sorted(box["tags"])  # a set (not JSON) becomes a list
        raise ValueError("boom")

    async with open_executor(store=store, tasks=[mutates]) as ex:
        ref = await ex.submit(mutates, {"tags": {"a", "b"}})
        c = await ref.wait()
    assert c.status is TaskStatus.FAILED
    row = store.execution(ref.task_id)
    assert row is not None
    assert (row.args, row.recreatable) == (None, False)


async def test_outer_cancel_keeps_the_lease_while_an_uninterruptible_task_runs(autojump_clock):
    store = MemoryStore(clock=FakeWallClock(start=0))
    log = []

    @task(id="work")
    async def work(who):
        log.append(("start", who))
        with trio.CancelScope(shield=True):  # like a sync task in a thread
            await trio.sleep(20)
        log.append(("end", who))

    async with trio.open_nursery() as n:

        async def side_a():
            with trio.move_on_after(1):
                async with open_executor(store=store, lease=3, tasks=[work]) as a:
                    await a.submit(work, "A")
                    await a.flush()
                    await trio.sleep_forever()

        n.start_soon(side_a)
        await trio.sleep(2)
        async with open_executor(store=store, recover=True, lease=3, tasks=[work]):
            await trio.sleep(30)
    assert log == [("start", "A"), ("end", "A")]  # never run by two owners


async def test_a_duplicate_task_id_never_touches_the_other_row(store, autojump_clock):
    store.clock = FakeWallClock(start=0)
    async with open_executor(store=store, lease=30) as a:
        ra = await a.submit(trio.sleep, 60, task_id="x")
        await a.flush()
        with pytest.raises(ValueError, match="already live"):
            await a.submit(trio.sleep, 0, task_id="x")
        async with open_executor(store=store, lease=30) as b:
            # another executor, same id: refused at the call (issue 13), never run
            with pytest.raises(ValueError, match="already recorded in the store"):
                await b.submit(trio.sleep, 0, task_id="x")
        row = store.execution("x")
        assert (row.owner, row.status) == (a.owner, TaskStatus.RUNNING)
        ca = await ra.wait()
    assert ca.status is TaskStatus.COMPLETED


async def test_a_failed_commit_loses_nothing(autojump_clock):
    class Flaky(MemoryStore):  # type: ignore[misc]
        calls = 0

        def write(self, changes):
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise StoreError("runs.db: write: database is locked")
            return super().write(changes)

    store = Flaky(clock=FakeWallClock(start=0))
    refs = []

    async def job(i):
        return i

    with pytest.raises(StoreError, match="locked"):
        async with open_executor(store=store, max_concurrent_tasks=4) as ex:
            for i in range(4):
                refs.append(ex.submit_nowait(job, i))
            await trio.sleep(1)
    for ref in refs:  # the batch was kept and written by the final flush
        with trio.fail_after(5):
            c = await ref.wait()
        # The failure stops the executor at once (issue 13): a task that had not
        # run by then ends cancelled; either way its record is the completion.
        assert c.status in (TaskStatus.COMPLETED, TaskStatus.CANCELLED)
        assert store.execution(ref.task_id).status is c.status


async def test_a_completed_step_is_recorded_with_its_execution(store, autojump_clock):
    store.clock = FakeWallClock(start=0)
    snapshots = []

    @task(id="charge")
    async def charge(ctx):
        ctx["charged"] = True

    @task(id="ship", dependencies=["charge"])
    async def ship(ctx):
        await trio.sleep_forever()

    original = store.write

    def spy(changes):
        fenced = original(changes)
        # (a "row" whose status is final: the execution, finish folded in)
        kinds = {
            (
                "finish"
                if isinstance(c, list) and c[3] not in ("pending", "running")
                else getattr(c, "kind", "row"),
                c[2] if isinstance(c, StepRecorded) else None,
            )
            for c in changes
        }
        snapshots.append(kinds)
        return fenced

    store.write = spy
    async with open_executor(store=store, shutdown_policy="cancel") as ex:
        await ex.start_workflow(Workflow("w", [charge, ship]))
        await trio.sleep(1)
    # In whichever batch charge's execution finished, its step record is there too.
    finishing = [k for k in snapshots if ("finish", None) in k and ("step", "charge") in k]
    assert finishing


@pytest.mark.parametrize("first_step_seconds", [1, 20])
async def test_a_taken_over_run_is_fenced_and_its_old_coordinator_stops(
    first_step_seconds, autojump_clock
):
    store = MemoryStore(clock=FakeWallClock(start=0))
    ran = []

    @task(id="s1")
    async def s1(ctx):
        ran.append("s1")
        await trio.sleep(first_step_seconds)
        ctx["s1"] = True

    @task(id="s2", dependencies=["s1"])
    async def s2(ctx):
        ran.append("s2")
        ctx["s2"] = True

    wf = Workflow("wf", [s1, s2])
    async with open_executor(store=store, lease=30, tasks=[wf]) as a:
        run = await a.start_workflow(wf)
        await a.flush()
        store.heartbeat(a.owner, -1.0)  # A looks dead to others (a stalled renewal)
        async with open_executor(store=store, recover=True, tasks=[wf], lease=30) as b:
            pass  # B resumes the run and drains it
        result_a = await run.wait()
    rec = store.run(run.run_id)
    assert (rec.status, rec.owner) == ("completed", b.owner)
    assert result_a.status.value == "cancelled"  # A stopped; wrote nothing over B's
    assert {k: v[0] for k, v in rec.steps.items()} == {"s1": "completed", "s2": "completed"}
    assert ran.count("s2") == 1
