"""Pause and resume keep the callers' order across executors (issue 30 item 6).

`Executor.pause` and `Executor.resume` are sync: an executor records its commands
in the store later, from a task of its own, so two executors' commands reach the
store in any order. Each command carries the time it was issued (``at``, on the
store's clock, taken at the call; strictly later than the previous one issued on
that database in this Trio run), and a store applies a pause or resume only if
it was issued no earlier than the last one applied to its target: one issued
before it and recorded after changes nothing ("superseded by a later resume").
Pause via A then resume via B, twenty times: every name ends resumed, in the
store and in every executor, on SQLite (two store objects on one file) and on
PostgreSQL.
"""

from __future__ import annotations

import datetime
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trioexec
from trioexec import SQLiteStore
from trioexec._store import Pause
from trioexec._store._control import MAX_SKEW
from trioexec.testing import FakeWallClock

START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC).timestamp()
NAMES = [f"sync-{i}" for i in range(20)]
NOTHING: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_command_issued_earlier_but_recorded_later_changes_nothing(make_store: Any) -> None:
    clock = Clock()
    store = make_store(clock=clock)
    # B's resume (issued at 1002) reaches the store before A's pause (issued at 1001).
    resume = store.command("resume", name="n", who="B", at=1_002.0)
    assert (resume.changed, resume.detail, resume.at) == (False, "not paused", 1_002.0)
    pause = store.command("pause", name="n", who="A", at=1_001.0)
    assert (pause.changed, pause.detail, pause.at) == (
        False,
        "superseded by a later resume",
        1_001.0,
    )
    assert store.pauses() == []
    # Issued after the last resume: it applies.
    assert store.command("pause", name="n", who="A", at=1_003.0).detail == "paused"
    late = store.command("resume", name="n", who="B", at=1_002.5)
    assert (late.changed, late.detail) == (False, "superseded by a later pause")
    assert store.pauses() == [Pause(kind="name", value="n", who="A", at=1_003.0)]
    # "Already paused" keeps who paused first, but a resume issued before it is
    # still superseded by it.
    assert store.command("pause", name="n", who="C", at=1_005.0).detail == "already paused"
    assert store.command("resume", name="n", who="B", at=1_004.0).detail == (
        "superseded by a later pause"
    )
    assert store.pauses() == [Pause(kind="name", value="n", who="A", at=1_003.0)]
    # Issued at the same instant: the one recorded later wins (arrival order).
    assert store.command("resume", name="n", who="B", at=1_005.0).detail == "resumed"
    # Without ``at``: issued now, on the store's clock (the CLI, the dashboard).
    clock.now = 2_000.0
    assert store.command("pause", key="k", who="ops").at == 2_000.0
    assert [(c.seq, c.detail) for c in store.commands()][-1] == (8, "paused")
    assert store.pauses() == [Pause(kind="key", value="k", who="ops", at=2_000.0)]


@pytest.mark.parametrize(
    "bad",
    [math.nan, math.inf, -math.inf, "1", True, 10**400],
    ids=["nan", "inf", "-inf", "str", "bool", "10**400"],
)
def test_a_command_issued_at_no_time_is_refused(make_store: Any, bad: object) -> None:
    store = make_store()
    with pytest.raises(ValueError, match=r"^at "):
        store.command("pause", name="n", who="ops", at=bad)
    assert store.commands() == []


@pytest.mark.parametrize(
    "bad",
    [1_000.0 * 1_000, 1_000.0 + MAX_SKEW + 0.5, 1e308, -1e308, -0.5],
    ids=["milliseconds", "just past the skew", "1e308", "-1e308", "before 1970"],
)
def test_an_issue_time_far_ahead_of_the_stores_clock_or_before_1970_is_refused(
    make_store: Any, bad: float
) -> None:
    """Milliseconds by mistake would order every later command before it: the
    pause could never be resumed. Refused, naming it; nothing recorded."""
    store = make_store(clock=Clock(1_000.0))
    with pytest.raises(ValueError, match=r"^at"):
        store.command("pause", name="n", who="script", at=bad)
    with pytest.raises(ValueError, match=r"^at"):
        store.command("cancel", task_id="t", who="script", at=bad)
    assert store.commands() == []
    assert store.pauses() == []
    # Up to MAX_SKEW ahead (a host whose clock is a little ahead) is taken.
    near = 1_000.0 + MAX_SKEW
    assert store.command("pause", name="n", who="ahead", at=near).at == near
    assert store.command("cancel", task_id="t", who="ahead", at=near).at == near


def test_a_clock_far_ahead_cannot_pin_a_pause(make_store: Any) -> None:
    """A host whose clock is ahead by more than MAX_SKEW (here: the clock that
    recorded the pause, set back since) orders nothing: the resume of a host on
    time applies. One ahead by less holds a later command off for that long."""
    clock = Clock(10_000.0)
    store = make_store(clock=clock)
    assert store.command("pause", name="far", who="ahead").detail == "paused"  # at 10,000
    assert store.command("pause", name="near", who="ahead").detail == "paused"
    clock.now = 10_000.0 - MAX_SKEW - 1  # the host on time
    resumed = store.command("resume", name="far", who="on time")
    assert (resumed.changed, resumed.detail) == (True, "resumed")
    assert store.pauses() == [Pause(kind="name", value="near", who="ahead", at=10_000.0)]
    # Ahead by less than MAX_SKEW: the clocks order them (as they do leases).
    clock.now = 10_000.0 - MAX_SKEW + 1
    held_off = store.command("resume", name="near", who="on time")
    assert (held_off.changed, held_off.detail) == (False, "superseded by a later pause")
    clock.now = 10_000.0
    assert store.command("resume", name="near", who="on time").detail == "resumed"
    assert store.pauses() == []


async def test_an_executor_whose_clock_is_set_back_records_its_commands(
    autojump_clock: Any,
) -> None:
    """An executor's issue times are strictly later than its last one; a clock
    set back (NTP) by more than MAX_SKEW would make them that far ahead of the
    store's clock, and the store refuses them: they start again from the clock
    (and the resume applies, the pause's time being that far ahead)."""
    clock = Clock(START)
    store = trioexec.MemoryStore(clock=clock)
    async with trioexec.open_executor(store=store) as ex:
        ex.pause(name="sync")
        await trio.sleep(1)  # recorded
        clock.now = START - 2 * MAX_SKEW
        ex.resume(name="sync")
        ex.pause(name="other")
        await trio.sleep(1)
        assert ex.paused() == (frozenset({"other"}), frozenset())
    assert [(c.kind, c.name, c.at, c.detail) for c in store.commands()] == [
        ("pause", "sync", START, "paused"),
        ("resume", "sync", START - 2 * MAX_SKEW, "resumed"),
        ("pause", "other", math.nextafter(START - 2 * MAX_SKEW, math.inf), "paused"),
    ]
    assert [(p.value, p.at) for p in store.pauses()] == [
        ("other", math.nextafter(START - 2 * MAX_SKEW, math.inf))
    ]


def test_trioexec_resume_that_changed_nothing_says_so_and_exits_1(tmp_path: Path) -> None:
    """A pause from a host whose clock is 30 s ahead supersedes ``trioexec resume``
    run at once on a host on time: it exits 1 and says the name is not resumed
    (it exited 0). A host 10 minutes ahead does not: the resume applies."""
    db = tmp_path / "app.db"
    for ahead in (30.0, 600.0):
        with SQLiteStore(db, clock=lambda ahead=ahead: time.time() + ahead) as host_ahead:
            host_ahead.command("pause", name=f"ahead-{ahead:g}", who="host ahead")
        done = subprocess.run(
            [sys.executable, "-m", "trioexec", "resume", str(db), "--name", f"ahead-{ahead:g}"],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
            timeout=120,
        )
        if ahead < MAX_SKEW:
            assert done.returncode == 1, done.stderr
            assert done.stdout == "name ahead-30: superseded by a later pause\n"
            assert done.stderr.startswith("trioexec: not resumed: name ahead-30 (a command")
        else:
            assert done.returncode == 0, done.stderr
            assert done.stdout == "name ahead-600: resumed\n"
    with SQLiteStore(db) as store:
        assert [p.value for p in store.pauses()] == ["ahead-30"]


def _two_stores(kind: str, store_maker: Callable[..., Any], clock: Any) -> tuple[Any, Any]:
    if kind == "memory":
        store = store_maker("memory", clock=clock)
        return store, store
    return store_maker(kind, clock=clock), store_maker(kind, clock=clock)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("between", ["back to back", "a checkpoint between"])
async def test_pause_via_one_executor_then_resume_via_another_ends_resumed(
    store_maker: Callable[..., Any], autojump_clock: Any, kind: str, between: str
) -> None:
    clock = FakeWallClock(start=START)  # (it does not move between the calls)
    store_a, store_b = _two_stores(kind, store_maker, clock)
    async with (
        trioexec.open_executor(store=store_a) as a,
        trioexec.open_executor(store=store_b) as b,
    ):
        for name in NAMES:
            a.pause(name=name)
            if between != "back to back":
                await trio.lowlevel.checkpoint()
            b.resume(name=name)
        assert a.paused() == (frozenset(NAMES), frozenset())  # (at once, here)
        assert b.paused() == NOTHING
        await trio.sleep(3)  # every executor follows the store within a second
        assert store_a.pauses() == store_b.pauses() == []
        assert a.paused() == b.paused() == NOTHING
    log = store_a.commands()
    assert len(log) == 2 * len(NAMES)
    for name in NAMES:
        pause, resume = sorted((c for c in log if c.name == name), key=lambda c: c.at)
        assert (pause.kind, resume.kind) == ("pause", "resume")  # issued in the callers' order
        assert pause.at < resume.at


async def test_pause_then_resume_through_two_executors_on_postgresql(
    store_maker: Callable[..., Any],
) -> None:
    """The same on PostgreSQL, on the real clock: both executors exit at once
    (each records what it has not recorded yet as it closes: B's resumes before
    A's pauses), and an executor that starts then finds nothing paused."""
    store_a, store_b = store_maker("postgres"), store_maker("postgres")
    async with (
        trioexec.open_executor(store=store_a) as a,
        trioexec.open_executor(store=store_b) as b,
    ):
        for name in NAMES:
            a.pause(name=name)
            b.resume(name=name)
    assert store_a.pauses() == []
    async with trioexec.open_executor(store=store_maker("postgres")) as c:
        assert c.paused() == NOTHING
    details = {c.detail for c in store_a.commands()}
    assert details <= {"paused", "resumed", "not paused", "superseded by a later resume"}


async def test_pause_then_resume_through_two_executors_on_one_sqlite_file_exiting_at_once(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """As on PostgreSQL, with two processes' worth of store objects on one file."""
    clock = FakeWallClock(start=START)
    path = tmp_path / "runs.db"
    with (
        SQLiteStore(path, clock=clock, inline=True) as store_a,
        SQLiteStore(path, clock=clock, inline=True) as store_b,
    ):
        async with (
            trioexec.open_executor(store=store_a) as a,
            trioexec.open_executor(store=store_b) as b,
        ):
            for name in NAMES:
                a.pause(name=name)
                b.resume(name=name)
        assert store_a.pauses() == []
        async with trioexec.open_executor(store=store_b) as c:
            assert c.paused() == NOTHING


def test_pauses_follow_the_issue_order_whatever_the_recording_order(make_store: Any) -> None:
    """Commands issued at distinct times and recorded in any order: what is paused
    is what the last one issued per target says (a model, one store for all the
    examples: each example uses targets of its own). The issue times are recent
    on the store's clock: a target resumed over an hour ago is forgotten."""
    store = make_store(clock=Clock(1_000.0))
    example = [0]

    @settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.lists(
            st.tuples(st.sampled_from(["pause", "resume"]), st.sampled_from(["name", "key"])),
            min_size=1,
            max_size=8,
        ),
        st.randoms(use_true_random=False),
    )
    def run(issued: list[tuple[str, str]], random: Any) -> None:
        example[0] += 1
        value = f"target-{example[0]}"
        order = list(enumerate(issued))
        random.shuffle(order)
        for at, (kind, target) in order:
            store.command(kind, **{target: value}, who="w", at=990.0 + at)
        last = {target: kind for kind, target in issued}  # (the latest issued wins)
        paused = sorted(t for t, kind in last.items() if kind == "pause")
        assert [p.kind for p in store.pauses() if p.value == value] == paused

    run()
