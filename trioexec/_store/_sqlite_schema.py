"""The SQLite store's schema: sqlite-utils migrations, and the check that a file is
trioexec's, and not from a newer trioexec, before anything writes to it."""

from __future__ import annotations

import sqlite_utils
from sqlite_utils.migrations import Migrations

from .._columns import DEDUPE_BY_KEY, DEDUPE_LIVE, SQLITE_SCHEMA, add_columns, added, version_of
from .._errors import StoreError

_FIRST = added(SQLITE_SCHEMA, 1)
#: The migrations, by name, in order: the nth brings a file to schema version n. Each
#: adds the executions columns of its version (`_columns.EXECUTIONS`), runs its
#: statements (whitespace collapsed: as stored, each on one line), and records its
#: version in trioexec_meta (0001, which makes the row, records the latest: the
#: rest follow in the same transaction).
_STEPS: dict[str, str] = {
    "0001_initial": f"""
        CREATE TABLE trioexec_meta (key TEXT PRIMARY KEY, value TEXT);
        CREATE TABLE executions ({", ".join(c.spelled(SQLITE_SCHEMA) for c in _FIRST)});
        CREATE TABLE owners (owner TEXT PRIMARY KEY, lease_expires_at REAL);
        CREATE INDEX executions_status ON executions (status, owner);
        CREATE INDEX executions_deferred ON executions (sub_status, deferred_since)
            WHERE sub_status IS NOT NULL;
        CREATE INDEX executions_run ON executions (run_id) WHERE run_id IS NOT NULL;
        INSERT INTO trioexec_meta (key, value) VALUES ('schema_version', '1');
        """,
    "0002_workflow_runs": """
        CREATE TABLE workflow_runs (run_id TEXT PRIMARY KEY, workflow TEXT NOT NULL,
            status TEXT NOT NULL, context TEXT NOT NULL, owner TEXT, created_at REAL,
            finished_at REAL);
        CREATE TABLE workflow_steps (run_id TEXT, step_id TEXT, state TEXT NOT NULL,
            output TEXT, task_id TEXT, PRIMARY KEY (run_id, step_id));
        CREATE INDEX workflow_runs_status ON workflow_runs (status, workflow);
        """,
    "0003_durable": """
        CREATE TABLE durable_promises (id TEXT PRIMARY KEY, state TEXT NOT NULL, data TEXT,
            timeout_at REAL NOT NULL, ikc TEXT, iku TEXT, tags TEXT NOT NULL,
            created_at REAL NOT NULL, settled_at REAL);
        CREATE TABLE durable_tasks (id TEXT PRIMARY KEY, state TEXT NOT NULL,
            version INTEGER NOT NULL, target TEXT, pid TEXT, ttl REAL, lease_expires_at REAL,
            timeout_at REAL);
        CREATE TABLE durable_callbacks (promise_id TEXT, task_id TEXT,
            PRIMARY KEY (promise_id, task_id));
        CREATE INDEX durable_promises_pending ON durable_promises (state, timeout_at);
        CREATE INDEX durable_tasks_state ON durable_tasks (state, target);
        CREATE INDEX durable_tasks_lease ON durable_tasks (state, lease_expires_at);
        CREATE INDEX durable_tasks_retry ON durable_tasks (state, timeout_at);
        CREATE INDEX durable_callbacks_task ON durable_callbacks (task_id);
        """,
    "0004_run_recovery_attempts": """
        ALTER TABLE workflow_runs ADD COLUMN recovery_attempts
            INTEGER NOT NULL DEFAULT 0
        """,
    # A claim takes a target's oldest ready tasks (ORDER BY id): without id in the
    # index it sorted the target's whole backlog on every claim.
    "0005_durable_claim_index": """
        CREATE INDEX durable_tasks_claim ON durable_tasks
            (state, target, id)
        """,
    # Admission by key: each execution's key and priority as submitted. Rows from
    # before have none (NULL key, priority 0). The index holds keyed rows only, so
    # a keyless insert costs nothing more; `executions(key=...)` reads it in rowid
    # order (the index's own order after the key).
    "0006_execution_keys": "CREATE INDEX executions_key ON executions (key) WHERE key IS NOT NULL",
    # Key limits shared by the executors on this file: the slots of a key each
    # owner holds (valid while its lease is), and each key's token bucket.
    # (key_holds_owner: for release_owner)
    "0007_key_ledger": """
        CREATE TABLE key_holds (key TEXT NOT NULL, owner TEXT NOT NULL,
            held INTEGER NOT NULL, wanted INTEGER NOT NULL, since REAL,
            PRIMARY KEY (key, owner));
        CREATE INDEX key_holds_owner ON key_holds (owner);
        CREATE TABLE key_buckets (key TEXT PRIMARY KEY, tokens REAL NOT NULL,
            stamp REAL NOT NULL);
        """,
    # Schedules (`Executor.schedule`): each one's definition as last saved, and one
    # row per occurrence claimed: the primary key lets one executor of many win it.
    "0008_schedules": """
        CREATE TABLE schedules (schedule_id TEXT PRIMARY KEY, cron TEXT NOT NULL,
            tz TEXT NOT NULL, name TEXT NOT NULL, next_run REAL, last_run REAL);
        CREATE TABLE schedule_runs (schedule_id TEXT NOT NULL, at REAL NOT NULL,
            owner TEXT NOT NULL, PRIMARY KEY (schedule_id, at));
        """,
    # Why a live execution is not running (`ExecutionRecord.waiting_on`); rows
    # written before it was recorded have it NULL.
    "0009_waiting_on": "",
    # Operator commands: the traceback of the exception that ended an execution
    # (dead letters show it), the append-only log of every command (executors
    # poll it by seq: AUTOINCREMENT never hands out a seq again), and what is
    # paused now.
    "0010_control": """
        CREATE TABLE commands (seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL,
            name TEXT, key TEXT, task_id TEXT, who TEXT NOT NULL, at REAL NOT NULL,
            changed INTEGER NOT NULL, detail TEXT NOT NULL);
        CREATE TABLE pauses (kind TEXT NOT NULL, value TEXT NOT NULL, who TEXT NOT NULL,
            at REAL NOT NULL, PRIMARY KEY (kind, value));
        """,
    # The dashboard's reads (`trioexec._store._browse`): pages under a status or
    # name filter in submission order (SQLite appends the rowid to every index);
    # the failed ones of a name, for the dead letters' page (few rows, written
    # only as an execution fails); the live executions, a few among millions,
    # with every column their filters and order read (a page from the index
    # alone; finished rows, most inserted finished, write nothing to it); the
    # executions finished since a time, counted from the index alone; a task's
    # commands. Each run records its steps' graph (JSON; NULL before); the runs
    # page reads them newest first, by keyset.
    "0011_dashboard": """
        CREATE INDEX executions_by_status ON executions (status);
        CREATE INDEX executions_name ON executions (name);
        CREATE INDEX executions_failed_name ON executions (name) WHERE status = 'failed';
        CREATE INDEX executions_live_rows ON executions (status, sub_status, submitted_at,
            deferred_since, waiting_on, name, key, run_id) WHERE status IN ('pending', 'running');
        CREATE INDEX executions_finished ON executions (finished_at, status)
            WHERE finished_at IS NOT NULL;
        CREATE INDEX commands_task ON commands (task_id) WHERE task_id IS NOT NULL;
        ALTER TABLE workflow_runs ADD COLUMN graph TEXT;
        CREATE INDEX workflow_runs_created ON workflow_runs (created_at, run_id);
        """,
    # Commands apply in the order they were issued (`_control.pause_turn`): a
    # target keeps its row once resumed (paused 0), with the issue time of the
    # latest pause or resume applied to it; old commands and resumed targets are
    # deleted as new commands are recorded (a range of the primary key).
    "0012_command_order": """
        ALTER TABLE pauses ADD COLUMN paused INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE pauses ADD COLUMN latest REAL NOT NULL DEFAULT 0;
        UPDATE pauses SET latest = at;
        """,
    # When each key's bucket is full again (a full bucket is the same as no
    # row): rounds delete the rows past it, earliest first, from this index.
    # Rows from before keep NULL (their key's rate is not known here) until
    # their key is settled again.
    "0013_key_bucket_full": """
        ALTER TABLE key_buckets ADD COLUMN full_at REAL;
        CREATE INDEX key_buckets_full ON key_buckets (full_at, key) WHERE full_at IS NOT NULL;
        """,
    # A task's value kept as JSON with its completion (`keep_results`); NULL
    # when none was kept, as in every row before.
    "0014_results": "",
    # `submit(dedupe_key=...)`: one live execution per key (the store refuses a
    # second), and a key's executions by when they finished (is one recent?).
    "0015_dedupe": f"""
        CREATE UNIQUE INDEX executions_dedupe_live ON executions {DEDUPE_LIVE};
        CREATE INDEX executions_dedupe ON executions {DEDUPE_BY_KEY};
        """,
    # The task tree: the task that submitted an execution, and its children by it.
    "0016_task_tree": """
        CREATE INDEX executions_children ON executions (parent_id)
            WHERE parent_id IS NOT NULL
        """,
}
SCHEMA_VERSION = len(_STEPS)
MIGRATIONS = Migrations("trioexec")
#: Every migration this trioexec defines, by name: a file with any other applied
#: was written by a newer trioexec.
KNOWN_MIGRATIONS = list(_STEPS)


def _register(version: int, name: str, statements: str) -> None:
    @MIGRATIONS(name=name)
    def apply(db: sqlite_utils.Database) -> None:
        for statement in filter(str.strip, statements.split(";")):
            db.execute(" ".join(statement.split()))
        db.execute(
            "UPDATE trioexec_meta SET value = ? WHERE key = 'schema_version'",
            [str(SCHEMA_VERSION if version == 1 else version)],
        )


for _version, (_name, _statements) in enumerate(_STEPS.items(), 1):
    _register(_version, _name, add_columns(SQLITE_SCHEMA, _version) + _statements)


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
