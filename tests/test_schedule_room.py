"""A full executor leaves a schedule's occurrence to one with room (issue 30
item 8). API.md §9: several executors sharing a store run each occurrence once.
An executor without room for an occurrence (a refusing overflow policy: REJECT,
DROP_NEWEST, FAIL_FAST) does not claim it, so another executor on the store
takes it, instead of claiming it and then refusing it (never run) or recording
it DROPPED. Two executors on one SQLite file, on one wall clock, under the
autojump clock.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import trioexec
from trioexec import HealthEventKind, MemoryStore, Overflow, SQLiteStore, TaskStatus
from trioexec._events import EventStream
from trioexec.testing import FakeWallClock

START = datetime.datetime(2026, 1, 1, 0, 0, 30, tzinfo=datetime.UTC).timestamp()
MINUTES = 20


def _drain(events: EventStream) -> list[trioexec.HealthEvent]:
    out = []
    while (event := events.get_nowait()) is not None:
        out.append(event)
    return out


@pytest.mark.parametrize("overflow", [Overflow.REJECT, Overflow.DROP_NEWEST, Overflow.FAIL_FAST])
async def test_every_occurrence_runs_once_when_one_executor_is_full(
    tmp_path: Path, autojump_clock: Any, overflow: Overflow
) -> None:
    clock = FakeWallClock(start=START)
    ran: list[str] = []

    @trioexec.task(id="tick")
    async def tick(label: str) -> None:
        ran.append(label)

    path = tmp_path / "runs.db"
    with (
        SQLiteStore(path, clock=clock, inline=True) as store_a,
        SQLiteStore(path, clock=clock, inline=True) as store_b,
    ):
        async with (
            trioexec.open_executor(
                store=store_a, max_concurrent_tasks=1, queue_capacity=0, overflow=overflow
            ) as full,
            trioexec.open_executor(store=store_b) as roomy,
        ):
            busy = await full.submit(trio.sleep, 24 * 3600)
            # Each starts the schedule; which of them reaches an occurrence first
            # is Trio's choice, occurrence by occurrence.
            full.schedule(tick, cron="* * * * *", schedule_id="minute", args=("full",))
            roomy.schedule(tick, cron="* * * * *", schedule_id="minute", args=("roomy",))
            await trio.sleep(MINUTES * 60)
            busy.cancel()
        rows = [r for r in store_a.executions() if r.task_id.startswith("minute@")]
    want = [f"minute@2026-01-01T00:{m:02}:00Z" for m in range(1, MINUTES + 1)]
    assert sorted(r.task_id for r in rows) == want  # each occurrence once...
    assert {r.status for r in rows} == {TaskStatus.COMPLETED}  # ...run, none DROPPED
    assert ran == ["roomy"] * MINUTES  # by the executor with room
    assert full.statistics().dropped_count == 0
    skipped = [e for e in _drain(full.events) if e.kind is HealthEventKind.SCHEDULE_SKIPPED]
    for event in skipped:  # (when it got there first: it says why it left it)
        assert event.reason == "no_room"
        assert event.attributes["error"].startswith(f"no room (overflow={overflow.value}")


async def test_a_full_executor_alone_skips_an_occurrence_and_claims_nothing(
    autojump_clock: Any,
) -> None:
    """Alone on its store, a full executor under DROP_NEWEST skips the occurrence
    (a ``schedule_skipped`` event, reason ``no_room``): it is never claimed, so
    another executor that joins the store may still take it."""
    clock = FakeWallClock(start=START)
    store = MemoryStore(clock=clock)
    tick_ran: list[str] = []

    @trioexec.task(id="tick")
    async def tick() -> None:
        tick_ran.append("tick")

    async with trioexec.open_executor(
        store=store, max_concurrent_tasks=1, queue_capacity=0, overflow=Overflow.DROP_NEWEST
    ) as ex:
        busy = await ex.submit(trio.sleep, 3600)
        ex.schedule(tick, cron="* * * * *", schedule_id="minute")
        await trio.sleep(60)
        busy.cancel()
    [event] = [e for e in _drain(ex.events) if e.kind is HealthEventKind.SCHEDULE_SKIPPED]
    assert (event.task_id, event.reason) == ("minute@2026-01-01T00:01:00Z", "no_room")
    assert event.attributes["error"] == (
        "no room (overflow=drop_newest, queue_full: 0 pending, 1 active, 0 deferred,"
        " capacity 1): left unclaimed for another executor on the store"
    )
    assert tick_ran == []
    assert store.execution("minute@2026-01-01T00:01:00Z") is None  # nothing DROPPED
    assert ex.statistics().dropped_count == 0
    [record] = store.schedules()
    assert record.last_run is None  # never claimed
    assert store.claim_occurrence("minute", event.attributes["at"], "other", None)


async def _blocked_submitter(
    ex: trioexec.Executor, ran: list[str], task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    async def mine() -> None:
        ran.append("mine")

    task_status.started()
    await ex.submit(mine)


async def test_a_place_held_for_a_claim_goes_to_the_occurrence_then_to_a_blocked_submitter(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """While an executor claims an occurrence it holds a place for it; a user's
    ``submit`` meanwhile blocks (the one other place is taken). Once the claim is
    won, the occurrence takes the held place at once, and the user's task the
    place it frees: neither waits for the task that runs for ever. (The
    occurrence waited behind the user, who waited for a place nobody handed on.)"""
    clock = FakeWallClock(start=START)
    ran: list[str] = []

    @trioexec.task(id="tick")
    async def tick() -> None:
        ran.append("tick")

    with SQLiteStore(tmp_path / "runs.db", clock=clock, inline=True) as store:
        async with trioexec.open_executor(
            store=store,
            max_concurrent_tasks=2,
            queue_capacity=0,
            shutdown_policy=trioexec.ShutdownPolicy.CANCEL,
        ) as ex:
            await ex.submit(trio.sleep_forever)  # one place left
            journal = ex._core.journal
            assert journal is not None
            async with trio.open_nursery() as nursery:
                ex.schedule(tick, cron="* * * * *", schedule_id="minute")
                await trio.testing.wait_all_tasks_blocked()  # (its record is saved)
                async with journal._lock:  # the claim takes its time
                    await trio.sleep(31)  # the occurrence (at 00:01:00) is being claimed
                    await trio.testing.wait_all_tasks_blocked()
                    await nursery.start(_blocked_submitter, ex, ran)
                    await trio.testing.wait_all_tasks_blocked()
                    assert ran == []  # the free place is held for the occurrence
                with trio.fail_after(600):  # (the task that runs for ever never frees its place)
                    while len(ran) < 2:
                        await trio.testing.wait_all_tasks_blocked()
                        await trio.sleep(1)
            assert ran == ["tick", "mine"]
