"""Results kept (API.md §13): ``keep_results`` / ``keep_result``, the record's
``result_kept`` and ``result``, `trioexec.wait_result` and `trioexec.TaskFailed`,
on every store, and read from another process."""

from __future__ import annotations

import json
import pickle
import sqlite3
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from acceptance.lineproc import LineProcess

import trioexec
from trioexec import TaskFailed, TaskStatus, wait_result

HERE = Path(__file__).parent


async def order(n: int) -> dict[str, Any]:
    return {"order": n, "items": (1, 2), "note": "ünï [b] 'q' 🧾"}


async def nothing() -> None:
    return None


async def boom() -> None:
    raise ValueError("card declined")


async def unserializable() -> object:
    return object()


@trioexec.task(keep_result=True)
async def kept_by_spec(n: int) -> int:
    return n


@trioexec.task(keep_result=False)
async def not_kept_by_spec(n: int) -> int:
    return n


async def run_all(
    store: Any, jobs: list[tuple[Any, tuple[Any, ...], dict[str, Any]]], **options: Any
) -> list[str]:
    """Run ``jobs`` (fn, args, submit options) to their end; their task ids."""
    async with trioexec.open_executor(store=store, report_unread_failures=False, **options) as ex:
        refs = [await ex.submit(fn, *args, **kw) for fn, args, kw in jobs]
    return [ref.task_id for ref in refs]


async def test_a_kept_result_is_in_the_record_on_every_store(make_store):
    store = make_store()
    [kept, none, failed] = await run_all(
        store, [(order, (7,), {}), (nothing, (), {}), (boom, (), {})], keep_results=True
    )
    record = store.execution(kept)
    assert record.status is TaskStatus.COMPLETED
    assert record.result_kept is True
    # (JSON: the tuple comes back as a list)
    assert record.result == {"order": 7, "items": [1, 2], "note": "ünï [b] 'q' 🧾"}
    # None is a kept value too, told apart from "not kept" by result_kept
    assert (store.execution(none).result_kept, store.execution(none).result) == (True, None)
    assert (store.execution(failed).result_kept, store.execution(failed).result) == (False, None)
    assert await wait_result(store, kept) == record.result
    assert await wait_result(store, none) is None


@pytest.mark.parametrize(
    ("executor", "fn", "submit", "kept"),
    [
        (False, order, None, False),  # the default: nothing kept
        (True, order, None, True),
        (True, order, False, False),  # submit's wins over the executor's
        (False, order, True, True),
        (False, kept_by_spec, None, True),  # @task's wins over the executor's
        (True, not_kept_by_spec, None, False),
        (True, kept_by_spec, False, False),  # submit's wins over @task's
        (False, not_kept_by_spec, True, True),
    ],
)
async def test_which_keep_setting_wins(executor, fn, submit, kept):
    store = trioexec.MemoryStore()
    [task_id] = await run_all(store, [(fn, (3,), {"keep_result": submit})], keep_results=executor)
    record = store.execution(task_id)
    assert record.status is TaskStatus.COMPLETED
    assert record.result_kept is kept
    assert record.result == (json.loads(json.dumps(await fn(3))) if kept else None)
    store.close()


async def test_a_value_json_refuses_fails_the_task_at_once_without_retry():
    attempts = 0

    @trioexec.task(retries=3, keep_result=True)
    async def returns_a_set() -> set[int]:
        nonlocal attempts
        attempts += 1
        return {1, 2}

    store = trioexec.MemoryStore()
    async with trioexec.open_executor(store=store, report_unread_failures=False) as ex:
        ref = await ex.submit(returns_a_set)
        completion = await ref.wait()
    assert attempts == 1
    assert completion.status is TaskStatus.FAILED
    assert isinstance(completion.error, TypeError)
    assert "'set'" in str(completion.error)
    assert "JSON" in str(completion.error)
    assert completion.result is None
    record = store.execution(ref.task_id)
    assert record.status is TaskStatus.FAILED
    assert record.result_kept is False
    assert "TypeError" in (record.error or "")
    assert "'set'" in (record.error or "")
    with pytest.raises(TaskFailed) as caught:
        await wait_result(store, ref.task_id)
    assert caught.value.status is TaskStatus.FAILED
    store.close()


async def test_without_a_store_the_json_check_still_applies():
    # (the same task behaves the same once a store is attached)
    async with trioexec.open_executor(keep_results=True, report_unread_failures=False) as ex:
        bad = await ex.submit(unserializable)
        good = await ex.submit(order, 1)
    assert (await bad.wait()).status is TaskStatus.FAILED
    assert (await good.wait()).result == await order(1)  # the value itself, not JSON


async def test_wait_result_says_why_not():
    store = trioexec.MemoryStore()
    [failed, not_kept] = await run_all(
        store, [(boom, (), {"keep_result": True}), (order, (1,), {})]
    )
    with pytest.raises(TaskFailed) as caught:
        await wait_result(store, failed)
    error = caught.value
    assert isinstance(error, trioexec.TrioexecError)
    assert (error.task_id, error.status) == (failed, TaskStatus.FAILED)
    assert error.error == "ValueError('card declined')"
    assert failed in str(error)
    assert "card declined" in str(error)
    again = pickle.loads(pickle.dumps(error))
    assert (again.task_id, again.status, again.error) == (error.task_id, error.status, error.error)
    with pytest.raises(LookupError, match="without a kept result"):
        await wait_result(store, not_kept)
    with pytest.raises(LookupError, match="no execution 'nobody'"):
        await wait_result(store, "nobody")
    with pytest.raises(ValueError, match="task_id"):
        await wait_result(store, "")
    with pytest.raises(TypeError, match="store"):
        await wait_result(None, failed)  # type: ignore[arg-type]
    store.close()


async def test_cancelled_and_timed_out_executions_raise_task_failed():
    store = trioexec.MemoryStore()

    async def forever() -> None:
        await trio.sleep_forever()

    async with trioexec.open_executor(store=store, keep_results=True) as ex:
        slow = await ex.submit(forever, timeout=0.01)
        stopped = await ex.submit(forever)
        await trio.testing.wait_all_tasks_blocked()
        stopped.cancel()
    for ref, status in ((slow, TaskStatus.TIMED_OUT), (stopped, TaskStatus.CANCELLED)):
        with pytest.raises(TaskFailed) as caught:
            await wait_result(store, ref.task_id)
        assert caught.value.status is status
    store.close()


async def test_wait_result_waits_for_a_running_task_and_for_one_not_written_yet(tmp_path):
    store = trioexec.SQLiteStore(tmp_path / "runs.db")
    go = trio.Event()

    async def charge() -> str:
        await go.wait()
        return "charged"

    got: list[object] = []
    async with trioexec.open_executor(store=store, keep_results=True) as ex:
        ref = await ex.submit(charge)
        # (asked at once: its row may not be written yet; this process's
        # executor is flushed before "unknown" is said)
        async with trio.open_nursery() as nursery:

            async def waiter() -> None:
                got.append(await wait_result(store, ref.task_id))

            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            go.set()
    assert got == ["charged"]
    store.close()


async def test_keep_options_are_checked():
    with pytest.raises(TypeError, match="keep_results must be a bool, got 'yes'"):
        trioexec.ExecutorConfig(keep_results="yes")  # type: ignore[arg-type]
    with pytest.raises(trioexec.TaskDefinitionError, match="keep_result must be a bool, got 1"):
        trioexec.task(keep_result=1)(order)  # type: ignore[call-overload]
    async with trioexec.open_executor() as ex:
        with pytest.raises(TypeError, match="keep_result must be a bool, got 'no'"):
            await ex.submit(order, 1, keep_result="no")  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="keep_result"):
            ex.submit_nowait(order, 1, keep_result=0)  # type: ignore[call-overload]
        assert await ex.run(order, 2, keep_result=True) == await order(2)


async def test_run_and_submit_nowait_keep_too():
    store = trioexec.MemoryStore()
    async with trioexec.open_executor(store=store) as ex:
        ref = ex.submit_nowait(order, 5, keep_result=True)
        assert (await ex.run(kept_by_spec, 6)) == 6
    assert store.execution(ref.task_id).result["order"] == 5
    kept = [r for r in store.executions() if r.name.endswith("kept_by_spec")]
    assert [(r.result_kept, r.result) for r in kept] == [(True, 6)]
    store.close()


async def test_a_deterministic_executor_keeps_results():
    store = trioexec.MemoryStore()
    ex = trioexec.DeterministicExecutor(store=store, keep_results=True)
    ref = ex.submit_nowait(order, 9)
    await ex.run_ready()
    assert store.execution(ref.task_id).result["order"] == 9
    assert await wait_result(store, ref.task_id) == store.execution(ref.task_id).result
    store.close()


async def test_workflow_steps_are_never_kept_as_results():
    # (a step's value is its run's: keep_results must not touch it)
    @trioexec.task(id="first")
    async def first(context: trioexec.Context) -> object:
        return object()  # not JSON, and no harm: it is the run's output

    @trioexec.task(id="second", dependencies=("first",))
    async def second(context: trioexec.Context) -> int:
        return 2

    store = trioexec.MemoryStore()
    workflow = trioexec.Workflow("wf", [first, second])
    async with trioexec.open_executor(store=store, keep_results=True) as ex:
        run = await ex.start_workflow(workflow)
        result = await run.wait()
    assert result.status is trioexec.RunStatus.COMPLETED
    steps = [r for r in store.executions() if r.run_id is not None]
    assert len(steps) == 2
    assert all(not r.result_kept for r in steps)
    store.close()


def test_an_older_sqlite_file_gains_the_column(tmp_path):
    path = tmp_path / "old.db"
    trioexec.SQLiteStore(path).close()
    with sqlite3.connect(path) as conn:  # as trioexec before results were kept wrote it
        conn.execute("ALTER TABLE executions DROP COLUMN result")
        conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0014_results'")
        conn.execute("UPDATE trioexec_meta SET value = '13' WHERE key = 'schema_version'")
        conn.execute(
            "INSERT INTO executions (task_id, name, status, attempt, recovery_attempts,"
            " version, priority) VALUES ('old', 'n', 'completed', 1, 0, 1, 0)"
        )
    conn.close()
    store = trioexec.SQLiteStore(path)
    record = store.execution("old")
    assert (record.result_kept, record.result) == (False, None)
    store.close()


def test_an_unreadable_kept_result_is_a_store_error(tmp_path):
    path = tmp_path / "runs.db"
    trioexec.SQLiteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO executions (task_id, name, status, attempt, recovery_attempts,"
            " version, priority, result) VALUES ('t', 'n', 'completed', 1, 0, 1, 0, '{oops')"
        )
    conn.close()
    store = trioexec.SQLiteStore(path)
    with pytest.raises(trioexec.StoreError, match="'t' has an unreadable kept result"):
        store.execution("t")
    store.close()


def test_postgres_listeners_are_woken_by_another_stores_write(postgres_url, pg_schema):
    """Many threads wait on one store's listener (`wait_for_end`); a write that
    ends an execution, committed by another store on the schema, wakes them all
    (at once: the wait would otherwise last its 30 s and report nothing heard)."""
    waiting = trioexec.PostgresStore(postgres_url, schema=pg_schema)
    writer = trioexec.PostgresStore(postgres_url, schema=pg_schema)
    try:
        seen = waiting.ends_heard
        waiting.wait_for_end(seen, 0.0)  # (listening from here on)
        seen = waiting.ends_heard
        heard: list[int] = []
        threads = [
            threading.Thread(target=lambda: heard.append(waiting.wait_for_end(seen, 30.0)))
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()

        async def one_task() -> None:
            await run_all(writer, [(order, (1,), {"keep_result": True})])

        trio.run(one_task)
        for thread in threads:
            thread.join(timeout=60)
        assert len(heard) == 3
        assert all(h > seen for h in heard)
    finally:
        waiting.close()
        writer.close()
    with pytest.raises(trioexec.StoreError, match="closed"):
        waiting.wait_for_end(0, 0.0)


def test_another_process_reads_the_result_by_id(db_target, tmp_path):
    """A worker process runs the tasks; this one waits for their results by id
    (PostgreSQL: woken by the worker's notify; SQLite: polling)."""
    worker = LineProcess(
        HERE / "results_worker.py", [db_target], tmp_path / "worker.err", stdin=subprocess.PIPE
    )
    try:
        _, charged, refused = worker.expect("SUBMITTED")
        store = trioexec.open_store(db_target)
        got: dict[str, object] = {}

        async def main() -> None:
            async def value() -> None:
                got["value"] = await wait_result(store, charged)

            async def failure() -> None:
                with pytest.raises(TaskFailed) as caught:
                    await wait_result(store, refused)
                got["failed"] = (caught.value.status, caught.value.error)

            with trio.fail_after(60):  # (bounds a hang; the results come at "go")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(value)
                    nursery.start_soon(failure)
                    # Neither can have ended: the worker ends them on "go".
                    assert store.execution(charged).status is TaskStatus.RUNNING
                    worker.send("go")

        trio.run(main)
        store.close()
        assert got["value"] == {"order": 7, "charged": True, "note": "ünïcode ['x']"}
        assert got["failed"] == (TaskStatus.FAILED, "ValueError('card declined')")
        worker.expect("DONE")
        assert worker.proc.wait(timeout=60) == 0
    finally:
        worker.cleanup()


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (float("nan"), "'float'"),  # (strict JSON: other readers refuse NaN)
        ({"x": float("inf")}, "'dict'"),
        (["deep"], "'list'"),  # (nested past the recursion limit below)
    ],
)
async def test_a_value_strict_json_refuses_fails_only_its_task(value, named):
    if value == ["deep"]:
        for _ in range(100_000):
            value = [value]

    async def returns() -> object:
        return value

    store = trioexec.MemoryStore()
    async with trioexec.open_executor(
        store=store, keep_results=True, report_unread_failures=False
    ) as ex:
        bad = await ex.submit(returns)
        good = await ex.submit(order, 1)
    assert (await bad.wait()).status is TaskStatus.FAILED
    assert named in str((await bad.wait()).error)
    assert (await good.wait()).status is TaskStatus.COMPLETED
    store.close()
