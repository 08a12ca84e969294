"""How long the dashboard's store reads take (`trioexec._store._browse`, issue 20)
on big stores: SQLite files of 100k and 1M executions, PostgreSQL at 100k.

    python benchmarks/browse_queries.py [--sqlite N ...] [--postgres N ...]
                                        [--deep PAGES] [--repeat R] [--quick]

Defaults: ``--sqlite 100000 1000000 --postgres 100000 --deep 1000 --repeat 5``;
``--quick``: 10k rows each, 50 pages deep (a smoke run). PostgreSQL is the
throwaway server of tests/pg_server.py (fsync on); ``--postgres`` with no size
skips it.

Each store is filled in SQL (one ``INSERT ... SELECT`` over a generated series,
not through an executor, for speed), as a day of work ending now: 1.5 % live
(pending, deferred on a promise/event/condition, active), 2 % failed, some
cancelled and timed out, the rest completed; 20 task names and one rare one
(1 row in 10,000); a third keyed (50 keys); workflow runs of 5 steps. SQLite
gets no ANALYZE (trioexec never runs one: the planner works without statistics,
as on a user's file); PostgreSQL gets VACUUM ANALYZE (what autovacuum does).

Then, for each filter and order: ``browse`` page 1 (limit 50), and the page
``--deep`` pages in, reached by walking the cursors (or the last page, if there
are fewer); each call timed ``--repeat`` times, the median kept. Also
``activity`` over the last hour (60 buckets of a minute), ``task_names`` and
``task_commands``. Every call counts the matches too (`Page.total`, up to
10,000). Prints a table per store, and one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trioexec import PostgresStore, SQLiteStore
from trioexec._store._browse import activity, browse, task_commands, task_names

HERE = Path(__file__).resolve()
DAY = 86_400.0
LIMIT = 50

#: The filters measured (each under every order).
FILTERS: list[tuple[str, dict[str, Any]]] = [
    ("none", {}),
    ("status=completed", {"status": "completed"}),
    ("status=failed", {"status": "failed"}),
    ("status=timed_out", {"status": "timed_out"}),
    ("status=pending", {"status": "pending"}),
    ("sub_status=deferred", {"sub_status": "deferred"}),
    ("name=task-3", {"name": "task-3"}),
    ("name=rare", {"name": "rare"}),
    ("name=absent", {"name": "absent"}),
    ("key=tenant-7", {"key": "tenant-7"}),
    ("waiting_on~promise", {"waiting_on": "promise"}),
    ("waiting_on~absent", {"waiting_on": "no such wait"}),
    ("run_id", {"run_id": "run-42"}),
    ("failed+task-3", {"status": "failed", "name": "task-3"}),
    ("pending+tenant-7+slot", {"status": "pending", "key": "tenant-7", "waiting_on": "slot"}),
]
ORDERS = ("newest", "oldest", "longest_waiting")


def _rows_sql(n: int, now: float, series: str, mark: Callable[[str], str]) -> str:
    """The INSERT of ``n`` executions over ``series`` (a table of ``i`` from 1 to n).
    ``mark`` casts an integer expression to text for concatenation."""
    at = f"({now - DAY} + i * {DAY / n})"
    m200, m50 = "(i % 200)", "(i % 50)"
    status = (
        f"CASE WHEN {m200} = 0 THEN 'pending' WHEN {m200} IN (1, 2) THEN 'running'"
        f" WHEN {m50} = 3 THEN 'failed' WHEN i % 500 = 4 THEN 'cancelled'"
        " WHEN i % 1000 = 5 THEN 'timed_out' ELSE 'completed' END"
    )
    live = f"{m200} IN (0, 1, 2)"
    return f"""
        INSERT INTO executions (task_id, name, run_id, status, sub_status, attempt,
            recovery_attempts, owner, version, submitted_at, started_at, finished_at,
            deferred_since, error, spec_id, args, key, priority, waiting_on)
        SELECT 'task-' || {mark("i")},
            CASE WHEN i % 10000 = 7 THEN 'rare' ELSE 'task-' || {mark("(i / 7) % 20")} END,
            CASE WHEN i % 100 BETWEEN 10 AND 14 THEN 'run-' || {mark("i / 100")} END,
            {status},
            CASE WHEN {m200} = 1 THEN 'deferred' WHEN {m200} = 2 THEN 'active' END,
            1, 0, CASE WHEN {live} THEN 'owner-A' END, 1,
            {at}, CASE WHEN {m200} <> 0 THEN {at} + 0.1 END,
            CASE WHEN NOT {live} THEN {at} + 0.5 END,
            CASE WHEN {m200} = 1 THEN {at} + 0.2 END,
            CASE WHEN {m50} = 3 THEN 'boom' END, 'spec', '[1, 2]',
            CASE WHEN i % 3 = 0 THEN 'tenant-' || {mark("(i / 7) % 50")} END, 0,
            CASE WHEN {m200} = 0 THEN (CASE WHEN i % 400 = 0 THEN 'slot'
                    ELSE 'key concurrency tenant-' || {mark("(i / 7) % 50")} END)
                 WHEN {m200} = 1 THEN (CASE i % 3 WHEN 0 THEN 'promise p-' || {mark("i")}
                                            WHEN 1 THEN 'event'
                                            ELSE 'condition file-ready' END) END
        FROM {series}
    """


def fill_sqlite(path: str, n: int, now: float) -> None:
    SQLiteStore(path).close()  # (creates and migrates the file)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < ?)"
            + _rows_sql(n, now, "s", lambda e: f"({e})"),
            (n,),
        )
        conn.execute("INSERT INTO owners (owner, lease_expires_at) VALUES ('owner-A', ?)", (now,))


def fill_postgres(url: str, schema: str, n: int, now: float) -> None:
    import psycopg

    PostgresStore(url, schema=schema).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        sql = _rows_sql(n, now, "generate_series(1, <n>) AS s(i)", lambda e: f"({e})::text")
        conn.execute(sql.replace("%", "%%").replace("<n>", "%s").encode(), (n,))
        conn.execute("INSERT INTO owners (owner, lease_expires_at) VALUES ('owner-A', %s)", (now,))
        conn.execute("VACUUM ANALYZE executions")


def timed(call: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The median milliseconds of ``repeat`` calls, and the last answer."""
    times = []
    answer = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        answer = call()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), answer


def measure(
    store: Any, label: str, n: int, now: float, deep: int, repeat: int
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def emit(**fields: Any) -> None:
        fields = {"store": label, "rows": n, **fields}
        out.append(fields)
        print(json.dumps(fields), flush=True)

    for order in ORDERS:
        for fname, query in FILTERS:

            def page_after(cursor: str | None, order: str = order, query: Any = query) -> Any:
                return browse(store, order=order, limit=LIMIT, cursor=cursor, **query)

            ms1, page = timed(lambda: page_after(None), repeat)
            # Walk the cursors to the deep page (each step a real call).
            cursor, depth, walked = page.next_cursor, 1, time.perf_counter()
            worst = 0.0
            while cursor is not None and depth < deep:
                t0 = time.perf_counter()
                nxt = page_after(cursor)
                worst = max(worst, (time.perf_counter() - t0) * 1000)
                depth += 1
                if nxt.next_cursor is None:
                    break
                cursor = nxt.next_cursor
            walk_s = time.perf_counter() - walked
            if depth > 1:
                msd, _ = timed(lambda at=cursor: page_after(at), repeat)
            else:
                msd = ms1
            emit(
                call="browse",
                order=order,
                filter=fname,
                total=page.total,
                page1_ms=round(ms1, 2),
                deep_page=depth,
                deep_ms=round(msd, 2),
                walk_worst_ms=round(worst, 2),
                walk_s=round(walk_s, 2),
            )
    ms, buckets = timed(lambda: activity(store, since=now - 3600, bucket=60.0, now=now), repeat)
    emit(
        call="activity",
        filter="last hour, 60 buckets",
        page1_ms=round(ms, 2),
        total=sum(b.completed + b.failed + b.cancelled + b.timed_out for b in buckets),
    )
    ms, names = timed(lambda: task_names(store), repeat)
    emit(call="task_names", filter="", page1_ms=round(ms, 2), total=len(names))
    ms, commands = timed(lambda: task_commands(store, "task-1"), repeat)
    emit(call="task_commands", filter="", page1_ms=round(ms, 2), total=len(commands))
    return out


def table(results: list[dict[str, Any]]) -> None:
    if not results:
        return
    head = results[0]
    print(f"\n{head['store']}, {head['rows']:,} executions (ms, median; limit {LIMIT})")
    print(
        f"{'call':<9} {'order':<16} {'filter':<22} {'total':>7} {'page 1':>8}"
        f" {'deep page':>10} {'ms':>8} {'walk max':>9}"
    )
    for r in results:
        total = "-" if r.get("total") is None else f"{r['total']:,}"
        deep = "" if r.get("deep_ms") is None else f"{r['deep_ms']:.2f}"
        worst = "" if r.get("walk_worst_ms") is None else f"{r['walk_worst_ms']:.2f}"
        print(
            f"{r['call']:<9.9} {r.get('order', ''):<16} {r['filter']:<22.22} {total:>7}"
            f" {r['page1_ms']:>8.2f} {r.get('deep_page', ''):>10} {deep:>8} {worst:>9}"
        )
    over = [r for r in results if max(r["page1_ms"], r.get("deep_ms", 0)) >= 50]
    print(f"calls at or over 50 ms: {len(over)}")


def postgres_server() -> Any:
    """tests/pg_server.py's throwaway server (fsync on)."""
    path = HERE.parent.parent / "tests" / "pg_server.py"
    spec = importlib.util.spec_from_file_location("trioexec_bench_pg_server", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.postgres_server(durable=True)


@contextmanager
def sqlite_store(n: int, now: float) -> Iterator[Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "browse.db")
        t0 = time.perf_counter()
        fill_sqlite(path, n, now)
        print(
            f"# sqlite: {n:,} rows written in {time.perf_counter() - t0:.1f} s "
            f"({os.path.getsize(path) / 1e6:.0f} MB)",
            flush=True,
        )
        with SQLiteStore(path, read_only=True) as store:
            yield store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sqlite", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--postgres", type=int, nargs="*", default=[100_000])
    parser.add_argument("--deep", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.sqlite, args.postgres, args.deep = [10_000], [10_000], 50
    now = float(int(time.time()))
    summary: list[list[dict[str, Any]]] = []
    for n in args.sqlite:
        with sqlite_store(n, now) as store:
            summary.append(measure(store, "sqlite", n, now, args.deep, args.repeat))
    if args.postgres:
        with postgres_server() as url:
            for n in args.postgres:
                schema = f"browse_{n}"
                t0 = time.perf_counter()
                fill_postgres(url, schema, n, now)
                print(
                    f"# postgres: {n:,} rows written in {time.perf_counter() - t0:.1f} s",
                    flush=True,
                )
                with PostgresStore(url, schema=schema, read_only=True) as store:
                    summary.append(measure(store, "postgres", n, now, args.deep, args.repeat))
    for results in summary:
        table(results)
    worst = max((max(r["page1_ms"], r.get("deep_ms", 0)) for s in summary for r in s), default=0)
    print(f"\nslowest call: {worst:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
