"""The PostgreSQL store's schema: versioned migrations, applied under an advisory
lock so that many processes opening a new database migrate it once, and the check
that a schema is trioexec's and not from a newer trioexec."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._columns import DEDUPE_BY_KEY, DEDUPE_LIVE, POSTGRES_SCHEMA, add_columns, added, version_of
from .._errors import StoreError

if TYPE_CHECKING:
    import psycopg


#: Migration n (1-based) brings the schema from version n - 1 to n: the executions
#: columns of version n (`_columns.EXECUTIONS`), then these statements. Times are
#: seconds since the epoch (double precision), as in the SQLite store; ``seq``
#: keeps submission order (SQLite's rowid).
_STEPS = (
    """
    CREATE TABLE trioexec_meta (key text PRIMARY KEY, value text NOT NULL);
    CREATE TABLE executions (seq bigint GENERATED ALWAYS AS IDENTITY, """
    + ", ".join(c.spelled(POSTGRES_SCHEMA) for c in added(POSTGRES_SCHEMA, 1))
    + """);
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
    # 3: admission by key: each execution's key and priority as submitted (rows
    # from before: NULL key, priority 0; a constant default rewrites no row). The
    # index holds keyed rows only: a keyless insert writes no entry to it.
    """
    CREATE INDEX executions_key ON executions (key, seq) WHERE key IS NOT NULL;
    """,
    # 4: key limits shared by the executors on this schema: the slots of a key
    # each owner holds (valid while its lease is), and each key's token bucket.
    """
    CREATE TABLE key_holds (key text NOT NULL, owner text NOT NULL, held integer NOT NULL,
        wanted integer NOT NULL, since double precision, PRIMARY KEY (key, owner));
    CREATE INDEX key_holds_owner ON key_holds (owner);
    CREATE TABLE key_buckets (key text PRIMARY KEY, tokens double precision NOT NULL,
        stamp double precision NOT NULL);
    """,  # 5: schedules (`Executor.schedule`): each one's definition as last saved, and
    # one row per occurrence claimed: the primary key lets one executor win it.
    """
    CREATE TABLE schedules (schedule_id text PRIMARY KEY, cron text NOT NULL, tz text NOT NULL,
        name text NOT NULL, next_run double precision, last_run double precision);
    CREATE TABLE schedule_runs (schedule_id text NOT NULL, at double precision NOT NULL,
        owner text NOT NULL, PRIMARY KEY (schedule_id, at));
    """,  # 6: why a live execution is not running (`ExecutionRecord.waiting_on`);
    # rows written before it was recorded have it NULL.
    "",
    # 7: operator commands: the traceback of the exception that ended an
    # execution (dead letters show it); the append-only log of every command
    # (executors poll it by seq; commands take turns under an advisory lock, so
    # seq order is commit order); what is paused now; the failed executions
    # (dead letters), for a requeue of them all (the live index skips them).
    """
    CREATE TABLE commands (seq bigserial PRIMARY KEY, kind text NOT NULL, name text, key text,
        task_id text, who text NOT NULL, at double precision NOT NULL, changed boolean NOT NULL,
        detail text NOT NULL);
    CREATE TABLE pauses (kind text NOT NULL, value text NOT NULL, who text NOT NULL,
        at double precision NOT NULL, PRIMARY KEY (kind, value));
    CREATE INDEX executions_failed ON executions (seq) WHERE status = 'failed';
    """,
    # 8: the dashboard's reads (`trioexec._store._browse`): pages under a status
    # or name filter in submission order; the live executions with every column
    # their filters and order read (a page from the index alone; finished rows
    # are left out of it); the failed ones of a name (dead letters); the
    # executions finished since a time, counted from the index; a task's
    # commands. Each run records its steps' graph (JSON; NULL before); the runs
    # page walks them newest first. The failed rows' index of 7 is the status
    # index's range now.
    """
    DROP INDEX executions_failed;
    CREATE INDEX executions_by_status ON executions (status, seq);
    CREATE INDEX executions_name ON executions (name, seq);
    CREATE INDEX executions_failed_name ON executions (name, seq) WHERE status = 'failed';
    CREATE INDEX executions_live_rows
        ON executions (status, sub_status, submitted_at, deferred_since, seq)
        INCLUDE (waiting_on, name, key, run_id) WHERE status IN ('pending', 'running');
    CREATE INDEX executions_finished ON executions (finished_at, status)
        WHERE finished_at IS NOT NULL;
    CREATE INDEX commands_task ON commands (task_id, seq) WHERE task_id IS NOT NULL;
    ALTER TABLE workflow_runs ADD COLUMN graph text;
    CREATE INDEX workflow_runs_created ON workflow_runs (created_at, run_id);
    """,
    # 9: commands apply in the order they were issued (`_control.pause_turn`): a
    # target keeps its row once resumed (paused false), with the issue time of
    # the latest pause or resume applied to it; old commands and resumed
    # targets are deleted as new commands are recorded (a range of the key).
    """
    ALTER TABLE pauses ADD COLUMN paused boolean NOT NULL DEFAULT true,
        ADD COLUMN latest double precision NOT NULL DEFAULT 0;
    UPDATE pauses SET latest = at;
    """,
    # 10: when each key's bucket is full again (a full bucket is the same as no
    # row): rounds delete the rows past it, earliest first, from this index.
    # Rows from before keep NULL (their key's rate is not known here) until
    # their key is settled again.
    """
    ALTER TABLE key_buckets ADD COLUMN full_at double precision;
    CREATE INDEX key_buckets_full ON key_buckets (full_at, key) WHERE full_at IS NOT NULL;
    """,
    # 11: a task's value kept as JSON with its completion (`keep_results`); NULL
    # when none was kept, as in every row before.
    "",
    # 12: `submit(dedupe_key=...)`: one live execution per key (the store refuses
    # a second), and a key's executions by when they finished (is one recent?).
    f"""
    CREATE UNIQUE INDEX executions_dedupe_live ON executions {DEDUPE_LIVE};
    CREATE INDEX executions_dedupe ON executions {DEDUPE_BY_KEY};
    """,
    # 13: the task tree: the task that submitted an execution, and its children by it.
    # (in submission order, as SQLite's rowid keeps them: a page of them is a range)
    "CREATE INDEX executions_children ON executions (parent_id, seq) WHERE parent_id IS NOT NULL;",
)
MIGRATIONS = tuple(add_columns(POSTGRES_SCHEMA, v) + sql for v, sql in enumerate(_STEPS, 1))
SCHEMA_VERSION = len(MIGRATIONS)

#: The advisory lock (one 64-bit key) a migration holds: "trioexec" in ASCII.
_MIGRATION_LOCK = 0x7472696F65786563


def schema_version(conn: psycopg.Connection[tuple[object, ...]], where: str, schema: str) -> int:
    """The schema version found in ``schema`` (0: no trioexec schema yet). Refuses a
    schema holding foreign tables, or written by a newer trioexec."""
    tables = [
        row[0]
        for row in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
            " ORDER BY table_name",
            (schema,),
        )
    ]
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
        for version in range(found + 1, SCHEMA_VERSION + 1):
            conn.execute(MIGRATIONS[version - 1].encode())
        if found < SCHEMA_VERSION:
            conn.execute(
                "INSERT INTO trioexec_meta (key, value) VALUES ('schema_version', %s)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )
