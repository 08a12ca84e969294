"""The dashboard's reads (`trioexec._store._browse`, issue 20) on SQLite files and
the real PostgreSQL server: filters alone and combined, the three orders, keyset
pages that visit every row once, text that SQL would read as wildcards or quotes,
malformed cursors, finished executions per bucket, a task's commands and its
children; and the run graph each workflow run records (schema: SQLite 0011,
PostgreSQL 8)."""

from __future__ import annotations

import base64
import json
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlite_utils
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pg_server import schema_at_version

import trioexec
from trioexec import PostgresStore, SQLiteStore, TaskStatus, Workflow, task
from trioexec._changes import RunCreated, RunEnded, StepRecorded
from trioexec._columns import ROW_COLUMNS
from trioexec._store import _browse, _pg_schema, _sqlite_schema
from trioexec._store._browse import (
    Bucket,
    Page,
    activity,
    browse,
    runs_page,
    task_children,
    task_commands,
    task_names,
)

SQL_KINDS = ["sqlite", "postgres"]
LIVE = (TaskStatus.PENDING, TaskStatus.RUNNING)
WHO = "tester"
#: Text SQL reads as something else: LIKE/GLOB wildcards, quotes, brackets, emoji.
ODD_NAMES = ["a[b]c", "it's", "100%", "a_b", "🎉 party", "a%_[", 'say "hi"', "*?"]


@pytest.fixture(params=SQL_KINDS)
def store(request: pytest.FixtureRequest, store_maker: Any) -> Any:
    return store_maker(request.param)


def row(task_id: str, **fields: Any) -> dict[str, Any]:
    """An execution's row as a test writes it: finished (completed) unless told."""
    values: dict[str, Any] = dict.fromkeys(ROW_COLUMNS)
    values.update(
        task_id=task_id,
        name="job",
        status=TaskStatus.COMPLETED,
        attempt=1,
        recovery_attempts=0,
        version=1,
        priority=0,
        submitted_at=1000.0,
        owner="A",
    )
    values.update(fields)
    status = TaskStatus(values["status"])
    values["status"] = status
    if status not in LIVE and "finished_at" not in fields:
        values["finished_at"] = values["submitted_at"] + 1
    return values


def pending(task_id: str, **fields: Any) -> dict[str, Any]:
    return row(task_id, status=TaskStatus.PENDING, **{"waiting_on": "slot", **fields})


def deferred(task_id: str, since: float, **fields: Any) -> dict[str, Any]:
    return row(
        task_id,
        status=TaskStatus.RUNNING,
        sub_status="deferred",
        deferred_since=since,
        **{"waiting_on": "event", **fields},
    )


def active(task_id: str, **fields: Any) -> dict[str, Any]:
    return row(task_id, status=TaskStatus.RUNNING, sub_status="active", **fields)


def put(store: Any, rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` (in this order: their submission order) in one batch."""
    assert store.write([[r[c] for c in ROW_COLUMNS] for r in rows]) == []


def walk(store: Any, **query: Any) -> tuple[list[str], list[Page]]:
    """Every page of a query, following the cursors: the task ids in page order."""
    pages = [browse(store, **query)]
    while pages[-1].next_cursor is not None:
        pages.append(browse(store, cursor=pages[-1].next_cursor, **query))
        assert len(pages) < 10_000
    return [r.task_id for p in pages for r in p.rows], pages


def expected(rows: list[dict[str, Any]], order: str = "newest", **query: Any) -> list[str]:
    """The reference answer of a query over ``rows`` (submission order)."""

    def matches(r: dict[str, Any]) -> bool:
        for field in ("status", "sub_status", "name", "key", "run_id"):
            if query.get(field) is not None and r[field] != query[field]:
                return False
        wanted = query.get("waiting_on")
        return wanted is None or (r["waiting_on"] is not None and wanted in r["waiting_on"])

    found = [(i, r) for i, r in enumerate(rows) if matches(r)]
    if order == "oldest":
        return [r["task_id"] for _, r in found]
    if order == "newest":
        return [r["task_id"] for _, r in reversed(found)]

    def waited(item: tuple[int, dict[str, Any]]) -> tuple[int, float, int]:
        i, r = item
        if r["status"] == TaskStatus.PENDING:
            return (0, r["submitted_at"] or 0.0, i)
        if r["sub_status"] == "deferred":
            return (0, r["deferred_since"] or 0.0, i)
        return (1, 0.0, i)

    live = [item for item in found if item[1]["status"] in LIVE]
    return [r["task_id"] for _, r in sorted(live, key=waited)]


def a_mix() -> list[dict[str, Any]]:
    """Executions of every kind, names, keys, runs and waits."""
    rows: list[dict[str, Any]] = []
    for i in range(60):
        name = ["email", "charge", ODD_NAMES[i % len(ODD_NAMES)]][i % 3]
        key = None if i % 4 else f"k{i % 8}"
        run_id = "run-1" if i % 10 == 0 else None
        common = {"name": name, "key": key, "run_id": run_id, "submitted_at": 1000.0 + i}
        kind = i % 6
        if kind == 0:
            rows.append(pending(f"t{i:02}", **common, waiting_on=["slot", "paused"][i % 2]))
        elif kind == 1:
            waits = ["promise p_1", "condition 100%", "key concurrency a[b]", "event"]
            rows.append(deferred(f"t{i:02}", 2000.0 - i, **common, waiting_on=waits[i % 4]))
        elif kind == 2:
            rows.append(active(f"t{i:02}", **common))
        else:
            status = [TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED][kind - 3]
            rows.append(row(f"t{i:02}", status=status, **common))
    return rows


# ---------------------------------------------------------------------- browse


QUERIES: list[dict[str, Any]] = [
    {},
    *({"status": s} for s in TaskStatus),
    {"sub_status": "deferred"},
    {"sub_status": "active"},
    {"name": "email"},
    *({"name": n} for n in ODD_NAMES),
    {"key": "k0"},
    {"key": "k4"},
    {"run_id": "run-1"},
    {"waiting_on": "slot"},
    {"waiting_on": "%"},
    {"waiting_on": "_"},
    {"waiting_on": "["},
    {"waiting_on": "p_1"},
    {"waiting_on": "Slot"},  # (case-sensitive: none)
    {"status": "running", "name": "charge"},
    {"status": "pending", "key": "k0", "name": "email"},
    {"sub_status": "deferred", "waiting_on": "e"},
    {"run_id": "run-1", "status": "pending"},
    {"name": "email", "waiting_on": "a"},
]


@pytest.mark.parametrize("order", ["newest", "oldest", "longest_waiting"])
def test_every_filter_and_order_walks_its_rows_once(store, order):
    rows = a_mix()
    put(store, rows)
    for query in QUERIES:
        for limit in (1, 7, 50):
            got, pages = walk(store, order=order, limit=limit, **query)
            want = expected(rows, order, **query)
            assert got == want, (query, limit)
            assert all(p.total == len(want) for p in pages), query
            assert all(len(p.rows) == limit for p in pages[:-1])
            assert pages[-1].next_cursor is None
            assert len(pages) == max(1, -(-len(want) // limit))
    # The filters' answers are the stores' own records, whole.
    [first] = browse(store, name="a[b]c", limit=1, order="oldest").rows
    assert first == store.execution(first.task_id)


def test_longest_waiting_lists_live_executions_waiting_longest_first(store):
    put(
        store,
        [
            row("done", submitted_at=1.0),
            active("holding", submitted_at=2.0),
            pending("queued", submitted_at=500.0),
            deferred("deferred-long", 100.0, submitted_at=900.0),
            deferred("deferred-short", 800.0, submitted_at=3.0),
            pending("queued-first", submitted_at=50.0),
            active("holding-too", submitted_at=1.0),
        ],
    )
    page = browse(store, order="longest_waiting")
    assert [r.task_id for r in page.rows] == [
        "queued-first",  # since 50
        "deferred-long",  # since 100
        "queued",  # since 500
        "deferred-short",  # since 800
        "holding",  # active: last, in submission order
        "holding-too",
    ]
    assert page.total == 6
    assert browse(store, order="longest_waiting", status="completed").rows == []


def test_odd_text_is_matched_as_itself_and_never_as_sql(store):
    rows = [row(f"n{i}", name=name, key=name) for i, name in enumerate(ODD_NAMES)]
    rows += [pending(f"w{i}", waiting_on=f"key concurrency {n}") for i, n in enumerate(ODD_NAMES)]
    rows.append(row("plain", name="ab", key="ab"))
    put(store, rows)
    for i, name in enumerate(ODD_NAMES):
        assert [r.task_id for r in browse(store, name=name).rows] == [f"n{i}"]
        assert [r.task_id for r in browse(store, key=name).rows] == [f"n{i}"]
        holding = [f"w{j}" for j, other in enumerate(ODD_NAMES) if name in other]
        got = browse(store, waiting_on=name, order="oldest").rows
        assert [r.task_id for r in got] == holding, name
    for text in ("%", "_", "' OR 1=1 --", "a_", "*", "["):
        assert browse(store, name=text).rows == []
    assert browse(store, waiting_on="%%").rows == []
    # Text no store can hold matches nothing (and is no error).
    for text in ("a\x00b", "\udc80"):
        assert browse(store, name=text) == Page(rows=[], next_cursor=None, total=0)
        assert browse(store, waiting_on=text).rows == []
    assert task_names(store) == sorted([*ODD_NAMES, "ab", "job"])
    assert task_names(store, limit=2) == sorted(task_names(store, limit=2))
    assert len(task_names(store, limit=2)) == 2


def test_a_malformed_cursor_is_refused_naming_it(store):
    put(store, [row(f"t{i}") for i in range(5)])
    page = browse(store, limit=2)
    assert page.next_cursor is not None

    def b64(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode()

    bad = [
        "",
        "garbage!",
        "bm90IGpzb24=",  # "not json"
        b64({"newest": 3}),
        b64([]),
        b64(["newest"]),
        b64(["newest", "3"]),
        b64(["newest", True]),
        b64(["newest", 1.5]),
        b64(["newest", 1, 2]),
        b64(["newest", 2**63]),  # (no 64-bit integer: the database could not compare it)
        b64(["newest", -(2**63) - 1]),
        page.next_cursor + "~",
        "A" * 600,
    ]
    waiting = [
        b64(["longest_waiting", 0, "x", 1]),
        b64(["longest_waiting", 2, 1.0, 1]),
        b64(["longest_waiting", 0, float("inf"), 1]),
        b64(["longest_waiting", 0, 1.0]),
        b64(["longest_waiting", 0, 10**400, 1]),
        b64(["longest_waiting", 0, 1.5, 2**64]),
    ]
    for cursor, order in [
        *((c, "newest") for c in bad),
        *((c, "longest_waiting") for c in waiting),
    ]:
        with pytest.raises(ValueError, match="malformed cursor") as info:
            browse(store, limit=2, cursor=cursor, order=order)
        assert repr(cursor)[:40] in str(info.value)
    with pytest.raises(ValueError, match="of order 'newest', not 'oldest'"):
        browse(store, order="oldest", cursor=page.next_cursor)
    # A cursor holds only where the walk is: it works under the same filters.
    assert [r.task_id for r in browse(store, limit=2, cursor=page.next_cursor).rows] == [
        "t2",
        "t1",
    ]


def test_bad_arguments_are_refused_naming_them(store):
    for kwargs, shown in [
        ({"status": "finished"}, "'finished'"),
        ({"sub_status": "asleep"}, "'asleep'"),
        ({"order": "random"}, "'random'"),
        ({"limit": 0}, "0"),
        ({"limit": True}, "True"),
        ({"limit": _browse.MAX_LIMIT + 1}, str(_browse.MAX_LIMIT + 1)),
        ({"name": 3}, "3"),
    ]:
        with pytest.raises(ValueError, match="must be") as info:
            browse(store, **kwargs)
        assert shown in str(info.value), kwargs
    with pytest.raises(TypeError, match="got dict"):
        browse({})
    with pytest.raises(ValueError, match="bucket must be > 0"):
        activity(store, since=0, bucket=0, now=10)
    with pytest.raises(ValueError, match="nan"):
        activity(store, since=float("nan"), now=10)
    with pytest.raises(ValueError, match="at most"):
        activity(store, since=0, bucket=1, now=_browse.MAX_BUCKETS + 1)
    with pytest.raises(ValueError, match="limit"):
        task_names(store, limit=-1)


def test_total_is_none_past_the_count_limit(store, monkeypatch):
    put(store, [row(f"t{i}") for i in range(12)])
    monkeypatch.setattr(_browse, "COUNT_LIMIT", 10)
    assert browse(store, limit=3).total is None
    assert browse(store, limit=3, status="completed").total is None
    assert browse(store, limit=3, status="failed").total == 0
    ids, _ = walk(store, limit=5)
    assert len(ids) == 12 == len(set(ids))


def test_a_read_only_store_browses(tmp_path):
    path = tmp_path / "runs.db"
    with SQLiteStore(path, inline=True) as writer:
        put(writer, [pending("p"), row("c", finished_at=50.0)])
        writer.command("cancel", task_id="p", who=WHO)
    with trioexec.open_store(str(path), read_only=True) as reader:
        assert [r.task_id for r in browse(reader).rows] == ["c", "p"]
        assert [c.kind for c in task_commands(reader, "p")] == ["cancel"]
        assert activity(reader, since=0, bucket=100, now=100)[0].finished == 1
        assert task_names(reader) == ["job"]


# Hypothesis: any rows, any query, any page size: the pages are the answer.

_ROWS = st.lists(
    st.tuples(
        st.sampled_from(["pending", "active", "deferred", "completed", "failed"]),
        st.sampled_from(["a", "b", "%", "_"]),
        st.integers(0, 3),  # submitted_at / deferred_since (ties on purpose)
        st.sampled_from([None, "slot", "a%b", "x_y"]),
    ),
    max_size=25,
)
_QUERY = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(["pending", "running", "completed"]),
        "name": st.sampled_from(["a", "%", "_"]),
        "waiting_on": st.sampled_from(["%", "_", "a", "slot"]),
        "sub_status": st.sampled_from(["deferred", "active"]),
    },
)


def _rows_of(drawn: list[tuple[str, str, int, str | None]]) -> list[dict[str, Any]]:
    rows = []
    for i, (kind, name, at, waiting) in enumerate(drawn):
        task_id = f"h{i}"
        if kind == "pending":
            rows.append(pending(task_id, name=name, submitted_at=float(at), waiting_on=waiting))
        elif kind == "deferred":
            rows.append(deferred(task_id, float(at), name=name, waiting_on=waiting))
        elif kind == "active":
            rows.append(active(task_id, name=name, submitted_at=float(at)))
        else:
            rows.append(row(task_id, name=name, status=kind, submitted_at=float(at)))
    return rows


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_pages_visit_every_match_once_whatever_the_rows(kind, request):
    url = request.getfixturevalue("postgres_url") if kind == "postgres" else None

    @settings(
        max_examples=25 if kind == "postgres" else 60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        drawn=_ROWS,
        query=_QUERY,
        order=st.sampled_from(["newest", "oldest", "longest_waiting"]),
        limit=st.integers(1, 6),
    )
    def check(drawn, query, order, limit):
        rows = _rows_of(drawn)
        with _fresh_store(kind, url) as store:
            if rows:
                put(store, rows)
            got, pages = walk(store, order=order, limit=limit, **query)
            want = expected(rows, order, **query)
            assert got == want
            assert {p.total for p in pages} == {len(want)}

    check()


class _fresh_store:
    """A store of its own for one hypothesis example (a new file; a new schema)."""

    def __init__(self, kind: str, url: str | None) -> None:
        self.kind, self.url = kind, url

    def __enter__(self) -> Any:
        if self.kind == "sqlite":
            self.tmp = tempfile.TemporaryDirectory()
            self.store: Any = SQLiteStore(Path(self.tmp.name) / "h.db", inline=True)
        else:
            assert self.url is not None
            self.schema = f"h_{uuid.uuid4().hex[:12]}"
            self.store = PostgresStore(self.url, schema=self.schema, inline=True)
        return self.store

    def __exit__(self, *exc: object) -> None:
        self.store.close()
        if self.kind == "sqlite":
            self.tmp.cleanup()
        else:
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {self.schema} CASCADE")


# ---------------------------------------------------------------------- activity


def test_activity_counts_finished_executions_per_bucket_zero_filled(store):
    put(
        store,
        [
            row("before", finished_at=99.9),
            row("c1", finished_at=100.0),
            row("c2", finished_at=159.9),
            row("f1", status="failed", finished_at=130.0),
            row("x1", status="cancelled", finished_at=250.0),
            row("t1", status="timed_out", finished_at=299.0),
            row("d1", status="dropped", finished_at=140.0),
            row("r1", status="rejected", finished_at=140.0),
            row("c3", finished_at=400.0),  # == now: the last bucket
            row("after", finished_at=400.5),
            pending("live"),
            active("running"),
        ],
    )
    got = activity(store, since=100.0, bucket=60.0, now=400.0)

    def ended(**n: int) -> dict[TaskStatus, int]:
        return {s: n.get(s.value, 0) for s in TaskStatus if s not in LIVE}

    assert got == [
        Bucket(start=100.0, ended=ended(completed=2, failed=1, dropped=1, rejected=1)),
        Bucket(start=160.0, ended=ended()),
        Bucket(start=220.0, ended=ended(cancelled=1)),
        Bucket(start=280.0, ended=ended(timed_out=1)),
        Bucket(start=340.0, ended=ended(completed=1)),
    ]
    # Every status that is not live counts as finished (issue 30, 16).
    assert [b.finished for b in got] == [5, 0, 1, 1, 1]
    assert set(_browse.ENDED) == set(TaskStatus) - set(LIVE)
    assert activity(store, since=400.0, now=400.0) == []
    assert activity(store, since=0.0, bucket=1000.0, now=10.0) == [Bucket(start=0.0, ended=ended())]
    # Without ``now``: the store's clock.
    store.clock = lambda: 160.0
    got = activity(store, since=100.0, bucket=30.0)
    assert [b.ended[TaskStatus.COMPLETED] for b in got] == [1, 1]


# ---------------------------------------------------------------------- commands


def test_task_commands_are_the_commands_naming_the_task(store):
    put(
        store,
        [
            pending("victim", owner=None),
            row("dead", status="failed", spec_id="spec", args="[]"),
            row("dead2", status="failed", spec_id="spec", args="[]"),
            row("other", status="failed", spec_id="spec", args="[]"),
        ],
    )
    store.command("cancel", task_id="victim", who=WHO)
    store.command("pause", name="job", who=WHO)
    store.requeue(["dead"], who=WHO)
    store.requeue(["dead2", "other"], who=WHO)  # names no one task
    store.command("cancel", task_id="victim", who="someone else")
    got = task_commands(store, "victim")
    assert [(c.kind, c.who, c.detail) for c in got] == [
        ("cancel", WHO, "cancelled in the store (no live owner)"),
        ("cancel", "someone else", "already finished (cancelled)"),
    ]
    assert got[0].seq < got[1].seq
    assert [(c.kind, c.detail) for c in task_commands(store, "dead")] == [
        ("retry", "requeued 1, refused 0")
    ]
    assert task_commands(store, "dead2") == []
    assert task_commands(store, "nobody") == []
    assert task_commands(store, "a\x00") == []
    assert task_commands(store, "it's'; DROP TABLE commands; --") == []
    assert len(store.commands()) == 5


# ---------------------------------------------------------------------- children


def test_task_children_are_the_first_submitted_and_counted(store, monkeypatch):
    """A task's children (the executions whose parent_id it is), in submission
    order, at most ``limit``, with how many in all: not its grandchildren, not
    another task's, whatever the ids hold."""
    odd = "it's'; DROP TABLE executions; --[/]🚀"
    put(
        store,
        [
            row("root"),
            *(row(f"c{i}", name=f"n{i}", parent_id="root") for i in range(5)),
            row("gc", parent_id="c0"),
            pending("other", parent_id="elsewhere"),
            row(odd),
            pending("odd-kid", parent_id=odd),
            row("rootless"),
        ],
    )
    got = task_children(store, "root", limit=3)
    assert [(r.task_id, r.name, r.parent_id) for r in got.rows] == [
        ("c0", "n0", "root"),
        ("c1", "n1", "root"),
        ("c2", "n2", "root"),
    ]
    assert (got.total, got.more) == (5, 2)
    whole = task_children(store, "root")
    assert [r.task_id for r in whole.rows] == [f"c{i}" for i in range(5)]
    assert (whole.total, whole.more) == (5, 0)
    assert [r.task_id for r in task_children(store, "c0").rows] == ["gc"]
    odd_kids = task_children(store, odd)
    assert [(r.task_id, r.status) for r in odd_kids.rows] == [("odd-kid", TaskStatus.PENDING)]
    for none in ("rootless", "gc", "nobody", "a\x00", "root%", "roo_", ""):
        assert task_children(store, none) == _browse.Children(rows=[], total=0), none
    monkeypatch.setattr(_browse, "COUNT_LIMIT", 4)
    over = task_children(store, "root", limit=2)
    assert (len(over.rows), over.total, over.more) == (2, None, 3)  # (at least 3 more)
    assert task_children(store, "root", limit=5).total == 5  # (none cut: not counted)


def test_task_children_refuses_bad_arguments_naming_them(store):
    with pytest.raises(ValueError, match="task_id"):
        task_children(store, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="task_id"):
        task_children(store, 7)  # type: ignore[arg-type]
    for bad in (0, _browse.MAX_LIMIT + 1, 1.5):
        with pytest.raises(ValueError, match="limit"):
            task_children(store, "x", limit=bad)
    with pytest.raises(TypeError, match="trioexec store"):
        task_children(object(), "x")


@contextmanager
def plans(store: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The plan of each statement `_browse` runs on ``store`` meanwhile, as its
    database explains it on the same snapshot (PostgreSQL without sequential
    scans: its tables here are too small for an index to be worth it)."""
    found: list[str] = []
    real = type(store).snapshot
    explain = "EXPLAIN QUERY PLAN" if isinstance(store, SQLiteStore) else "EXPLAIN"

    class Spy:
        def __init__(self, conn: Any) -> None:
            self.conn = conn

        def execute(self, sql: str, params: Any = ()) -> Any:
            plan = self.conn.execute(f"{explain} {sql}", params).fetchall()
            found.append(" ".join(str(r[-1]) for r in plan))
            return self.conn.execute(sql, params)

    @contextmanager
    def snapshot(self: Any, doing: str) -> Iterator[Spy]:
        with real(self, doing) as conn:
            if not isinstance(store, SQLiteStore):
                conn.execute("SET LOCAL enable_seqscan = off")
            yield Spy(conn)

    monkeypatch.setattr(type(store), "snapshot", snapshot)
    yield found
    monkeypatch.undo()


def test_task_children_read_the_childrens_index(store, monkeypatch):
    put(store, [row("root"), *(row(f"c{i}", parent_id="root") for i in range(3))])
    with plans(store, monkeypatch) as found:
        assert task_children(store, "root", limit=2).total == 3
    assert len(found) == 2  # (the first children, then how many: they were cut)
    for plan in found:
        assert "executions_children" in plan, plan
    if isinstance(store, SQLiteStore):  # (its index holds the rowid: no sort)
        assert "TEMP B-TREE" not in found[0]
    with plans(store, monkeypatch) as found:
        assert task_children(store, "root").total == 3
    assert len(found) == 1  # (none cut: one query)


# ---------------------------------------------------------------------- run graph


def diamond() -> Workflow:
    @task(id="fetch")
    async def fetch(ctx):
        ctx["a"] = 1

    @task(id="left", dependencies=["fetch"])
    async def left(ctx):
        pass

    @task(id="right 🎉", dependencies=["fetch"])
    async def right(ctx):
        pass

    @task(id="join", dependencies=["right 🎉", "left"])
    async def join(ctx):
        pass

    return Workflow("diamond", [fetch, left, right, join])


GRAPH = {"fetch": [], "left": ["fetch"], "right 🎉": ["fetch"], "join": ["right 🎉", "left"]}


@pytest.mark.parametrize("kind", ["memory", *SQL_KINDS])
async def test_a_run_records_its_graph(kind, store_maker, autojump_clock):
    store = store_maker(kind)
    async with trioexec.open_executor(store=store) as ex:
        result = await ex.run_workflow(diamond(), {})
    assert result.ok
    record = store.run(result.run_id)
    assert record.graph == GRAPH
    assert list(record.graph) == ["fetch", "left", "right 🎉", "join"]  # run order
    assert [r.graph for r in store.runs()] == [GRAPH]
    # A run written in the old shape (no graph) reads back without one.
    store.write([RunCreated(("old-run", "A", "diamond", "{}", 5.0, None))])
    assert store.run("old-run").graph is None
    # A graph no trioexec writes (a hand-edited row) reads as none: it only
    # draws the run, so the run itself stays readable.
    for n, bent in enumerate(['{"a": 5}', "[1, 2]", "not json", '"text"']):
        store.write([RunCreated((f"bent-{n}", "A", "diamond", "{}", 5.0, bent))])
        assert store.run(f"bent-{n}").graph is None
    await trio.lowlevel.checkpoint()


# ---------------------------------------------------------------------- migrations


def test_a_sqlite_file_of_schema_10_migrates(tmp_path):
    path = tmp_path / "runs.db"
    db = sqlite_utils.Database(path)
    _sqlite_schema.MIGRATIONS.apply(db, stop_before="0011_dashboard")
    db.execute(
        "INSERT INTO workflow_runs (run_id, workflow, status, context, owner, created_at)"
        " VALUES ('old', 'wf', 'completed', '{}', 'A', 1.0)"
    )
    db.execute(
        "INSERT INTO executions (task_id, name, status, attempt, recovery_attempts, version,"
        " submitted_at, finished_at) VALUES ('it''s', '100%', 'completed', 1, 0, 1, 1.0, 2.0)"
    )
    db.conn.commit()
    db.close()
    with pytest.raises(trioexec.StoreError, match="older trioexec"):
        SQLiteStore(path, read_only=True)
    with SQLiteStore(path, inline=True) as store:
        assert store.run("old").graph is None
        assert [r.task_id for r in browse(store, name="100%").rows] == ["it's"]
        assert activity(store, since=0, bucket=10, now=10)[0].finished == 1
    with closing(sqlite3.connect(path)) as conn:
        version = conn.execute(
            "SELECT value FROM trioexec_meta WHERE key = 'schema_version'"
        ).fetchone()
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        plan = " ".join(
            str(r[-1])
            for r in conn.execute(
                "EXPLAIN QUERY PLAN SELECT status, count(*) FROM executions"
                " WHERE finished_at >= 1 AND finished_at <= 2 GROUP BY status"
            )
        )
    assert version == (str(_sqlite_schema.SCHEMA_VERSION),)  # (11, and on)
    assert {
        "executions_by_status",
        "executions_name",
        "executions_finished",
        "executions_live_rows",
        "executions_failed_name",
    } <= indexes
    assert "USING COVERING INDEX executions_finished" in plan
    with SQLiteStore(path, read_only=True) as reader:
        assert browse(reader).total == 1


def test_a_postgres_schema_of_version_7_migrates(postgres_url, pg_schema):
    before = 7
    with schema_at_version(postgres_url, pg_schema, before) as conn:
        conn.execute(
            "INSERT INTO workflow_runs (run_id, workflow, status, context, owner, created_at)"
            " VALUES ('old', 'wf', 'completed', '{}', 'A', 1.0)"
        )
        conn.execute(
            "INSERT INTO executions (task_id, name, status, attempt, submitted_at, finished_at)"
            " VALUES ('it''s', '100%%', 'failed', 1, 1.0, 2.0)"
        )
    with pytest.raises(trioexec.StoreError, match="older trioexec"):
        PostgresStore(postgres_url, schema=pg_schema, read_only=True)
    with PostgresStore(postgres_url, schema=pg_schema, inline=True) as store:
        assert store.run("old").graph is None
        assert [r.task_id for r in browse(store, status="failed").rows] == ["it's"]
        # (the failed rows' index of 7 gave way to the status index)
        assert [t for t, _ in store.requeue(who=WHO).refused] == ["it's"]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        indexes = {
            r[0]
            for r in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE schemaname = %s", (pg_schema,)
            )
        }
        version = conn.execute(
            f"SELECT value FROM {pg_schema}.trioexec_meta WHERE key = 'schema_version'"
        ).fetchone()
    assert version == (str(_pg_schema.SCHEMA_VERSION),)  # (8, and on)
    assert {
        "executions_by_status",
        "executions_name",
        "executions_finished",
        "executions_live_rows",
        "executions_failed_name",
    } <= indexes
    assert "executions_failed" not in indexes


# ---------------------------------------------------------------------- runs_page


def test_runs_page_walks_every_run_once_newest_first_with_its_steps(store):
    """Keyset pages of runs: newest first (ties by run id, runs without a time
    last), filtered by status and workflow, each run with its steps."""
    changes: list[Any] = []
    for i in range(23):
        at = None if i % 7 == 3 else 1000.0 + i // 2  # (ties, and a few untimed)
        changes.append(RunCreated((f"r{i:02d}", "w", f"wf{i % 2}", "{}", at, '{"a": []}')))
        changes.append(StepRecorded((f"r{i:02d}", "w", "a", "completed", str(i), f"t{i}")))
        if i % 3 == 0:
            changes.append(RunEnded((f"r{i:02d}", "w", "completed", 2000.0)))
    store.write(changes)
    runs = [c for c in changes if isinstance(c, RunCreated)]

    def key(c: Any) -> tuple[Any, ...]:
        return (c[4] is not None, c[4] or 0.0, c[0])

    def walk(**query: Any) -> list[str]:
        seen, cursor, pages = [], None, 0
        while True:
            page = runs_page(store, limit=4, cursor=cursor, **query)
            seen += [r.run_id for r in page.rows]
            pages += 1
            assert pages < 20
            if page.next_cursor is None:
                return seen
            cursor = page.next_cursor

    assert walk() == [c[0] for c in sorted(runs, key=key, reverse=True)]
    done = {f"r{i:02d}" for i in range(0, 23, 3)}
    assert walk(status="completed") == [
        c[0] for c in sorted(runs, key=key, reverse=True) if c[0] in done
    ]
    assert walk(workflow="wf1", status="running") == [
        c[0] for c in sorted(runs, key=key, reverse=True) if c[2] == "wf1" and c[0] not in done
    ]
    [first] = runs_page(store, limit=1).rows
    assert first == store.run(first.run_id)  # (steps and graph as the store reads them)
    assert first.steps == {"a": ("completed", "22")}
    assert runs_page(store, workflow="\x00").rows == []
    for bad in ("", "x", base64.urlsafe_b64encode(b'["runs",1e999,"a"]').decode()):
        with pytest.raises(ValueError, match="cursor"):
            runs_page(store, cursor=bad)


def test_runs_page_brings_each_running_runs_live_executions(store):
    """Its steps under way (issue 30, 17): a running run's pending and running
    executions, in submission order; none for an ended run, none that ended."""
    store.write(
        [
            RunCreated(("going", "w", "wf", "{}", 1000.0, '{"a": [], "b": ["a"], "c": ["a"]}')),
            RunCreated(("over", "w", "wf", "{}", 999.0, '{"a": []}')),
            RunEnded(("over", "w", "completed", 1001.0)),
        ]
    )
    put(
        store,
        [
            row("a-1", name="a", run_id="going"),
            pending("b-1", name="b", run_id="going", attempt=1, waiting_on="retry backoff"),
            active("c-1", name="c", run_id="going"),
            pending("other", name="a", run_id="over"),  # (a hand-made row: not read)
        ],
    )
    page = runs_page(store)
    assert [r.run_id for r in page.rows] == ["going", "over"]
    assert list(page.live) == ["going"]
    assert [(r.task_id, r.status) for r in page.live["going"]] == [
        ("b-1", TaskStatus.PENDING),
        ("c-1", TaskStatus.RUNNING),
    ]
    assert page.live["going"][0].waiting_on == "retry backoff"


def test_runs_page_walks_the_created_at_index(tmp_path):
    with SQLiteStore(str(tmp_path / "runs.db")):
        pass
    with closing(sqlite3.connect(tmp_path / "runs.db")) as conn:
        plan = " ".join(
            str(r[-1])
            for r in conn.execute(
                "EXPLAIN QUERY PLAN SELECT run_id FROM workflow_runs r"
                " WHERE r.created_at IS NOT NULL AND (r.created_at, r.run_id) < (?, ?)"
                " ORDER BY r.created_at DESC, r.run_id DESC LIMIT 51",
                (1.0, "x"),
            )
        )
    assert "workflow_runs_created" in plan
    assert "TEMP B-TREE" not in plan
