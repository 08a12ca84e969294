"""Every ``trioexec`` command takes a PostgreSQL URL where it takes a database path
(issue 16): the database of test_cli.py built on a throwaway PostgreSQL server, and
the real console script pointed at its URL."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from test_cli import (
    AppDb,
    approval_and_its_waiter,
    build_app_db,
    build_keyed_db,
    cli,
    keyed_status_checks,
    ok,
    one_line_error,
    plain,
)

import trioexec
from trioexec.durable import DurableStore, PromiseState, TaskState


@pytest.fixture
def pg_app(pg_database: str) -> AppDb:
    return build_app_db(pg_database)


def store_view(url: str, fn: Any) -> Any:
    with trioexec.open_store(url) as store:
        return fn(store)


def durable_view(url: str, fn: Any) -> Any:
    import trio

    async def main() -> Any:
        with DurableStore(url) as ds:
            return await fn(ds)

    return trio.run(main)


def test_status_of_a_url_shows_and_filters_by_key(pg_database: str, tmp_path: Path) -> None:
    build_keyed_db(pg_database)
    keyed_status_checks(pg_database, tmp_path)


def test_status_and_runs_of_a_url_match_the_store(pg_app: AppDb, tmp_path: Path) -> None:
    url = str(pg_app.path)
    got = json.loads(ok(cli("status", url, "--json", cwd=tmp_path)))
    assert got == plain(store_view(url, lambda s: s.executions()))
    assert {r["task_id"] for r in got} >= {"approval-old", "webhook-new", "crunch-1", "queued-1"}
    older = json.loads(ok(cli("status", url, "--older-than", "10m", "--json", cwd=tmp_path)))
    assert [r["task_id"] for r in older] == ["approval-old"]
    table = ok(cli("status", url, cwd=tmp_path))
    assert re.search(r"approval-old\s+approval\s+running\s+deferred", table)

    runs = json.loads(ok(cli("runs", url, "--json", cwd=tmp_path)))
    assert runs == plain(store_view(url, lambda s: s.runs()))
    assert {r["run_id"]: r["status"] for r in runs} == {"run-ok": "completed", "run-bad": "failed"}


def test_watch_once_on_a_url(pg_app: AppDb, tmp_path: Path) -> None:
    out = ok(cli("watch", str(pg_app.path), "--once", cwd=tmp_path))
    for label, value in [("active", "1"), ("deferred", "2"), ("pending", "1")]:
        assert re.search(rf"│ {re.escape(label)}\s+{re.escape(value)}\s+│", out), label
    listing = out.split("deferred, longest first:")[1]
    assert listing.index("approval-old") < listing.index("webhook-new")


def test_promises_tasks_and_check_on_a_url(pg_app: AppDb, tmp_path: Path) -> None:
    url = str(pg_app.path)
    everything = json.loads(ok(cli("promises", url, "--json", cwd=tmp_path)))
    assert [p["id"] for p in everything] == ["approval-7", "done-1", "job-1", "job-2", "report-3"]
    out = ok(cli("promises", "resolve", url, "approval-7", "--data", '{"ok": true}', cwd=tmp_path))
    assert out.strip() == "promise approval-7: resolved"
    promise, waiter = durable_view(url, approval_and_its_waiter)
    assert promise.state is PromiseState.RESOLVED
    assert json.loads(promise.data) == {"ok": True}
    assert waiter.state is TaskState.PENDING
    pending = json.loads(ok(cli("tasks", url, "--state", "pending", "--json", cwd=tmp_path)))
    assert [t["id"] for t in pending] == ["job-1", "job-2", "report-3"]
    assert ok(cli("check", url, cwd=tmp_path)).strip() == f"{url}: all invariants hold"


def test_a_server_that_is_not_there_is_one_line_without_the_password(tmp_path: Path) -> None:
    url = "postgresql://someone:s3cret@127.0.0.1:1/nothing"
    line = one_line_error(cli("status", url, cwd=tmp_path), code=1)
    assert "s3cret" not in line
    assert "postgresql://someone:***@127.0.0.1:1/nothing" in line
    assert "cannot open" in line


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://alice:t0p%secret@127.0.0.1:1/db",
        "postgresql://alice:t0psecret@[::1/db",
        "postgresql+psycopg://alice:t0psecret@127.0.0.1:1/db",
    ],
)
def test_a_mistyped_url_is_one_line_without_the_password(url: str, tmp_path: Path) -> None:
    proc = cli("status", url, cwd=tmp_path)
    line = one_line_error(proc, code=1)
    assert "alice:***@" in line
    assert "t0p" not in proc.stderr + proc.stdout


def test_status_of_a_url_with_a_password_does_not_show_it(pg_database: str, tmp_path: Path) -> None:
    build_keyed_db(pg_database)
    url = pg_database.replace("postgres@", "postgres:t0psecret@", 1)  # (trusted: ignored)
    for command in (["status", url], ["watch", url, "--once"], ["check", url]):
        out = ok(cli(*command, cwd=tmp_path))
        assert "t0psecret" not in out
        assert "postgres:***@" in out


def test_a_url_of_another_kind_is_one_line(tmp_path: Path) -> None:
    line = one_line_error(cli("status", "mysql://db/app", cwd=tmp_path), code=1)
    assert "unknown store URL scheme 'mysql'" in line


def test_demo_records_into_a_url(pg_database: str, tmp_path: Path) -> None:
    out = ok(cli("demo", "--quick", "--db", pg_database, "--tasks", "4", cwd=tmp_path, timeout=120))
    # The 4 tasks asked for, and the demo's own 7 (file waiters, the refund
    # workflow's 4 steps, the retried charge).
    assert f"Recording to {pg_database}" in " ".join(out.split())
    assert "Store: 11 completed, 0 other" in " ".join(out.split())
    counts = store_view(pg_database, lambda s: s.counts())
    assert counts[trioexec.TaskStatus.COMPLETED] == 11
    assert sum(counts.values()) == 11


def test_the_demo_on_a_url_never_prints_its_password(pg_database: str, tmp_path: Path) -> None:
    # (the test server trusts every connection: a password in the URL is accepted)
    url = pg_database.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")
    assert "s3cret" in url
    done = cli("demo", "--quick", "--tasks", "8", "--slots", "2", "--db", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "s3cret" not in done.stdout + done.stderr
    assert "postgresql://postgres:***@" in done.stdout
    assert "Store: 15 completed" in " ".join(done.stdout.split())
