"""The SQLite store's schema: sqlite-utils migrations, and the check that a file is
trioexec's, and not from a newer trioexec, before anything writes to it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import sqlite_utils
from sqlite_utils.migrations import Migrations

from .._columns import DEDUPE_BY_KEY, DEDUPE_LIVE, SQLITE_SCHEMA, added, version_of
from .._errors import StoreError

_Migrate = TypeVar("_Migrate", bound=Callable[[sqlite_utils.Database], None])

SCHEMA_VERSION = 16
MIGRATIONS = Migrations("trioexec")
#: Every migration this trioexec defines, by name: a file with any other applied
#: was written by a newer trioexec.
KNOWN_MIGRATIONS: list[str] = []


def _add_columns(db: sqlite_utils.Database, version: int) -> None:
    """Add the executions columns of schema ``version`` (`_columns.EXECUTIONS`)."""
    for column in added(SQLITE_SCHEMA, version):
        db.execute(f"ALTER TABLE executions ADD COLUMN {column.sqlite()}")


def _migration(name: str) -> Callable[[_Migrate], _Migrate]:
    KNOWN_MIGRATIONS.append(name)
    return MIGRATIONS(name=name)


@_migration("0001_initial")
def _initial(db: sqlite_utils.Database) -> None:
    db["trioexec_meta"].create({"key": str, "value": str}, pk="key")  # type: ignore[union-attr]
    first = added(SQLITE_SCHEMA, 1)
    db["executions"].create(  # type: ignore[union-attr]
        {c.name: c.python_type for c in first},
        pk="task_id",
        not_null={c.name for c in first if c.not_null},
        defaults={c.name: c.default for c in first if c.default is not None},
    )
    db["owners"].create({"owner": str, "lease_expires_at": float}, pk="owner")  # type: ignore[union-attr]
    db.execute("CREATE INDEX executions_status ON executions (status, owner)")
    db.execute(
        "CREATE INDEX executions_deferred ON executions (sub_status, deferred_since)"
        " WHERE sub_status IS NOT NULL"
    )
    db.execute("CREATE INDEX executions_run ON executions (run_id) WHERE run_id IS NOT NULL")
    db.execute(
        "INSERT INTO trioexec_meta (key, value) VALUES ('schema_version', ?)",
        [str(SCHEMA_VERSION)],
    )


@_migration("0002_workflow_runs")
def _workflow_runs(db: sqlite_utils.Database) -> None:
    db["workflow_runs"].create(  # type: ignore[union-attr]
        {
            "run_id": str,
            "workflow": str,
            "status": str,
            "context": str,
            "owner": str,
            "created_at": float,
            "finished_at": float,
        },
        pk="run_id",
        not_null={"workflow", "status", "context"},
    )
    db["workflow_steps"].create(  # type: ignore[union-attr]
        {"run_id": str, "step_id": str, "state": str, "output": str, "task_id": str},
        pk=("run_id", "step_id"),
        not_null={"state"},
    )
    db.execute("CREATE INDEX workflow_runs_status ON workflow_runs (status, workflow)")
    db.execute("UPDATE trioexec_meta SET value = '2' WHERE key = 'schema_version'")


@_migration("0003_durable")
def _durable(db: sqlite_utils.Database) -> None:
    db["durable_promises"].create(  # type: ignore[union-attr]
        {
            "id": str,
            "state": str,
            "data": str,
            "timeout_at": float,
            "ikc": str,
            "iku": str,
            "tags": str,
            "created_at": float,
            "settled_at": float,
        },
        pk="id",
        not_null={"state", "timeout_at", "tags", "created_at"},
    )
    db["durable_tasks"].create(  # type: ignore[union-attr]
        {
            "id": str,
            "state": str,
            "version": int,
            "target": str,
            "pid": str,
            "ttl": float,
            "lease_expires_at": float,
            "timeout_at": float,
        },
        pk="id",
        not_null={"state", "version"},
    )
    db["durable_callbacks"].create(  # type: ignore[union-attr]
        {"promise_id": str, "task_id": str}, pk=("promise_id", "task_id")
    )
    db.execute("CREATE INDEX durable_promises_pending ON durable_promises (state, timeout_at)")
    db.execute("CREATE INDEX durable_tasks_state ON durable_tasks (state, target)")
    db.execute("CREATE INDEX durable_tasks_lease ON durable_tasks (state, lease_expires_at)")
    db.execute("CREATE INDEX durable_tasks_retry ON durable_tasks (state, timeout_at)")
    db.execute("CREATE INDEX durable_callbacks_task ON durable_callbacks (task_id)")
    db.execute("UPDATE trioexec_meta SET value = '3' WHERE key = 'schema_version'")


@_migration("0004_run_recovery_attempts")
def _run_recovery_attempts(db: sqlite_utils.Database) -> None:
    db.execute("ALTER TABLE workflow_runs ADD COLUMN recovery_attempts INTEGER NOT NULL DEFAULT 0")
    db.execute("UPDATE trioexec_meta SET value = '4' WHERE key = 'schema_version'")


@_migration("0005_durable_claim_index")
def _durable_claim_index(db: sqlite_utils.Database) -> None:
    # A claim takes a target's oldest ready tasks (ORDER BY id): without id in the
    # index it sorted the target's whole backlog on every claim.
    db.execute("CREATE INDEX durable_tasks_claim ON durable_tasks (state, target, id)")
    db.execute("UPDATE trioexec_meta SET value = '5' WHERE key = 'schema_version'")


@_migration("0006_execution_keys")
def _execution_keys(db: sqlite_utils.Database) -> None:
    # Admission by key: each execution's key and priority as submitted. Rows from
    # before have none (NULL key, priority 0). The index holds keyed rows only, so
    # a keyless insert costs nothing more; `executions(key=...)` reads it in rowid
    # order (the index's own order after the key).
    _add_columns(db, 6)
    db.execute("CREATE INDEX executions_key ON executions (key) WHERE key IS NOT NULL")
    db.execute("UPDATE trioexec_meta SET value = '6' WHERE key = 'schema_version'")


@_migration("0007_key_ledger")
def _key_ledger(db: sqlite_utils.Database) -> None:
    # Key limits shared by the executors on this file: the slots of a key each
    # owner holds (valid while its lease is), and each key's token bucket.
    db.execute(
        "CREATE TABLE key_holds (key TEXT NOT NULL, owner TEXT NOT NULL,"
        " held INTEGER NOT NULL, wanted INTEGER NOT NULL, since REAL,"
        " PRIMARY KEY (key, owner))"
    )
    db.execute("CREATE INDEX key_holds_owner ON key_holds (owner)")  # (release_owner)
    db.execute(
        "CREATE TABLE key_buckets (key TEXT PRIMARY KEY, tokens REAL NOT NULL, stamp REAL NOT NULL)"
    )
    db.execute("UPDATE trioexec_meta SET value = '7' WHERE key = 'schema_version'")


@_migration("0008_schedules")
def _schedules(db: sqlite_utils.Database) -> None:
    # Schedules (`Executor.schedule`): each one's definition as last saved, and one
    # row per occurrence claimed: the primary key lets one executor of many win it.
    db.execute(
        "CREATE TABLE schedules (schedule_id TEXT PRIMARY KEY, cron TEXT NOT NULL,"
        " tz TEXT NOT NULL, name TEXT NOT NULL, next_run REAL, last_run REAL)"
    )
    db.execute(
        "CREATE TABLE schedule_runs (schedule_id TEXT NOT NULL, at REAL NOT NULL,"
        " owner TEXT NOT NULL, PRIMARY KEY (schedule_id, at))"
    )
    db.execute("UPDATE trioexec_meta SET value = '8' WHERE key = 'schema_version'")


@_migration("0009_waiting_on")
def _waiting_on(db: sqlite_utils.Database) -> None:
    # Why a live execution is not running (`ExecutionRecord.waiting_on`); rows
    # written before it was recorded have it NULL.
    _add_columns(db, 9)
    db.execute("UPDATE trioexec_meta SET value = '9' WHERE key = 'schema_version'")


@_migration("0010_control")
def _control(db: sqlite_utils.Database) -> None:
    # Operator commands: the traceback of the exception that ended an execution
    # (dead letters show it), the append-only log of every command (executors
    # poll it by seq: AUTOINCREMENT never hands out a seq again), and what is
    # paused now.
    _add_columns(db, 10)
    db.execute(
        "CREATE TABLE commands (seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL,"
        " name TEXT, key TEXT, task_id TEXT, who TEXT NOT NULL, at REAL NOT NULL,"
        " changed INTEGER NOT NULL, detail TEXT NOT NULL)"
    )
    db.execute(
        "CREATE TABLE pauses (kind TEXT NOT NULL, value TEXT NOT NULL, who TEXT NOT NULL,"
        " at REAL NOT NULL, PRIMARY KEY (kind, value))"
    )
    db.execute("UPDATE trioexec_meta SET value = '10' WHERE key = 'schema_version'")


@_migration("0011_dashboard")
def _dashboard(db: sqlite_utils.Database) -> None:
    # The dashboard's reads (`trioexec._store._browse`): pages under a status or
    # name filter in submission order (SQLite appends the rowid to every index);
    # the live executions, a few among millions, with every column their filters
    # and order read (a page from the index alone; finished rows, most inserted
    # finished, write nothing to it); the executions finished since a time,
    # counted from the index alone; a task's commands. Each run records its
    # steps' graph (JSON; NULL before).
    db.execute("CREATE INDEX executions_by_status ON executions (status)")
    db.execute("CREATE INDEX executions_name ON executions (name)")
    # (the failed ones of a name, for the dead letters' page: few rows, written
    # only as an execution fails)
    db.execute("CREATE INDEX executions_failed_name ON executions (name) WHERE status = 'failed'")
    db.execute(
        "CREATE INDEX executions_live_rows ON executions (status, sub_status, submitted_at,"
        " deferred_since, waiting_on, name, key, run_id) WHERE status IN ('pending', 'running')"
    )
    db.execute(
        "CREATE INDEX executions_finished ON executions (finished_at, status)"
        " WHERE finished_at IS NOT NULL"
    )
    db.execute("CREATE INDEX commands_task ON commands (task_id) WHERE task_id IS NOT NULL")
    db.execute("ALTER TABLE workflow_runs ADD COLUMN graph TEXT")
    # (the runs page: newest first, by keyset)
    db.execute("CREATE INDEX workflow_runs_created ON workflow_runs (created_at, run_id)")
    db.execute("UPDATE trioexec_meta SET value = '11' WHERE key = 'schema_version'")


@_migration("0012_command_order")
def _command_order(db: sqlite_utils.Database) -> None:
    # Commands apply in the order they were issued (`_control.pause_turn`): a
    # target keeps its row once resumed (paused 0), with the issue time of the
    # latest pause or resume applied to it; old commands and resumed targets are
    # deleted as new commands are recorded (a range of the primary key).
    db.execute("ALTER TABLE pauses ADD COLUMN paused INTEGER NOT NULL DEFAULT 1")
    db.execute("ALTER TABLE pauses ADD COLUMN latest REAL NOT NULL DEFAULT 0")
    db.execute("UPDATE pauses SET latest = at")
    db.execute("UPDATE trioexec_meta SET value = '12' WHERE key = 'schema_version'")


@_migration("0013_key_bucket_full")
def _key_bucket_full(db: sqlite_utils.Database) -> None:
    # When each key's bucket is full again (a full bucket is the same as no
    # row): rounds delete the rows past it, earliest first, from this index.
    # Rows from before keep NULL (their key's rate is not known here) until
    # their key is settled again.
    db.execute("ALTER TABLE key_buckets ADD COLUMN full_at REAL")
    db.execute(
        "CREATE INDEX key_buckets_full ON key_buckets (full_at, key) WHERE full_at IS NOT NULL"
    )
    db.execute("UPDATE trioexec_meta SET value = '13' WHERE key = 'schema_version'")


@_migration("0014_results")
def _results(db: sqlite_utils.Database) -> None:
    # A task's value kept as JSON with its completion (`keep_results`); NULL
    # when none was kept, as in every row before.
    _add_columns(db, 14)
    db.execute("UPDATE trioexec_meta SET value = '14' WHERE key = 'schema_version'")


@_migration("0015_dedupe")
def _dedupe(db: sqlite_utils.Database) -> None:
    # `submit(dedupe_key=...)`: one live execution per key (the store refuses a
    # second), and a key's executions by when they finished (is one recent?).
    _add_columns(db, 15)
    db.execute(f"CREATE UNIQUE INDEX executions_dedupe_live ON executions {DEDUPE_LIVE}")
    db.execute(f"CREATE INDEX executions_dedupe ON executions {DEDUPE_BY_KEY}")
    db.execute("UPDATE trioexec_meta SET value = '15' WHERE key = 'schema_version'")


@_migration("0016_task_tree")
def _task_tree(db: sqlite_utils.Database) -> None:
    # The task tree: the task that submitted an execution, and its children by it.
    _add_columns(db, 16)
    db.execute(
        "CREATE INDEX executions_children ON executions (parent_id) WHERE parent_id IS NOT NULL"
    )
    db.execute("UPDATE trioexec_meta SET value = '16' WHERE key = 'schema_version'")


def schema_version(db: sqlite_utils.Database, path: str) -> int:
    """Refuse a foreign or newer file (reads only). Returns the schema version
    (0: no trioexec schema yet)."""
    tables = set(db.table_names())
    if tables and "trioexec_meta" not in tables:
        shown = ", ".join(sorted(tables)[:5])
        raise StoreError(
            f"{path}: not a trioexec database (it has tables {shown}, "
            "but no trioexec schema); refusing to touch it"
        )
    if "trioexec_meta" not in tables:
        return 0
    row = db.conn.execute("SELECT value FROM trioexec_meta WHERE key = 'schema_version'").fetchone()
    found = version_of(path, row[0] if row else 0, SCHEMA_VERSION)
    unknown = {m.name for m in MIGRATIONS.applied(db)} - set(KNOWN_MIGRATIONS)
    if unknown:
        raise StoreError(
            f"{path}: written by a newer trioexec (unknown migrations {sorted(unknown)})"
        )
    return found


def migrate(db: sqlite_utils.Database, path: str) -> None:
    """Apply the pending migrations, in one write transaction (two processes opening
    a new file: one migrates), checking the file again under the lock."""
    conn = db.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        schema_version(db, path)  # again, under the lock
        MIGRATIONS.apply(db)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
