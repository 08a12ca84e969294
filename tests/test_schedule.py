"""Schedules (`Executor.schedule`, issue 18 item 4): occurrences at their wall-clock
times with their task ids, once per occurrence across executors sharing a store,
catch-up, time zones across DST changes, errors, cancelling, shutdown, and the
``trioexec schedules`` command.

Everything timed runs under Trio's autojump clock with a `FakeWallClock` as the
store's clock: the schedule computes occurrences on the wall clock and sleeps on
Trio's, so the virtual times asserted here are exact.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import zoneinfo
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pexpect
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

import trioexec
import trioexec._control
from trioexec import ExecutorClosed, MemoryStore, ScheduleRecord, ShutdownPolicy
from trioexec._schedule import occurrence_after, occurrence_before, occurrence_task_id
from trioexec.testing import FakeWallClock

UTC = datetime.UTC
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def at(*fields: int, tz: datetime.tzinfo = UTC) -> float:
    return datetime.datetime(*fields, tzinfo=tz).timestamp()  # type: ignore[misc]


START = at(2026, 1, 1, 0, 1)  # a minute past midnight, UTC


def recorder(clock: Callable[[], float]) -> tuple[trioexec.TaskSpec, list[tuple[str, float]]]:
    """A task that notes its argument and the wall time it ran at."""
    ran: list[tuple[str, float]] = []

    @trioexec.task(id="tick")
    async def tick(label: str) -> None:
        ran.append((label, clock()))

    return tick, ran


# ---------------------------------------------------------------- occurrences


def test_occurrence_ids_are_the_utc_time_to_the_second() -> None:
    assert occurrence_task_id("nightly", at(2026, 3, 29, 1, 0)) == "nightly@2026-03-29T01:00:00Z"
    assert occurrence_task_id("a@b", at(2026, 1, 1, 0, 0, 7)) == "a@b@2026-01-01T00:00:07Z"


@given(st.floats(min_value=START, max_value=START + 400 * 86400))
def test_every_five_minutes_is_the_next_multiple_of_300_seconds(t: float) -> None:
    utc = zoneinfo.ZoneInfo("UTC")
    after = occurrence_after("*/5 * * * *", utc, t)
    assert after % 300 == 0
    assert int(t) < after <= int(t) + 300
    assert occurrence_before("*/5 * * * *", utc, after) == after - 300


def test_a_time_the_spring_change_skips_runs_at_the_change() -> None:
    # 2026-03-29, Europe/Berlin: 02:00 CET becomes 03:00 CEST; 02:30 never happens.
    runs = [at(2026, 3, 28, 0, 0)]
    for _ in range(3):
        runs.append(occurrence_after("30 2 * * *", BERLIN, runs[-1]))
    assert runs[1:] == [
        at(2026, 3, 28, 2, 30, tz=BERLIN),  # 01:30 UTC
        at(2026, 3, 29, 1, 0),  # 03:00 CEST: once, as Debian cron does
        at(2026, 3, 30, 2, 30, tz=BERLIN),  # 00:30 UTC
    ]


def test_a_time_the_autumn_change_repeats_runs_once() -> None:
    # 2026-10-25, Europe/Berlin: 03:00 CEST becomes 02:00 CET; 02:30 happens twice.
    first = occurrence_after("30 2 * * *", BERLIN, at(2026, 10, 24, 12, 0))
    second = occurrence_after("30 2 * * *", BERLIN, first)
    third = occurrence_after("30 2 * * *", BERLIN, second)
    assert first == at(2026, 10, 25, 0, 30)  # the first 02:30 (CEST)
    assert second == at(2026, 10, 26, 1, 30)  # the next day's (CET)
    assert third - second == 86400


# ---------------------------------------------------------------- runs


async def test_occurrences_run_at_their_times_with_their_task_ids(autojump_clock: Any) -> None:
    clock = FakeWallClock(start=START)
    store = MemoryStore(clock=clock)
    tick, ran = recorder(clock)
    async with trioexec.open_executor(store=store) as ex:
        schedule = ex.schedule(tick, cron="*/5 * * * *", schedule_id="five", args=("x",))
        assert (schedule.schedule_id, schedule.name, schedule.tz) == ("five", "tick", "UTC")
        assert schedule.next_run == at(2026, 1, 1, 0, 5)
        await trio.sleep(15 * 60)
        assert schedule.next_run == at(2026, 1, 1, 0, 20)
        assert schedule.last_run == at(2026, 1, 1, 0, 15)
    assert ran == [("x", at(2026, 1, 1, 0, m)) for m in (5, 10, 15)]
    records = store.executions()
    assert [r.task_id for r in records] == [f"five@2026-01-01T00:{m:02}:00Z" for m in (5, 10, 15)]
    assert {(r.name, r.status, r.spec_id) for r in records} == {
        ("tick", trioexec.TaskStatus.COMPLETED, "tick")
    }
    assert store.schedules() == [
        ScheduleRecord(
            schedule_id="five",
            cron="*/5 * * * *",
            tz="UTC",
            name="tick",
            next_run=at(2026, 1, 1, 0, 20),
            last_run=at(2026, 1, 1, 0, 15),
        )
    ]


async def test_an_occurrence_at_the_start_runs_at_once(autojump_clock: Any) -> None:
    clock = FakeWallClock(start=at(2026, 1, 1, 0, 5))
    tick, ran = recorder(clock)
    async with trioexec.open_executor(store=MemoryStore(clock=clock)) as ex:
        ex.schedule(tick, cron="*/5 * * * *", schedule_id="five", args=("x",))
        await trio.sleep(60)
    assert ran == [("x", at(2026, 1, 1, 0, 5))]


async def test_without_a_store_each_occurrence_just_runs(autojump_clock: Any) -> None:
    clock = FakeWallClock(start=START)
    tick, ran = recorder(clock)
    async with trioexec.open_executor() as ex:
        ex._core.wall = clock  # (no store: the wall clock is time.time otherwise)
        ex.schedule(tick, cron="0 * * * *", schedule_id="hourly", args=("h",))
        await trio.sleep(3 * 3600)
    assert ran == [("h", at(2026, 1, 1, h)) for h in (1, 2, 3)]


async def test_a_plain_function_runs_under_its_own_name(autojump_clock: Any) -> None:
    clock = FakeWallClock(start=START)
    store = MemoryStore(clock=clock)
    seen: list[float] = []

    def note() -> None:  # a plain function: runs in a worker thread
        seen.append(1.0)

    async with trioexec.open_executor(store=store) as ex:
        schedule = ex.schedule(note, cron="*/30 * * * *", schedule_id="plain")
        # Stop the schedule a second after 00:30, before it wakes again (it looks
        # at the wall clock every minute): while the thread runs, autojump may
        # skip ahead to its next deadline, and the one after.
        await trio.sleep(29 * 60 + 1)
        schedule.cancel()
        await ex.wait_for_idle()
    assert schedule.name.endswith("note")
    assert seen == [1.0]
    assert [r.task_id for r in store.executions()] == ["plain@2026-01-01T00:30:00Z"]


async def test_a_schedule_in_a_time_zone_follows_its_dst_change(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three virtual days: nothing here sends a command or dies, so the executor
    # reads the store's commands and renews its lease hourly, not every 0.5 s and
    # 10 s (half a million wake-ups of autojump that the schedule never sees).
    monkeypatch.setattr(trioexec._control, "POLL", 3600.0)
    clock = FakeWallClock(start=at(2026, 3, 27, 12, 0))
    store = MemoryStore(clock=clock)
    tick, ran = recorder(clock)
    async with trioexec.open_executor(store=store, lease=3 * 3600.0) as ex:
        ex.schedule(tick, cron="30 2 * * *", schedule_id="night", tz="Europe/Berlin", args=("n",))
        await trio.sleep(3 * 86400)
    assert [r.task_id for r in store.executions()] == [
        "night@2026-03-28T01:30:00Z",  # 02:30 CET
        "night@2026-03-29T01:00:00Z",  # 02:30 does not exist: 03:00 CEST
        "night@2026-03-30T00:30:00Z",  # 02:30 CEST
    ]
    assert [t for _, t in ran] == [
        at(2026, 3, 28, 1, 30),
        at(2026, 3, 29, 1),
        at(2026, 3, 30, 0, 30),
    ]


# ---------------------------------------------------------------- many executors


def _shared(make_store: Callable[..., Any], clock: FakeWallClock) -> tuple[Any, Any]:
    """Two stores on one database (the memory store: one object shared)."""
    first = make_store(clock=clock)
    second = first if isinstance(first, MemoryStore) else make_store(clock=clock)
    return first, second


async def test_two_executors_on_one_store_run_each_occurrence_once(
    autojump_clock: Any, make_store: Callable[..., Any]
) -> None:
    clock = FakeWallClock(start=START)
    store_a, store_b = _shared(make_store, clock)
    tick, ran = recorder(clock)
    async with (
        trioexec.open_executor(store=store_a) as a,
        trioexec.open_executor(store=store_b) as b,
    ):
        a.schedule(tick, cron="*/5 * * * *", schedule_id="five", args=("a",))
        b.schedule(tick, cron="*/5 * * * *", schedule_id="five", args=("b",))
        await trio.sleep(30 * 60)
    assert sorted(t for _, t in ran) == [at(2026, 1, 1, 0, m) for m in range(5, 31, 5)]
    ids = [r.task_id for r in store_a.executions()]
    assert sorted(ids) == [f"five@2026-01-01T00:{m:02}:00Z" for m in range(5, 31, 5)]
    [record] = store_b.schedules()
    assert (record.last_run, record.next_run) == (at(2026, 1, 1, 0, 30), at(2026, 1, 1, 0, 35))


def test_a_claim_is_won_once_across_store_objects(make_store: Callable[..., Any]) -> None:
    first = make_store()
    second = first if isinstance(first, MemoryStore) else make_store()
    record = ScheduleRecord(schedule_id="s", cron="* * * * *", tz="UTC", name="t", next_run=60.0)
    assert first.save_schedule(record) is None
    assert second.save_schedule(record) == record
    wins = [
        store.claim_occurrence("s", 60.0, owner, 120.0)
        for store in (first, second)
        for owner in "AB"
    ]
    assert wins == [True, False, False, False]
    assert second.claim_occurrence("s", 120.0, "B", 180.0)
    assert first.claim_occurrence("s", 60.0, "C", 999.0) is False  # an old one: too late
    # Saving again keeps the last run (and takes the new definition).
    before = first.save_schedule(
        ScheduleRecord(schedule_id="s", cron="*/2 * * * *", tz="UTC", name="t")
    )
    assert (before.last_run, before.next_run) == (120.0, 180.0)
    assert second.schedules() == [
        ScheduleRecord(schedule_id="s", cron="*/2 * * * *", tz="UTC", name="t", last_run=120.0)
    ]


# ---------------------------------------------------------------- catch-up


async def test_catch_up_runs_the_latest_missed_occurrence_once(
    autojump_clock: Any, make_store: Callable[..., Any]
) -> None:
    clock = FakeWallClock(start=START)
    store_a, store_b = _shared(make_store, clock)
    tick, ran = recorder(clock)
    async with trioexec.open_executor(store=store_a) as ex:
        ex.schedule(tick, cron="*/5 * * * *", schedule_id="five", args=("first",))
        await trio.sleep(5 * 60)  # runs 00:05
    await trio.sleep(20 * 60)  # 00:06 to 00:26 with no executor: 00:10 ... 00:25 missed
    async with (
        trioexec.open_executor(store=store_a) as a,
        trioexec.open_executor(store=store_b) as b,
    ):
        a.schedule(tick, cron="*/5 * * * *", schedule_id="five", catch_up=True, args=("a",))
        b.schedule(tick, cron="*/5 * * * *", schedule_id="five", catch_up=True, args=("b",))
        await trio.sleep(5 * 60)  # to 00:31
    assert [t for _, t in ran] == [at(2026, 1, 1, 0, m) for m in (5, 26, 30)]
    assert [r.task_id for r in store_b.executions()] == [
        "five@2026-01-01T00:05:00Z",
        "five@2026-01-01T00:25:00Z",  # caught up, at 00:26
        "five@2026-01-01T00:30:00Z",
    ]


async def test_without_catch_up_missed_occurrences_stay_missed(autojump_clock: Any) -> None:
    clock = FakeWallClock(start=START)
    store = MemoryStore(clock=clock)
    tick, ran = recorder(clock)
    async with trioexec.open_executor(store=store) as ex:
        ex.schedule(tick, cron="*/5 * * * *", schedule_id="five", args=("x",))
        await trio.sleep(5 * 60)
    await trio.sleep(20 * 60)
    async with trioexec.open_executor(store=store) as ex:
        ex.schedule(tick, cron="*/5 * * * *", schedule_id="five", args=("x",))
        await trio.sleep(5 * 60)
    assert [t for _, t in ran] == [at(2026, 1, 1, 0, 5), at(2026, 1, 1, 0, 30)]


async def test_catch_up_with_nothing_missed_runs_nothing_extra(autojump_clock: Any) -> None:
    clock = FakeWallClock(start=START)
    store = MemoryStore(clock=clock)
    tick, ran = recorder(clock)
    async with trioexec.open_executor(store=store) as ex:  # a new schedule: nothing missed
        ex.schedule(tick, cron="*/5 * * * *", schedule_id="five", catch_up=True, args=("x",))
        await trio.sleep(6 * 60)
    async with trioexec.open_executor(store=store) as ex:  # restarted before 00:10
        ex.schedule(tick, cron="*/5 * * * *", schedule_id="five", catch_up=True, args=("x",))
        await trio.sleep(60)
    assert [t for _, t in ran] == [at(2026, 1, 1, 0, 5)]


# ---------------------------------------------------------------- errors, cancel, shutdown


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "*/5 * * *"}, "bad cron expression '\\*/5 \\* \\* \\*'"),
        ({"cron": "61 * * * *"}, "bad cron expression '61 \\* \\* \\* \\*'"),
        ({"cron": "0 0 31 2 *"}, "bad cron expression '0 0 31 2 \\*'"),
        ({"tz": "Mars/Olympus_Mons"}, "unknown time zone 'Mars/Olympus_Mons'"),
        ({"tz": "../etc/passwd"}, "unknown time zone '../etc/passwd'"),
        ({"schedule_id": ""}, "schedule_id must not be empty"),
    ],
)
async def test_a_bad_schedule_is_a_value_error_naming_it(
    autojump_clock: Any, options: dict[str, Any], message: str
) -> None:
    clock = FakeWallClock(start=START)
    store = MemoryStore(clock=clock)
    tick, ran = recorder(clock)
    async with trioexec.open_executor(store=store) as ex:
        kw: dict[str, Any] = {"cron": "*/5 * * * *", "schedule_id": "s", **options}
        with pytest.raises(ValueError, match=message):
            ex.schedule(tick, args=("x",), **kw)
        await trio.sleep(600)
    assert ran == []
    assert store.schedules() == []


async def test_a_schedule_id_runs_once_per_executor(autojump_clock: Any) -> None:
    clock = FakeWallClock(start=START)
    tick, _ = recorder(clock)
    async with trioexec.open_executor(store=MemoryStore(clock=clock)) as ex:
        ex.schedule(tick, cron="* * * * *", schedule_id="s", args=("x",))
        with pytest.raises(ValueError, match="schedule 's' is already running"):
            ex.schedule(tick, cron="*/2 * * * *", schedule_id="s", args=("x",))
        with pytest.raises(TypeError, match="TaskSpec or a function"):
            ex.schedule(42, cron="* * * * *", schedule_id="t")  # type: ignore[arg-type]


async def test_unschedule_and_cancel_stop_a_schedule(autojump_clock: Any) -> None:
    clock = FakeWallClock(start=START)
    tick, ran = recorder(clock)
    async with trioexec.open_executor(store=MemoryStore(clock=clock)) as ex:
        one = ex.schedule(tick, cron="*/5 * * * *", schedule_id="one", args=("one",))
        two = ex.schedule(tick, cron="*/5 * * * *", schedule_id="two", args=("two",))
        await trio.sleep(5 * 60)  # both run 00:05
        assert ex.unschedule("one") is True
        assert ex.unschedule("one") is False
        assert ex.unschedule("never") is False
        assert (one.cancelled, one.next_run) == (True, None)
        await trio.sleep(5 * 60)  # only two runs 00:10
        two.cancel()
        two.cancel()  # (idempotent)
        await trio.sleep(30 * 60)
        # The id is free again once its schedule has ended.
        ex.schedule(tick, cron="*/5 * * * *", schedule_id="one", args=("again",))
        await trio.sleep(5 * 60)
    assert sorted(ran, key=lambda r: (r[1], r[0])) == [
        ("one", at(2026, 1, 1, 0, 5)),
        ("two", at(2026, 1, 1, 0, 5)),
        ("two", at(2026, 1, 1, 0, 10)),
        ("again", at(2026, 1, 1, 0, 45)),
    ]


async def test_leaving_the_block_stops_schedules_at_once(autojump_clock: Any) -> None:
    clock = FakeWallClock(start=START)
    tick, ran = recorder(clock)
    async with trioexec.open_executor(store=MemoryStore(clock=clock)) as ex:
        schedule = ex.schedule(tick, cron="0 0 * * *", schedule_id="daily", args=("d",))
    assert clock() == START  # no wait for the next midnight
    assert schedule.cancelled
    assert schedule.next_run is None
    assert ran == []


async def test_shutdown_stops_schedules_and_refuses_new_ones(autojump_clock: Any) -> None:
    clock = FakeWallClock(start=START)
    tick, ran = recorder(clock)

    @trioexec.task(id="slow")
    async def slow() -> None:
        await trio.sleep(3600)

    async with trioexec.open_executor(store=MemoryStore(clock=clock)) as ex:
        schedule = ex.schedule(tick, cron="*/5 * * * *", schedule_id="five", args=("x",))
        await ex.submit(slow)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ex.shutdown, ShutdownPolicy.DRAIN)  # drains for an hour
            await trio.testing.wait_all_tasks_blocked()
            assert schedule.cancelled
            with pytest.raises(ExecutorClosed):
                ex.schedule(tick, cron="* * * * *", schedule_id="late", args=("x",))
    assert clock() == START + 3600
    assert ran == []


# ---------------------------------------------------------------- the CLI


_script = shutil.which("trioexec", path=os.path.dirname(sys.executable))
TRIOEXEC = [_script] if _script else [sys.executable, "-m", "trioexec"]
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def _build(target: str) -> None:
    """A daily schedule in Europe/Berlin, last run 2026-03-29 (the DST day), as an
    executor leaves it that ran across that night's occurrence (for two minutes
    of it: a day would be 170,000 reads of the store's commands under autojump,
    and the same record)."""

    @trioexec.task(id="report")
    async def report() -> None:
        pass

    async def main() -> None:
        clock = FakeWallClock(start=at(2026, 3, 29, 0, 59))  # 01:59 CET
        with trioexec.open_store(target, clock=clock, inline=True) as store:
            async with trioexec.open_executor(store=store) as ex:
                ex.schedule(report, cron="30 2 * * *", schedule_id="nightly", tz="Europe/Berlin")
                await trio.sleep(120)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_schedules_command_lists_a_schedule_with_its_next_run(
    db_target: str, tmp_path: Path
) -> None:
    _build(db_target)
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR")}
    done = subprocess.run(
        [*TRIOEXEC, "schedules", db_target],
        cwd=tmp_path,
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    header, row = done.stdout.splitlines()
    assert header.split() == ["schedule", "cron", "tz", "task", "last", "run", "next", "run"]
    # Last run 03:00 CEST (02:30 did not happen that night), next 02:30 CEST.
    assert row.split() == [
        "nightly",
        "30",
        "2",
        "*",
        "*",
        "*",
        "Europe/Berlin",
        "report",
        "2026-03-29",
        "03:00",
        "2026-03-30",
        "02:30",
    ]
    done = subprocess.run(
        [*TRIOEXEC, "schedules", db_target, "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == [
        {
            "schedule_id": "nightly",
            "cron": "30 2 * * *",
            "tz": "Europe/Berlin",
            "name": "report",
            "next_run": at(2026, 3, 30, 0, 30),
            "last_run": at(2026, 3, 29, 1, 0),
        }
    ]


def test_the_schedules_command_fits_an_80_column_terminal(tmp_path: Path) -> None:
    target = str(tmp_path / "app.db")
    _build(target)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    child = pexpect.spawn(
        TRIOEXEC[0],
        [*TRIOEXEC[1:], "schedules", target],
        cwd=str(tmp_path),
        env=env,
        dimensions=(24, 80),
        encoding="utf-8",
        timeout=60,
    )
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    lines = [ANSI.sub("", line).rstrip() for line in child.before.splitlines() if line.strip()]
    assert len(lines) == 2, lines  # one row: nothing folded
    assert "nightly" in lines[1]
    assert "2026-03-30 02:30" in lines[1]
