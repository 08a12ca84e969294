"""`SQLiteStore` on real files: what it refuses to open (and leaves untouched),
what survives reopening and is shared between connections, WAL, and indexes."""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest
import sqlite_utils
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from trioexec import SQLiteStore, StoreError, SubStatus, TaskStatus
from trioexec._changes import Finish, Start, Sub, submitted
from trioexec._store._sqlite_schema import MIGRATIONS, SCHEMA_VERSION
from trioexec.durable import DurableStore, PromiseState


def submit(task_id, *, run_id=None, owner="A", at=1.0):
    return submitted(task_id, 1, "job", run_id, None, None, owner, at)


def make_store_file(path):
    """A good trioexec file with one execution in it, closed (WAL checkpointed)."""
    with SQLiteStore(path, inline=True) as store:
        store.write([submit("t1")])


def sql(path, statement, params=()):
    """Run one statement on ``path`` with a plain sqlite3 connection of our own."""
    conn = sqlite3.connect(path)
    try:
        with conn:
            return conn.execute(statement, params).fetchall()
    finally:
        conn.close()


def assert_refused(path, *words):
    """Opening ``path`` raises StoreError naming the path and saying what is wrong."""
    with pytest.raises(StoreError) as info:
        SQLiteStore(path, inline=True)
    message = str(info.value)
    assert str(path) in message
    for word in words:
        assert word in message
    # Not a raw sqlite3 traceback chained underneath.
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__
    return message


# ------------------------------------------------------------ refusing to open


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(random.Random(1).randbytes(8192), id="random-bytes"),
        pytest.param(
            b"SQLite format 3\x00" + random.Random(2).randbytes(4096 - 16), id="header-only"
        ),
    ],
)
def test_corrupt_file_is_refused_and_left_alone(tmp_path, content):
    path = tmp_path / "runs.db"
    path.write_bytes(content)
    assert_refused(path, "corrupt")
    assert path.read_bytes() == content
    assert list(tmp_path.iterdir()) == [path]  # no -wal/-shm files either


@pytest.mark.parametrize("cut", ["truncated", "pages-overwritten"])
def test_damaged_trioexec_file_is_refused_and_left_alone(tmp_path, cut):
    path = tmp_path / "runs.db"
    with SQLiteStore(path, inline=True) as store:
        store.write([submit(f"t{i}") for i in range(2000)])
    good = path.read_bytes()
    assert len(good) > 3 * 4096
    if cut == "truncated":
        damaged = good[: len(good) // 3]
    else:  # keep the 100-byte header, garble the rest of the first pages
        damaged = good[:100] + random.Random(3).randbytes(8192) + good[8292:]
    path.write_bytes(damaged)
    assert_refused(path, "corrupt")
    assert path.read_bytes() == damaged


def test_foreign_database_is_refused_and_left_alone(tmp_path):
    # A rollback-journal file: switching it to WAL would rewrite its header.
    path = tmp_path / "app.db"
    sql(path, "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    sql(path, "INSERT INTO users (name) VALUES ('ada')")
    before = path.read_bytes()
    assert_refused(path, "not a trioexec database", "users")
    assert path.read_bytes() == before
    assert list(tmp_path.iterdir()) == [path]  # not switched to WAL: no -wal/-shm


def test_foreign_wal_database_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "app.db"
    sql(path, "PRAGMA journal_mode=WAL")
    sql(path, "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    before = path.read_bytes()
    assert_refused(path, "not a trioexec database", "users")
    assert path.read_bytes() == before


def test_newer_schema_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "runs.db"
    make_store_file(path)
    sql(path, "UPDATE trioexec_meta SET value = '999' WHERE key = 'schema_version'")
    before = path.read_bytes()
    assert_refused(path, "newer trioexec", "999")
    assert path.read_bytes() == before
    assert sql(path, "SELECT value FROM trioexec_meta") == [("999",)]


def test_unknown_applied_migration_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "runs.db"
    make_store_file(path)
    sql(
        path,
        "INSERT INTO _sqlite_migrations (migration_set, name, applied_at)"
        " VALUES ('trioexec', '0099_from_the_future', '2030-01-01 00:00:00+00:00')",
    )
    before = path.read_bytes()
    assert_refused(path, "newer trioexec", "0099_from_the_future")
    assert path.read_bytes() == before


def test_migrations_of_other_sets_are_not_ours_to_judge(tmp_path):
    path = tmp_path / "runs.db"
    make_store_file(path)
    sql(
        path,
        "INSERT INTO _sqlite_migrations (migration_set, name, applied_at)"
        " VALUES ('someone-else', '0099_theirs', '2030-01-01 00:00:00+00:00')",
    )
    with SQLiteStore(path, inline=True) as store:
        assert [r.task_id for r in store.executions()] == ["t1"]


def test_path_under_a_missing_directory_is_refused(tmp_path):
    path = tmp_path / "no" / "such" / "dir" / "runs.db"
    assert_refused(path, "cannot open")
    assert not (tmp_path / "no").exists()


def test_path_that_is_a_directory_is_refused(tmp_path):
    path = tmp_path / "a-directory"
    path.mkdir()
    assert_refused(path, "cannot open")
    assert list(path.iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (read-only fs)")
def test_path_on_a_read_only_filesystem_is_refused():
    # Root can write into chmod-ed directories, but not into /proc.
    path = "/proc/trioexec-test.db"
    assert_refused(path, "cannot open")
    assert not os.path.exists(path)


# ------------------------------------------------------------ data and lifecycle


def test_reopening_keeps_the_data(tmp_path):
    path = tmp_path / "runs.db"
    with SQLiteStore(path, inline=True, clock=lambda: 50.0) as store:
        store.heartbeat("A", 80.0)
        store.write([submit("t1", run_id="r"), submit("t2")])
        store.write([Start(("t1", 1, 1, 10.0)), Sub(("t1", 1, SubStatus.DEFERRED, 20.0, None))])
        store.write([Finish(("t2", 1, TaskStatus.FAILED, 30.0, "ValueError('x')", None, None))])
        before = store.executions()
    schema = sql(path, "SELECT * FROM trioexec_meta ORDER BY key")
    migrations = sql(path, "SELECT * FROM _sqlite_migrations ORDER BY id")
    with SQLiteStore(path, inline=True, clock=lambda: 50.0) as store:
        assert store.executions() == before
        assert store.executions(deferred_longer_than=30) == [before[0]]
        assert before[0].lease_expires_at == 80.0
        assert before[1].error == "ValueError('x')"
    # Reopening migrated nothing again.
    assert sql(path, "SELECT * FROM trioexec_meta ORDER BY key") == schema
    assert sql(path, "SELECT * FROM _sqlite_migrations ORDER BY id") == migrations


def test_two_stores_on_one_file_see_each_others_commits(tmp_path):
    path = tmp_path / "runs.db"
    with (
        SQLiteStore(path, inline=True) as one,
        SQLiteStore(path, inline=True) as two,
    ):
        one.write([submit("t1")])
        assert [r.task_id for r in two.executions()] == ["t1"]
        assert two.write([submit("t1")]) == ["t1"]  # a duplicate, wherever it comes from
        two.write([Start(("t1", 1, 1, 2.0))])
        record = one.execution("t1")
        assert record is not None
        assert record.status is TaskStatus.RUNNING
        two.heartbeat("A", 99.0)
        assert one.executions(sub_status=SubStatus.ACTIVE)[0].lease_expires_at == 99.0
        # The second store claims it; the first one's writes are fenced from then on.
        two.release_owner("A")
        recovery = two.recover("B", 100.0, lambda r: True, 3)
        assert [r.task_id for r in recovery.claimed] == ["t1"]
        assert one.taken_over("A", {"t1": 1}) == ["t1"]
        assert one.write(
            [
                Finish(
                    (
                        "t1",
                        1,
                        TaskStatus.COMPLETED,
                        101.0,
                        None,
                        None,
                        None,
                    )
                )
            ]
        ) == ["t1"]


def test_close_is_idempotent_and_use_after_close_raises(tmp_path):
    path = tmp_path / "runs.db"
    store = SQLiteStore(path, inline=True)
    store.write([submit("t1")])
    store.close()
    store.close()
    calls = [
        lambda: store.write([submit("t2")]),
        lambda: store.heartbeat("A", 1.0),
        lambda: store.release_owner("A"),
        lambda: store.taken_over("A", {"t1": 1}),
        lambda: store.recover("B", 1.0, lambda r: True, 3),
        lambda: store.executions(),
        lambda: store.execution("t1"),
    ]
    for call in calls:
        with pytest.raises(StoreError, match=re.escape(str(path)) + ".*closed"):
            call()


def test_context_manager_closes(tmp_path):
    path = tmp_path / "runs.db"
    with SQLiteStore(path, inline=True) as store:
        store.write([submit("t1")])
    with pytest.raises(StoreError, match="closed"):
        store.executions()
    # Closed for real: the last connection checkpointed the WAL away.
    assert not (tmp_path / "runs.db-wal").exists()


def test_wal_mode(tmp_path):
    path = tmp_path / "runs.db"
    with SQLiteStore(path, inline=True):
        assert sql(path, "PRAGMA journal_mode") == [("wal",)]


# ------------------------------------------------------------ indexes


class Statements:
    """Records the SQL (parameters expanded) run on connections opened while
    installed, but only while ``on``."""

    def __init__(self):
        self.on = False
        self.seen = []

    def __call__(self, statement):
        if self.on:
            self.seen.append(statement)

    def during(self, call):
        self.seen, self.on = [], True
        try:
            call()
        finally:
            self.on = False
        return [s for s in self.seen if "executions" in s]


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    """100k executions, 1000 of them running (half deferred), in runs 0-99."""
    statements = Statements()
    connect = sqlite3.connect

    def tracing_connect(*args, **kwargs):
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(statements)
        return conn

    path = tmp_path_factory.mktemp("big") / "big.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite3, "connect", tracing_connect)
        store = SQLiteStore(path, inline=True, clock=lambda: 1_000.0)
    n = 100_000
    assert store.write([submit(f"t{i:06d}", run_id=f"run-{i % 100}") for i in range(n)]) == []
    running = [f"t{i:06d}" for i in range(0, n, 100)]
    store.write(
        [Start((t, 1, 1, 500.0)) for t in running]
        + [Sub((t, 1, SubStatus.DEFERRED, 600.0, None)) for t in running[::2]]
    )
    yield store, statements, path
    store.close()


def full_scans(path, statements):
    conn = sqlite3.connect(path)
    try:
        plans = {s: conn.execute(f"EXPLAIN QUERY PLAN {s}").fetchall() for s in statements}
    finally:
        conn.close()
    return {
        s: [row[3] for row in plan if re.match(r"SCAN (e|executions)\b", row[3])]
        for s, plan in plans.items()
        if any(re.match(r"SCAN (e|executions)\b", row[3]) for row in plan)
    }


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"status": TaskStatus.RUNNING}, 1000),
        ({"status": "completed"}, 0),
        ({"sub_status": SubStatus.DEFERRED}, 500),
        ({"sub_status": "active"}, 500),
        ({"deferred_longer_than": 300.0}, 500),
        ({"deferred_longer_than": 500.0}, 0),
        ({"run_id": "run-7"}, 1000),
        ({"status": TaskStatus.RUNNING, "sub_status": SubStatus.DEFERRED}, 500),
        ({"status": TaskStatus.PENDING, "run_id": "run-0"}, 0),
        ({"status": TaskStatus.PENDING, "run_id": "run-1"}, 1000),
    ],
    ids=repr,
)
def test_filtered_queries_use_an_index(big_store, query, expected):
    store, statements, path = big_store
    seen = statements.during(lambda: store.executions(**query))
    assert seen, "no statement recorded: is the store still using sqlite3.connect?"
    assert len(store.executions(**query)) == expected
    assert full_scans(path, seen) == {}


def test_the_periodic_lease_queries_use_an_index(big_store):
    store, statements, path = big_store
    live = {f"t{i:06d}": 1 for i in range(0, 100_000, 100)}
    seen = statements.during(lambda: store.taken_over("A", live))
    seen += statements.during(lambda: store.recover("A", 2_000.0, lambda r: True, 3))
    assert seen
    assert full_scans(path, seen) == {}


def test_the_unfiltered_query_is_a_scan(big_store):
    # The check above can fail: without filters the plan is a full scan.
    store, statements, path = big_store
    seen = statements.during(lambda: store.executions())
    assert list(full_scans(path, seen).values()) == [["SCAN e"]]


@pytest.mark.parametrize("json_insert", [True, False])
def test_folded_batch_insert_both_ways(tmp_path, monkeypatch, json_insert):
    """Rows first submitted in a batch are inserted in one json_each statement
    (SQLite >= 3.38) or with executemany; both give the same records."""
    from trioexec._store import _sqlite

    if json_insert and not _sqlite._JSON_ARROW:
        pytest.skip("this SQLite has no ->> operator")
    monkeypatch.setattr(_sqlite, "_JSON_ARROW", json_insert)
    changes = [
        submitted("a", 1, "task a", None, "spec", '[1, "x"]', "owner", 10.0),
        Start(("a", 1, 1, 11.0)),
        Sub(("a", 1, SubStatus.DEFERRED, 12.0, None)),
        Finish(("a", 1, TaskStatus.FAILED, 13.0, "ValueError('boom')", None, None)),
        submitted("b", 1, "task b", "run-1", None, None, "owner", 10.5),
        Start(("b", 1, 1, 11.5)),
        Sub(("b", 1, SubStatus.DEFERRED, 12.5, None)),
        Finish(("b", 2, TaskStatus.COMPLETED, 13.0, None, None, None)),  # stale version: fenced
    ]
    with SQLiteStore(str(tmp_path / "x.db")) as store:
        assert store.write(changes) == ["b"]
        a, b = store.execution("a"), store.execution("b")
    assert (a.status, a.sub_status, a.attempt, a.error) == (
        TaskStatus.FAILED,
        None,
        1,
        "ValueError('boom')",
    )
    assert (a.spec_id, a.args, a.name, a.run_id) == ("spec", '[1, "x"]', "task a", None)
    assert (b.status, b.sub_status, b.run_id) == (TaskStatus.RUNNING, SubStatus.DEFERRED, "run-1")
    assert isinstance(b.attempt, int)
    assert isinstance(a.finished_at, float)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("json_insert", [True, False])
def test_a_large_batch_goes_in_whole_and_exact(tmp_path, monkeypatch, json_insert, sparse):
    """300 rows in one write: each is read back as written, floats to the last bit
    and any text; with ``sparse``, every seventh row has a sparse value and the
    others none."""
    from trioexec._changes import widen
    from trioexec._store import _sqlite

    if json_insert and not _sqlite._JSON_ARROW:
        pytest.skip("this SQLite has no ->> operator")
    monkeypatch.setattr(_sqlite, "_JSON_ARROW", json_insert)
    from trioexec._columns import ROW_COLUMNS

    where = ROW_COLUMNS.index("dedupe_key")
    rows, keys = [], {}
    for i in range(300):
        at = 1764423845.123456 + i / 3  # (no short decimal form)
        row = submitted(f"t{i}", 1, f"n[{i}]'\N{SNAKE}", None, None, f'["{i}"]', "me", at)
        if sparse and i % 7 == 0:
            row = widen(row)
            row[where] = keys[f"t{i}"] = f"k{i}"
        rows.append(row)
    with SQLiteStore(str(tmp_path / "x.db")) as store:
        assert store.write(rows) == []
        records = {r.task_id: r for r in store.executions(limit=1000)}
    assert len(records) == 300
    for i in range(300):
        record = records[f"t{i}"]
        assert record.submitted_at == 1764423845.123456 + i / 3
        assert (record.name, record.args) == (f"n[{i}]'\N{SNAKE}", f'["{i}"]')
        assert record.dedupe_key == keys.get(f"t{i}")
        assert record.status is TaskStatus.PENDING


@settings(max_examples=30, deadline=None)
@given(times=st.lists(st.floats(-1e15, 1e15, allow_nan=False), min_size=4, max_size=4))
def test_times_go_in_to_the_last_bit(tmp_path_factory, times):
    """A row's four times (any float a clock may give, a Unix time or a test's
    small one) are read back exactly as written, NULL as None."""
    times = [t if t != 0 else None for t in times]  # (0 stands for "not yet")
    row = submitted("t", 1, "n", None, None, None, "me", times[0])
    row[10:13] = times[1:]
    path = tmp_path_factory.mktemp("times") / "x.db"
    with SQLiteStore(str(path)) as store:
        assert store.write([row]) == []
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (got,) = conn.execute(
            "SELECT submitted_at, started_at, finished_at, deferred_since FROM executions"
        ).fetchall()
    assert list(got) == times


@pytest.mark.parametrize("at", [float("inf"), 1e302, -1e302])
def test_a_time_no_clock_gives_is_refused_with_a_store_error(tmp_path, at):
    """An infinite time (or one past 2**1000 seconds) is not written: the write
    fails with a StoreError, and writes nothing."""
    from trioexec._store import _sqlite

    if not _sqlite._JSON_ARROW:
        pytest.skip("this SQLite has no ->> operator")
    with SQLiteStore(str(tmp_path / "x.db")) as store:
        with pytest.raises(StoreError):
            store.write([submitted("t", 1, "n", None, None, None, "me", at)])
        assert store.execution("t") is None


@pytest.mark.parametrize("json_insert", [True, False])
def test_a_batch_with_a_stored_id_writes_the_rest(tmp_path, monkeypatch, json_insert):
    """A batch's rows go in without a lookup first; one whose id is stored already
    (another executor's) fails the insert, which is done again without it: that
    id is fenced (its later changes in the batch with it), the stored row is
    left as it was, and the batch's other rows and changes are written."""
    from trioexec._store import _sqlite

    if json_insert and not _sqlite._JSON_ARROW:
        pytest.skip("this SQLite has no ->> operator")
    monkeypatch.setattr(_sqlite, "_JSON_ARROW", json_insert)
    with SQLiteStore(str(tmp_path / "x.db")) as store:
        assert store.write([submitted("taken", 1, "theirs", None, None, None, "other", 1.0)]) == []
        assert store.write([submitted("old", 1, "old", None, None, None, "me", 1.0)]) == []
        fenced = store.write(
            [
                submitted("new-1", 1, "mine", None, None, None, "me", 10.0),
                submitted("taken", 1, "mine", None, None, None, "me", 10.0),
                Start(("taken", 1, 1, 11.0)),
                Start(("old", 1, 1, 11.0)),
                submitted("new-2", 1, "mine", None, None, None, "me", 10.0),
                Start(("new-2", 1, 1, 11.0)),
            ]
        )
        assert set(fenced) == {"taken"}
        taken, old = store.execution("taken"), store.execution("old")
        new_1, new_2 = store.execution("new-1"), store.execution("new-2")
    assert (taken.owner, taken.name, taken.status) == ("other", "theirs", TaskStatus.PENDING)
    assert old.status is TaskStatus.RUNNING
    assert (new_1.owner, new_1.status) == ("me", TaskStatus.PENDING)
    assert (new_2.owner, new_2.status) == ("me", TaskStatus.RUNNING)


# ------------------------------------------------------------ issue 13: files that change


def durable_call(ds, method, *args, **kwargs):
    """One DurableStore call, run to completion (``method`` like 'promises.get')."""
    group, name = method.split(".")
    return trio.run(functools.partial(getattr(getattr(ds, group), name), *args, **kwargs))


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_database_deleted_or_replaced_while_open_refuses_to_write(tmp_path, how):
    """Before the fix SQLite went on writing into the unlinked (or the old) inode:
    every later write was lost without a word."""
    path = tmp_path / "runs.db"
    store = SQLiteStore(path, inline=True)
    store.write([submit("t1")])
    ds = DurableStore(store)
    if how == "deleted":
        path.unlink()
    else:
        make_store_file(tmp_path / "restored.db")
        os.replace(tmp_path / "restored.db", path)
    calls = {
        "write": lambda: store.write([submit("t2")]),
        "heartbeat": lambda: store.heartbeat("A", 99.0),
        "renew_lease": lambda: store.renew_lease("A", 30.0),
        "recover": lambda: store.recover("B", 1.0, lambda r: True, 3),
        "claim_runs": lambda: store.claim_runs("B", 1.0, ["etl"], 3),
        "release_owner": lambda: store.release_owner("A"),
        "durable": lambda: durable_call(ds, "promises.create", "p1", 60),
    }
    for name, call in calls.items():
        with pytest.raises(StoreError) as info:
            call()
        assert str(info.value).startswith(f"{path}: the database file was deleted or replaced")
        assert info.value.__cause__ is None, name
    ds.close()
    store.close()
    if how == "replaced":  # the file now at the path was never written to
        with SQLiteStore(path, inline=True) as fresh:
            assert [r.task_id for r in fresh.executions()] == ["t1"]
            assert fresh.executions()[0].lease_expires_at is None


@pytest.mark.parametrize("read_only", [False, True], ids=["read-write", "read-only"])
def test_an_unparsable_schema_version_is_a_store_error(tmp_path, read_only):
    """Before the fix: a raw ValueError from int('abc')."""
    path = tmp_path / "runs.db"
    make_store_file(path)
    sql(path, "UPDATE trioexec_meta SET value = 'abc' WHERE key = 'schema_version'")
    before = path.read_bytes()
    with pytest.raises(StoreError) as info:
        SQLiteStore(path, read_only=read_only)
    assert str(info.value) == f"{path}: unreadable schema version 'abc' in trioexec_meta"
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("column", "value"), [("status", "bogus"), ("sub_status", "x")], ids=["status", "sub-status"]
)
@pytest.mark.parametrize("read_only", [False, True], ids=["read-write", "read-only"])
def test_an_unreadable_execution_row_is_a_store_error_naming_it(tmp_path, column, value, read_only):
    """Before the fix: a raw ValueError from the enum, naming neither file nor row."""
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        store.write([submit("t1"), submit("t2"), Start(("t2", 1, 1, 2.0))])
    sql(path, f"UPDATE executions SET {column} = ? WHERE task_id = 't2'", (value,))
    with SQLiteStore(path, read_only=read_only) as store:
        calls = [store.executions, lambda: store.execution("t2")]
        calls += [lambda: store.executions(limit=5, order="newest")]
        if column == "status":
            calls.append(store.counts)
        elif not read_only:  # still running: recovery reads it
            calls.append(lambda: store.recover("B", 10.0, lambda r: True, 3))
        for call in calls:
            with pytest.raises(StoreError) as info:
                call()
            assert str(info.value).startswith(f"{path}: execution 't2' has an unreadable row")
            assert repr(value) in str(info.value)
        assert store.execution("t1").status is TaskStatus.PENDING  # the rest still reads


@pytest.mark.parametrize(
    ("breakage", "row", "calls"),
    [
        pytest.param(
            "UPDATE durable_promises SET state = 'bogus' WHERE id = 'p2'",
            "durable promise 'p2'",
            [("promises.get", "p2"), ("promises.search",)],
            id="promise-state",
        ),
        pytest.param(
            "UPDATE durable_promises SET tags = 'not json' WHERE id = 'p2'",
            "durable promise 'p2'",
            [("promises.get", "p2"), ("promises.search",)],
            id="promise-tags",
        ),
        pytest.param(
            "UPDATE durable_tasks SET state = 'bogus' WHERE id = 'p2'",
            "durable task 'p2'",
            [("tasks.get", "p2"), ("tasks.search",)],
            id="task-state",
        ),
    ],
)
@pytest.mark.parametrize("read_only", [False, True], ids=["read-write", "read-only"])
def test_an_unreadable_durable_row_is_a_store_error_naming_it(
    tmp_path, breakage, row, calls, read_only
):
    """Before the fix: a raw ValueError (or JSONDecodeError) from the row reader."""
    path = tmp_path / "runs.db"
    with DurableStore(path) as ds:
        durable_call(ds, "promises.create", "p1", 3600)
        durable_call(ds, "promises.create", "p2", 3600, target="mailer")
    sql(path, breakage)
    with SQLiteStore(path, read_only=read_only) as store, DurableStore(store) as ds:
        for method, *args in calls:
            with pytest.raises(StoreError) as info:
                durable_call(ds, method, *args)
            assert str(info.value).startswith(f"{path}: {row} has an unreadable row")
        assert durable_call(ds, "promises.get", "p1").id == "p1"


# ------------------------------------------------------------ issue 13: read-only views

HOLD_WRITE_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


@contextlib.contextmanager
def write_lock_held(path):
    """Another process holds ``path``'s write lock (an open ``BEGIN IMMEDIATE``)
    for as long as the block runs."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_WRITE_LOCK, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "locked\n"
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        proc.stdout.close()


def files(directory):
    """The directory's content as far as the data goes: SQLite's shared-memory index
    (``-shm``), and an empty ``-wal``, are what any reader of a WAL database sets up
    (and a later writer reuses); they hold no data."""
    return {
        p.name: p.read_bytes()
        for p in directory.iterdir()
        if not p.name.endswith("-shm") and not (p.name.endswith("-wal") and not p.stat().st_size)
    }


def test_read_only_never_creates_a_file(tmp_path):
    with pytest.raises(StoreError) as info:
        SQLiteStore(tmp_path / "missing.db", read_only=True)
    assert str(info.value) == f"{tmp_path / 'missing.db'}: no such database file"
    assert list(tmp_path.iterdir()) == []


def test_read_only_leaves_an_empty_file_empty(tmp_path):
    """Before the fix a view of a 0-byte file turned it into a trioexec database."""
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(StoreError) as info:
        SQLiteStore(path, read_only=True)
    assert str(info.value) == f"{path}: not a trioexec database (empty file)"
    assert files(tmp_path) == {"empty.db": b""}


@pytest.mark.parametrize(
    ("prepare", "words"),
    [
        pytest.param(
            lambda p: p.write_bytes(random.Random(1).randbytes(8192)), ["corrupt"], id="corrupt"
        ),
        pytest.param(
            lambda p: sql(p, "CREATE TABLE invoices (id INTEGER PRIMARY KEY)"),
            ["not a trioexec database", "invoices"],
            id="foreign",
        ),
        pytest.param(
            lambda p: sql(p, "PRAGMA user_version = 1"),
            ["not a trioexec database (no trioexec schema)"],
            id="no-tables",
        ),
        pytest.param(
            lambda p: (
                make_store_file(p),
                sql(p, "UPDATE trioexec_meta SET value = '999' WHERE key = 'schema_version'"),
            ),
            ["newer trioexec", "999"],
            id="newer",
        ),
    ],
)
def test_read_only_refuses_what_it_cannot_read_and_leaves_it_alone(tmp_path, prepare, words):
    path = tmp_path / "runs.db"
    prepare(path)
    before = files(tmp_path)
    with pytest.raises(StoreError) as info:
        SQLiteStore(path, read_only=True)
    assert str(info.value).startswith(f"{path}: ")
    for word in words:
        assert word in str(info.value)
    assert files(tmp_path) == before


def test_read_only_refuses_an_older_schema_until_a_writer_migrates_it(tmp_path):
    path = tmp_path / "runs.db"
    db = sqlite_utils.Database(path)
    MIGRATIONS.apply(db, stop_before="0004_run_recovery_attempts")
    db.close()
    before = path.read_bytes()
    with pytest.raises(StoreError) as info:
        SQLiteStore(path, read_only=True)
    assert str(info.value) == (
        f"{path}: written by an older trioexec (schema version 3; this trioexec reads"
        f" {SCHEMA_VERSION}):"
        " open it once read-write to migrate it"
    )
    assert path.read_bytes() == before
    SQLiteStore(path).close()  # a writer migrates it
    with SQLiteStore(path, read_only=True) as store:
        assert store.executions() == []


def test_read_only_store_refuses_every_write_and_changes_nothing(tmp_path):
    path = tmp_path / "runs.db"
    with SQLiteStore(path, inline=True) as store:
        store.heartbeat("A", 99.0)
        store.write([submit("t1"), Start(("t1", 1, 1, 2.0))])
    with DurableStore(path) as ds:
        durable_call(ds, "promises.create", "p1", 3600)
    before = files(tmp_path)
    with SQLiteStore(path, read_only=True) as store, DurableStore(store) as ds:
        writes = {
            "write": lambda: store.write([submit("t2")]),
            "heartbeat": lambda: store.heartbeat("A", 1.0),
            "renew_lease": lambda: store.renew_lease("A", 1.0),
            "recover": lambda: store.recover("B", 1e9, lambda r: True, 3),
            "claim_runs": lambda: store.claim_runs("B", 1e9, ["etl"], 3),
            "release_owner": lambda: store.release_owner("A"),
            "promises.create": lambda: durable_call(ds, "promises.create", "p2", 60),
            "promises.resolve": lambda: durable_call(ds, "promises.resolve", "p1"),
            "tasks.create": lambda: durable_call(
                ds, "tasks.create", "p3", pid="w", ttl=5, timeout=60, target="x"
            ),
        }
        for name, call in writes.items():
            with pytest.raises(StoreError) as info:
                call()
            assert str(info.value) == f"{path}: opened read-only", name
        # Not merely refused by the store: the connection itself cannot write.
        conn = store._db._checkout()
        try:
            with pytest.raises(sqlite3.OperationalError, match=r"readonly"):
                conn.execute("DELETE FROM executions")
        finally:
            store._db._checkin(conn)
        # Reads work.
        assert store.execution("t1").lease_expires_at == 99.0
        assert store.taken_over("A", {"t1": 1}) == []
        assert store.counts()[TaskStatus.RUNNING] == 1
        assert durable_call(ds, "promises.get", "p1").state is PromiseState.PENDING
        assert trio.run(ds.check_invariants) == []
    assert files(tmp_path) == before


def build_durable_times(path):
    """Promises and tasks the durable clock (at 1000) will have moved on: a timed-out
    promise with a task suspended on it, a timed-out promise with its own task, an
    expired lease, a pending task whose retry timeout passed, and live ones."""
    now = [0.0]
    with DurableStore(path, clock=lambda: now[0], retry_timeout=500) as ds:
        durable_call(ds, "promises.create", "gate", 100)  # times out at 100
        durable_call(ds, "promises.create", "later", 5000)
        durable_call(ds, "promises.create", "own", 100, target="mailer")  # its task too
        job = durable_call(ds, "tasks.create", "job", pid="w1", ttl=50, timeout=5000, target="m")
        assert durable_call(ds, "tasks.suspend", "job", job.version, ["gate"]) == "suspended"
        durable_call(ds, "tasks.create", "leased", pid="w2", ttl=50, timeout=5000, target="m")
        durable_call(ds, "promises.create", "queued", 5000, target="reporter")  # due at 500
        for i in range(5):
            durable_call(ds, "promises.create", f"z{i}", 5000, tags={"team": "ops"})


def test_read_only_durable_view_sees_time_pass_without_writing(tmp_path):
    """A read-only DurableStore answers what a writer would (timeouts, expired
    leases), from memory: the file keeps what it had."""
    path, copy = tmp_path / "ro.db", tmp_path / "rw.db"
    build_durable_times(path)
    shutil.copy(path, copy)
    raw = sql(path, "SELECT id, state FROM durable_promises ORDER BY id")

    def answers(ds):
        out = [durable_call(ds, "promises.get", i) for i in ("gate", "own", "later", "nope")]
        out += [durable_call(ds, "tasks.get", i) for i in ("job", "own", "leased", "queued")]
        for state in (None, "pending", "rejected_timedout"):
            out.append(durable_call(ds, "promises.search", state=state))
            out.append(durable_call(ds, "promises.search", state=state, limit=2))
            out.append(durable_call(ds, "promises.search", state=state, limit=2, cursor="job"))
        out.append(durable_call(ds, "promises.search", tag=("team", "ops"), limit=3))
        for state in (None, "pending", "acquired", "suspended", "fulfilled"):
            out.append(durable_call(ds, "tasks.search", state=state))
            out.append(durable_call(ds, "tasks.search", state=state, limit=1, cursor="job"))
        out.append(durable_call(ds, "tasks.search", target="m"))
        out.append(trio.run(ds.check_invariants))
        return out

    with (
        SQLiteStore(path, read_only=True) as store,
        DurableStore(store, clock=lambda: 1000.0, retry_timeout=500) as ds,
    ):
        seen = answers(ds)
        assert seen == answers(ds)  # nothing was kept between operations
    with DurableStore(copy, clock=lambda: 1000.0, retry_timeout=500) as ds:
        assert seen == answers(ds)
    assert seen[0].state is PromiseState.REJECTED_TIMEDOUT
    assert seen[4].state == "pending"  # "job" was resumed when its gate timed out
    assert sql(path, "SELECT id, state FROM durable_promises ORDER BY id") == raw
    assert ("gate", "pending") in raw


@pytest.mark.parametrize(
    "name",
    [
        "with space.db",
        "what?.db",
        "hash#tag.db",
        "per%41cent.db",
        "per%.db",
        "[brackets].db",
        "quo'te\"s.db",
        "emoji-\N{PARTY POPPER}.db",
        "a?mode=rwc&x=1.db",
    ],
)
def test_read_only_opens_paths_that_mean_something_in_a_uri(tmp_path, name):
    path = tmp_path / name
    make_store_file(path)
    before = files(tmp_path)
    with SQLiteStore(path, read_only=True) as store:
        assert [r.task_id for r in store.executions()] == ["t1"]
    assert files(tmp_path) == before


def test_read_only_reads_while_another_process_holds_the_write_lock(tmp_path):
    """Before the fix a view took the write lock to migrate, so it waited 10 s
    behind any writer and failed."""
    path = tmp_path / "runs.db"
    make_store_file(path)
    with DurableStore(path) as ds:
        durable_call(ds, "promises.create", "p1", 3600)
    with write_lock_held(path):
        started = time.monotonic()
        with SQLiteStore(path, read_only=True) as store, DurableStore(store) as ds:
            assert [r.task_id for r in store.executions(limit=10)] == ["t1"]
            assert store.counts()[TaskStatus.PENDING] == 1
            assert [p.id for p in durable_call(ds, "promises.search")[0]] == ["p1"]
            assert trio.run(ds.check_invariants) == []
        assert time.monotonic() - started < 5.0  # a writer's open would wait 10 s


def test_a_reading_thread_that_ends_leaves_no_connection_behind(tmp_path):
    # Before: each thread's read connection was tracked weakly and left to the
    # garbage collector when the thread ended (Python 3.13: "unclosed database").
    import gc
    import threading
    import warnings

    store = SQLiteStore(tmp_path / "runs.db")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            thread = threading.Thread(target=store.executions)
            thread.start()
            thread.join()
        gc.collect()
        store.close()
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert store._db._readers == set()  # every one closed by close()


def test_a_file_that_is_no_database_leaves_no_connection_open(tmp_path):
    import gc
    import warnings

    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not a database" * 100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(StoreError):
            SQLiteStore(path)
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_opening_waits_while_another_process_holds_the_new_files_lock(tmp_path, monkeypatch):
    """Two processes creating one store at once (CI: two workers on a fresh file):
    the second was refused at once with 'database is locked', as SQLite refuses a
    connection that read first; now it tries again until the lock is free."""

    from trioexec._store import _sqlite_file

    path = tmp_path / "fresh.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # (the other process, creating the schema)
    retries: list[float] = []

    def other_commits(seconds: float) -> None:  # (instead of waiting: it commits)
        retries.append(seconds)
        if other.in_transaction:
            other.execute("COMMIT")

    monkeypatch.setattr(_sqlite_file.time, "sleep", other_commits)
    with SQLiteStore(path) as store:
        assert store.executions() == []
    assert retries  # it did have to wait
    other.close()


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(
            st.sampled_from(["plain", "run", "key", "priority", "version", "sparse"]), st.booleans()
        ),
        min_size=1,
        max_size=6,
    ),
    two_owners=st.booleans(),
)
def test_each_insert_stores_every_row_as_written(tmp_path_factory, shapes, two_owners):
    """A batch goes in by one of three inserts: plain tasks' rows naming only the
    columns such a row can change (`Column.rare` left out, the owner once), dense
    rows whole, rows with a sparse value. Whichever a batch takes (a plain row
    beside others, two owners), each row reads back as written, in batch order."""
    from trioexec._changes import R_STATUS, widen
    from trioexec._columns import ROW_COLUMNS

    at = ROW_COLUMNS.index
    rows = []
    for i, (shape, ended) in enumerate(shapes):
        owner = "B" if two_owners and i == len(shapes) - 1 else "A"
        row = submitted(f"t{i}", 1, f"n[{i}]'\N{SNAKE}", None, None, None, owner, 1e9 + i / 3)
        if ended:  # (started and finished, as most rows of a batch are)
            row[R_STATUS], row[at("attempt")] = TaskStatus.COMPLETED, 1
            row[at("started_at")], row[at("finished_at")] = 1e9 + i, 1e9 + i + 0.25
            row[at("waiting_on")] = None
        if shape == "run":
            row[at("run_id")], row[at("spec_id")], row[at("args")] = "r", "s", "[1]"
        elif shape == "key":
            row[at("key")] = "k"
        elif shape == "priority":
            row[at("priority")] = -3
        elif shape == "version":
            row[at("version")], row[at("recovery_attempts")] = 4, 2
        elif shape == "sparse":
            widen(row)[at("parent_id")] = "p"
        rows.append(row)
    path = tmp_path_factory.mktemp("layouts") / "x.db"
    with SQLiteStore(str(path)) as store:
        assert store.write([list(row) for row in rows]) == []
        records = store.executions(limit=100)
    assert [r.task_id for r in records] == [row[0] for row in rows]
    for record, row in zip(records, rows, strict=True):
        for name, value in zip(ROW_COLUMNS, widen(row), strict=True):
            assert getattr(record, name) == value, (name, record, row)
