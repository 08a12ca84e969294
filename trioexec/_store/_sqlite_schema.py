"""The SQLite store's schema: sqlite-utils migrations, and the check that a file is
trioexec's, and not from a newer trioexec, before anything writes to it."""

from __future__ import annotations

import sqlite_utils
from sqlite_utils.migrations import Migrations

from .._columns import SHARED_STEPS, SQLITE_SCHEMA, migration, version_of
from .._errors import StoreError

#: The migrations, by name, in order: the nth brings a file to schema version n. Each
#: adds the executions columns of its version (`_columns.EXECUTIONS`), runs its
#: statements (`migration`; whitespace collapsed: as stored, each on one line), and
#: records its version in trioexec_meta (0001, which makes the row, records the
#: latest: the rest follow in the same transaction). From 0006 on, both schemas'.
_STEPS: dict[str, str] = {
    "0001_initial": """
        CREATE TABLE trioexec_meta (key TEXT PRIMARY KEY, value TEXT);
        CREATE TABLE executions ({columns});
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
    "0004_run_recovery_attempts": "ALTER TABLE workflow_runs ADD COLUMN recovery_attempts"
    " INTEGER NOT NULL DEFAULT 0",
    # A claim takes a target's oldest ready tasks (ORDER BY id): without id in the
    # index it sorted the target's whole backlog on every claim.
    "0005_durable_claim_index": "CREATE INDEX durable_tasks_claim ON durable_tasks"
    " (state, target, id)",
    **SHARED_STEPS,
}
SCHEMA_VERSION = len(_STEPS)
MIGRATIONS = Migrations("trioexec")


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
    _register(_version, _name, migration(SQLITE_SCHEMA, _version, _statements))


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
    # (a file with a migration applied that this trioexec does not define)
    unknown = {m.name for m in MIGRATIONS.applied(db)} - set(_STEPS)
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
