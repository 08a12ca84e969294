"""The edges a review of issue 18 items 2 and 3 found: pause/resume against the
queue's counts, keys, retries and shutdown; operator commands through the store;
dead letters. Each test failed before its fix."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import trioexec
import trioexec._control
from trioexec import Backoff, KeyLimit, Overflow, ShutdownPolicy, SQLiteStore, TaskStatus
from trioexec.testing import FakeWallClock


async def _noop() -> None:
    pass


# ------------------------------------------------------------ pauses and shutdown


@pytest.mark.parametrize("how", ["pause after the drain began", "own task submits during drain"])
async def test_a_drain_ends_when_tasks_are_paused_after_it_began(
    autojump_clock: trio.abc.Clock, how: str
) -> None:
    gate = trio.Event()
    later: list[trioexec.TaskRef] = []

    async def blocker() -> None:
        await gate.wait()

    async def producer() -> None:
        await gate.wait()
        later.append(await ex.submit(_noop, name="later"))  # (allowed while draining)

    with trio.fail_after(100):
        async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
            if how == "pause after the drain began":
                await ex.submit(blocker)
                later.append(await ex.submit(_noop, name="later"))
            else:
                ex.pause(name="later")
                await ex.submit(producer)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ex.shutdown)  # DRAIN: the parked ones were cancelled here
                await trio.testing.wait_all_tasks_blocked()
                ex.pause(name="later")
                gate.set()
    # A paused task would never start: the drain must not wait for it forever.
    assert later[0].status is TaskStatus.CANCELLED


async def test_drop_oldest_keeps_a_paused_task_where_cancel_pending_finds_it(
    autojump_clock: trio.abc.Clock,
) -> None:
    gate = trio.Event()

    async def blocker() -> None:
        await gate.wait()

    with trio.fail_after(100):
        async with trioexec.open_executor(
            max_concurrent_tasks=1, queue_capacity=3, overflow=Overflow.DROP_OLDEST
        ) as ex:
            await ex.submit(blocker)
            await trio.testing.wait_all_tasks_blocked()
            ex.pause(name="p")
            parked = await ex.submit(_noop, name="p")  # the oldest queued task
            for _ in range(200):  # each drops the oldest that is not paused
                await ex.submit(_noop, name="w")
            gate.set()
            # take_all walks Pending._order: the paused task is not there any more,
            # so it stays PENDING and this shutdown waits for it forever.
            await ex.shutdown(ShutdownPolicy.CANCEL_PENDING)
    assert parked.status is TaskStatus.CANCELLED


async def test_pausing_many_queued_tasks_keeps_them_where_cancel_pending_finds_them(
    autojump_clock: trio.abc.Clock,
) -> None:
    gate = trio.Event()

    async def blocker() -> None:
        await gate.wait()

    with trio.fail_after(100):
        async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
            await ex.submit(blocker)
            refs = [await ex.submit(_noop, name="n") for _ in range(100)]
            ex.pause(name="n")  # the 65th parked passes _COMPACT_AFTER tombstones
            ex.resume(name="n")
            gate.set()
            # take_all walks Pending._order: one task is not there, stays PENDING,
            # and this shutdown waits for it forever.
            await ex.shutdown(ShutdownPolicy.CANCEL_PENDING)
    assert {ref.status for ref in refs} == {TaskStatus.CANCELLED}


@pytest.mark.parametrize("policy", [ShutdownPolicy.DRAIN, ShutdownPolicy.CANCEL_PENDING])
async def test_a_shutdown_ends_with_a_retry_held_by_a_pause(
    autojump_clock: trio.abc.Clock, policy: ShutdownPolicy
) -> None:
    calls: list[int] = []

    @trioexec.task(retries=1, backoff=Backoff(initial=1, max=1), id="review-flaky")
    async def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("once")

    with trio.fail_after(100):
        async with trioexec.open_executor(shutdown_policy=policy) as ex:
            ref = await ex.submit(flaky, name="r")
            await trio.testing.wait_all_tasks_blocked()  # failed once, in its backoff
            ex.pause(name="r")
            await trio.sleep(5)
            assert (ref.status, ref.waiting_on) == (TaskStatus.PENDING, "paused")
    # Its next attempt would never start: the shutdown must end it, as it ends
    # the paused queued tasks.
    assert ref.status is TaskStatus.CANCELLED


# ------------------------------------------------------------ pauses and keys


async def test_key_statistics_count_paused_tasks_as_pending(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with trioexec.open_executor(key_limits=KeyLimit(concurrency=1)) as ex:
        ex.pause(key="k")
        for _ in range(3):
            await ex.submit(_noop, key="k")
        assert ex.statistics().queue_depth == 3
        # KeyStatistics.pending: "have not started (held back by the key or
        # waiting for a slot)"; these have not started either.
        assert ex.key_statistics("k").pending == 3
        ex.resume(key="k")


async def test_pausing_with_a_retry_waiting_for_its_key_keeps_the_queue_counts(
    autojump_clock: trio.abc.Clock,
) -> None:
    gate = trio.Event()
    calls: list[float] = []

    @trioexec.task(retries=1, backoff=Backoff(initial=10, max=10), key="K")
    async def flaky() -> None:
        calls.append(trio.current_time())
        if len(calls) == 1:
            raise RuntimeError("once")

    async def hold() -> None:
        await gate.wait()

    async with trioexec.open_executor(
        max_concurrent_tasks=2, key_limits={"K": KeyLimit(concurrency=3)}
    ) as ex:
        pending = ex._core.pending
        retry = await ex.submit(flaky)  # fails, waits 10 s for its next attempt
        await trio.testing.wait_all_tasks_blocked()
        held = [await ex.submit(hold, key="K"), await ex.submit(hold)]  # both slots busy
        await trio.testing.wait_all_tasks_blocked()
        # Let through by K (it has room), waiting for a slot:
        low = [await ex.submit(_noop, key="K", name="n") for _ in range(2)]
        await trio.sleep(20)  # the retry waits in K's line now (no room)
        assert retry.waiting_on == "key concurrency K"
        # A retry in K's line: a better task is held, not swapped with a let-through one.
        high = await ex.submit(_noop, key="K", name="n", priority=10)
        ex.pause(name="n")
        state = pending.keys.states["K"]
        assert not [job for job in state.earmarked if job.paused]
        assert (pending.startable, pending.keys.held) == (0, 0)  # nothing of "n" may start
        ex.resume(name="n")
        gate.set()
        with trio.fail_after(100):
            for ref in (retry, *held, *low, high):
                assert (await ref.wait()).ok


# ------------------------------------------------------------ the store


@trioexec.task(id="review-boom")
async def boom(n: int) -> None:
    raise ValueError(f"boom {n}")


async def test_a_recovered_paused_task_is_recorded_as_paused(
    autojump_clock: trio.abc.Clock,
) -> None:
    store = trioexec.MemoryStore(clock=FakeWallClock())
    async with trioexec.open_executor(store=store, tasks=[boom]) as ex:
        await (await ex.submit(boom, 1, task_id="dead")).wait()
    store.requeue(["dead"], who="op")
    store.command("pause", name="review-boom", who="op")
    async with trioexec.open_executor(store=store, tasks=[boom], recover=True) as ex:
        await ex.flush()
        record = store.execution("dead")
        assert record.status is TaskStatus.PENDING
        assert record.waiting_on == "paused"  # TaskRef.waiting_on says so
        ex.resume(name="review-boom")


async def test_a_cancelled_task_keeps_no_traceback(autojump_clock: trio.abc.Clock) -> None:
    store = trioexec.MemoryStore(clock=FakeWallClock())

    async def with_a_nursery() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)

    async with trioexec.open_executor(store=store) as ex:
        ref = await ex.submit(with_a_nursery, task_id="c")
        await trio.testing.wait_all_tasks_blocked()
        ref.cancel()
        assert (await ref.wait()).status is TaskStatus.CANCELLED
    record = store.execution("c")
    assert record.status is TaskStatus.CANCELLED
    # ExecutionRecord: traceback is that of "a FAILED or TIMED_OUT execution (None otherwise)"
    assert record.traceback is None


async def test_a_pause_just_before_the_executor_exits_is_recorded(
    store_maker: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # (A longer poll only widens the window: with 0.5 s, an exit within 0.5 s of
    # the pause loses it just the same.)
    monkeypatch.setattr(trioexec._control, "POLL", 30.0)
    store = store_maker("postgres")
    async with trioexec.open_executor(store=store) as ex:
        await trio.testing.wait_all_tasks_blocked()  # Control.run waits in LISTEN
        ex.pause(name="nightly")
    # "Every command is recorded": the other executors on the store never hear of it.
    assert [(p.kind, p.value) for p in store.pauses()] == [("name", "nightly")]


async def test_a_task_that_completes_despite_a_cancel_command_has_no_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    store = trioexec.MemoryStore(clock=FakeWallClock())
    done = trio.Event()

    async def finishing() -> int:
        with trio.CancelScope(shield=True):  # (its last step cannot be interrupted)
            await done.wait()
        return 42

    async with trioexec.open_executor(store=store) as ex:
        ref = await ex.submit(finishing, task_id="s")
        await trio.testing.wait_all_tasks_blocked()
        await ex.flush()
        command = store.command("cancel", task_id="s", who="op")
        assert command.detail.startswith("sent to its owner")
        await trio.sleep(1)  # the executor follows the command (POLL)
        done.set()
        completion = await ref.wait()
    assert (completion.status, completion.result) == (TaskStatus.COMPLETED, 42)
    assert completion.error is None
    record = store.execution("s")
    assert (record.status, record.error, record.traceback) == (TaskStatus.COMPLETED, None, None)


# ------------------------------------------------------------ the command line


def test_cli_pause_with_a_bad_target_records_nothing(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    SQLiteStore(db).close()
    done = subprocess.run(
        [sys.executable, "-m", "trioexec", "pause", str(db), "--name", "ok", "--name", ""],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    store = SQLiteStore(db)
    try:
        # A usage error is refused as a whole, before anything is written.
        assert store.pauses() == []
        assert store.commands() == []
    finally:
        store.close()


@pytest.mark.parametrize("again", ["key", "name"])
async def test_a_retry_let_go_and_paused_again_before_it_runs_stays_held(autojump_clock, again):
    """Issue 31 review: a pause lifted and another laid at once (the same name,
    or the task's key) holds a retry between its attempts still; it does not slip
    through in the moment between the lift and its task running."""
    attempts: list[float] = []

    @trioexec.task(retries=1, backoff=Backoff(initial=1, jitter=0.0), key="K")
    async def flaky() -> None:
        attempts.append(trio.current_time())
        if len(attempts) == 1:
            raise ValueError("first attempt fails")

    async with trioexec.open_executor() as ex:
        ref = await ex.submit(flaky, name="r")
        await trio.sleep(0.5)
        ex.pause(name="r")
        await trio.sleep(5)
        assert (len(attempts), ref.waiting_on) == (1, "paused")
        ex.resume(name="r")
        ex.pause(**{again: "K" if again == "key" else "r"})
        await trio.sleep(5)
        held = (len(attempts), ref.waiting_on)
        ex.resume(**{again: "K" if again == "key" else "r"})
        assert (await ref.wait()).ok
    assert held == (1, "paused")
    assert len(attempts) == 2
