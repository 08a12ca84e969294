"""The PostgreSQL store's schema: versioned migrations, applied under an advisory
lock so that many processes opening a new database migrate it once, and the check
that a schema is trioexec's and not from a newer trioexec."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._columns import POSTGRES_SCHEMA, SHARED_STEPS, migration, version_of
from .._errors import StoreError

if TYPE_CHECKING:
    import psycopg


#: Migration n (1-based) brings the schema from version n - 1 to n: the executions
#: columns of version n (`_columns.EXECUTIONS`), then its statements: these two, then
#: both schemas' (`_columns.SHARED_STEPS`, 3 on). Times are
#: seconds since the epoch (double precision), as in the SQLite store; ``seq``
#: keeps submission order (SQLite's rowid).
_STEPS = (
    """
    CREATE TABLE trioexec_meta (key text PRIMARY KEY, value text NOT NULL);
    CREATE TABLE executions (seq bigint GENERATED ALWAYS AS IDENTITY, {columns});
    CREATE UNIQUE INDEX executions_seq ON executions (seq);
    -- Only the live rows: most rows are inserted finished, and an index they
    -- skip costs their insert nothing (every index is part of every insert).
    CREATE INDEX executions_live ON executions (status, owner, seq)
        WHERE status IN ('pending', 'running');
    CREATE INDEX executions_deferred ON executions (sub_status, deferred_since)
        WHERE sub_status IS NOT NULL;
    CREATE INDEX executions_run ON executions (run_id) WHERE run_id IS NOT NULL;
    CREATE TABLE owners (owner text PRIMARY KEY, lease_expires_at double precision);
    CREATE TABLE workflow_runs (seq bigint GENERATED ALWAYS AS IDENTITY,
        run_id text PRIMARY KEY, workflow text NOT NULL, status text NOT NULL,
        context text NOT NULL, owner text, created_at double precision,
        finished_at double precision, recovery_attempts integer NOT NULL DEFAULT 0);
    CREATE INDEX workflow_runs_status ON workflow_runs (status, workflow);
    CREATE TABLE workflow_steps (seq bigint GENERATED ALWAYS AS IDENTITY, run_id text NOT NULL,
        step_id text NOT NULL, state text NOT NULL, output text, task_id text,
        PRIMARY KEY (run_id, step_id));
    CREATE TABLE durable_promises (id text PRIMARY KEY, state text NOT NULL, data text,
        timeout_at double precision NOT NULL, ikc text, iku text, tags text NOT NULL,
        created_at double precision NOT NULL, settled_at double precision);
    CREATE INDEX durable_promises_pending ON durable_promises (state, timeout_at);
    CREATE TABLE durable_tasks (id text PRIMARY KEY, state text NOT NULL,
        version bigint NOT NULL, target text, pid text, ttl double precision,
        lease_expires_at double precision, timeout_at double precision);
    CREATE INDEX durable_tasks_claim ON durable_tasks (state, target, id);
    CREATE INDEX durable_tasks_lease ON durable_tasks (state, lease_expires_at);
    CREATE INDEX durable_tasks_retry ON durable_tasks (state, timeout_at);
    CREATE TABLE durable_callbacks (promise_id text NOT NULL, task_id text NOT NULL,
        seq bigint GENERATED ALWAYS AS IDENTITY, PRIMARY KEY (promise_id, task_id));
    CREATE INDEX durable_callbacks_task ON durable_callbacks (task_id);
    """,
    # 2: the durable indexes hold only the rows their queries look for (a claim:
    # pending tasks by target; time: pending tasks' retries, acquired tasks' leases,
    # pending promises' timeouts). A task's claim then writes one index entry
    # besides its key's, its fulfil none besides its key's; each wrote four before.
    """
    DROP INDEX durable_tasks_claim;
    DROP INDEX durable_tasks_lease;
    DROP INDEX durable_tasks_retry;
    DROP INDEX durable_promises_pending;
    CREATE INDEX durable_tasks_claim ON durable_tasks (target, id) WHERE state = 'pending';
    CREATE INDEX durable_tasks_lease ON durable_tasks (lease_expires_at)
        WHERE state = 'acquired';
    CREATE INDEX durable_tasks_retry ON durable_tasks (timeout_at) WHERE state = 'pending';
    CREATE INDEX durable_promises_pending ON durable_promises (timeout_at)
        WHERE state = 'pending';
    """,
)
#: What PostgreSQL's shared migrations (`SHARED_STEPS`) ran first, by version: 7 made
#: an index of the failed executions (dead letters), for a requeue of them all (the
#: live index skips them); 8 dropped it (the status index's range now).
_FIRST_RUN = {
    7: "CREATE INDEX executions_failed ON executions (seq) WHERE status = 'failed';",
    8: "DROP INDEX executions_failed;",
}
MIGRATIONS = tuple(
    migration(POSTGRES_SCHEMA, v, _FIRST_RUN.get(v, "") + sql)
    for v, sql in enumerate((*_STEPS, *SHARED_STEPS.values()), 1)
)
SCHEMA_VERSION = len(MIGRATIONS)

#: The advisory lock (one 64-bit key) a migration holds: "trioexec" in ASCII.
_MIGRATION_LOCK = 0x7472696F65786563


def schema_version(conn: psycopg.Connection[tuple[object, ...]], where: str, schema: str) -> int:
    """The schema version found in ``schema`` (0: no trioexec schema yet). Refuses a
    schema holding foreign tables, or written by a newer trioexec."""
    query = "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
    tables = [row[0] for row in conn.execute(f"{query} ORDER BY table_name", (schema,))]
    if tables and "trioexec_meta" not in tables:
        raise StoreError(
            f"{where}: schema {schema!r} is not trioexec's (it has tables "
            f"{', '.join(map(str, tables[:5]))}, but no trioexec_meta); refusing to touch it"
        )
    if not tables:
        return 0
    row = conn.execute("SELECT value FROM trioexec_meta WHERE key = 'schema_version'").fetchone()
    return version_of(where, 0 if row is None else row[0], SCHEMA_VERSION)


def migrate(conn: psycopg.Connection[tuple[object, ...]], where: str, schema: str) -> None:
    """Create or migrate the schema, in one transaction under an advisory lock (many
    processes opening a new database: one migrates, the others then find it done)."""
    from psycopg import sql

    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        found = schema_version(conn, where, schema)  # again, under the lock
        for step in MIGRATIONS[found:]:
            conn.execute(step.encode())
        if found < SCHEMA_VERSION:
            conn.execute(
                "INSERT INTO trioexec_meta (key, value) VALUES ('schema_version', %s)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )
