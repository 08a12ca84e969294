"""Deduplication (API.md §13): ``dedupe_key`` and ``dedupe_window`` on submit,
``TaskRef.deduplicated``, ``dedupe_key`` on refs and records; one execution per
key on every store, across executors and across processes."""

from __future__ import annotations

import json
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
from acceptance.lineproc import LineProcess

import trioexec
from trioexec import TaskStatus
from trioexec.testing import FakeWallClock

HERE = Path(__file__).parent


async def charge(order: int, gate: trio.Event | None = None) -> dict[str, int]:
    if gate is not None:
        await gate.wait()
    return {"order": order}


async def declined(order: int) -> None:
    raise ValueError(f"order {order}: card declined")


async def test_a_live_execution_holds_its_key_without_a_store():
    gate = trio.Event()
    async with trioexec.open_executor(keep_results=True) as ex:
        first = await ex.submit(charge, 1, gate, dedupe_key="order-1")
        again = await ex.submit(charge, 2, gate, dedupe_key="order-1")
        nowait = ex.submit_nowait(charge, 3, gate, dedupe_key="order-1")
        other = await ex.submit(charge, 4, gate, dedupe_key="order-2")
        assert (first.deduplicated, again.deduplicated, nowait.deduplicated) == (False, True, True)
        assert again.task_id == nowait.task_id == first.task_id
        assert (other.deduplicated, other.task_id != first.task_id) == (False, True)
        assert first.dedupe_key == again.dedupe_key == "order-1"
        assert ex.statistics().queued_count == 2  # (the duplicates made nothing)
        gate.set()
        assert (await again.wait()).result == {"order": 1}
        # completed: it holds the key while the executor is open (no window)
        later = await ex.submit(charge, 5, dedupe_key="order-1")
        assert later.deduplicated
        assert (await later.wait()).result == {"order": 1}
        assert await ex.run(charge, 6, dedupe_key="order-1") == {"order": 1}
        plain = await ex.submit(charge, 7)
        assert (plain.deduplicated, plain.dedupe_key) == (False, None)


async def test_an_execution_that_did_not_complete_frees_its_key():
    async with trioexec.open_executor(report_unread_failures=False) as ex:
        failed = await ex.submit(declined, 1, dedupe_key="k")
        assert (await failed.wait()).status is TaskStatus.FAILED
        retried = await ex.submit(charge, 1, dedupe_key="k")
        assert not retried.deduplicated
        assert (await retried.wait()).result == {"order": 1}
        stopped = await ex.submit(charge, 2, trio.Event(), dedupe_key="c")
        stopped.cancel()
        assert (await stopped.wait()).status is TaskStatus.CANCELLED
        assert not (await ex.submit(charge, 2, dedupe_key="c")).deduplicated


async def test_the_window_counts_from_the_earlier_ones_finish(autojump_clock):
    store = trioexec.MemoryStore(clock=FakeWallClock(start=1_000.0))
    async with trioexec.open_executor(store=store) as ex:
        first = await ex.submit(charge, 1, dedupe_key="w")
        await first.wait()
        await trio.sleep(5)
        assert (await ex.submit(charge, 2, dedupe_key="w", dedupe_window=10)).deduplicated
        fresh = await ex.submit(charge, 3, dedupe_key="w", dedupe_window=4.5)
        assert not fresh.deduplicated  # (the window is the new submission's)
        assert (await fresh.wait()).result == {"order": 3}
        # the latest completed one decides now
        assert (
            await ex.submit(charge, 4, dedupe_key="w", dedupe_window=1)
        ).task_id == fresh.task_id
    records = [r for r in store.executions() if r.dedupe_key == "w"]
    assert [r.task_id for r in records] == [first.task_id, fresh.task_id]
    store.close()


async def test_the_window_without_a_store_is_on_the_executors_clock(monkeypatch):
    now = [100.0]
    async with trioexec.open_executor() as ex:
        monkeypatch.setattr(ex._core.lifecycle, "wall", lambda: now[0])
        first = await ex.submit(charge, 1, dedupe_key="w")
        await first.wait()
        now[0] += 30
        assert (await ex.submit(charge, 2, dedupe_key="w", dedupe_window=31)).deduplicated
        assert not (await ex.submit(charge, 3, dedupe_key="w", dedupe_window=29)).deduplicated


async def test_one_execution_per_key_on_every_store(make_store):
    store = make_store()
    gate = trio.Event()
    async with trioexec.open_executor(store=store, keep_results=True) as ex:
        refs = [await ex.submit(charge, n, gate, dedupe_key=f"k{n % 3}") for n in range(9)]
        assert [r.deduplicated for r in refs] == [False] * 3 + [True] * 6
        gate.set()
        values = [(await r.wait()).result for r in refs]
    assert values == [{"order": n % 3} for n in range(9)]
    records = store.executions()
    assert sorted(r.dedupe_key for r in records) == ["k0", "k1", "k2"]
    assert all(r.result_kept for r in records)
    # a second executor on the store (another process, as far as it knows; a
    # MemoryStore is shared by sharing the object)
    shared = store if isinstance(store, trioexec.MemoryStore) else make_store()
    async with trioexec.open_executor(store=shared, keep_results=True) as other:
        remote = await other.submit(charge, 99, dedupe_key="k1")
        assert remote.deduplicated
        assert remote.task_id == refs[1].task_id
        assert remote.done
        assert remote.status is TaskStatus.COMPLETED
        assert (await remote.wait()).result == {"order": 1}
        assert await other.run(charge, 98, dedupe_key="k2") == {"order": 2}


async def test_executors_sharing_a_store_make_one_execution_per_key_at_once(tmp_path):
    """Two executors on one SQLite file submit the same keys at the same instant
    (their store calls run in threads, racing): each key runs once, and both
    refs of a key wait for that one execution."""
    path = tmp_path / "runs.db"
    stores = [trioexec.SQLiteStore(path), trioexec.SQLiteStore(path)]
    keys = [f"order-{n}" for n in range(40)]
    refs: dict[int, dict[str, trioexec.TaskRef[Any]]] = {0: {}, 1: {}}
    async with (
        trioexec.open_executor(store=stores[0], keep_results=True) as one,
        trioexec.open_executor(store=stores[1], keep_results=True) as two,
    ):

        async def submit(which: int, ex: trioexec.Executor, key: str) -> None:
            refs[which][key] = await ex.submit(charge, which, dedupe_key=key)

        async with trio.open_nursery() as nursery:
            for key in keys:
                nursery.start_soon(submit, 0, one, key)
                nursery.start_soon(submit, 1, two, key)
        for key in keys:
            a, b = refs[0][key], refs[1][key]
            assert a.task_id == b.task_id
            assert sorted([a.deduplicated, b.deduplicated]) == [False, True]
            assert (await a.wait()).result == (await b.wait()).result
    per_key = Counter(r.dedupe_key for r in stores[0].executions())
    assert per_key == dict.fromkeys(keys, 1)
    for store in stores:
        store.close()


def test_processes_sharing_a_store_make_one_execution_per_key(db_target, tmp_path):
    """Two real processes submit the same 30 keys at the same moment: one
    execution per key, and each process's ref of it waits for that execution
    (the other process's, from the store) and gets its kept result."""
    keys = [f"order-{n}" for n in range(30)]
    workers = {
        name: LineProcess(
            HERE / "dedupe_worker.py",
            [db_target, name, *keys],
            tmp_path / f"{name}.err",
            stdin=subprocess.PIPE,
        )
        for name in ("a", "b")
    }
    try:
        for worker in workers.values():
            worker.expect("READY")
        for worker in workers.values():
            worker.send("go")
        seen: dict[str, dict[str, tuple[str, bool, Any]]] = {}
        for name, worker in workers.items():
            worker.expect("DONE", timeout=120)
            assert worker.proc.wait(timeout=60) == 0
            refs = {
                f[1]: (f[2], f[3] == "1") for f in map(str.split, worker.lines) if f[0] == "REF"
            }
            got = {
                f[1]: json.loads(f[2])
                for f in (line.split(" ", 2) for line in worker.lines)
                if f[0] == "GOT"
            }
            assert set(refs) == set(got) == set(keys)
            seen[name] = {k: (*refs[k], got[k]) for k in keys}
        for key in keys:
            (a_id, a_dup, a_value), (b_id, b_dup, b_value) = seen["a"][key], seen["b"][key]
            assert a_id == b_id
            assert sorted([a_dup, b_dup]) == [False, True]
            assert a_value == b_value
            assert a_value["charged_by"] == ("b" if a_dup else "a")
    finally:
        for worker in workers.values():
            worker.cleanup()
    store = trioexec.open_store(db_target)
    per_key = Counter(r.dedupe_key for r in store.executions())
    store.close()
    assert per_key == dict.fromkeys(keys, 1)


async def test_a_refused_submission_frees_its_key_and_its_record_says_so():
    store = trioexec.MemoryStore()
    gate = trio.Event()
    async with trioexec.open_executor(
        store=store, max_concurrent_tasks=1, queue_capacity=0, overflow="reject"
    ) as ex:
        busy = await ex.submit(charge, 1, gate)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trioexec.TaskRejected):
            await ex.submit(charge, 2, dedupe_key="full")
        gate.set()
        await busy.wait()
        again = await ex.submit(charge, 3, dedupe_key="full")
        assert not again.deduplicated
        assert (await again.wait()).result == {"order": 3}
    refused = [r for r in store.executions() if r.status is TaskStatus.REJECTED]
    assert [(r.dedupe_key, r.error) for r in refused] == [("full", refused[0].error)]
    assert "not admitted" in (refused[0].error or "")
    store.close()


async def test_dedupe_options_are_checked():
    async with trioexec.open_executor() as ex:
        with pytest.raises(ValueError, match="dedupe_key must not be empty"):
            await ex.submit(charge, 1, dedupe_key="")
        with pytest.raises(ValueError, match="dedupe_key must be a str, got int 5"):
            await ex.submit(charge, 1, dedupe_key=5)  # type: ignore[call-overload]
        with pytest.raises(ValueError, match="dedupe_window needs a dedupe_key"):
            await ex.submit(charge, 1, dedupe_window=5)
        for bad in (0, -1, float("inf"), float("nan")):
            with pytest.raises(ValueError, match="dedupe_window"):
                ex.submit_nowait(charge, 1, dedupe_key="k", dedupe_window=bad)
        # a chosen task id refused for its window is free again
        with pytest.raises(ValueError, match="dedupe_window"):
            await ex.submit(charge, 1, task_id="mine", dedupe_key="k", dedupe_window=0)
        assert (await ex.submit(charge, 1, task_id="mine", dedupe_key="k")).task_id == "mine"


async def test_a_duplicate_of_a_pending_chosen_id_keeps_the_original():
    store = trioexec.MemoryStore()
    gate = trio.Event()
    async with trioexec.open_executor(store=store) as ex:
        await ex.submit(charge, 1, gate, task_id="charge-1", dedupe_key="o")
        second = await ex.submit(charge, 2, gate, task_id="charge-2", dedupe_key="o")
        assert second.task_id == "charge-1"
        # charge-2 was never made: its id is free
        third = await ex.submit(charge, 3, gate, task_id="charge-2")
        assert third.task_id == "charge-2"
        gate.set()
    assert {r.task_id for r in store.executions()} == {"charge-1", "charge-2"}
    store.close()


@trioexec.task(id="dedupe.flaky")
async def flaky(order: int) -> int:
    raise ValueError(f"order {order}: try again")


async def test_a_dead_letter_is_not_requeued_while_its_key_is_held(make_store):
    store = make_store()
    async with trioexec.open_executor(store=store, report_unread_failures=False) as ex:
        dead = await ex.submit(flaky, 1, dedupe_key="order-1")
        await dead.wait()
        other = await ex.submit(flaky, 2, dedupe_key="order-2")
        await other.wait()
        holder = await ex.submit(charge, 1, dedupe_key="order-1")
        await holder.wait()
    done = store.requeue([dead.task_id, other.task_id], who="test")
    assert done.refused == [
        (dead.task_id, f"its dedupe key is held by {holder.task_id!r} (completed)")
    ]
    assert [r.task_id for r in done.requeued] == [other.task_id]
    assert store.execution(other.task_id).status is TaskStatus.PENDING
    assert store.execution(dead.task_id).status is TaskStatus.FAILED


async def test_a_key_wins_over_a_chosen_id(make_store):
    store = make_store()
    async with trioexec.open_executor(store=store, keep_results=True) as ex:
        first = await ex.submit(charge, 1, task_id="charge-1", dedupe_key="charge-1")
        again = await ex.submit(charge, 2, task_id="charge-1", dedupe_key="charge-1")
        assert again.deduplicated
        assert again.task_id == "charge-1"
        assert (await first.wait()).result == (await again.wait()).result == {"order": 1}
        later = ex.submit_nowait(charge, 3, task_id="charge-1", dedupe_key="charge-1")
        assert later.deduplicated
        # a chosen id that another key holds is refused, as without a key
        with pytest.raises(ValueError, match="'charge-1' is already recorded in the store"):
            await ex.submit(charge, 4, task_id="charge-1", dedupe_key="other")


async def test_an_execution_that_just_failed_frees_its_key_at_once(make_store):
    """Its end is known here before it is in the store: a submission right after
    (its end not written yet) makes a new execution, as the contract says."""
    store = make_store()
    async with trioexec.open_executor(store=store, report_unread_failures=False) as ex:
        failed = await ex.submit(declined, 1, dedupe_key="y")
        while not failed.done:
            await trio.lowlevel.checkpoint()
        retry = await ex.submit(charge, 1, dedupe_key="y")
        assert not retry.deduplicated
        assert (await retry.wait()).result == {"order": 1}
    assert (await failed.wait()).status is TaskStatus.FAILED


async def test_the_window_is_less_than_its_seconds(autojump_clock):
    store = trioexec.MemoryStore(clock=FakeWallClock(start=1_000.0))
    async with trioexec.open_executor(store=store) as ex:
        first = await ex.submit(charge, 1, dedupe_key="w")
        await first.wait()
        ended = store.execution(first.task_id).finished_at
        await trio.sleep(5 - (store.clock() - ended))  # (exactly 5 s after it ended)
        assert not (await ex.submit(charge, 2, dedupe_key="w", dedupe_window=5)).deduplicated
    store.close()


async def test_a_keyed_submission_in_flight_as_the_executor_closes_is_refused(tmp_path):
    """Its row was stored while a shutdown began: it is refused (ExecutorClosed),
    never run, and its row ends REJECTED, so the key is free for the next one."""
    store = trioexec.SQLiteStore(tmp_path / "runs.db")
    stored = trio.Event()
    shutting_down = threading.Event()
    real = store.dedupe

    def dedupe(row: Any, window: Any) -> Any:
        found = real(row, window)
        trio.from_thread.run_sync(stored.set)
        assert shutting_down.wait(30)  # (returns once the shutdown has begun: bounded)
        return found

    store.dedupe = dedupe  # type: ignore[method-assign]
    ran: list[int] = []

    async def job() -> None:
        ran.append(1)

    errors: list[BaseException] = []
    async with trioexec.open_executor(store=store) as ex:

        async def submitter() -> None:
            try:
                await ex.submit(job, dedupe_key="k")
            except trioexec.ExecutorClosed as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(submitter)
            await stored.wait()  # (its row is in; the thread returns after the shutdown began)
            nursery.start_soon(ex.shutdown, trioexec.ShutdownPolicy.CANCEL)
            await trio.testing.wait_all_tasks_blocked()  # (the shutdown waits for it now)
            shutting_down.set()
    assert len(errors) == 1
    assert ran == []
    [record] = store.executions()
    assert (record.status, record.dedupe_key) == (TaskStatus.REJECTED, "k")
    store.close()
