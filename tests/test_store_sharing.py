"""Several executors and threads sharing one store object (issue 13, defect 4): the
store serialises its own writes, and each thread reads through a connection of its
own, so a read never waits behind another thread's write batch. Real files, real
threads (no mock clock: Trio's autojump and worker threads do not mix)."""

from __future__ import annotations

import threading

import pytest
import trio
from pg_server import STORE_KINDS

import trioexec
from trioexec import SQLiteStore, SubStatus, TaskStatus
from trioexec._changes import Finish, Start, Sub, submitted
from trioexec.durable import DurableStore, PromiseState

THREADS = 6
PER_THREAD = 60


@pytest.fixture(params=STORE_KINDS)
def shared(request, store_maker):
    """A store that writes from worker threads (not inline)."""
    return store_maker(request.param, **({} if request.param == "memory" else {"inline": False}))


async def test_two_executors_share_one_sqlite_store(tmp_path):
    """Before the fix: 'cannot start a transaction within a transaction' (both
    writers used the one write connection at once, from two worker threads)."""
    n = 150

    async def work(i: int, handle: trioexec.TaskHandle) -> int:
        if i % 3 == 0:
            await handle.defer_until(lambda: True)  # already true: no sub-status write
        await trio.lowlevel.checkpoint()
        return i

    with SQLiteStore(tmp_path / "shared.db") as store:
        refs: dict[str, list[trioexec.TaskRef[int]]] = {"a": [], "b": []}

        async def one_executor(who: str) -> None:
            async with trioexec.open_executor(store=store, max_concurrent_tasks=8) as ex:
                for i in range(n):
                    refs[who].append(await ex.submit(work, i, name=f"{who}-{i}"))
                await ex.wait_for_idle()
                await ex.flush()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one_executor, "a")
            nursery.start_soon(one_executor, "b")

        rows = {r.task_id: r for r in store.executions()}
        assert len(rows) == 2 * n
        for who, mine in refs.items():
            for i, ref in enumerate(mine):
                row = rows[ref.task_id]
                assert (row.name, row.status, row.sub_status) == (
                    f"{who}-{i}",
                    TaskStatus.COMPLETED,
                    None,
                )
                assert (await ref.wait()).result == i
        assert store.counts()[TaskStatus.COMPLETED] == 2 * n


def hammer(store, me: int, start: threading.Barrier, errors: list[BaseException]) -> None:
    """One thread's share: its own executions through every store method."""
    owner = f"owner-{me}"
    try:
        start.wait()
        for i in range(PER_THREAD):
            t = f"t{me}-{i:03d}"
            store.heartbeat(owner, 1e12)
            assert store.write([submitted(t, 1, f"job-{me}", None, None, None, owner, 1.0)]) == []
            assert store.write([Start((t, 1, 1, 2.0))]) == []
            if i % 2:
                assert store.write([Sub((t, 1, SubStatus.DEFERRED, 3.0, None))]) == []
            assert store.taken_over(owner, {t: 1}) == []
            assert store.execution(t).status is TaskStatus.RUNNING
            store.executions(status=TaskStatus.RUNNING, limit=20, order="newest")
            store.counts(sub_status=SubStatus.DEFERRED)
            store.recover(owner, 0.0, lambda r: True, 3)  # nobody's lease has expired
            assert store.runs_taken_over(owner, []) == []
            finish = Finish((t, 1, TaskStatus.COMPLETED, 4.0, None, None, None))
            assert store.write([finish]) == []
        store.release_owner(owner)
    except BaseException as exc:  # reported by the main thread
        errors.append(exc)


def test_threads_share_one_store(shared):
    """Before the fix: SQLite raised 'cannot start a transaction within a
    transaction' (or misused the one read connection); MemoryStore's readers met
    'dictionary changed size during iteration'."""
    start = threading.Barrier(THREADS)
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=hammer, args=(shared, me, start, errors)) for me in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    rows = shared.executions()
    assert len(rows) == THREADS * PER_THREAD
    assert {(r.status, r.sub_status, r.version, r.finished_at) for r in rows} == {
        (TaskStatus.COMPLETED, None, 1, 4.0)
    }
    for me in range(THREADS):
        mine = shared.executions(status="completed", run_id=None)
        assert [r.task_id for r in mine if r.owner == f"owner-{me}"] == [
            f"t{me}-{i:03d}" for i in range(PER_THREAD)
        ]


def test_reads_walk_the_rows_while_other_threads_write(shared):
    """Before the fix MemoryStore's long reads iterated its dicts while writers
    inserted into them: 'dictionary changed size during iteration'."""
    shared.write(
        [submitted(f"old-{i}", 1, "job", None, None, None, "A", 1.0) for i in range(20_000)]
    )
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def write(me: int) -> None:
        try:
            start.wait()
            for i in range(300):
                shared.write([submitted(f"new-{me}-{i}", 1, "job", None, None, None, "B", 2.0)])
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        try:
            start.wait()
            for _ in range(4):
                assert len(shared.executions(status="pending")) >= 20_000
                shared.recover("A", 0.0, lambda r: True, 3)  # walks every row
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(me,)) for me in range(2)]
    threads += [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(shared.executions()) == 20_000 + 2 * 300


def test_durable_tables_share_the_store_with_its_writers(tmp_path):
    """The durable tables write under the store's lock, beside executor-style
    batches in other threads: every promise and every execution lands."""
    with SQLiteStore(tmp_path / "shared.db") as store:
        ds = DurableStore(store)
        start = threading.Barrier(3)
        errors: list[BaseException] = []

        def promises() -> None:
            async def main() -> None:
                for i in range(40):
                    await ds.promises.create(f"p{i}", 3600)
                    await ds.promises.resolve(f"p{i}", data=i)

            try:
                start.wait()
                trio.run(main)
            except BaseException as exc:
                errors.append(exc)

        workers = [
            threading.Thread(target=hammer, args=(store, me, start, errors)) for me in range(2)
        ]
        workers.append(threading.Thread(target=promises))
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        assert errors == []
        assert len(store.executions(status="completed")) == 2 * PER_THREAD

        async def settled() -> list[PromiseState]:
            page, _ = await ds.promises.search(limit=100)
            return [p.state for p in page]

        assert trio.run(settled) == [PromiseState.RESOLVED] * 40
        ds.close()


def test_a_read_never_waits_behind_a_write_in_another_thread(tmp_path):
    """`execution`, `run`, `executions` and `counts` answer (from the committed
    state) while another thread is in the middle of a write transaction holding the
    store's lock: they use this thread's read connection, not the write one."""
    with SQLiteStore(tmp_path / "shared.db") as store:
        store.write([submitted("t1", 1, "job", None, "spec", "[]", "gone", 1.0)])
        inside, release = threading.Event(), threading.Event()

        def slow_recreatable(record: trioexec.ExecutionRecord) -> bool:
            inside.set()  # recover() holds the lock and an open write transaction here
            release.wait()
            return True

        writer = threading.Thread(target=store.recover, args=("B", 10.0, slow_recreatable, 3))
        writer.start()
        try:
            assert inside.wait(timeout=10)
            answers: list[object] = []
            reader = threading.Thread(
                target=lambda: answers.extend(
                    [
                        store.execution("t1").owner,
                        store.run("no-such-run"),
                        [r.task_id for r in store.executions(limit=5)],
                        store.counts()[TaskStatus.PENDING],
                    ]
                )
            )
            reader.start()
            reader.join(timeout=10)  # a bound on a failure, not a wait for success
            assert not reader.is_alive(), "a read waited behind the write"
            assert answers == ["gone", None, ["t1"], 1]
            # The Trio thread's own connection answers too (the executor's check).
            assert store.execution("t1").owner == "gone"
        finally:
            release.set()
            writer.join()
        assert store.execution("t1").owner == "B"  # the recovery committed


def test_close_closes_every_threads_read_connection(tmp_path):
    store = SQLiteStore(tmp_path / "shared.db")
    store.write([submitted("t1", 1, "job", None, None, None, "A", 1.0)])
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(store.execution("t1")))
    thread.start()
    thread.join()
    assert len(store._db._readers) >= 1
    store.close()
    assert len(store._db._readers) == 0
    with pytest.raises(trioexec.StoreError, match="closed"):
        store.execution("t1")
    assert seen[0].task_id == "t1"
