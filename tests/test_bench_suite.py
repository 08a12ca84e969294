"""benchmarks/suite.py's runner: interleaved rounds, the median kept, the spread."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from bench_scripts import load_script


@pytest.fixture
def suite(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return load_script("suite", monkeypatch)


def test_rounds_are_interleaved_and_the_median_is_kept(
    suite: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[tuple[str, Any]] = []
    seconds = {"executor": iter([3.0, 1.0, 2.0]), "channel_pool": iter([5.0, 4.0, 6.0])}

    def once(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        order.append((name, kwargs["n"]))
        return {"seconds": next(seconds[name]), "peak_rss_kb": 1}

    monkeypatch.setattr(suite.Runner, "_once", staticmethod(once))
    run = suite.Runner(repeat=3)
    run.interleave(("executor", {"n": 1}), ("channel_pool", {"n": 1}), ("executor", {"n": 1}))
    assert order == [("executor", 1), ("channel_pool", 1)] * 3  # A B, A B, A B
    ours, pool = run("executor", n=1), run("channel_pool", n=1)
    assert len(order) == 6  # cached: not run again
    assert (ours["seconds"], ours["rounds"]) == (2.0, [3.0, 1.0, 2.0])
    assert (pool["seconds"], pool["rounds"]) == (5.0, [5.0, 4.0, 6.0])
    assert suite.per_round(pool, ours) == [5 / 3, 4 / 1, 6 / 2]
    row = suite.ratio("x", 2.5, ">= 1.0x", True, rounds=suite.per_round(pool, ours))
    assert row["spread"] == [suite.rnd(5 / 3), 4.0]


def test_a_bound_keeps_its_worst_round_and_untimed_cases_run_once(
    suite: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    peaks = iter([10, 30, 20])
    calls: list[str] = []

    def once(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        calls.append(name)
        return {"peak_rss_kb": next(peaks)} if name == "store_backlog" else {"rows": 1}

    monkeypatch.setattr(suite.Runner, "_once", staticmethod(once))
    run = suite.Runner(repeat=3)
    assert run("store_backlog", n=1)["peak_rss_kb"] == 30
    assert run("sqlite_raw", single=1) == {"rows": 1}
    assert calls == ["store_backlog"] * 3 + ["sqlite_raw"]


def test_the_floor_pool_runs_every_task_and_resumes_every_deferral(suite: ModuleType) -> None:
    """Issue 32's floor (`FloorPool`) is a working pool, not a stand-in: every task
    runs, a deferral gives its slot to queued work and takes one back, and no more
    tasks than slots run at any time (its own count of them, checked)."""
    import trio
    import trio.testing

    held: list[int] = []

    async def main() -> None:
        ev = trio.Event()

        async def parked(handle: Any) -> str:
            held.append(pool.counts.active)
            await handle.defer_until(ev)
            held.append(pool.counts.active)
            return "woken"

        async def plain(i: int) -> int:
            held.append(pool.counts.active)
            await trio.lowlevel.checkpoint()
            return i

        async with trio.open_nursery() as nursery:
            pool = suite.FloorPool(nursery, 3, queue_capacity=100)
            deferring = [await pool.submit(suite.takes_handle, parked) for _ in range(10)]
            plains = [await pool.submit(plain, i) for i in range(10)]
            await trio.testing.wait_all_tasks_blocked()
            assert pool.counts.deferred == 10
            assert pool.limiter.borrowed_tokens == 0  # (each gave its slot back)
            assert [r.result for r in plains] == list(range(10))
            ev.set()
            await trio.testing.wait_all_tasks_blocked()
            assert [r.result for r in deferring] == ["woken"] * 10
            assert pool.counts.completed == 20
            assert pool.counts.deferred == 0
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert len(held) == 30
    assert max(held) <= 3


def test_the_stored_floor_writes_each_task_s_row_as_trioexec_reads_it(
    suite: ModuleType, tmp_path: Any
) -> None:
    """Issue 32's stored floor (`floor_pool(store=True)`) writes a whole row per
    task, its end folded in, that trioexec's own store reads as that execution's."""
    import trio
    import trio.testing

    import trioexec

    path = str(tmp_path / "floor.db")

    async def boom() -> None:
        raise KeyError("no")

    async def main() -> None:
        rows: list[list[Any]] = []
        async with trio.open_nursery() as nursery:
            pool = suite.FloorPool(nursery, 2, rows=rows)
            refs = [await pool.submit(suite.noop) for _ in range(5)]
            refs.append(await pool.submit(boom))
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        await trio.to_thread.run_sync(suite.write_rows, path, rows)
        with trioexec.SQLiteStore(path) as store:
            for ref in refs:
                record = store.execution(ref.task_id)
                assert record is not None
                assert record.name == ref.name
                assert record.status == ref.status
                assert record.attempt == 1
                assert record.finished_at == ref.finished_at
            assert "KeyError" in (store.execution(refs[-1].task_id).error or "")

    with trioexec.SQLiteStore(path):
        pass  # (the schema)
    trio.run(main)
