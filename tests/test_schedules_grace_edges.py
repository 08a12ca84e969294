"""Edge cases of schedules, the shutdown grace and `serve_until_signal`.

Schedules: starting in the hour a DST change repeats (no past occurrence, no busy
loop, other tasks keep running); an occurrence claimed in the store and then
refused is released for another executor (`Store.release_occurrence`, on every
store) with a ``schedule_skipped`` health event; a schedule id too long for its
occurrences' task ids is refused up front; a wall-clock step forward is noticed
within a minute; `Schedule.cancelled` once its executor's block ended with an
error. The grace: it abandons the thread of a sync task with a ``timeout=`` and
cannot interrupt one without (the documented limit). `serve_until_signal`
returns None once the executor shut down some other way.

Everything timed runs under the autojump clock with a `FakeWallClock` (or a wall
clock derived from one); the tests with a thread release it themselves.
"""

from __future__ import annotations

import datetime
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
import trio.testing

import trioexec
from trioexec import (
    HealthEventKind,
    MemoryStore,
    ScheduleRecord,
    ShutdownPolicy,
    SQLiteStore,
    TaskStatus,
)
from trioexec._events import EventStream
from trioexec.testing import FakeWallClock

UTC = datetime.UTC


def at(*fields: int) -> float:
    return datetime.datetime(*fields, tzinfo=UTC).timestamp()  # type: ignore[misc]


class GuardedWall:
    """A wall clock that follows ``FakeWallClock`` (plus a settable offset) and
    counts its calls. A schedule loop that never sleeps calls it without end
    (and, without a checkpoint, would hang the test): after ``limit`` calls it
    jumps two hours ahead, out of the window, and notes that it had to."""

    def __init__(self, start: float, limit: int = 2000) -> None:
        self._clock = FakeWallClock(start=start)
        self.offset = 0.0
        self.calls = 0
        self.limit = limit
        self.tripped = False

    def __call__(self) -> float:
        self.calls += 1
        if self.calls > self.limit and not self.tripped:
            self.tripped = True
            self.offset += 7200.0
        return self._clock() + self.offset


def recorder() -> tuple[trioexec.TaskSpec, list[str]]:
    ran: list[str] = []

    @trioexec.task(id="tick")
    async def tick(label: str) -> None:
        ran.append(label)

    return tick, ran


# ------------------------------------------------------------------ 1. DST: the repeated hour


async def test_starting_in_the_repeated_hour_neither_runs_a_past_occurrence_nor_spins(
    autojump_clock: Any,
) -> None:
    # 2026-11-01, America/New_York: 02:00 EDT becomes 01:00 EST; 01:00-02:00 happens
    # twice. The executor starts at 01:10 EST (06:10 UTC), after "30 1 * * *" already
    # fired at 01:30 EDT (05:30 UTC). The next occurrence is 2026-11-02 01:30 EST.
    # occurrence_after(cron, zone, 01:10 EST) returns 01:30 EDT, 40 minutes in the
    # past: the schedule fires it at once, then computes the same "following" time
    # again and again (_schedule.py:242-246): a loop without a sleep until the wall
    # clock leaves 01:00-01:29 EST, submitting the same occurrence over and over.
    wall = GuardedWall(at(2026, 11, 1, 6, 10))
    tick, ran = recorder()
    async with trioexec.open_executor() as ex:
        ex._core.wall = wall  # (no store: as tests/test_schedule.py does)
        schedule = ex.schedule(
            tick, cron="30 1 * * *", schedule_id="nightly", tz="America/New_York", args=("n",)
        )
        await trio.sleep(60)
        schedule.cancel()
    assert not wall.tripped, (
        f"the schedule loop spun: {wall.calls} wall-clock reads in 60 s; ran {len(ran)} times"
    )
    assert ran == []
    assert schedule.last_run is None


async def test_starting_in_the_repeated_hour_with_a_store_does_not_hammer_it(
    autojump_clock: Any,
) -> None:
    # The same with a store: the claim of 01:30 EDT fails after the first time, so
    # the loop is a busy loop of write transactions (one per turn) until 01:30 EST.
    wall = GuardedWall(at(2026, 11, 1, 6, 10))
    store = MemoryStore(clock=wall)
    claims = 0
    claim = store.claim_occurrence

    def counting_claim(*args: Any) -> bool:
        nonlocal claims
        claims += 1
        return claim(*args)

    store.claim_occurrence = counting_claim  # type: ignore[method-assign]
    tick, _ = recorder()
    async with trioexec.open_executor(store=store) as ex:
        ex.schedule(
            tick, cron="30 1 * * *", schedule_id="nightly", tz="America/New_York", args=("n",)
        )
        await trio.sleep(60)
    assert claims <= 1, f"{claims} claims of one occurrence in 60 virtual seconds"
    assert not wall.tripped


async def test_the_repeated_hour_loop_lets_other_tasks_run(autojump_clock: Any) -> None:
    # Worse than a busy loop: without a store, the refused submission (its id is
    # live) raises before any schedule point (submit only has
    # checkpoint_if_cancelled before its checks), so the loop never yields and
    # the whole Trio run -- heartbeats, signal handling, every other task --
    # freezes until the wall clock leaves the window (up to 45 minutes).
    wall = GuardedWall(at(2026, 11, 1, 6, 10))
    beats_at_trip: list[int] = []
    beats = 0
    tick, _ = recorder()

    async def beat() -> None:
        # (bounded: a schedule that sleeps never trips the guard)
        nonlocal beats
        while not wall.tripped and beats < 1000:
            beats += 1
            await trio.lowlevel.checkpoint()
        beats_at_trip.append(beats)

    async with trioexec.open_executor() as ex:
        ex._core.wall = wall
        async with trio.open_nursery() as nursery:
            nursery.start_soon(beat)
            ex.schedule(
                tick, cron="30 1 * * *", schedule_id="nightly", tz="America/New_York", args=("n",)
            )
        ex.unschedule("nightly")
    # ~700 schedule-loop turns (3 wall reads each) ran before the guard tripped;
    # a loop that checkpoints would have let `beat` run about as often.
    assert beats_at_trip
    assert beats_at_trip[0] >= 100, f"other tasks ran {beats_at_trip[0]} times"


# ------------------------------------------------------------------ 2. claim, then refuse


async def test_an_occurrence_one_executor_claims_but_refuses_is_run_by_none(
    autojump_clock: Any, tmp_path: Path
) -> None:
    # Two executors on one SQLite file; B's clock runs 10 s behind A's (two hosts),
    # so A always reaches an occurrence first. A is full (one slot, no queue,
    # REJECT): it claims the occurrence, its submission is refused, and
    # _schedule.py:266-269 skips it. B, idle, then loses the claim. API.md §9:
    # "several executors sharing a store run each occurrence once" -- here, none.
    clock_a = FakeWallClock(start=at(2026, 1, 1, 0, 1))
    clock_b = FakeWallClock(start=at(2026, 1, 1, 0, 1) - 10)
    path = tmp_path / "runs.db"
    tick, ran = recorder()
    with (
        SQLiteStore(path, clock=clock_a, inline=True) as store_a,
        SQLiteStore(path, clock=clock_b, inline=True) as store_b,
    ):
        async with (
            trioexec.open_executor(
                store=store_a,
                max_concurrent_tasks=1,
                queue_capacity=0,
                overflow=trioexec.Overflow.REJECT,
            ) as a,
            trioexec.open_executor(store=store_b) as b,
        ):
            busy = await a.submit(trio.sleep, 3600)
            a.schedule(tick, cron="*/5 * * * *", schedule_id="five", args=("a",))
            b.schedule(tick, cron="*/5 * * * *", schedule_id="five", args=("b",))
            await trio.sleep(30 * 60)
            busy.cancel()
        ids = sorted(r.task_id for r in store_a.executions() if r.task_id.startswith("five@"))
    assert ran == ["b"] * 6, ran
    assert ids == [f"five@2026-01-01T00:{m:02}:00Z" for m in range(5, 31, 5)]


async def test_a_refused_occurrence_says_so_in_a_health_event(autojump_clock: Any) -> None:
    clock = FakeWallClock(start=at(2026, 1, 1, 0, 4, 50))
    store = MemoryStore(clock=clock)
    tick, ran = recorder()
    async with trioexec.open_executor(
        store=store, max_concurrent_tasks=1, queue_capacity=0, overflow=trioexec.Overflow.REJECT
    ) as ex:
        busy = await ex.submit(trio.sleep, 3600)
        ex.schedule(tick, cron="*/5 * * * *", schedule_id="five", args=("a",))
        await trio.sleep(60)
        busy.cancel()
    skipped = [e for e in _drain(ex.events) if e.kind is HealthEventKind.SCHEDULE_SKIPPED]
    assert ran == []
    [event] = skipped
    # (issue 30 item 8: a full executor no longer claims it, then refuses it: it
    # leaves it unclaimed, for another executor on the store that has room)
    assert (event.task_id, event.reason) == ("five@2026-01-01T00:05:00Z", "no_room")
    assert event.attributes["schedule_id"] == "five"
    assert event.attributes["at"] == at(2026, 1, 1, 0, 5)
    assert event.attributes["error"].startswith("no room (overflow=reject, queue_full")
    # Never claimed: the store's last run is none, and it may be claimed.
    [record] = store.schedules()
    assert record.last_run is None
    assert store.claim_occurrence("five", at(2026, 1, 1, 0, 5), "other", None)


def _drain(events: EventStream) -> list[trioexec.HealthEvent]:
    out = []
    while (event := events.get_nowait()) is not None:
        out.append(event)
    return out


def test_only_the_claimer_releases_an_occurrence(make_store: Callable[..., Any]) -> None:
    first = make_store()
    second = first if isinstance(first, MemoryStore) else make_store()
    record = ScheduleRecord(schedule_id="s", cron="* * * * *", tz="UTC", name="t", next_run=60.0)
    first.save_schedule(record)
    assert first.claim_occurrence("s", 60.0, "A", 120.0)
    assert first.claim_occurrence("s", 120.0, "A", 180.0)
    assert second.release_occurrence("s", 120.0, "B") is False  # not B's
    assert second.release_occurrence("s", 999.0, "A") is False  # never claimed
    assert second.schedules()[0].last_run == 120.0
    assert second.release_occurrence("s", 120.0, "A") is True
    # The last run goes back to the latest occurrence still claimed.
    assert first.schedules()[0].last_run == 60.0
    assert second.claim_occurrence("s", 120.0, "B", 180.0)  # free again
    assert first.release_occurrence("s", 60.0, "A") is True
    assert first.schedules()[0].last_run == 120.0  # (not the one released)
    assert first.release_occurrence("s", 60.0, "A") is False  # once


# ------------------------------------------------------------------ 3. ids


async def test_a_schedule_id_whose_occurrence_ids_are_too_long_is_refused_up_front(
    autojump_clock: Any,
) -> None:
    # check_id accepts a 990-character schedule_id (_schedule.py:162), but every
    # occurrence id is 990 + 21 characters: submit raises ValueError, which
    # _fire swallows (_schedule.py:266). Nothing ever runs, nothing says so, and
    # the store records each occurrence as the schedule's last run.
    clock = FakeWallClock(start=at(2026, 1, 1, 0, 1))
    store = MemoryStore(clock=clock)
    tick, ran = recorder()
    refused = False
    async with trioexec.open_executor(store=store) as ex:
        try:
            ex.schedule(tick, cron="*/5 * * * *", schedule_id="s" * 990, args=("x",))
        except ValueError as exc:
            refused = "schedule_id is 990 characters long (at most 979" in str(exc)
        ex.schedule(tick, cron="*/5 * * * *", schedule_id="s" * 979, args=("y",))
        await trio.sleep(15 * 60)
    assert refused
    assert ran == ["y", "y", "y"]


# ------------------------------------------------------------------ 4. the wall clock


async def test_a_wall_clock_step_forward_is_noticed_before_the_long_sleep_ends(
    autojump_clock: Any,
) -> None:
    # A daily schedule sleeps ~24 h on Trio's (monotonic) clock in one go
    # (_schedule.py:236-239). If the wall clock steps forward (NTP correction, a
    # VM or laptop resumed: CLOCK_MONOTONIC does not count suspend), the
    # occurrence runs as late as the step, here almost a day.
    wall = GuardedWall(at(2026, 1, 1, 0, 1))
    store = MemoryStore(clock=wall)
    tick, ran = recorder()
    async with trioexec.open_executor(store=store) as ex:
        ex.schedule(tick, cron="0 0 * * *", schedule_id="daily", args=("d",))
        await trio.sleep(3600)  # 01:01
        wall.offset += 23 * 3600  # the wall clock says 2026-01-02 00:01 now
        await trio.sleep(15 * 60)
        assert ran == ["d"], "midnight passed 15 minutes ago by the wall clock"
        ex.unschedule("daily")


# ------------------------------------------------------------------ 5. the grace


async def _shut_down_with_a_stuck_thread(
    timeout: float | None,
) -> tuple[bool, list[float], trioexec.TaskRef[None]]:
    """Shut down (DRAIN, grace 5 s) while a sync task waits in its thread; the
    thread is let go 60 virtual seconds in. Returns whether the shutdown had
    ended by then, when it ended, and the task."""
    release = threading.Event()

    def stuck() -> None:
        release.wait(30)  # (a real bound, so a failing test cannot hang)

    ended_at: list[float] = []
    async with trioexec.open_executor(shutdown_grace=5.0) as ex:
        ref = await ex.submit(stuck, timeout=timeout)

        async def shut() -> None:
            await ex.shutdown(ShutdownPolicy.DRAIN)
            ended_at.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(shut)
            await trio.sleep(60)  # virtual: 12 graces
            done_by_60 = bool(ended_at)
            release.set()
    return done_by_60, ended_at, ref


async def test_the_grace_abandons_the_thread_of_a_sync_task_with_a_timeout(
    autojump_clock: Any,
) -> None:
    # A sync task with a timeout= runs in a thread that is abandoned when it is
    # cancelled (as at its timeout): the grace ends its attempt, CANCELLED.
    done_by_60, ended_at, ref = await _shut_down_with_a_stuck_thread(timeout=3600.0)
    assert done_by_60
    assert ended_at == [5.0]
    assert ref.status is TaskStatus.CANCELLED


async def test_the_grace_cannot_interrupt_the_thread_of_a_sync_task_without_a_timeout(
    autojump_clock: Any,
) -> None:
    # Documented (open_executor, Executor.shutdown): without a timeout= the thread
    # is waited for, so that trio.from_thread calls in it run in its task (its
    # causation, its cancellation). Trio cannot abandon such a thread later, so
    # the grace cancels the task, which the thread sees only through
    # trio.from_thread.check_cancelled() or defer_until_sync, and the shutdown
    # waits for the thread to return; the task ends as its function does (here
    # it returns: COMPLETED).
    done_by_60, ended_at, ref = await _shut_down_with_a_stuck_thread(timeout=None)
    assert not done_by_60
    assert ended_at == [60.0]
    assert ref.status is TaskStatus.COMPLETED


# ------------------------------------------------------------------ 6. serve_until_signal


async def test_serve_until_signal_returns_when_the_executor_shut_down_otherwise(
    autojump_clock: Any,
) -> None:
    # A task ends the work with ex.shutdown() (API.md: "shutdown() called from
    # inside a task begins the shutdown and returns"). The executor drains and is
    # idle and closed, but serve_until_signal (_signals.py:179-180) waits for a
    # signal that may never come: the worker process hangs until the service
    # manager kills it.
    async def last_job(ex: trioexec.Executor) -> None:
        await ex.shutdown()

    returned = False
    async with trioexec.open_executor() as ex:
        await ex.submit(last_job, ex)
        with trio.move_on_after(3600):
            await trioexec.serve_until_signal(ex, signals=(signal.SIGUSR1,))
            returned = True
        assert ex.closed
    assert returned, "serve_until_signal still waiting an hour after the executor closed"


# ------------------------------------------------------------------ 7. Schedule.cancelled


async def test_a_schedule_says_cancelled_after_its_executor_ended_by_an_error(
    autojump_clock: Any,
) -> None:
    # Schedule.cancelled: "True once the schedule was cancelled (or its executor
    # shut down)". Only Executor.shutdown closes the schedules (_executor.py,
    # `self._schedules.close()`); a body that raises goes through
    # core.shutdown.begin(CANCEL) alone, so the schedule task dies with the
    # nursery while its own scope was never cancelled: `cancelled` stays False.
    clock = FakeWallClock(start=at(2026, 1, 1, 0, 1))
    tick, _ = recorder()
    schedule = None
    try:
        async with trioexec.open_executor(store=MemoryStore(clock=clock)) as ex:
            schedule = ex.schedule(tick, cron="*/5 * * * *", schedule_id="five", args=("x",))
            await trio.sleep(1)
            raise KeyError("boom")
    except KeyError:
        pass
    assert schedule is not None
    assert schedule.next_run is None
    assert schedule.cancelled
