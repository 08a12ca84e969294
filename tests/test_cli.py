"""The ``trioexec`` command, end to end: the real console script in a subprocess,
against real database files built with the library, and the live views (``watch``,
``demo``) under a pseudo-terminal (pexpect), checking what a person would see.

Every database is built in ``tmp_path`` by `build_app_db`: an executor with a
completed and a failed task and two workflow runs (one completed, one failed), rows
written directly to leave executions RUNNING (two deferred: one for an hour, one for
seconds; one active) and one PENDING, and durable promises and tasks (one task
suspended on a pending promise). Commands run with ``cwd=tmp_path`` and a relative
``app.db``, as a person would type them.

Rich renders for the width it is given: in a pipe that is ``COLUMNS`` (set wide here,
so that what is checked is the content, not the wrapping), in a pty its size.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pexpect
import pytest
import trio

import trioexec
from trioexec import Context, SQLiteStore, SubStatus, TaskStatus, Workflow, task
from trioexec._changes import Finish, Start, Sub, submitted
from trioexec.durable import DurableStore, PromiseState, TaskState

_script = shutil.which("trioexec", path=os.path.dirname(sys.executable))
TRIOEXEC = [_script] if _script else [sys.executable, "-m", "trioexec"]

ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07]*\x07|[()][0-9A-Za-z])")
OLD = 3600.0  # how long "approval-old" has been deferred
RECENT = 5.0  # how long "webhook-new" has been deferred


def interruptible() -> None:
    """A child's ``preexec_fn``: Ctrl-C (SIGINT) acts as it does in a shell's
    foreground. A test run started in the background (``cmd &`` in a script)
    inherits SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli_env(columns: int | None = 200) -> dict[str, str]:
    """The environment, minus what would change how rich renders; COLUMNS as given
    (None: the terminal's size decides)."""
    env = dict(os.environ)
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(name, None)
    for name in ("COLUMNS", "LINES"):
        env.pop(name, None)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return env


def cli(
    *args: str, cwd: Path, columns: int = 200, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TRIOEXEC, *args],
        cwd=cwd,
        env=cli_env(columns),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    """The stdout of a command that must have succeeded quietly."""
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return proc.stdout


def one_line_error(proc: subprocess.CompletedProcess[str], code: int | None = None) -> str:
    """The single stderr line of a command that must have failed cleanly."""
    assert proc.returncode != 0
    if code is not None:
        assert proc.returncode == code
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def squash(text: str) -> str:
    """What a person reads: no escape codes, whitespace (and wrapping) collapsed."""
    return " ".join(ANSI.sub("", text).split())


def plain(value: Any) -> Any:
    """A record as the CLI's --json has it."""
    if attrs.has(type(value)):
        return {k: plain(v) for k, v in attrs.asdict(value, recurse=False).items()}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return getattr(value, "value", value)


def with_durable(path: Path, fn: Any) -> Any:
    async def main() -> Any:
        with DurableStore(path) as ds:
            return await fn(ds)

    return trio.run(main)


def executions(path: Path, **filters: Any) -> list[trioexec.ExecutionRecord]:
    with SQLiteStore(path) as store:
        return store.executions(**filters)


def sql(path: Path, statement: str, *params: object) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(statement, params)
        conn.commit()


# ---------------------------------------------------------------------- the database


@attrs.frozen
class AppDb:
    path: Path | str  # a SQLite file, or a PostgreSQL URL (test_cli_postgres.py)
    good: str  # task id of the completed "send-email"
    bad: str  # task id of the failed "charge-card"


def build_app_db(path: Path | str) -> AppDb:
    """The database described above, at ``path`` (a SQLite file, or a PostgreSQL
    database's URL)."""
    ids: dict[str, str] = {}

    @task(id="fetch")
    async def fetch(context: Context) -> None:
        context["rows"] = 3

    @task(id="load", dependencies=["fetch"])
    async def load(context: Context) -> None:
        await trio.lowlevel.checkpoint()

    @task(id="explode", dependencies=["fetch"])
    async def explode(context: Context) -> None:
        raise ValueError("disk full")

    async def send_email() -> str:
        return "sent"

    async def charge_card() -> None:
        raise ValueError("card declined")

    async def main() -> None:
        with trioexec.open_store(path) as store:
            async with trioexec.open_executor(store=store) as ex:
                good = await ex.submit(send_email, name="send-email")
                bad = await ex.submit(charge_card, name="charge-card")
                assert (await good.wait()).ok
                assert not (await bad.wait()).ok
                ids["good"], ids["bad"] = good.task_id, bad.task_id
                done = await ex.run_workflow(
                    Workflow("etl", [fetch, load]), context={"job": 1}, run_id="run-ok"
                )
                assert done.ok
                failed = await ex.run_workflow(
                    Workflow("etl-broken", [fetch, explode]), run_id="run-bad"
                )
                assert not failed.ok
            # Another executor's executions, still live: as an executor in the middle
            # of its work leaves them for another process to look at.
            now = time.time()
            old, new = now - OLD, now - RECENT
            store.write(
                [
                    submitted("approval-old", 1, "approval", None, None, None, "w2", old),
                    Start(("approval-old", 1, 1, old)),
                    Sub(("approval-old", 1, SubStatus.DEFERRED, old, None)),
                    submitted("webhook-new", 1, "webhook", None, None, None, "w2", new),
                    Start(("webhook-new", 1, 1, new)),
                    Sub(("webhook-new", 1, SubStatus.DEFERRED, new, None)),
                    submitted("crunch-1", 1, "crunch", None, None, None, "w2", new),
                    Start(("crunch-1", 1, 1, new)),
                    submitted("queued-1", 1, "queued", None, None, None, "w2", new),
                ]
            )
        with DurableStore(path) as ds:
            await ds.promises.create("approval-7", 3600, data={"who": "bob"}, tags={"team": "ops"})
            await ds.promises.create("done-1", 3600)
            await ds.promises.resolve("done-1", data=42)
            job = await ds.tasks.create("job-1", pid="w1", ttl=60, timeout=3600, target="mailer")
            assert await ds.tasks.suspend("job-1", job.version, ["approval-7"]) == "suspended"
            await ds.promises.create("job-2", 3600, target="mailer")
            await ds.promises.create("report-3", 3600, target="reporter")

    trio.run(main)
    return AppDb(path, ids["good"], ids["bad"])


@pytest.fixture
def app(tmp_path: Path) -> AppDb:
    return build_app_db(tmp_path / "app.db")


# ---------------------------------------------------------------------- status


def test_help_lists_every_command(tmp_path: Path) -> None:
    out = ok(cli("--help", cwd=tmp_path))
    for command in ("demo", "status", "watch", "runs", "promises", "tasks", "check"):
        assert re.search(rf"^\s+{command}\s", out, re.MULTILINE), command
    assert ok(cli("--version", cwd=tmp_path)).strip() == f"trioexec, version {trioexec.__version__}"


def test_status_shows_counts_and_every_execution(app: AppDb) -> None:
    out = ok(cli("status", "app.db", cwd=app.path.parent))
    first, *table = out.splitlines()
    assert first == "app.db: 1 pending, 3 running, 4 completed, 2 failed"
    rows = {line.split()[0]: line.split() for line in table[1:] if line.strip()}
    assert set(rows) == {r.task_id for r in executions(app.path)}
    assert rows[app.good][1:3] == ["send-email", "completed"]
    assert rows[app.bad][1:3] == ["charge-card", "failed"]
    assert "ValueError('card declined')" in out
    assert rows["approval-old"][1:] == ["approval", "running", "deferred", "1", "1.0h"]
    assert rows["webhook-new"][1:5] == ["webhook", "running", "deferred", "1"]
    assert re.fullmatch(r"\d+\.\ds", rows["webhook-new"][5])
    assert rows["crunch-1"][1:] == ["crunch", "running", "active", "1"]
    assert rows["queued-1"][1:] == ["queued", "pending", "0", "slot"]  # (waiting on)


def test_status_json_matches_the_store(app: AppDb) -> None:
    got = json.loads(ok(cli("status", "app.db", "--json", cwd=app.path.parent)))
    assert got == plain(executions(app.path))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--status", "failed"], lambda r: r.status is TaskStatus.FAILED),
        (["--sub-status", "deferred"], lambda r: r.sub_status is SubStatus.DEFERRED),
        (
            ["--status", "running", "--sub-status", "active"],
            lambda r: r.status is TaskStatus.RUNNING and r.sub_status is SubStatus.ACTIVE,
        ),
        (["--older-than", "10m"], lambda r: r.task_id == "approval-old"),
        (["--older-than", "90"], lambda r: r.task_id == "approval-old"),
        (["--older-than", "2h"], lambda r: False),
    ],
    ids=["failed", "deferred", "running-active", "older-10m", "older-90s", "older-2h"],
)
def test_status_filters(app: AppDb, args: list[str], expected: Any) -> None:
    got = json.loads(ok(cli("status", "app.db", *args, "--json", cwd=app.path.parent)))
    want = [r.task_id for r in executions(app.path) if expected(r)]
    assert [r["task_id"] for r in got] == want
    assert want or args == ["--older-than", "2h"]


def build_keyed_db(path: Path | str) -> None:
    """Executions with admission keys (and one without), at ``path`` (a SQLite file,
    or a PostgreSQL database's URL)."""
    now = time.time()
    with trioexec.open_store(path) as store:
        store.write(
            [
                submitted("fetch-a1", 1, "fetch", None, None, None, "w", now, "api.example", 5),
                submitted("fetch-b1", 1, "fetch", None, None, None, "w", now, "b.example", 0),
                submitted("plain-1", 1, "plain", None, None, None, "w", now),
                submitted("fetch-a2", 1, "fetch", None, None, None, "w", now, "api.example", 1),
                Finish(("fetch-a1", 1, TaskStatus.COMPLETED, now, None, None, None)),
            ]
        )


def keyed_status_checks(db: str, cwd: Path) -> None:
    """What `trioexec status` shows of `build_keyed_db`'s database ``db``."""
    out = ok(cli("status", db, cwd=cwd))
    header, *table = out.splitlines()[1:]
    assert header.split() == [
        "task",
        "name",
        "key",
        "status",
        "sub-status",
        "try",  # (no "deferred" column: none is deferred)
        "waiting",  # ("waiting on": some are live)
        "on",
        "error",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in table if line.strip()}
    assert rows == {
        "fetch-a1": ["fetch", "api.example", "completed", "0"],
        "fetch-b1": ["fetch", "b.example", "pending", "0", "slot"],
        "plain-1": ["plain", "pending", "0", "slot"],  # (no key: an empty cell)
        "fetch-a2": ["fetch", "api.example", "pending", "0", "slot"],
    }
    got = json.loads(ok(cli("status", db, "--key", "api.example", "--json", cwd=cwd)))
    assert [(r["task_id"], r["key"], r["priority"]) for r in got] == [
        ("fetch-a1", "api.example", 5),
        ("fetch-a2", "api.example", 1),
    ]
    out = ok(cli("status", db, "--key", "api.example", "--limit", "1", cwd=cwd))
    lines = out.rstrip().splitlines()
    assert lines[0].endswith(": 3 pending, 1 completed")  # (the whole database)
    assert [line.split()[0] for line in lines[2:-1]] == ["fetch-a1"]
    assert lines[-1] == "... and 1 more (--limit)"
    out = ok(cli("status", db, "--key", "api.example", "--status", "pending", cwd=cwd))
    assert "fetch-a2" in out
    assert "fetch-a1" not in out
    assert json.loads(ok(cli("status", db, "--key", "nobody", "--json", cwd=cwd))) == []


def test_status_shows_and_filters_by_key(tmp_path: Path) -> None:
    build_keyed_db(tmp_path / "keys.db")
    keyed_status_checks("keys.db", tmp_path)


def test_status_without_keys_has_no_key_column(app: AppDb) -> None:
    out = ok(cli("status", "app.db", cwd=app.path.parent))
    assert out.splitlines()[1].split() == [
        "task", "name", "status", "sub-status", "try", "deferred", "waiting", "on", "error"
    ]  # fmt: skip


def test_status_older_than_table_shows_only_the_long_waits(app: AppDb) -> None:
    out = ok(cli("status", "app.db", "--older-than", "10m", cwd=app.path.parent))
    assert "approval-old" in out
    assert "1.0h" in out
    assert "webhook-new" not in out
    assert app.good not in out
    # The first line still counts the whole database.
    assert out.splitlines()[0] == "app.db: 1 pending, 3 running, 4 completed, 2 failed"


def test_status_limit_says_how_many_more(app: AppDb) -> None:
    out = ok(cli("status", "app.db", "--limit", "2", cwd=app.path.parent))
    assert out.rstrip().splitlines()[-1] == "... and 8 more (--limit)"
    assert "queued-1" not in out


def test_status_in_an_80_column_terminal_shows_whole_ids_and_statuses(app: AppDb) -> None:
    out = ok(cli("status", "app.db", cwd=app.path.parent, columns=80))
    for word in (app.good, app.bad, "approval-old", "completed", "deferred"):
        assert word in out


# ---------------------------------------------------------------------- watch


def test_watch_once_shows_the_panel_and_the_longest_waits_first(app: AppDb) -> None:
    out = ok(cli("watch", "app.db", "--once", cwd=app.path.parent))
    assert re.search(r"trioexec watch app\.db — \d\d:\d\d:\d\d", out)
    for label, value in [
        ("active", "1"),
        ("deferred", "2"),
        ("pending", "1"),
        ("completed", "4"),
        ("failed/cancelled/timed out", "2/0/0"),
    ]:
        assert re.search(rf"│ {re.escape(label)}\s+{re.escape(value)}\s+│", out), label
    listing = out.split("deferred, longest first:")[1]
    assert listing.index("approval-old") < listing.index("webhook-new")
    assert "crunch-1" not in listing
    assert app.good not in listing


def test_watch_in_a_pipe_prints_once_and_exits(app: AppDb) -> None:
    out = ok(cli("watch", "app.db", "--interval", "0.05", cwd=app.path.parent, timeout=20))
    assert out.count("trioexec watch app.db") == 1


def test_watch_live_under_a_terminal_follows_another_process(app: AppDb) -> None:
    transcript = io.StringIO()
    child = pexpect.spawn(
        TRIOEXEC[0],
        [*TRIOEXEC[1:], "watch", "app.db", "--interval", "0.1"],
        cwd=str(app.path.parent),
        preexec_fn=interruptible,
        env=cli_env(columns=None),
        dimensions=(40, 120),
        encoding="utf-8",
        timeout=15,
    )
    child.logfile_read = transcript
    try:
        child.expect(r"trioexec watch app\.db — \d\d:\d\d:\d\d")
        child.expect(r"completed\s+4\s")
        child.expect(r"deferred, longest first")
        # Another process finishes a task and fails one: the view follows.
        now = time.time()
        with SQLiteStore(app.path) as store:
            store.write(
                [
                    submitted("late-1", 1, "late", None, None, None, "w3", now),
                    Start(("late-1", 1, 1, now)),
                    Finish(("late-1", 1, TaskStatus.COMPLETED, now, None, None, None)),
                    Finish(("crunch-1", 1, TaskStatus.FAILED, now, "OSError()", None, None)),
                ]
            )
        child.expect(r"completed\s+5\s")
        child.expect(r"active\s+0\s")  # the next refresh: crunch-1 is no longer active
        child.expect(r"failed/cancelled/timed out\s+3/0/0")
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert (child.exitstatus, child.signalstatus) == (0, None)
    seen = transcript.getvalue()
    assert "Traceback" not in seen
    assert "interrupted" not in seen
    assert seen.rstrip().endswith("\x1b[?25h")  # the cursor is given back


# ---------------------------------------------------------------------- runs


def test_runs_lists_each_run_with_its_progress(app: AppDb) -> None:
    out = ok(cli("runs", "app.db", cwd=app.path.parent))
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    assert set(rows) == {"run-ok", "run-bad"}
    assert re.search(r"run-ok\s+etl\s+completed\s.*\s2/2\s+0\s*$", rows["run-ok"])
    assert re.search(r"run-bad\s+etl-broken\s+failed\s.*\s1/2\s+0\s*$", rows["run-bad"])


def test_runs_one_run_shows_its_steps(app: AppDb) -> None:
    out = ok(cli("runs", "app.db", "run-bad", cwd=app.path.parent))
    assert "run-ok" not in out
    steps = executions(app.path, run_id="run-bad")
    assert [s.name for s in steps] == ["fetch", "explode"]
    for step in steps:
        assert re.search(rf"{step.task_id}\s+{step.name}\s+{step.status.value}\s", out)
    assert "ValueError('disk full')" in out


def test_runs_json_matches_the_store(app: AppDb) -> None:
    got = json.loads(ok(cli("runs", "app.db", "--json", cwd=app.path.parent)))
    with SQLiteStore(app.path) as store:
        assert got == plain(store.runs())
    one = json.loads(ok(cli("runs", "app.db", "run-ok", "--json", cwd=app.path.parent)))
    assert one == [r for r in got if r["run_id"] == "run-ok"]
    assert one[0]["steps"]["fetch"][0] == "completed"


# ---------------------------------------------------------------------- durable


def test_promises_lists_ids_states_and_data(app: AppDb) -> None:
    out = ok(cli("promises", "app.db", cwd=app.path.parent))
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    assert set(rows) == {"approval-7", "done-1", "job-1", "job-2", "report-3"}
    assert re.search(
        r'approval-7\s+pending\s+\{"who": "bob"\}\s+\d\d:\d\d:\d\d', rows["approval-7"]
    )
    assert re.search(r"done-1\s+resolved\s+42\s", rows["done-1"])
    assert '{"team": "ops"}' in rows["approval-7"]


def test_promises_list_json_and_state_filter_match_the_store(app: AppDb) -> None:
    cwd = app.path.parent
    everything = json.loads(ok(cli("promises", "app.db", "--json", cwd=cwd)))
    pending = json.loads(
        ok(cli("promises", "list", "app.db", "--state", "pending", "--json", cwd=cwd))
    )

    async def search(ds: DurableStore) -> Any:
        return (await ds.promises.search())[0], (await ds.promises.search(state="pending"))[0]

    all_records, pending_records = with_durable(app.path, search)
    assert everything == plain(all_records)
    assert pending == plain(pending_records)
    assert [p["id"] for p in pending] == ["approval-7", "job-1", "job-2", "report-3"]


async def approval_and_its_waiter(ds: DurableStore) -> Any:
    """The promise "approval-7" and the task "job-1" suspended on it."""
    return await ds.promises.get("approval-7"), await ds.tasks.get("job-1")


def test_promises_resolve_settles_it_and_wakes_the_suspended_task(app: AppDb) -> None:
    cwd = app.path.parent
    out = ok(cli("promises", "resolve", "app.db", "approval-7", "--data", '{"ok": true}', cwd=cwd))
    assert out.strip() == "promise approval-7: resolved"

    promise, waiter = with_durable(app.path, approval_and_its_waiter)
    assert promise.state is PromiseState.RESOLVED
    assert json.loads(promise.data) == {"ok": True}
    assert promise.settled_at is not None
    assert waiter.state is TaskState.PENDING  # resumed: a worker can claim it again
    assert waiter.awaiting == ()
    pending = json.loads(ok(cli("tasks", "app.db", "--state", "pending", "--json", cwd=cwd)))
    assert [t["id"] for t in pending] == ["job-1", "job-2", "report-3"]
    assert ok(cli("check", "app.db", cwd=cwd)).strip() == "app.db: all invariants hold"


def test_promises_reject_settles_it_with_the_reason(app: AppDb) -> None:
    out = ok(
        cli(
            "promises",
            "reject",
            "app.db",
            "approval-7",
            "--data",
            '"too late"',
            cwd=app.path.parent,
        )
    )
    assert out.strip() == "promise approval-7: rejected"
    promise, waiter = with_durable(app.path, approval_and_its_waiter)
    assert promise.state is PromiseState.REJECTED
    assert json.loads(promise.data) == "too late"
    assert waiter.state is TaskState.PENDING  # a rejection wakes it too


def test_tasks_lists_states_targets_and_what_they_await(app: AppDb) -> None:
    out = ok(cli("tasks", "app.db", cwd=app.path.parent))
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()[:1]}
    assert re.search(r"job-1\s+suspended\s+1\s+mailer\s+approval-7\s*$", rows["job-1"])
    assert re.search(r"job-2\s+pending\s+0\s+mailer\s*$", rows["job-2"])
    assert re.search(r"report-3\s+pending\s+0\s+reporter\s*$", rows["report-3"])


@pytest.mark.parametrize(
    ("args", "want"),
    [
        ([], {}),
        (["--state", "suspended"], {"state": "suspended"}),
        (["--target", "mailer"], {"target": "mailer"}),
        (
            ["--state", "pending", "--target", "reporter"],
            {"state": "pending", "target": "reporter"},
        ),
    ],
    ids=["all", "suspended", "mailer", "pending-reporter"],
)
def test_tasks_json_and_filters_match_the_store(
    app: AppDb, args: list[str], want: dict[str, str]
) -> None:
    got = json.loads(ok(cli("tasks", "app.db", *args, "--json", cwd=app.path.parent)))

    async def search(ds: DurableStore) -> Any:
        return (await ds.tasks.search(**want))[0]

    assert got == plain(with_durable(app.path, search))
    assert got
    assert all(t[k] == v for t in got for k, v in want.items())


# ---------------------------------------------------------------------- check


def test_check_passes_a_healthy_database(app: AppDb) -> None:
    cwd = app.path.parent
    assert ok(cli("check", "app.db", cwd=cwd)).strip() == "app.db: all invariants hold"
    assert json.loads(ok(cli("check", "app.db", "--json", cwd=cwd))) == {
        "ok": True,
        "violations": [],
        "ownerless": [],  # (w2's live rows: a lease never expires without one)
    }


@pytest.mark.parametrize(
    ("breakage", "violation"),
    [
        pytest.param(
            "UPDATE durable_tasks SET state = 'acquired', pid = 'w9', lease_expires_at = NULL,"
            " timeout_at = NULL WHERE id = 'job-2'",
            "durable: acquired_task_no_lease",
            id="acquired-task-without-lease",
        ),
        pytest.param(
            "UPDATE executions SET sub_status = 'active' WHERE name = 'send-email'",
            "sub_status_truth: {good} is completed with sub-status active",
            id="completed-with-sub-status",
        ),
        pytest.param(
            "UPDATE executions SET finished_at = NULL WHERE name = 'charge-card'",
            "finished_without_time: {bad}",
            id="failed-without-finish-time",
        ),
    ],
)
def test_check_fails_a_broken_database(app: AppDb, breakage: str, violation: str) -> None:
    sql(app.path, breakage)
    violation = violation.format(good=app.good, bad=app.bad)
    proc = cli("check", "app.db", cwd=app.path.parent)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [f"violated {violation}"]
    proc = cli("check", "app.db", "--json", cwd=app.path.parent)
    assert proc.returncode == 1
    assert json.loads(proc.stdout) == {"ok": False, "violations": [violation], "ownerless": []}


# ---------------------------------------------------------------------- errors


@pytest.fixture
def bad_files(app: AppDb) -> Path:
    """app.db, plus corrupt.db (not SQLite) and foreign.db (someone else's SQLite)."""
    (app.path.parent / "corrupt.db").write_bytes(b"this is not a database\n" * 400)
    sql(app.path.parent / "foreign.db", "CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    return app.path.parent


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["status", "missing.db"], 1, "trioexec: missing.db: no such database file"),
        (["tasks", "missing.db"], 1, "trioexec: missing.db: no such database file"),
        (["promises", "resolve", "missing.db", "x"], 1, "missing.db: no such database file"),
        (["watch", "corrupt.db", "--once"], 1, "corrupt.db: not a usable SQLite database"),
        (["check", "corrupt.db"], 1, "corrupt.db: not a usable SQLite database"),
        (["promises", "corrupt.db"], 1, "corrupt.db: not a usable SQLite database"),
        (["demo", "--db", "corrupt.db"], 1, "corrupt.db: not a usable SQLite database"),
        (["status", "foreign.db"], 1, "foreign.db: not a trioexec database"),
        (["promises", "foreign.db"], 1, "foreign.db: not a trioexec database"),
        (["runs", "app.db", "run-nope"], 1, "trioexec: app.db: no workflow run 'run-nope'"),
        (["promises", "resolve", "app.db", "nope"], 1, "trioexec: app.db: no promise 'nope'"),
        (["promises", "reject", "app.db", "done-1"], 1, "'done-1' is already resolved"),
        (
            ["promises", "resolve", "app.db", "approval-7", "--data", "{oops"],
            2,
            "trioexec: --data is not JSON: ",
        ),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else None,
)
def test_what_a_person_gets_wrong_is_one_clear_line(
    bad_files: Path, args: list[str], code: int, message: str
) -> None:
    before = {p.name: p.read_bytes() for p in bad_files.glob("*.db") if p.name != "app.db"}
    line = one_line_error(cli(*args, cwd=bad_files), code)
    assert message in line
    # A foreign or corrupt file is left exactly as it was; nothing is created.
    assert {p.name: p.read_bytes() for p in bad_files.glob("*.db") if p.name != "app.db"} == before
    assert not (bad_files / "missing.db").exists()
    # The promises are untouched (a bad --data settles nothing).
    promise = with_durable(bad_files / "app.db", lambda ds: ds.promises.get("approval-7"))
    assert promise.state is PromiseState.PENDING


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["status", "app.db", "--older-than", "soon"], "'soon' is not a duration like 90s"),
        (["status", "app.db", "--status", "bogus"], "'bogus' is not one of 'pending'"),
        (["watch", "app.db", "--interval", "0"], "--interval"),
        (["demo", "--slots", "0"], "--slots"),
        (["status"], "Missing argument 'DB'"),
        (["frobnicate"], "No such command 'frobnicate'. (see 'trioexec --help')"),
        (["status", "app.db", "--bogus"], "(see 'trioexec status --help')"),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else None,
)
def test_bad_arguments_exit_2_and_say_what_is_wrong(
    app: AppDb, args: list[str], message: str
) -> None:
    proc = cli(*args, cwd=app.path.parent)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    errors = proc.stderr.splitlines()
    assert len(errors) == 1
    assert message in errors[0]


def test_a_bad_older_than_is_exactly_one_line(app: AppDb) -> None:
    line = one_line_error(cli("status", "app.db", "--older-than", "soon", cwd=app.path.parent), 2)
    assert "'soon' is not a duration" in line


@pytest.mark.parametrize("age", ["nan", ""])
def test_a_meaningless_older_than_is_rejected(app: AppDb, age: str) -> None:
    proc = cli("status", "app.db", "--older-than", age, "--json", cwd=app.path.parent)
    assert proc.returncode == 2, proc.stdout[:200]


@pytest.mark.parametrize(
    ("breakage", "args"),
    [
        pytest.param(
            "UPDATE executions SET status = 'bogus' WHERE name = 'send-email'",
            ["status", "app.db"],
            id="status-unknown-execution-status",
        ),
        pytest.param(
            "UPDATE executions SET status = 'bogus' WHERE name = 'send-email'",
            ["check", "app.db"],
            id="check-unknown-execution-status",
        ),
        pytest.param(
            "UPDATE durable_tasks SET state = 'bogus' WHERE id = 'job-2'",
            ["tasks", "app.db"],
            id="tasks-unknown-task-state",
        ),
        pytest.param(
            "UPDATE durable_promises SET tags = 'not json' WHERE id = 'done-1'",
            ["promises", "app.db"],
            id="promises-tags-not-json",
        ),
    ],
)
def test_a_corrupt_row_is_one_line(app: AppDb, breakage: str, args: list[str]) -> None:
    sql(app.path, breakage)
    one_line_error(cli(*args, cwd=app.path.parent), 1)


def test_check_fails_an_unknown_durable_task_state(app: AppDb) -> None:
    sql(app.path, "UPDATE durable_tasks SET state = 'bogus' WHERE id = 'job-2'")
    assert cli("check", "app.db", cwd=app.path.parent).returncode == 1


@pytest.mark.parametrize(
    "args",
    [["check", "app.db"], ["promises", "resolve", "app.db", "done-1"]],
    ids=["check", "resolve"],
)
def test_a_store_error_in_a_durable_call_is_one_line(app: AppDb, args: list[str]) -> None:
    sql(app.path, "DROP TABLE durable_tasks")
    assert "no such table: durable_tasks" in one_line_error(cli(*args, cwd=app.path.parent), 1)


# ---------------------------------------------------------------------- python -m


def test_python_dash_m_is_the_same_command(app: AppDb) -> None:
    run = [sys.executable, "-m", "trioexec", "status", "app.db", "--sub-status", "deferred"]
    proc = subprocess.run(
        [*run, "--json"],
        cwd=app.path.parent,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert [r["task_id"] for r in json.loads(ok(proc))] == ["approval-old", "webhook-new"]
    proc = subprocess.run(
        [sys.executable, "-m", "trioexec", "status", "missing.db"],
        cwd=app.path.parent,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert one_line_error(proc, 1) == "trioexec: missing.db: no such database file"


# ---------------------------------------------------------------------- demo


def spawn_demo(cwd: Path, transcript: io.StringIO) -> pexpect.spawn:
    child = pexpect.spawn(
        TRIOEXEC[0],
        [*TRIOEXEC[1:], "demo", "--quick", "--tasks", "8", "--slots", "2", "--db", "demo.db"],
        cwd=str(cwd),
        preexec_fn=interruptible,
        env=cli_env(columns=None),
        dimensions=(50, 140),
        encoding="utf-8",
        timeout=40,
    )
    child.logfile_read = transcript
    return child


def test_demo_under_a_terminal_shows_the_live_panel_and_the_summary(tmp_path: Path) -> None:
    """The demo's story in detail is tests/test_demo.py's; here, its shape with
    other --tasks and --slots."""
    transcript = io.StringIO()
    child = spawn_demo(tmp_path, transcript)
    try:
        child.expect(r"Recording to")
        child.expect(r"trioexec demo — +\d+\.\ds of ~5s")  # the live panel's title
        child.expect(r"slots in use")
        child.expect(r"2/2")  # the slots are busy...
        child.expect(r"deferred\s+[1-9]\d*\s+\(holding no slot\)")  # ...and waiters hold none
        child.expect(r"promise approval-refund-")  # what the workflow's approval waits on
        child.expect(r"done\s+15/15")
        child.expect(r"summary")
        child.expect(r"faster")
        child.expect(r"trioexec promises demo\.db")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert (child.exitstatus, child.signalstatus) == (0, None)
    raw = transcript.getvalue()
    seen = squash(raw)
    assert "Traceback" not in seen
    assert seen.startswith(
        "trioexec demo: 15 tasks on 2 slots, about 5 s. Recording to demo.db; watch it from "
        "another shell with: trioexec watch demo.db "
        "• 4 tasks wait on events (a webhook, an upload, an API) set between"
    )
    assert "\x1b[?25h" in raw  # the live view gave the cursor back
    for row in (
        "with defer_until (this run, real time)",
        "with defer_until (simulated)",
        "holding slots while waiting (simulated)",
    ):
        assert re.search(rf"{re.escape(row)} │ +\d+\.\ds │", seen), row
    sentence = re.search(
        r"Deferral finished the same 15 tasks in (\d+\.\d)s instead of (\d+\.\d)s "
        r"\((\d+\.\d)x faster\): while 7 tasks waited, their slots ran the others\. "
        r"Store: 15 completed, 0 other — demo\.db",
        seen,
    )
    assert sentence, seen[-600:]
    ideal, held, speedup = map(float, sentence.groups())
    assert ideal < held
    assert speedup >= 1.0
    # What it recorded is there for the other commands.
    assert [r.status for r in executions(tmp_path / "demo.db")] == [TaskStatus.COMPLETED] * 15
    assert ok(cli("status", "demo.db", cwd=tmp_path)).startswith("demo.db: 15 completed\n")


def test_ctrl_c_in_the_demo_is_one_line(tmp_path: Path) -> None:
    transcript = io.StringIO()
    child = spawn_demo(tmp_path, transcript)
    try:
        child.expect(r"slots in use")
        child.sendintr()
        child.expect(pexpect.EOF, timeout=20)
    finally:
        child.close(force=True)
    seen = ANSI.sub("", transcript.getvalue())
    assert "Traceback" not in seen, seen[-400:]
    assert "trioexec: interrupted" in seen
    assert child.exitstatus == 130
