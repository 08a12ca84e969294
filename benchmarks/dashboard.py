"""How long each page of ``trioexec dashboard`` takes on a big SQLite file
(issue 20: every page under 200 ms at 100,000 executions).

    python benchmarks/dashboard.py [--rows N] [--requests R] [--db PATH] [--json PATH]

Builds a SQLite file of N executions (default 100,000; ``--rows 1000000`` for a
million) in seconds: the schema is made by opening a `trioexec.SQLiteStore` on
it, a real executor writes a few workflow runs (completed, failed, and one
cancelled while a step waited on its durable promise), `DurableStore` writes
promises (pending and resolved) and a pause command is recorded; then the N
executions go in by one bulk SQL insert in the store's schema: completed
mostly, failed ones with a traceback, cancelled, timed out, pending (on a slot,
paused), running (active, and deferred on a promise, a condition, an event or a
rate limit), over the last 24 hours, under two dozen names, a third of them
with an admission key. ``--db PATH`` keeps the file (and reuses it if it is
there with as many executions).

Then it times every page of the app in this process, as a browser would ask for
it (``httpx.AsyncClient`` over ``httpx.ASGITransport``, on Trio, the app from
``trioexec.web.create_app``): one request first (the cold one, shown apart),
then R more (default 20), and prints each page's median and max, the size of
the page, and the machine. ``--json PATH`` writes the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

import trioexec
from trioexec import Context, TaskHandle, Workflow
from trioexec.durable import DurableStore

TARGET_MS = 200.0
DAY = 86400.0
NAMES = [
    "resize-image",
    "send-email",
    "charge-card",
    "refund-card",
    "sync-crm",
    "import-report",
    "export-invoices",
    "webhook-github",
    "webhook-stripe",
    "thumbnail",
    "transcode-video",
    "geocode",
    "score-lead",
    "notify-slack",
    "nightly-export",
    "reindex-search",
    "fetch-feed",
    "scan-upload",
    "ocr-document",
    "translate",
    "compress-logs",
    "rotate-keys",
    "backup-db",
    "warm-cache",
]
# Each execution's fate, with its share of the rows.
FATES = [
    ("completed", 0.87),
    ("failed", 0.04),
    ("cancelled", 0.02),
    ("timed_out", 0.01),
    ("pending", 0.02),
    ("active", 0.01),
    ("deferred", 0.03),
]
TRACEBACK = """Traceback (most recent call last):
  File "/srv/app/tasks.py", line 88, in {name}
    response = await client.post(url, json=payload)
  File "/srv/app/http.py", line 41, in post
    raise ConnectionError(f"{{url}}: 503 Service Unavailable")
ConnectionError: https://api.example.com/v1/{name}: 503 Service Unavailable
"""
OWNER = "bench-host:4242:ab12cd34"
RUNS = 6  # workflow runs written by a real executor
PROMISES = 40


# ------------------------------------------------------------------------ build


@trioexec.task(id="fetch-order")
async def fetch_order(ctx: Context) -> None:
    ctx["order"] = {"id": "A-1042", "amount": 120.0}


def refund(ds: DurableStore, fail: bool) -> Workflow:
    @trioexec.task(id="approval", dependencies=["fetch-order"])
    async def approval(ctx: Context, handle: TaskHandle) -> None:
        await handle.defer_until(ds.promises.settled(ctx["promise"], poll=0.05))
        ctx["approved"] = True

    @trioexec.task(id="pay", dependencies=["approval"])
    async def pay(ctx: Context) -> None:
        if fail:
            raise ConnectionError("payments API: 503 Service Unavailable")
        ctx["paid"] = ctx["order"]["amount"]

    @trioexec.task(id="notify", dependencies=["pay"])
    async def notify(ctx: Context) -> None:
        ctx["notified"] = True

    return Workflow("refund", [fetch_order, approval, pay, notify])


async def write_runs_and_promises(db: str) -> None:
    """Workflow runs by a real executor, promises, a pause: what a live system has."""
    with trioexec.open_store(db) as store, DurableStore(store) as ds:
        for i in range(PROMISES):
            await ds.promises.create(
                f"approval-{i:03d}",
                7 * DAY,
                data={"order": f"A-{1000 + i}"},
                tags={"kind": "refund"},
            )
        async with trioexec.open_executor(
            store=store, shutdown_policy=trioexec.ShutdownPolicy.CANCEL
        ) as ex:
            runs = []
            for i in range(RUNS):
                run = await ex.start_workflow(
                    refund(ds, fail=i == RUNS - 2),
                    {"promise": f"approval-{i:03d}"},
                    run_id=f"refund-{i:03d}",
                )
                runs.append(run)
            # All but the last are approved; the last one's approval step is left
            # deferred on its promise and is cancelled when the executor closes.
            for i in range(RUNS - 1):
                await ds.promises.resolve(f"approval-{i:03d}", data={"approved": True})
            for run in runs[:-1]:
                await run.wait()
            with trio.fail_after(30):
                while not store.executions(run_id=runs[-1].run_id, sub_status="deferred"):
                    await ex.flush()
                    await trio.sleep(0.01)
        for i in range(RUNS, RUNS + PROMISES // 4):
            await ds.promises.resolve(f"approval-{i:03d}", data={"approved": i % 2 == 0})
        store.command("pause", name="nightly-export", who="bench@example")


def rows(n: int, now: float, seed: int) -> Iterator[dict[str, Any]]:
    """The N executions, oldest submission first, over the last day."""
    rng = random.Random(seed)
    fates = [f for f, _ in FATES]
    weights = [w for _, w in FATES]
    for i in range(n):
        name = NAMES[rng.randrange(len(NAMES))]
        fate = rng.choices(fates, weights)[0]
        submitted = now - DAY + DAY * i / n
        row: dict[str, Any] = {
            "task_id": f"bench-{i:07d}",
            "name": name,
            "status": fate,
            "attempt": 1,
            "version": 2,
            "submitted_at": submitted,
            "spec_id": name,
            "args": json.dumps([i, f"item-{i}"]),
            "key": f"tenant-{rng.randrange(50)}" if rng.random() < 0.33 else None,
        }
        if fate in ("active", "deferred"):
            row.update(status="running", sub_status=fate, owner=OWNER, started_at=submitted + 0.2)
            if fate == "deferred":
                since = rng.uniform(now - 2 * 3600, now)
                row["deferred_since"] = max(since, submitted + 0.3)
                row["waiting_on"] = rng.choice(
                    [
                        f"promise approval-{i}",
                        f"condition inbox/report-{i % 97}.csv exists",
                        "event",
                        f"rate limit tenant-{i % 50}",
                    ]
                )
        elif fate == "pending":
            row.update(attempt=0, version=1, waiting_on=rng.choice(["slot", "slot", "paused"]))
        else:
            started = submitted + rng.uniform(0.0, 2.0)
            row.update(started_at=started, finished_at=started + rng.uniform(0.01, 5.0))
            if fate in ("failed", "timed_out"):
                row["attempt"] = rng.choice([1, 2, 3])
                row["error"] = (
                    f"ConnectionError('https://api.example.com/v1/{name}: 503 Service Unavailable')"
                    if fate == "failed"
                    else "TooSlowError()"
                )
                row["traceback"] = TRACEBACK.format(name=name.replace("-", "_"))
            elif fate == "cancelled":
                row["error"] = "cancelled by ops@example pid 4242"
        yield row


def bulk_insert(db: str, n: int, seed: int) -> float:
    """Insert the N executions in one transaction; return the seconds it took."""
    started = time.perf_counter()
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(executions)")]
        known = [c for c in columns if c in {*next(rows(1, 0.0, seed)), *OPTIONAL}]
        sql = f"INSERT INTO executions ({', '.join(known)}) VALUES ({', '.join('?' * len(known))})"
        conn.execute("BEGIN IMMEDIATE")
        batch: list[tuple[Any, ...]] = []
        for row in rows(n, time.time(), seed):
            batch.append(tuple(row.get(c) for c in known))
            if len(batch) == 20_000:
                conn.executemany(sql, batch)
                batch.clear()
        conn.executemany(sql, batch)
        conn.execute("COMMIT")
    finally:
        conn.close()
    return time.perf_counter() - started


OPTIONAL = {
    "sub_status",
    "owner",
    "started_at",
    "finished_at",
    "deferred_since",
    "waiting_on",
    "error",
    "traceback",
}


def executions_in(db: str) -> int:
    with sqlite3.connect(db) as conn:
        try:
            return int(conn.execute("SELECT count(*) FROM executions").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def build(db: str, n: int, seed: int) -> dict[str, float]:
    """The database (unless ``db`` has N bench executions already); what took how long."""
    if Path(db).exists() and executions_in(db) >= n:
        with sqlite3.connect(db) as conn:
            bench = conn.execute(
                "SELECT count(*) FROM executions WHERE task_id LIKE 'bench-%'"
            ).fetchone()[0]
        if bench == n:
            return {}
        raise SystemExit(f"{db}: has {bench} bench executions, not {n}; give another --db")
    if Path(db).exists():
        raise SystemExit(f"{db}: exists and is not this benchmark's database; give another --db")
    trioexec.SQLiteStore(db).close()  # the schema, as this trioexec makes it
    insert = bulk_insert(db, n, seed)  # (first: the newest rows are the real ones)
    started = time.perf_counter()
    trio.run(write_runs_and_promises, db)
    return {"insert_s": insert, "runs_s": time.perf_counter() - started}


# ----------------------------------------------------------------------- timing


def deep_cursor(db: str, pages: int) -> str | None:
    """The cursor of page ``pages + 1`` of the tasks list (newest first)."""
    from trioexec._store._browse import browse

    cursor = None
    with trioexec.open_store(db, read_only=True) as store:
        for _ in range(pages):
            page = browse(store, cursor=cursor, limit=50)
            cursor = page.next_cursor
            if cursor is None:
                break
    return cursor


def pages_to_time(db: str) -> list[tuple[str, str]]:
    """(what, path): every page of the app, with the filters a person uses."""
    with sqlite3.connect(db) as conn:
        failed = conn.execute(
            "SELECT task_id FROM executions WHERE status = 'failed' ORDER BY task_id DESC LIMIT 1"
        ).fetchone()[0]
        deferred = conn.execute(
            "SELECT task_id FROM executions WHERE sub_status = 'deferred' LIMIT 1"
        ).fetchone()[0]
        run_id = conn.execute(
            "SELECT run_id FROM workflow_runs ORDER BY created_at DESC LIMIT 1"
        ).fetchone()[0]
    page_1000 = deep_cursor(db, 999)
    paths = [
        ("overview", "/"),
        ("tasks", "/tasks"),
        ("tasks: failed", "/tasks?status=failed"),
        ("tasks: deferred, longest waiting", "/tasks?sub_status=deferred&order=longest_waiting"),
        ("tasks: by name", "/tasks?name=charge-card"),
        ("tasks: by key", "/tasks?key=tenant-7"),
        ("tasks: waiting_on promise", "/tasks?waiting_on=promise"),
        ("tasks: oldest first", "/tasks?order=oldest"),
    ]
    if page_1000 is not None:
        paths.append(("tasks: page 1000", "/tasks?cursor=" + _quote(page_1000)))
    paths += [
        ("task (failed)", f"/tasks/{failed}"),
        ("task (deferred)", f"/tasks/{deferred}"),
        ("runs", "/runs"),
        ("run graph", f"/runs/{run_id}"),
        ("promises", "/promises"),
        ("failed", "/failed"),
        ("control", "/control"),
    ]
    return paths


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


async def time_pages(db: str, paths: list[tuple[str, str]], requests: int) -> list[dict[str, Any]]:
    import httpx

    from trioexec.web import create_app

    app = create_app(db, token="bench-token", read_only=False)
    results = []
    transport = httpx.ASGITransport(app=app)
    # (ASGITransport runs no lifespan; the app opens its store in its lifespan.)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client,
    ):
        for what, path in paths:
            times = []
            size = 0
            for _ in range(requests + 1):
                started = time.perf_counter()
                response = await client.get(path)
                times.append((time.perf_counter() - started) * 1000)
                if response.status_code != 200:
                    raise SystemExit(f"GET {path}: {response.status_code}\n{response.text[:500]}")
                size = len(response.content)
            cold, warm = times[0], times[1:]
            results.append(
                {
                    "page": what,
                    "path": path if len(path) < 60 else path[:57] + "...",
                    "cold_ms": round(cold, 2),
                    "median_ms": round(statistics.median(warm), 2),
                    "max_ms": round(max(warm), 2),
                    "bytes": size,
                }
            )
    return results


def machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        found = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
        if found:
            model = found.group(1).strip()
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="executions (default 100000)")
    parser.add_argument("--requests", type=int, default=20, help="timed requests per page")
    parser.add_argument("--db", help="keep the database here (reused if it is there)")
    parser.add_argument("--json", dest="json_path", help="also write the results as JSON")
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args(argv)
    if args.rows < 1 or args.requests < 1:
        parser.error(f"--rows and --requests must be >= 1, got {args.rows}, {args.requests}")
    with tempfile.TemporaryDirectory(prefix="trioexec-bench-dashboard-") as tmp:
        db = args.db or os.path.join(tmp, "dashboard.db")
        built = build(db, args.rows, args.seed)
        paths = pages_to_time(db)
        results = trio.run(time_pages, db, paths, args.requests)
        size = os.path.getsize(db)
    report = {
        "rows": args.rows,
        "requests": args.requests,
        "db_bytes": size,
        "build": {k: round(v, 2) for k, v in built.items()},
        "machine": machine(),
        "target_ms": TARGET_MS,
        "pages": results,
    }
    show(report)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=2) + "\n")


def show(report: dict[str, Any]) -> None:
    m = report["machine"]
    build = report["build"]
    built = (
        f"bulk insert {build['insert_s']:.1f} s, runs and promises {build['runs_s']:.1f} s"
        if build
        else "reused"
    )
    print(
        f"{report['rows']:,} executions, {report['db_bytes'] / 1e6:.0f} MB ({built});"
        f" {m['cpus']} CPUs ({m['cpu']}), Python {m['python']}, SQLite {m['sqlite']}"
    )
    print(f"{report['requests']} requests per page after one cold one; times in ms\n")
    width = max(len(r["page"]) for r in report["pages"])
    print(f"{'page':<{width}}  {'cold':>8}  {'median':>8}  {'max':>8}  {'KB':>6}")
    slow = []
    for r in report["pages"]:
        print(
            f"{r['page']:<{width}}  {r['cold_ms']:>8.1f}  {r['median_ms']:>8.1f}"
            f"  {r['max_ms']:>8.1f}  {r['bytes'] / 1024:>6.1f}"
        )
        if r["median_ms"] > report["target_ms"]:
            slow.append(r["page"])
    print()
    target = report["target_ms"]
    if slow:
        print(f"over {target:.0f} ms (median): {', '.join(slow)}")
    else:
        print(f"every page's median is under {target:.0f} ms")
    peaks = [r["page"] for r in report["pages"] if r["max_ms"] > target]
    if peaks:
        print(f"max over {target:.0f} ms: {', '.join(peaks)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
