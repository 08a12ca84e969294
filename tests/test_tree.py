"""The task tree (API.md §13): a task submitted from a task of the same executor
is its child; its deadline is never later than its ancestors'; cancelling or
timing out a task ends its unfinished descendants (pending ones without
running) with an error naming the ancestor; ``detached=True`` makes a root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from acceptance.lineproc import LineProcess

import trioexec
from trioexec import TaskHandle, TaskStatus
from trioexec._remote import await_end

HERE = Path(__file__).parent

Refs = dict[str, trioexec.TaskRef[Any]]


async def deferred(handle: TaskHandle) -> None:
    await handle.defer_until(trio.Event())  # (gives its slot back, forever)


async def forever() -> None:
    await trio.sleep_forever()


ran: list[str] = []


async def noted(name: str) -> str:
    ran.append(name)
    return name


async def family(ex: trioexec.Executor, refs: Refs, depth: int, name: str, then: str) -> str:
    """Submit a child (``name``.c, itself a family while ``depth``), a deferred
    one (.d), a pending one (.p: it never gets a slot while the families hold
    both) and a detached one (.x); then ``then``: "forever" or "return"."""
    if depth:
        refs[f"{name}.c"] = await ex.submit(family, ex, refs, depth - 1, f"{name}.c", "forever")
    refs[f"{name}.d"] = await ex.submit(deferred)
    refs[f"{name}.x"] = await ex.submit(deferred, detached=True)
    refs[f"{name}.p"] = await ex.submit(noted, f"{name}.p", priority=-1)
    if then == "forever":
        await trio.sleep_forever()
    return name


async def test_children_know_their_parent(autojump_clock):
    refs: Refs = {}
    store = trioexec.MemoryStore()
    async with trioexec.open_executor(store=store, max_concurrent_tasks=2) as ex:
        refs["r"] = root = await ex.submit(family, ex, refs, 1, "r", "forever")
        await trio.testing.wait_all_tasks_blocked()
        assert root.parent_id is None
        assert refs["r.c"].parent_id == root.task_id
        assert refs["r.c.d"].parent_id == refs["r.c"].task_id
        assert refs["r.x"].parent_id is None  # detached: a root
        root.cancel()
        refs["r.x"].cancel()
        refs["r.c.x"].cancel()
    records = {r.task_id: r for r in store.executions()}
    assert records[refs["r.c"].task_id].parent_id == root.task_id
    assert records[refs["r.x"].task_id].parent_id is None
    assert records[root.task_id].parent_id is None
    store.close()


async def test_cancelling_a_task_ends_its_descendants_not_detached_ones(autojump_clock):
    ran.clear()
    refs: Refs = {}
    async with trioexec.open_executor(max_concurrent_tasks=2) as ex:
        refs["r"] = root = await ex.submit(family, ex, refs, 2, "r", "forever")
        await trio.testing.wait_all_tasks_blocked()
        assert refs["r.p"].status is TaskStatus.PENDING
        root.cancel()
        await trio.testing.wait_all_tasks_blocked()
        for name, ref in refs.items():
            if name.endswith(".x"):
                assert ref.status is TaskStatus.RUNNING, name  # (deferred, untouched)
                continue
            assert ref.status is TaskStatus.CANCELLED, name
            if name != "r":
                error = (await ref.wait()).error
                assert isinstance(error, trioexec.TaskCancelled)
                assert f"its ancestor {root.task_id!r} was" in str(error), name
        assert not [n for n in ran if n.startswith("r.")]  # pending ones never ran
        for name, ref in refs.items():
            if name.endswith(".x"):
                ref.cancel()


async def test_a_parent_that_completes_or_fails_leaves_its_children(autojump_clock):
    refs: Refs = {}

    async def fails(ex: trioexec.Executor) -> None:
        refs["f.d"] = await ex.submit(deferred)
        raise ValueError("parent failed")

    async with trioexec.open_executor(max_concurrent_tasks=4, report_unread_failures=False) as ex:
        done = await ex.submit(family, ex, refs, 0, "r", "return")
        failed = await ex.submit(fails, ex)
        assert (await done.wait()).status is TaskStatus.COMPLETED
        assert (await failed.wait()).status is TaskStatus.FAILED
        await trio.testing.wait_all_tasks_blocked()
        assert refs["r.d"].status is TaskStatus.RUNNING
        assert refs["f.d"].status is TaskStatus.RUNNING
        # ...and cancelling the ended parent later still reaches them (as
        # `trioexec cancel` does through a store)
        done.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert refs["r.d"].status is TaskStatus.CANCELLED
        assert f"its ancestor {done.task_id!r} was" in str((await refs["r.d"].wait()).error)
        assert refs["r.x"].status is TaskStatus.RUNNING  # (detached)
        assert refs["f.d"].status is TaskStatus.RUNNING
        ex.cancel_pending()
        for ref in refs.values():
            ref.cancel()


async def test_a_childs_deadline_is_its_parents(autojump_clock):
    ran.clear()
    refs: Refs = {}
    async with trioexec.open_executor(max_concurrent_tasks=2) as ex:
        start = trio.current_time()
        refs["r"] = root = await ex.submit(family, ex, refs, 1, "r", "forever", timeout=10)
        completion = await root.wait()
        assert completion.status is TaskStatus.TIMED_OUT
        assert trio.current_time() - start == pytest.approx(10)
        await trio.testing.wait_all_tasks_blocked()
        for name, ref in refs.items():
            if name.endswith(".x"):
                assert ref.status is TaskStatus.RUNNING
                ref.cancel()
                continue
            assert ref.status is TaskStatus.TIMED_OUT, name
            if name != "r":
                error = (await ref.wait()).error
                assert isinstance(error, trioexec.TaskTimeout)
                assert repr(root.task_id) in str(error), (name, error)
        assert ran == []  # (the pending ones ended without running)


async def test_a_child_keeps_the_deadline_it_inherited_after_its_parent_ended(autojump_clock):
    refs: Refs = {}

    async def parent(ex: trioexec.Executor) -> str:
        refs["d"] = await ex.submit(deferred)
        refs["own"] = await ex.submit(deferred, timeout=3)  # (its own is earlier)
        return "done"

    async with trioexec.open_executor() as ex:
        start = trio.current_time()
        ref = await ex.submit(parent, ex, timeout=10)
        assert (await ref.wait()).status is TaskStatus.COMPLETED
        own = await refs["own"].wait()
        assert own.status is TaskStatus.TIMED_OUT
        assert "after 3s" in str(own.error)
        assert trio.current_time() - start == pytest.approx(3)
        child = await refs["d"].wait()
        assert child.status is TaskStatus.TIMED_OUT
        assert trio.current_time() - start == pytest.approx(10)
        assert f"the deadline of its ancestor {ref.task_id!r} passed" in str(child.error)


async def test_a_task_of_another_executor_is_not_a_parent(autojump_clock):
    async with trioexec.open_executor() as other, trioexec.open_executor() as ex:

        async def submits_elsewhere() -> trioexec.TaskRef[Any]:
            return await ex.submit(deferred)

        inner = await (await other.submit(submits_elsewhere)).wait()
        child = inner.result
        assert child.parent_id is None
        child.cancel()


async def test_detached_is_checked():
    async def submits() -> None:
        with pytest.raises(TypeError, match="detached must be a bool, got 'yes'"):
            await ex.submit(forever, detached="yes")  # type: ignore[call-overload]

    async with trioexec.open_executor() as ex:
        await ex.run(submits)


@pytest.mark.parametrize("mode", ["waits", "returns"])
def test_trioexec_cancel_reaches_descendants_in_another_process(db_target, tmp_path, mode):
    """A worker process runs a parent and its tree; ``trioexec cancel DB PARENT``
    from this one ends the parent's unfinished descendants there (the parent
    too, if it still runs), not its detached task: through the store's command,
    whether the parent still runs ("waits") or has completed ("returns")."""
    worker = LineProcess(
        HERE / "tree_worker.py", [db_target, mode], tmp_path / "worker.err", stdin=subprocess.PIPE
    )
    try:
        parent, child, grandchild, pending, detached = worker.expect("READY")[1:]
        cli = subprocess.run(
            [sys.executable, "-m", "trioexec", "cancel", db_target, parent],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        store = trioexec.open_store(db_target)

        async def ends() -> dict[str, Any]:
            with trio.fail_after(60):  # (bounds a hang; the worker follows within a second)
                return {t: await await_end(store, t) for t in (child, grandchild, pending)}

        ended = trio.run(ends)
        for task_id, record in ended.items():
            assert record.status is TaskStatus.CANCELLED, (task_id, record)
            assert f"its ancestor {parent!r} was" in (record.error or ""), record.error
        assert store.execution(detached).status is TaskStatus.RUNNING
        expected = TaskStatus.CANCELLED if mode == "waits" else TaskStatus.COMPLETED
        assert trio.run(await_end, store, parent).status is expected
        store.close()
        worker.send("stop")
        worker.expect("DONE")
        assert "PENDING RAN" not in worker.lines
    finally:
        worker.cleanup()


async def test_a_pending_child_keeps_its_inherited_deadline_after_its_parent_ended(autojump_clock):
    """Its parent completed long before; no slot frees for it: at the inherited
    deadline it ends TIMED_OUT, without running (not when a slot would start it)."""
    ran.clear()
    refs: Refs = {}

    async def parent(ex: trioexec.Executor) -> None:
        refs["p"] = await ex.submit(noted, "p", priority=-1)
        # (the one slot is this one's once the parent ends)
        refs["blocker"] = await ex.submit(forever, detached=True)

    async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
        start = trio.current_time()
        ref = await ex.submit(parent, ex, timeout=10)
        assert (await ref.wait()).status is TaskStatus.COMPLETED
        await trio.testing.wait_all_tasks_blocked()
        assert refs["p"].status is TaskStatus.PENDING
        child = await refs["p"].wait()
        assert trio.current_time() - start == pytest.approx(10)
        assert child.status is TaskStatus.TIMED_OUT
        assert f"the deadline of its ancestor {ref.task_id!r} passed" in str(child.error)
        assert ran == []
        refs["blocker"].cancel()


async def test_children_that_ended_leave_no_deadline_to_watch(autojump_clock):
    """A parent with a day's deadline completes with 300 children pending: they
    are watched for the deadline they inherited, and once they have run and
    ended, the executor holds on to none of them until that day."""

    async def parent(ex: trioexec.Executor) -> list[trioexec.TaskRef[None]]:
        return [await ex.submit(trio.sleep, 1) for _ in range(300)]

    async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
        ref = await ex.submit(parent, ex, timeout=86_400)
        children = (await ref.wait()).result
        lifecycle = ex._core.lifecycle
        assert len(lifecycle._deadlines) == 300  # (watched: their parent ended)
        for child in children[:200]:
            assert (await child.wait()).status is TaskStatus.COMPLETED
        # (stale entries are dropped once they are half: at most half remain)
        assert len(lifecycle._deadlines) <= 200
        for child in children[200:]:
            assert (await child.wait()).status is TaskStatus.COMPLETED
        assert lifecycle._deadlines == []
        assert trio.current_time() < 1_000


# ---------------------------------------------------------------- found in review


async def test_a_child_refused_or_still_waiting_for_room_is_nobodys_to_end(tmp_path):
    """A child is its parent's once accepted: a refused submission (a bad key) is
    never ended by it, and one let in after its parent was cancelled ends at
    once (the counts stay right, the store never keeps a row pending)."""
    ran.clear()
    store = trioexec.SQLiteStore(tmp_path / "runs.db")
    async with trioexec.open_executor(store=store, max_concurrent_tasks=1, queue_capacity=1) as ex:

        async def parent() -> None:
            with pytest.raises(ValueError, match="dedupe_key"):
                await ex.submit(noted, "bad", dedupe_key="")
            await ex.submit(noted, "first")  # (the one place in the queue)
            await ex.submit(noted, "second")  # (waits for room: the parent holds the slot)

        ref = await ex.submit(parent)
        await trio.testing.wait_all_tasks_blocked()
        ref.cancel()
        await trio.testing.wait_all_tasks_blocked()
    metrics = ex.statistics()
    assert metrics.queue_depth == 0
    assert ran == []
    assert {r.status for r in store.executions()} <= {TaskStatus.CANCELLED, TaskStatus.COMPLETED}
    children = [r.status for r in store.executions() if r.parent_id == ref.task_id]
    assert children
    assert set(children) == {TaskStatus.CANCELLED}  # (the one let in after its parent too)
    store.close()


async def test_no_retry_after_an_ancestors_deadline(autojump_clock):
    @trioexec.task(retries=3, backoff=trioexec.Backoff(initial=10))
    async def slow(handle: TaskHandle) -> None:
        await handle.defer_until(trio.Event())

    refs: Refs = {}

    async def parent(ex: trioexec.Executor) -> None:
        refs["c"] = await ex.submit(slow)

    async with trioexec.open_executor() as ex:
        start = trio.current_time()
        await (await ex.submit(parent, ex, timeout=1)).wait()
        child = await refs["c"].wait()
        assert child.status is TaskStatus.TIMED_OUT
        assert child.attempts == 1
        assert trio.current_time() - start == pytest.approx(1)


async def test_a_workflow_does_not_switch_plain_tasks_to_the_extras_path():
    @trioexec.task(id="only")
    async def only(context: trioexec.Context) -> int:
        return 1

    async with trioexec.open_executor() as ex:
        await ex.run_workflow(trioexec.Workflow("wf", [only]))
        assert not ex._core.lifecycle.uses_extras
