"""`ExecutionRecord.waiting_on` as the stores record it: equal to `TaskRef.waiting_on`
after each flush, through every transition; the migration that adds it; the CLI."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import sqlite_utils
import trio
import trio.testing
from pg_server import schema_at_version

from trioexec import (
    Backoff,
    KeyLimit,
    PostgresStore,
    SQLiteStore,
    SubStatus,
    TaskHandle,
    TaskStatus,
    open_executor,
    task,
)
from trioexec._changes import Finish, Start, Sub, Wait, submitted
from trioexec._store import _pg_schema, _sqlite_schema
from trioexec.testing import FakeWallClock


async def recorded(ex, store, ref):
    """The store's waiting_on for ``ref``, checked equal to the ref's own."""
    await trio.testing.wait_all_tasks_blocked()
    await ex.flush()
    record = store.execution(ref.task_id)
    assert record.waiting_on == ref.waiting_on, (record, ref.waiting_on)
    return record.waiting_on


async def test_deferred_on_an_event_then_queued_for_its_slot(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))
    event, go = trio.Event(), trio.Event()

    async def deferring(handle: TaskHandle):
        await handle.defer_until(event)

    async with open_executor(store=store, max_concurrent_tasks=1) as ex:
        first = await ex.submit(deferring)
        assert await recorded(ex, store, first) == "event"  # deferred, its slot lent
        second = await ex.submit(go.wait)  # takes the lent slot
        assert await recorded(ex, store, second) is None
        event.set()  # the first queues for its slot again, held by the second
        assert await recorded(ex, store, first) == "slot"
        assert store.execution(first.task_id).sub_status is SubStatus.DEFERRED
        go.set()
        await first.wait()
        await second.wait()
        assert await recorded(ex, store, first) is None
        assert await recorded(ex, store, second) is None


async def test_a_condition_can_say_what_it_waits_on(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))

    class Approval:
        """An event-like condition that names itself (as durable promises do)."""

        __trioexec_waiting_on__ = "promise approval [o'brien] 🚀"

        def __init__(self) -> None:
            self.event = trio.Event()

        async def wait(self) -> None:
            await self.event.wait()

    approval = Approval()

    async def waits(handle: TaskHandle):
        await handle.defer_until(approval)

    async with open_executor(store=store) as ex:
        ref = await ex.submit(waits)
        assert await recorded(ex, store, ref) == "promise approval [o'brien] 🚀"
        assert ref.waiting_on == "promise approval [o'brien] 🚀"
        approval.event.set()
        await ref.wait()
        assert await recorded(ex, store, ref) is None


async def test_deferred_on_a_condition(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))
    ready = False

    def is_ready() -> bool:
        return ready

    async def polling(handle: TaskHandle):
        await handle.defer_until(is_ready, poll_interval=1)

    async with open_executor(store=store) as ex:
        ref = await ex.submit(polling)
        waiting = await recorded(ex, store, ref)
        assert waiting.startswith("condition ")
        assert waiting.endswith("<locals>.is_ready")
        ready = True
        await ref.wait()
        assert await recorded(ex, store, ref) is None


async def test_running_is_none(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))
    go = trio.Event()
    async with open_executor(store=store) as ex:
        ref = await ex.submit(go.wait)
        assert await recorded(ex, store, ref) is None
        assert store.execution(ref.task_id).status is TaskStatus.RUNNING
        go.set()


async def test_key_concurrency_then_slot_once_let_through(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))
    free, block = trio.Event(), trio.Event()
    key = "tenant 'a' [1] 🚀 100%"
    async with open_executor(
        store=store, max_concurrent_tasks=2, key_limits=KeyLimit(concurrency=1)
    ) as ex:
        holder = await ex.submit(free.wait, key=key)
        blocker = await ex.submit(block.wait)  # the other slot
        filler = await ex.submit(block.wait)  # first in line for a slot
        held = await ex.submit(trio.sleep, 1, key=key)
        assert await recorded(ex, store, filler) == "slot"
        assert await recorded(ex, store, held) == f"key concurrency {key}"
        free.set()  # its key lets it through, but the freed slot goes to `filler`
        await holder.wait()
        assert await recorded(ex, store, held) == "slot"
        assert await recorded(ex, store, filler) is None
        block.set()
        await held.wait()
        assert await recorded(ex, store, held) is None
        assert await recorded(ex, store, blocker) is None


async def test_retry_backoff_between_attempts(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))
    calls = []

    @task(retries=1, backoff=Backoff(initial=10))
    async def flaky():
        calls.append(trio.current_time())
        if len(calls) == 1:
            raise OSError("once")

    async with open_executor(store=store) as ex:
        ref = await ex.submit(flaky)
        assert await recorded(ex, store, ref) == "retry backoff"
        assert store.execution(ref.task_id).status is TaskStatus.PENDING
        await ref.wait()
        assert await recorded(ex, store, ref) is None
        assert calls[1] - calls[0] == 10


async def test_backoff_over_and_waiting_for_a_slot(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))
    calls = []
    block = trio.Event()

    @task(retries=1, backoff=Backoff(initial=5))
    async def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("once")

    async with open_executor(store=store, max_concurrent_tasks=1) as ex:
        ref = await ex.submit(flaky)
        assert await recorded(ex, store, ref) == "retry backoff"
        blocker = await ex.submit(block.wait)  # takes the slot during the backoff
        await trio.sleep(6)
        assert await recorded(ex, store, ref) == "slot"
        assert await recorded(ex, store, blocker) is None
        block.set()
        await ref.wait()
        assert await recorded(ex, store, ref) is None


async def test_old_change_shapes_are_still_accepted(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))
    assert (
        store.write(
            [
                submitted("a", 1, "job", None, None, None, "w", 1.0),  # 9 fields
                submitted("b", 1, "job", None, None, None, "w", 1.0, "k", 0),  # 11 fields
                submitted("c", 1, "job", None, None, None, "w", 1.0, "k", 0, "rate limit k"),
                Start(("a", 1, 1, 2.0)),
                Sub(("a", 1, SubStatus.DEFERRED, 3.0, None)),  # the old shape: waiting on nothing
            ]
        )
        == []
    )
    assert [store.execution(t).waiting_on for t in "abc"] == [None, "slot", "rate limit k"]
    store.write([Sub(("a", 1, SubStatus.DEFERRED, 3.0, "promise p-1")), Wait(("b", 1, "x"))])
    assert store.execution("a").waiting_on == "promise p-1"
    assert store.execution("b").waiting_on == "x"
    assert store.executions(status="running")[0].deferred_since == 3.0


def test_a_sqlite_file_at_the_previous_version_migrates(tmp_path):
    path = tmp_path / "runs.db"
    db = sqlite_utils.Database(path)
    _sqlite_schema.MIGRATIONS.apply(db, stop_before="0009_waiting_on")
    db.execute(
        "INSERT INTO executions (task_id, name, status, attempt, recovery_attempts, owner,"
        " version, submitted_at) VALUES ('old', 'job', 'pending', 0, 0, 'A', 1, 1.0)"
    )
    db.conn.commit()
    db.close()
    with SQLiteStore(path, inline=True) as store:
        assert store.execution("old").waiting_on is None  # written before it was recorded
        store.write([Wait(("old", 1, "slot"))])
        assert store.execution("old").waiting_on == "slot"
    with closing(sqlite3.connect(path)) as conn:
        version = conn.execute(
            "SELECT value FROM trioexec_meta WHERE key = 'schema_version'"
        ).fetchone()
    assert version == (str(_sqlite_schema.SCHEMA_VERSION),)


def test_a_postgres_schema_at_the_previous_version_migrates(postgres_url, pg_schema):
    before = 5
    with schema_at_version(postgres_url, pg_schema, before) as conn:
        conn.execute(
            "INSERT INTO executions (task_id, name, status, attempt, owner, submitted_at)"
            " VALUES ('old', 'job', 'pending', 0, 'A', 1.0)"
        )
    with PostgresStore(postgres_url, schema=pg_schema) as store:
        assert store.execution("old").waiting_on is None
        store.write([Wait(("old", 1, "slot"))])
        assert store.execution("old").waiting_on == "slot"
    assert _pg_schema.SCHEMA_VERSION >= 6  # (migrated through 6, and on)


# ---------------------------------------------------------------------- the CLI


def _cli(*args: str, cwd: Path, columns: int = 200) -> str:
    import os
    import shutil

    script = shutil.which("trioexec", path=os.path.dirname(sys.executable))
    command = [script] if script else [sys.executable, "-m", "trioexec"]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR")}
    env["COLUMNS"] = str(columns)
    proc = subprocess.run(
        [*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _waiting_db(path: Path) -> None:
    with SQLiteStore(path, inline=True) as store:
        store.write(
            [
                submitted("p-1", 1, "approve", None, None, None, "w", 1.0),
                Start(("p-1", 1, 1, 2.0)),
                Sub(("p-1", 1, SubStatus.DEFERRED, 3.0, "promise approval-7")),
                submitted("k-1", 1, "crunch", None, None, None, "w", 2.0, "t'[%]", 0),
                Wait(("k-1", 1, "key concurrency t'[%]")),
                submitted("q-1", 1, "queued", None, None, None, "w", 3.0),
                submitted("done", 1, "fin", None, None, None, "w", 4.0),
                Finish(("done", 1, TaskStatus.COMPLETED, 5.0, None, None, None)),
            ]
        )


def test_status_shows_a_waiting_on_column_and_filters_by_glob(tmp_path):
    _waiting_db(tmp_path / "w.db")
    out = _cli("status", "w.db", cwd=tmp_path)
    assert "waiting on" in out
    assert "promise approval-7" in out
    assert "key concurrency t'[%]" in out
    out = _cli("status", "w.db", "--waiting-on", "promise*", cwd=tmp_path)
    assert "p-1" in out
    assert "k-1" not in out
    assert "q-1" not in out
    assert "done" not in out
    out = _cli("status", "w.db", "--waiting-on", "key concurrency t'[[]%]", cwd=tmp_path)
    assert "k-1" in out
    assert "p-1" not in out
    out = _cli("status", "w.db", "--waiting-on", "*", "--status", "pending", cwd=tmp_path)
    assert "k-1" in out
    assert "q-1" in out
    assert "p-1" not in out
    out = _cli("status", "w.db", "--waiting-on", "%", cwd=tmp_path)  # no SQL LIKE here
    assert "p-1" not in out
    assert "k-1" not in out


def test_status_waiting_on_fits_80_columns(tmp_path):
    from test_cli_tables import pty  # (an 80-column terminal; a pipe has no width)

    _waiting_db(tmp_path / "w.db")
    out = pty(["status", "w.db"], tmp_path, 80)
    assert all(len(line) <= 80 for line in out.splitlines())
    for word in ("p-1", "k-1", "q-1", "pending", "deferred", "waiting"):
        assert word in out


def test_status_of_finished_executions_has_no_waiting_on_column(tmp_path):
    _waiting_db(tmp_path / "w.db")
    out = _cli("status", "w.db", "--status", "completed", cwd=tmp_path)
    assert "waiting on" not in out


def test_watch_shows_what_deferred_tasks_wait_on(tmp_path):
    _waiting_db(tmp_path / "w.db")
    out = _cli("watch", "w.db", "--once", cwd=tmp_path)
    assert "promise approval-7" in out
