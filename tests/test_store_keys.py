"""Admission keys in the stores: every store records each execution's key and
priority from its submission, filters by key, hands them back to recovery, and
migrates a database from before keys (NULL key, priority 0)."""

from __future__ import annotations

import contextlib
import sqlite3

import psycopg
import pytest
import sqlite_utils
import trio
import trio.testing
from pg_server import schema_at_version

from trioexec import (
    KeyLimit,
    PostgresStore,
    SQLiteStore,
    StoreError,
    TaskHandle,
    TaskStatus,
    open_executor,
    task,
)
from trioexec._changes import Finish, Start, submitted
from trioexec._store import _pg_schema, _sqlite_schema
from trioexec.testing import FakeWallClock


def keyed(task_id, key, priority, *, owner="dead", spec="work", args="[1]", at=0.0):
    """A "submit" change with a key and a priority (its two optional last fields)."""
    return submitted(task_id, 1, task_id, None, spec, args, owner, at, key, priority)


async def test_key_and_priority_round_trip_through_an_executor(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))
    release = trio.Event()

    async def wait(handle: TaskHandle):
        await handle.defer_until(release)

    async def quick():
        return 1

    async with open_executor(store=store, key_limits=KeyLimit(concurrency=1)) as ex:
        held = await ex.submit(wait, key="k", priority=3)
        plain = await ex.submit(quick)
        other = await ex.submit(quick, key="other", priority=-2)
        await trio.testing.wait_all_tasks_blocked()
        await ex.flush()
        live = store.execution(held.task_id)
        assert (live.status, live.key, live.priority) == (TaskStatus.RUNNING, "k", 3)
        assert live.waiting_on == held.waiting_on == "event"  # (recorded by the stores)
        release.set()
    records = {r.task_id: r for r in store.executions()}
    assert {t: (r.status, r.key, r.priority) for t, r in records.items()} == {
        held.task_id: (TaskStatus.COMPLETED, "k", 3),
        plain.task_id: (TaskStatus.COMPLETED, None, 0),
        other.task_id: (TaskStatus.COMPLETED, "other", -2),
    }


async def test_a_task_spec_key_and_priority_are_recorded(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))

    @task(id="fetch", key=lambda host: host, priority=7)
    async def fetch(host):
        return host

    async with open_executor(store=store) as ex:
        ref = await ex.submit(fetch, "a.example")
        await ref.wait()
    record = store.execution(ref.task_id)
    assert (record.key, record.priority) == ("a.example", 7)


ODD_KEYS = ["tenant[1]", "o'brien", 'say "hi"', "🦊 fox", "a%b_c", "x; DROP TABLE t"]


async def test_keys_with_brackets_quotes_emoji_and_wildcards_are_kept_as_given(
    make_store, autojump_clock
):
    store = make_store(clock=FakeWallClock(start=100))
    limits = KeyLimit(concurrency=1)
    async with open_executor(max_concurrent_tasks=8, store=store, key_limits=limits) as ex:
        refs = {key: await ex.submit(trio.sleep, 1, key=key) for key in ODD_KEYS}
        await trio.testing.wait_all_tasks_blocked()
        assert all(ex.key_statistics(key).active == 1 for key in ODD_KEYS)  # one key each
    for key, ref in refs.items():
        assert [r.task_id for r in store.executions(key=key)] == [ref.task_id], key
    assert store.executions(key="a_b%c") == []  # no LIKE: "%" and "_" are plain characters


async def test_a_key_with_a_lone_surrogate_is_refused_naming_it():
    async with open_executor() as ex:
        with pytest.raises(ValueError, match="lone surrogate"):
            await ex.submit(trio.sleep, 0, key="bad\udc80")


def test_executions_and_counts_filter_by_key(make_store):
    store = make_store()
    store.write(
        [
            keyed("a1", "a", 0, at=1.0),
            keyed("b1", "b", 5, at=2.0),
            keyed("a2", "a", 1, at=3.0),
            submitted("none", 1, "none", None, None, None, "dead", 4.0),
            Finish(("a1", 1, TaskStatus.COMPLETED, 5.0, None, None, None)),
        ]
    )
    assert [r.task_id for r in store.executions(key="a")] == ["a1", "a2"]
    assert [r.task_id for r in store.executions(key="a", order="newest")] == ["a2", "a1"]
    assert [r.task_id for r in store.executions(key="a", limit=1)] == ["a1"]
    assert [r.task_id for r in store.executions(key="a", status="pending")] == ["a2"]
    assert [r.task_id for r in store.executions(key="b")] == ["b1"]
    assert store.executions(key="nobody") == []
    assert [r.task_id for r in store.executions()] == ["a1", "b1", "a2", "none"]
    counts = store.counts(key="a")
    assert (counts[TaskStatus.PENDING], counts[TaskStatus.COMPLETED]) == (1, 1)
    assert sum(store.counts(key="b").values()) == 1
    # A "submit" without the last two fields: no key, priority 0.
    assert (store.execution("none").key, store.execution("none").priority) == (None, 0)
    assert store.execution("b1").priority == 5


@pytest.mark.parametrize("priority", [2**62 - 1, -(2**62) + 1])
def test_the_extreme_priorities_are_kept(make_store, priority):
    store = make_store()
    store.write([keyed("t", "k", priority)])
    assert store.execution("t").priority == priority


async def test_recovery_keeps_key_and_priority(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))
    ran = []
    keyed_running = [0, 0]  # now, most

    @task(id="work")
    async def work(n):
        ran.append(n)
        if n:  # (t0 has no key)
            keyed_running[0] += 1
            keyed_running[1] = max(keyed_running)
        await trio.sleep(1)
        if n:
            keyed_running[0] -= 1

    # A dead owner's live executions: in submission order 0, 1, 2, 3.
    store.write(
        [
            keyed("t0", None, 0, args="[0]"),
            keyed("t1", "k", 1, args="[1]"),
            keyed("t2", "k", 5, args="[2]"),
            keyed("t3", "k", 3, args="[3]"),
            Start(("t1", 1, 1, 0.0)),
        ]
    )
    store.heartbeat("dead", 5.0)  # long lapsed
    async with open_executor(
        store=store,
        recover=True,
        tasks=[work],
        max_concurrent_tasks=2,
        key_limits={"k": KeyLimit(concurrency=1)},
        priority_aging=None,
    ) as ex:
        await trio.testing.wait_all_tasks_blocked()
        stats = ex.key_statistics("k")
        assert (stats.active, stats.pending) == (1, 2)  # recovered with their key
        await ex.wait_for_idle()
    # Highest priority first; the keyless one alongside, in the second slot.
    assert ran == [0, 2, 3, 1] or ran == [2, 0, 3, 1]
    assert keyed_running == [0, 1]
    records = {r.task_id: r for r in store.executions()}
    assert {t: (r.key, r.priority, r.version) for t, r in records.items()} == {
        "t0": (None, 0, 2),
        "t1": ("k", 1, 2),
        "t2": ("k", 5, 2),
        "t3": ("k", 3, 2),
    }
    assert all(r.status is TaskStatus.COMPLETED for r in records.values())


async def test_an_executor_recovers_what_another_submitted_with_a_key(make_store, autojump_clock):
    store = make_store(clock=FakeWallClock(start=100))
    release = trio.Event()
    ran = []

    @task(id="slow")
    async def slow(n, handle: TaskHandle):
        ran.append(n)
        await handle.defer_until(release)

    async with open_executor(store=store, tasks=[slow], lease=30) as first:
        ref = await first.submit(slow, 1, key="host", priority=4)
        await trio.testing.wait_all_tasks_blocked()
        await first.flush()
        # The first executor stalls: its lease is gone, and another takes over.
        store.release_owner(first.owner)
        async with open_executor(
            store=store, recover=True, tasks=[slow], key_limits=KeyLimit(concurrency=1)
        ) as second:
            await trio.testing.wait_all_tasks_blocked()
            assert second.key_statistics("host").deferred == 1  # (deferral holds no slot)
            record = store.execution(ref.task_id)
            assert (record.owner, record.key, record.priority) == (second.owner, "host", 4)
            release.set()
    assert ran == [1, 1]
    record = store.execution(ref.task_id)
    assert (record.status, record.key, record.priority) == (TaskStatus.COMPLETED, "host", 4)


# ---------------------------------------------------------------------- migration


def test_a_sqlite_file_from_before_keys_migrates_in_place(tmp_path):
    path = tmp_path / "runs.db"
    db = sqlite_utils.Database(path)
    _sqlite_schema.MIGRATIONS.apply(db, stop_before="0006_execution_keys")
    db.execute(
        "INSERT INTO executions (task_id, name, status, attempt, recovery_attempts, owner,"
        " version, submitted_at, finished_at) VALUES ('old', 'job', 'completed', 1, 0, 'A',"
        " 1, 1.0, 2.0)"
    )
    db.conn.commit()
    db.close()
    with pytest.raises(StoreError, match="written by an older trioexec"):
        SQLiteStore(path, read_only=True)  # a view never migrates
    with SQLiteStore(path, inline=True) as store:
        old = store.execution("old")
        assert (old.status, old.key, old.priority) == (TaskStatus.COMPLETED, None, 0)
        store.write([keyed("new", "k", 2)])
        assert [r.task_id for r in store.executions(key="k")] == ["new"]
        assert [r.task_id for r in store.executions()] == ["old", "new"]
    with contextlib.closing(sqlite3.connect(path)) as conn:
        version = conn.execute(
            "SELECT value FROM trioexec_meta WHERE key = 'schema_version'"
        ).fetchone()
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM executions e WHERE e.key = ? ORDER BY e.rowid",
            ("k",),
        ).fetchall()
    assert version == (str(_sqlite_schema.SCHEMA_VERSION),)
    assert "executions_key" in str(plan)
    assert "TEMP B-TREE" not in str(plan)  # the index's order is rowid order
    with SQLiteStore(path, read_only=True) as view:
        assert view.execution("new").key == "k"


def test_a_postgres_schema_from_before_keys_migrates_in_place(postgres_url, pg_schema):
    before = 2  # the schema version before keys (migration 3 added them)
    with schema_at_version(postgres_url, pg_schema, before) as conn:
        conn.execute(
            "INSERT INTO executions (task_id, name, status, attempt, owner, submitted_at,"
            " finished_at) VALUES ('old', 'job', 'completed', 1, 'A', 1.0, 2.0)"
        )
    with pytest.raises(StoreError, match="written by an older trioexec"):
        PostgresStore(postgres_url, schema=pg_schema, read_only=True)
    with PostgresStore(postgres_url, schema=pg_schema) as store:
        old = store.execution("old")
        assert (old.status, old.key, old.priority) == (TaskStatus.COMPLETED, None, 0)
        store.write([keyed("new", "k", 2)])
        assert [r.task_id for r in store.executions(key="k")] == ["new"]
        assert [r.task_id for r in store.executions()] == ["old", "new"]
    with psycopg.connect(postgres_url) as conn:
        version = conn.execute(
            f"SELECT value FROM {pg_schema}.trioexec_meta WHERE key = 'schema_version'"
        ).fetchone()
        indexes = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (pg_schema,)
        ).fetchall()
    assert version == (str(_pg_schema.SCHEMA_VERSION),)
    assert ("executions_key",) in indexes
    with PostgresStore(postgres_url, schema=pg_schema, read_only=True) as view:
        assert view.execution("new").key == "k"
