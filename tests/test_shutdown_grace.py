"""A shutdown's grace (`Executor.shutdown(grace=...)`, ``open_executor(shutdown_grace=...)``)
under the autojump clock, and `serve_until_signal` in a real process sent real signals."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
import trio
import trio.testing

from trioexec import (
    Backoff,
    DeterministicExecutor,
    HealthEventKind,
    RunStatus,
    ShutdownPolicy,
    SubStatus,
    TaskStatus,
    Workflow,
    open_executor,
    open_store,
    serve_until_signal,
    task,
)

C, X = TaskStatus.COMPLETED, TaskStatus.CANCELLED


def grace_events(ex):
    events = []
    while (event := ex.events.get_nowait()) is not None:
        if event.kind is HealthEventKind.SHUTDOWN_GRACE_EXPIRED:
            events.append(event)
    return events


# --------------------------------------------------------------------------- the grace


async def test_drain_cancels_at_exactly_the_grace_what_runs_past_it(autojump_clock):
    async with open_executor(max_concurrent_tasks=2) as ex:
        short = await ex.submit(trio.sleep, 3)
        long = await ex.submit(trio.sleep, 100)
        queued = await ex.submit(trio.sleep, 1)  # starts at 3 (short's slot), ends at 4
        late = await ex.submit(trio.sleep, 10)  # starts at 4, would end at 14
        await ex.shutdown(ShutdownPolicy.DRAIN, grace=5)
        assert trio.current_time() == 5
        assert [r.status for r in (short, long, queued, late)] == [C, X, C, X]
        [event] = grace_events(ex)
        assert event.reason == "grace_expired"
        assert event.attributes == {
            "grace": 5,
            "pending_depth": 0,
            "active_count": 2,
            "deferred_count": 0,
        }
    m = ex.statistics()
    assert (m.completed_count, m.cancelled_count) == (2, 2)
    assert m.cancellation_observed_count == 2
    assert ex.slots.in_use == 0


async def test_work_shorter_than_the_grace_finishes_and_no_event(autojump_clock):
    async with open_executor(max_concurrent_tasks=1) as ex:
        refs = [await ex.submit(trio.sleep, 1) for _ in range(3)]
        await ex.shutdown(grace=10)
        assert trio.current_time() == 3  # not the grace: it ended when the work did
        assert [r.status for r in refs] == [C, C, C]
        assert grace_events(ex) == []
    assert trio.current_time() == 3


async def test_pending_tasks_left_at_the_grace_are_cancelled(autojump_clock):
    async with open_executor(max_concurrent_tasks=1) as ex:
        refs = [await ex.submit(trio.sleep, 2) for _ in range(4)]
        await ex.shutdown(grace=5)
        assert trio.current_time() == 5
        assert [r.status for r in refs] == [C, C, X, X]
        [event] = grace_events(ex)
        assert (event.attributes["active_count"], event.attributes["pending_depth"]) == (1, 1)


async def test_deferred_tasks_are_drained_within_the_grace_and_cancelled_after(autojump_clock):
    soon, never = trio.Event(), trio.Event()
    seen = []

    async def wait_for(event, handle):
        await handle.defer_until(event)
        seen.append(trio.current_time())

    async def set_soon():
        await trio.sleep(2)
        soon.set()

    async with trio.open_nursery() as outside:
        async with open_executor(max_concurrent_tasks=1) as ex:
            a = await ex.submit(wait_for, soon)
            b = await ex.submit(wait_for, never)
            await trio.testing.wait_all_tasks_blocked()
            assert (a.sub_status, b.sub_status) == (SubStatus.DEFERRED, SubStatus.DEFERRED)
            outside.start_soon(set_soon)
            with trio.fail_after(100):  # (without the grace: never)
                await ex.shutdown(grace=4)
            assert trio.current_time() == 4
        assert (a.status, b.status) == (C, X)
        assert seen == [2]
        [event] = grace_events(ex)
        assert event.attributes["deferred_count"] == 1


async def test_a_task_waiting_to_retry_is_cancelled_at_the_grace(autojump_clock):
    @task(retries=3, backoff=Backoff(initial=60, factor=1))
    async def flaky():
        raise RuntimeError("not yet")

    async with open_executor() as ex:
        ref = await ex.submit(flaky)
        await trio.testing.wait_all_tasks_blocked()
        await ex.shutdown(grace=1)
        assert trio.current_time() == 1
    assert ref.status is X


async def test_a_workflow_run_past_the_grace_ends_cancelled(autojump_clock):
    @task(id="first")
    async def first(ctx):
        await trio.sleep(1)

    @task(id="slow", dependencies=["first"])
    async def slow(ctx):
        await trio.sleep(100)

    @task(id="never", dependencies=["slow"])
    async def never(ctx):
        raise AssertionError("started after the grace")

    async with open_executor(shutdown_grace=5) as ex:
        run = await ex.start_workflow(Workflow("wf", [first, slow, never]))
    assert trio.current_time() == 5
    result = await run.wait()
    assert result.status is RunStatus.CANCELLED
    assert {k: v.status for k, v in result.steps.items()} == {"first": C, "slow": X}


async def test_grace_zero_cancels_at_once(autojump_clock):
    async with open_executor(max_concurrent_tasks=1) as ex:
        running = await ex.submit(trio.sleep, 1)
        queued = await ex.submit(trio.sleep, 1)
        await trio.testing.wait_all_tasks_blocked()
        await ex.shutdown(grace=0)
        assert trio.current_time() == 0
        assert (running.status, queued.status) == (X, X)
        assert len(grace_events(ex)) == 1


async def test_grace_zero_on_an_idle_executor_has_nothing_to_cancel(autojump_clock):
    async with open_executor(shutdown_grace=0) as ex:
        assert (await ex.run(trio.sleep, 1)) is None
    assert ex.closed
    assert trio.current_time() == 1
    assert grace_events(ex) == []


async def test_cancel_pending_with_a_grace_bounds_the_running_ones(autojump_clock):
    async with open_executor(max_concurrent_tasks=2) as ex:
        quick = await ex.submit(trio.sleep, 1)
        slow = await ex.submit(trio.sleep, 50)
        queued = await ex.submit(trio.sleep, 1)
        await trio.testing.wait_all_tasks_blocked()
        await ex.shutdown(ShutdownPolicy.CANCEL_PENDING, grace=3)
        assert trio.current_time() == 3
        assert [r.status for r in (quick, slow, queued)] == [C, X, X]


async def test_block_exit_drains_for_shutdown_grace(autojump_clock):
    async with open_executor(max_concurrent_tasks=2, shutdown_grace=7.5) as ex:
        done = await ex.submit(trio.sleep, 7)
        cut = await ex.submit(trio.sleep, 10_000)
    assert trio.current_time() == 7.5
    assert (done.status, cut.status) == (C, X)
    assert len(grace_events(ex)) == 1


async def test_block_exit_without_shutdown_grace_waits_as_long_as_it_takes(autojump_clock):
    async with open_executor() as ex:
        ref = await ex.submit(trio.sleep, 10_000)
    assert trio.current_time() == 10_000
    assert ref.status is C


async def test_explicit_grace_overrides_the_executors(autojump_clock):
    async with open_executor(shutdown_grace=100) as ex:
        ref = await ex.submit(trio.sleep, 50)
        await ex.shutdown(grace=2)
        assert trio.current_time() == 2
    assert ref.status is X


async def test_a_later_call_may_shorten_the_grace_but_not_extend_it(autojump_clock):
    async with open_executor() as ex:
        ref = await ex.submit(trio.sleep, 50)
        async with trio.open_nursery() as n:
            n.start_soon(lambda: ex.shutdown(grace=10))
            await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(1)
            await ex.shutdown(grace=3)  # ends at 1 + 3, before the first one's 10
            assert trio.current_time() == 4
        await ex.shutdown(grace=20)
    assert ref.status is X
    assert trio.current_time() == 4

    async with open_executor() as ex:
        ref = await ex.submit(trio.sleep, 50)
        async with trio.open_nursery() as n:
            n.start_soon(lambda: ex.shutdown(grace=5))
            await trio.testing.wait_all_tasks_blocked()
            await ex.shutdown(grace=30)  # no longer than the first
            assert trio.current_time() == 9
    assert ref.status is X


async def test_a_grace_set_from_inside_a_task_holds_while_nobody_waits(autojump_clock):
    async def stopper():
        await trio.sleep(1)
        await ex.shutdown(grace=2)  # returns at once: a task cannot wait for itself
        return trio.current_time()

    async with open_executor() as ex:
        long = await ex.submit(trio.sleep, 100)
        stop = await ex.submit(stopper)
        await ex.wait_for_idle()  # not a shutdown: the grace's own timer ends it
        assert trio.current_time() == 3
    assert (await stop.wait()).result == 1
    assert long.status is X


async def test_cancelled_waiter_leaves_the_grace_in_force(autojump_clock):
    async with open_executor() as ex:
        ref = await ex.submit(trio.sleep, 100)
        with trio.move_on_after(1):
            await ex.shutdown(grace=4)
        assert ex.closed
        await ex.wait_for_idle()
        assert trio.current_time() == 4
    assert ref.status is X


# --------------------------------------------------------------------------- bad values


BAD_GRACES = [
    (-1, ValueError),
    (-0.001, ValueError),
    (math.nan, ValueError),
    (math.inf, ValueError),
    (10**400, ValueError),
    ("30", TypeError),
    (True, TypeError),
    ([1], TypeError),
]


@pytest.mark.parametrize(("value", "error"), BAD_GRACES)
async def test_bad_shutdown_grace_is_refused_naming_it(value, error):
    with pytest.raises(error, match=r"shutdown_grace.*" + _pattern(value)):
        async with open_executor(shutdown_grace=value):
            pass  # pragma: no cover
    with pytest.raises(error, match=r"shutdown_grace.*" + _pattern(value)):
        DeterministicExecutor(shutdown_grace=value)


@pytest.mark.parametrize(("value", "error"), BAD_GRACES)
async def test_bad_grace_refused_before_anything_shuts_down(value, error):
    async with open_executor() as ex:
        with pytest.raises(error, match=r"grace.*" + _pattern(value)):
            await ex.shutdown(grace=value)
        assert not ex.closed
        with pytest.raises(error, match=r"grace.*" + _pattern(value)):
            await serve_until_signal(ex, grace=value)
        assert not ex.closed


async def test_good_graces_are_accepted():
    for value in (0, 0.5, 30, 1e9):
        async with open_executor(shutdown_grace=value) as ex:
            assert ex._core.config.shutdown_grace == value
    assert DeterministicExecutor(shutdown_grace=2.0) is not None


async def test_serve_until_signal_refuses_bad_signals():
    async with open_executor() as ex:
        with pytest.raises(ValueError, match="at least one signal"):
            await serve_until_signal(ex, signals=())
        with pytest.raises(ValueError, match="SIGKILL"):
            await serve_until_signal(ex, signals=(signal.SIGTERM, signal.SIGKILL))
        with pytest.raises(ValueError, match="12345"):
            await serve_until_signal(ex, signals=(12345,))
        assert not ex.closed


def _pattern(value):
    return re.escape(repr(value)[:40])


# --------------------------------------------------------------------------- signals

ACCEPTANCE = Path(__file__).resolve().parent / "acceptance"


def _load(name: str):
    # By path: the acceptance helpers are not a package on sys.path from here.
    spec = importlib.util.spec_from_file_location(
        f"trioexec_test_{name}", ACCEPTANCE / f"{name}.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LineProcess = _load("lineproc").LineProcess


@pytest.fixture
def app(tmp_path):
    procs = []

    def start(grace, n_finish, n_forever, n_quick):
        db = tmp_path / "app.db"
        proc = LineProcess(
            ACCEPTANCE / "signal_app.py",
            [str(db), str(grace), str(n_finish), str(n_forever), str(n_quick)],
            tmp_path / f"app-{len(procs)}.stderr",
        )
        procs.append(proc)
        return proc, db

    yield start
    for proc in procs:
        proc.cleanup()


def _exit_code(proc) -> int:
    try:
        return proc.proc.wait(timeout=proc.timeout)
    except subprocess.TimeoutExpired:  # pragma: no cover
        proc.fail("did not exit")
        raise


def _statuses(db: Path) -> dict[str, TaskStatus]:
    store = open_store(db, read_only=True)
    try:
        return {r.task_id: r.status for r in store.executions()}
    finally:
        store.close()


def test_sigterm_drains_the_work_and_exits_0(app):
    proc, db = app("none", 3, 0, 10)
    proc.expect("READY")
    os.kill(proc.pid, signal.SIGTERM)
    proc.expect("DRAINING")
    assert proc.expect("STOPPED") == ["STOPPED", "SIGTERM"]
    assert _exit_code(proc) == 0
    statuses = _statuses(db)
    assert len(statuses) == 13
    assert set(statuses.values()) == {C}, statuses


def test_sigterm_past_the_grace_cancels_the_rest_and_exits_0(app):
    proc, db = app("1.5", 2, 2, 6)
    proc.expect("READY")
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.expect("STOPPED") == ["STOPPED", "SIGTERM"]
    assert _exit_code(proc) == 0
    statuses = _statuses(db)
    assert len(statuses) == 10
    for task_id, status in statuses.items():
        # The quick ones and the finishers (0.2 s of work left) end well within it.
        assert status is (X if task_id.startswith("forever") else C), statuses


def test_a_second_signal_cancels_what_is_left(app):
    proc, db = app("none", 0, 2, 0)
    proc.expect("READY")
    os.kill(proc.pid, signal.SIGTERM)
    proc.expect("DRAINING")  # the first signal began a drain with no limit...
    os.kill(proc.pid, signal.SIGINT)  # ...that only this one ends
    assert proc.expect("STOPPED") == ["STOPPED", "SIGTERM"]
    assert _exit_code(proc) == 0
    assert _statuses(db) == {"forever-0": X, "forever-1": X}
