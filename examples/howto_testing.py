"""How-to: test tasks that defer, with virtual time and no sleeping.

These are pytest tests written for pytest-trio (``trio_mode = true``), the way
trioexec's own tests are written:

- ``autojump_clock`` (a ``trio.testing.MockClock(autojump_threshold=0)``): time
  jumps ahead whenever every task is blocked, so an hour-long wait takes no real
  time and durations can be asserted exactly;
- ``trio.testing.wait_all_tasks_blocked()`` instead of sleeping "long enough":
  it returns once every task is waiting on something, e.g. deferred;
- `trioexec.DeterministicExecutor`: nothing runs until ``await ex.run_ready()``,
  then tasks run one at a time in FIFO order, in the test's own task;
- a store whose wall clock follows the mock clock: `trioexec.MemoryStore` or
  ``SQLiteStore(path, inline=True)`` (inline: no worker threads, which autojump
  does not mix with) with ``clock=trioexec.testing.FakeWallClock()``, so
  ``deferred_since`` and ``deferred_longer_than`` move with virtual time.

Run them with ``pytest examples/howto_testing.py``, or with
``python examples/howto_testing.py``, which runs each test under a fresh mock
clock the same way (no pytest needed).
"""

from __future__ import annotations

import functools
import inspect
import pathlib
import tempfile

import trio
import trio.testing

import trioexec
from trioexec import Backoff, DeterministicExecutor, SubStatus, TaskHandle, TaskStatus
from trioexec.testing import FakeWallClock

HOUR = 3600.0


async def wait_for(event: trio.Event, handle: TaskHandle) -> str:
    await handle.defer_until(event)
    return "done"


async def test_deferred_task_frees_its_slot(autojump_clock: trio.testing.MockClock) -> None:
    event = trio.Event()
    async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
        ref = await ex.submit(wait_for, event)
        await trio.testing.wait_all_tasks_blocked()  # until it has deferred
        assert ref.sub_status is SubStatus.DEFERRED
        assert ex.slots.in_use == 0
        assert await ex.run(trio.sleep, 1) is None  # the one slot is free for other work

        await trio.sleep(HOUR)  # instant, with the autojump clock
        event.set()
        completion = await ref.wait()
    assert completion.result == "done"
    assert completion.deferred_seconds == HOUR + 1  # exact: virtual time


async def test_polling_follows_the_backoff(autojump_clock: trio.testing.MockClock) -> None:
    checks: list[float] = []

    async def job_done() -> bool:
        checks.append(trio.current_time() - t0)
        return len(checks) == 5

    async def poller(handle: TaskHandle) -> None:
        await handle.defer_until(job_done, poll_interval=Backoff(initial=10, factor=3, max=60))

    async with trioexec.open_executor() as ex:
        t0 = trio.current_time()
        await ex.run(poller)
    assert checks == [0, 10, 40, 100, 160]  # now, then after 10, 30, 60, 60


async def test_deterministic_executor_runs_fifo_in_the_test() -> None:
    ran: list[int] = []

    async def job(n: int) -> int:
        ran.append(n)
        return n * n

    ex = DeterministicExecutor(max_concurrent_tasks=2, queue_capacity=2)
    refs = [ex.submit_nowait(job, n) for n in range(4)]
    assert ran == []  # nothing runs until run_ready
    assert ex.pending == 4
    first = await ex.run_ready(max_tasks=1)
    assert [c.result for c in first] == [0]
    rest = await ex.run_ready()
    assert [c.result for c in rest] == [1, 4, 9]
    assert ran == [0, 1, 2, 3]
    assert all(r.status is TaskStatus.COMPLETED for r in refs)


async def test_store_queries_follow_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    event = trio.Event()
    with trioexec.MemoryStore(clock=FakeWallClock(start=1_700_000_000)) as store:
        async with trioexec.open_executor(store=store) as ex:
            ref = await ex.submit(wait_for, event)
            await trio.sleep(20 * 60)
            await ex.flush()  # make what happened so far visible to queries
            [record] = store.executions(sub_status=SubStatus.DEFERRED)
            assert record.task_id == ref.task_id
            assert record.deferred_since == 1_700_000_000  # deferred at once
            assert store.executions(deferred_longer_than=15 * 60) == [record]
            assert store.executions(deferred_longer_than=30 * 60) == []
            event.set()
        record = store.execution(ref.task_id)
    assert record is not None
    assert record.status is TaskStatus.COMPLETED
    assert record.sub_status is None


async def test_sqlite_store_inline(
    autojump_clock: trio.testing.MockClock, tmp_path: pathlib.Path
) -> None:
    event = trio.Event()
    path = tmp_path / "runs.db"
    with trioexec.SQLiteStore(path, inline=True, clock=FakeWallClock()) as store:
        async with trioexec.open_executor(store=store) as ex:
            ref = await ex.submit(wait_for, event, name="wait_for")
            await trio.sleep(HOUR)
            await ex.flush()
            assert [r.name for r in store.executions(deferred_longer_than=HOUR - 1)] == ["wait_for"]
            event.set()
    # Another reader (a dashboard, the CLI) sees the same file.
    with trioexec.SQLiteStore(path) as reader:
        record = reader.execution(ref.task_id)
    assert record is not None
    assert record.status is TaskStatus.COMPLETED
    assert record.sub_status is None
    assert record.finished_at == HOUR  # FakeWallClock() starts at 0


def run_without_pytest() -> None:
    """Run every test above as pytest-trio would: a fresh mock clock for those
    that ask for ``autojump_clock``, a fresh directory for ``tmp_path``."""
    tests = [fn for name, fn in globals().items() if name.startswith("test_")]
    for test in tests:
        params = inspect.signature(test).parameters
        with tempfile.TemporaryDirectory() as tmp:
            clock = trio.testing.MockClock(autojump_threshold=0)
            fixtures = {"autojump_clock": clock, "tmp_path": pathlib.Path(tmp)}
            kwargs = {name: fixtures[name] for name in params}
            use_clock = clock if "autojump_clock" in params else None
            trio.run(functools.partial(test, **kwargs), clock=use_clock)
        print(f"passed: {test.__name__}")
    assert len(tests) == 5, tests


if __name__ == "__main__":
    run_without_pytest()
