"""`SQLiteStore`: executions in a SQLite file (WAL), schema by sqlite-utils migrations.

The only module that imports ``sqlite3``/``sqlite_utils``. Every ``sqlite3.Error``
becomes a `StoreError` naming the file, here and nowhere else.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, final

import sqlite_utils
from sqlite_utils.migrations import Migrations

from .._errors import StoreError
from .._records import ExecutionRecord, SubStatus, TaskStatus
from ._base import (
    LIVE,
    ORPHANED,
    RUN_KINDS,
    RUN_ORPHANED,
    SUPERSEDED,
    Change,
    Recovery,
    RunRecord,
    RunRecovery,
    abandoned_error,
    seconds,
)

SCHEMA_VERSION = 4
MIGRATIONS = Migrations("trioexec")


@MIGRATIONS(name="0001_initial")
def _initial(db: sqlite_utils.Database) -> None:
    db["trioexec_meta"].create({"key": str, "value": str}, pk="key")  # type: ignore[union-attr]
    db["executions"].create(  # type: ignore[union-attr]
        {
            "task_id": str,
            "name": str,
            "run_id": str,
            "status": str,
            "sub_status": str,
            "attempt": int,
            "recovery_attempts": int,
            "owner": str,
            "version": int,
            "submitted_at": float,
            "started_at": float,
            "finished_at": float,
            "deferred_since": float,
            "error": str,
            "spec_id": str,
            "args": str,
        },
        pk="task_id",
        not_null={"name", "status", "attempt", "recovery_attempts", "version"},
        defaults={"attempt": 0, "recovery_attempts": 0, "version": 1},
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


@MIGRATIONS(name="0002_workflow_runs")
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


@MIGRATIONS(name="0003_durable")
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


@MIGRATIONS(name="0004_run_recovery_attempts")
def _run_recovery_attempts(db: sqlite_utils.Database) -> None:
    db.execute("ALTER TABLE workflow_runs ADD COLUMN recovery_attempts INTEGER NOT NULL DEFAULT 0")
    db.execute("UPDATE trioexec_meta SET value = '4' WHERE key = 'schema_version'")


_COLUMNS = (
    "e.task_id, e.name, e.run_id, e.status, e.sub_status, e.attempt, e.recovery_attempts,"
    " e.owner, o.lease_expires_at, e.version, e.submitted_at, e.started_at, e.finished_at,"
    " e.deferred_since, e.error, e.spec_id, e.args"
)
_SELECT = f"SELECT {_COLUMNS} FROM executions e LEFT JOIN owners o ON o.owner = e.owner"


def _record(row: tuple[Any, ...]) -> ExecutionRecord:
    return ExecutionRecord(
        task_id=row[0],
        name=row[1],
        run_id=row[2],
        status=TaskStatus(row[3]),
        sub_status=None if row[4] is None else SubStatus(row[4]),
        attempt=row[5],
        recovery_attempts=row[6],
        owner=row[7],
        lease_expires_at=row[8],
        version=row[9],
        submitted_at=row[10],
        started_at=row[11],
        finished_at=row[12],
        deferred_since=row[13],
        error=row[14],
        spec_id=row[15],
        args=row[16],
    )


@final
class SQLiteStore:
    """Executions in a SQLite file, shared safely by several processes.

    WAL journal, ``synchronous=NORMAL`` (a commit survives a crash of the process;
    the last commits before a power cut may not), ``busy_timeout`` 10 s. The schema is
    created or migrated on open.

    Args:
      path: the database file (created if missing).
      clock: the wall clock for persisted times.
      inline: write from the Trio thread instead of a worker thread. For tests
        under Trio's autojump clock, where threads would stall virtual time.

    Raises:
      StoreError: naming the path, if the file is corrupt, not a SQLite database,
        a SQLite database that is not trioexec's ("foreign"), written by a newer
        trioexec, or cannot be opened (for example a read-only directory).

    Example::

        with trioexec.SQLiteStore("runs.db") as store:
            async with trioexec.open_executor(store=store) as ex:
                ...
            print(store.executions(sub_status="deferred"))
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        inline: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.clock = clock
        self.inline = inline
        self._write_conn: sqlite3.Connection | None = None
        self._read_conn: sqlite3.Connection | None = None
        with self._errors("cannot open"):
            self._write_conn = self._connect()
            db = sqlite_utils.Database(self._write_conn)
            self._check(db)  # before anything writes: a foreign file is left as it was
            self._write_conn.execute("PRAGMA journal_mode=WAL")
            self._migrate(db)
            self._read_conn = self._connect()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=10.0
        )
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _check(self, db: sqlite_utils.Database) -> None:
        """Refuse a foreign or newer file (reads only)."""
        tables = set(db.table_names())
        if tables and "trioexec_meta" not in tables:
            shown = ", ".join(sorted(tables)[:5])
            raise StoreError(
                f"{self.path}: not a trioexec database (it has tables {shown}, "
                "but no trioexec schema); refusing to touch it"
            )
        if "trioexec_meta" in tables:
            row = db.conn.execute(
                "SELECT value FROM trioexec_meta WHERE key = 'schema_version'"
            ).fetchone()
            found = int(row[0]) if row else 0
            if found > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path}: written by a newer trioexec (schema version {found}; "
                    f"this trioexec knows up to {SCHEMA_VERSION})"
                )
            known = {m.name for m in MIGRATIONS._migrations}
            unknown = {m.name for m in MIGRATIONS.applied(db)} - known
            if unknown:
                raise StoreError(
                    f"{self.path}: written by a newer trioexec "
                    f"(unknown migrations {sorted(unknown)})"
                )

    def _migrate(self, db: sqlite_utils.Database) -> None:
        conn = db.conn
        conn.execute("BEGIN IMMEDIATE")  # two processes opening a new file: one migrates
        try:
            self._check(db)  # again, under the lock
            MIGRATIONS.apply(db)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except StoreError:
            self._close_quietly()
            raise
        except sqlite3.DatabaseError as exc:
            self._close_quietly()
            message = str(exc)
            if "not a database" in message or "malformed" in message:
                raise StoreError(
                    f"{self.path}: not a usable SQLite database (corrupt?): {message}"
                ) from None
            raise StoreError(f"{self.path}: {doing}: {message}") from None

    @contextlib.contextmanager
    def _using(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {doing}: {exc}") from None

    def _close_quietly(self) -> None:
        for conn in (self._write_conn, self._read_conn):
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
        self._write_conn = self._read_conn = None

    @property
    def _w(self) -> sqlite3.Connection:
        if self._write_conn is None:
            raise StoreError(f"{self.path}: the store is closed")
        return self._write_conn

    @property
    def _r(self) -> sqlite3.Connection:
        if self._read_conn is None:
            raise StoreError(f"{self.path}: the store is closed")
        return self._read_conn

    @contextlib.contextmanager
    def _transaction(self, doing: str) -> Iterator[sqlite3.Connection]:
        conn = self._w
        with self._using(doing):
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    # ------------------------------------------------------------------ writes

    def write(self, changes: Sequence[Change]) -> list[str]:
        fenced: list[str] = []
        with self._transaction("write") as conn:
            # An execution first submitted in this batch is folded in memory (the
            # same transition rules as MemoryStore) and inserted once, final state
            # and all: under load most batches hold submit, start and finish of
            # the same short tasks.
            submitted = [c[1] for c in changes if c[0] == "submit"]
            existing = self._existing(conn, submitted) if submitted else set()
            fresh: dict[object, list[object]] = {}  # rows in _ROW_COLUMNS order
            refused: set[object] = set()  # ids whose submit was refused: the rest too
            for change in changes:
                task_id = change[1]
                kind = change[0]
                if kind in RUN_KINDS:
                    if not _write_run(conn, change):
                        fenced.append(str(task_id))
                elif kind == "submit":
                    if task_id in existing or task_id in fresh:
                        fenced.append(str(task_id))
                        refused.add(task_id)
                    else:
                        _, _, version, name, run_id, spec_id, args, owner, submitted_at = change
                        fresh[task_id] = [
                            task_id, name, run_id, TaskStatus.PENDING, None, 0, 0, owner,
                            version, submitted_at, None, None, None, None, spec_id, args,
                        ]  # fmt: skip
                elif task_id in refused:
                    fenced.append(str(task_id))
                elif task_id in fresh:
                    if not _fold(fresh[task_id], change):
                        fenced.append(str(task_id))
                elif conn.execute(_UPDATES[str(kind)], _update_args(change)).rowcount != 1:
                    fenced.append(str(task_id))
            if fresh:
                # One statement for all the rows: sqlite3's executemany would let
                # go of the GIL and wait to get it back for every row, while the
                # Trio thread wants it (statuses are StrEnums: JSON text).
                if _JSON_ARROW:
                    conn.execute(_INSERT_ROWS, (json.dumps(list(fresh.values())),))
                else:
                    conn.executemany(_INSERT_EACH, fresh.values())
        return fenced

    @staticmethod
    def _existing(conn: sqlite3.Connection, task_ids: list[object]) -> set[object]:
        found: set[object] = set()
        for start in range(0, len(task_ids), 500):
            chunk = task_ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            found.update(
                row[0]
                for row in conn.execute(
                    f"SELECT task_id FROM executions WHERE task_id IN ({marks})", chunk
                )
            )
        return found

    def claim_runs(
        self,
        owner: str,
        now: float,
        workflows: Collection[str],
        max_recovery_attempts: int,
    ) -> RunRecovery:
        known = set(workflows)
        claimed: list[RunRecord] = []
        orphaned: list[RunRecord] = []
        abandoned: list[RunRecord] = []
        with self._transaction("claim workflow runs") as conn:
            rows = conn.execute(
                "SELECT r.run_id, r.workflow, r.recovery_attempts FROM workflow_runs r"
                " LEFT JOIN owners o ON o.owner = r.owner"
                " WHERE r.status = 'running' AND r.owner IS NOT ?"
                " AND (o.lease_expires_at IS NULL OR o.lease_expires_at < ?)"
                " ORDER BY r.rowid",
                (owner, now),
            ).fetchall()
            for run_id, workflow, attempts in rows:
                if workflow not in known or attempts >= max_recovery_attempts:
                    error = RUN_ORPHANED if workflow not in known else abandoned_error(attempts)
                    conn.execute(
                        "UPDATE workflow_runs SET status = 'failed', finished_at = ?"
                        " WHERE run_id = ?",
                        (now, run_id),
                    )
                    self._end_steps(conn, run_id, "failed", now, error)
                    (orphaned if workflow not in known else abandoned).append(
                        self._run(conn, run_id)
                    )
                    continue
                conn.execute(
                    "UPDATE workflow_runs SET owner = ?, recovery_attempts = recovery_attempts + 1"
                    " WHERE run_id = ?",
                    (owner, run_id),
                )
                self._end_steps(conn, run_id, "cancelled", now, SUPERSEDED)
                claimed.append(self._run(conn, run_id))
        return RunRecovery(claimed, orphaned, abandoned)

    @staticmethod
    def _end_steps(
        conn: sqlite3.Connection, run_id: str, status: str, now: float, error: str
    ) -> None:
        conn.execute(
            "UPDATE executions SET status = ?, sub_status = NULL, deferred_since = NULL,"
            " finished_at = ?, error = ? WHERE run_id = ? AND status IN ('pending', 'running')",
            (status, now, error, run_id),
        )

    @staticmethod
    def _run(conn: sqlite3.Connection, run_id: str) -> RunRecord:
        row = conn.execute(
            "SELECT run_id, workflow, status, context, owner, created_at, finished_at,"
            " recovery_attempts FROM workflow_runs WHERE run_id = ?",
            (run_id,),
        ).fetchone()
        steps = {
            step_id: (state, output)
            for step_id, state, output in conn.execute(
                "SELECT step_id, state, output FROM workflow_steps WHERE run_id = ? ORDER BY rowid",
                (run_id,),
            )
        }
        return RunRecord(
            run_id=row[0],
            workflow=row[1],
            status=row[2],
            context=row[3],
            owner=row[4],
            created_at=row[5],
            finished_at=row[6],
            steps=steps,
            recovery_attempts=row[7],
        )

    def runs_taken_over(self, owner: str, run_ids: Collection[str]) -> list[str]:
        ids = list(run_ids)
        lost: list[str] = []
        with self._using("check run ownership"):
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                lost.extend(
                    row[0]
                    for row in self._r.execute(
                        f"SELECT run_id FROM workflow_runs WHERE run_id IN ({marks})"
                        " AND owner IS NOT ?",
                        (*chunk, owner),
                    )
                )
        return lost

    def run(self, run_id: str) -> RunRecord | None:
        with self._using("query workflow run"):
            found = self._r.execute(
                "SELECT 1 FROM workflow_runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            return None if found is None else self._run(self._r, run_id)

    def runs(self, *, status: str | None = None) -> list[RunRecord]:
        with self._using("query workflow runs"):
            sql = "SELECT run_id FROM workflow_runs"
            params: tuple[object, ...] = ()
            if status is not None:
                sql += " WHERE status = ?"
                params = (status,)
            ids = [row[0] for row in self._r.execute(sql + " ORDER BY rowid", params)]
            return [self._run(self._r, run_id) for run_id in ids]

    def heartbeat(self, owner: str, lease_expires_at: float) -> None:
        with self._transaction("heartbeat") as conn:
            conn.execute(
                "INSERT INTO owners (owner, lease_expires_at) VALUES (?, ?)"
                " ON CONFLICT (owner) DO UPDATE SET lease_expires_at = excluded.lease_expires_at",
                (owner, lease_expires_at),
            )

    def release_owner(self, owner: str) -> None:
        with self._transaction("release owner") as conn:
            conn.execute("DELETE FROM owners WHERE owner = ?", (owner,))

    def taken_over(self, owner: str, live: dict[str, int]) -> list[str]:
        if not live:
            return []
        with self._using("check ownership"):
            mine = dict(
                self._r.execute(
                    "SELECT task_id, version FROM executions"
                    " WHERE owner = ? AND status IN ('pending', 'running')",
                    (owner,),
                ).fetchall()
            )
            lost = [t for t, v in live.items() if mine.get(t, v) != v]
            missing = [t for t in live if t not in mine]
            if missing:
                # Either not flushed yet (fine) or taken by someone else (lost).
                for start in range(0, len(missing), 500):
                    chunk = missing[start : start + 500]
                    marks = ",".join("?" * len(chunk))
                    lost.extend(
                        row[0]
                        for row in self._r.execute(
                            f"SELECT task_id FROM executions WHERE task_id IN ({marks})",
                            chunk,
                        )
                    )
        return lost

    def recover(
        self,
        owner: str,
        now: float,
        recreatable: Callable[[ExecutionRecord], bool],
        max_recovery_attempts: int,
        limit: int | None = None,
    ) -> Recovery:
        claimed: list[ExecutionRecord] = []
        orphaned: list[ExecutionRecord] = []
        abandoned: list[ExecutionRecord] = []
        with self._transaction("recover") as conn:
            rows = conn.execute(
                f"{_SELECT} WHERE e.status IN ('pending', 'running') AND e.owner IS NOT ?"
                " AND e.run_id IS NULL"  # a workflow step is resumed with its run
                " AND (o.lease_expires_at IS NULL OR o.lease_expires_at < ?)"
                " ORDER BY e.rowid",
                (owner, now),
            ).fetchall()
            for row in rows:
                record = _record(row)
                if record.recovery_attempts >= max_recovery_attempts:
                    error = abandoned_error(record.recovery_attempts)
                    self._fail(conn, record, now, error)
                    abandoned.append(self._one(conn, record.task_id))
                elif not recreatable(record):
                    self._fail(conn, record, now, ORPHANED)
                    orphaned.append(self._one(conn, record.task_id))
                elif limit is None or len(claimed) < limit:
                    conn.execute(
                        "UPDATE executions SET owner = ?, version = version + 1,"
                        " status = 'pending', sub_status = NULL, deferred_since = NULL,"
                        " recovery_attempts = recovery_attempts + 1"
                        " WHERE task_id = ? AND version = ?",
                        (owner, record.task_id, record.version),
                    )
                    claimed.append(self._one(conn, record.task_id))
        return Recovery(claimed, orphaned, abandoned)

    @staticmethod
    def _fail(conn: sqlite3.Connection, record: ExecutionRecord, now: float, error: str) -> None:
        conn.execute(
            "UPDATE executions SET status = 'failed', sub_status = NULL, deferred_since = NULL,"
            " finished_at = ?, error = ? WHERE task_id = ? AND version = ?",
            (now, error, record.task_id, record.version),
        )

    @staticmethod
    def _one(conn: sqlite3.Connection, task_id: str) -> ExecutionRecord:
        return _record(conn.execute(f"{_SELECT} WHERE e.task_id = ?", (task_id,)).fetchone())

    # ------------------------------------------------------------------ reads

    def executions(
        self,
        *,
        status: TaskStatus | str | None = None,
        sub_status: SubStatus | str | None = None,
        deferred_longer_than: float | datetime.timedelta | None = None,
        run_id: str | None = None,
    ) -> list[ExecutionRecord]:
        where: list[str] = []
        params: list[object] = []
        if status is not None:
            where.append("e.status = ?")
            params.append(TaskStatus(status).value)
        if sub_status is not None:
            where.append("e.sub_status = ?")
            params.append(SubStatus(sub_status).value)
        if deferred_longer_than is not None:
            where.append("e.sub_status = 'deferred' AND e.deferred_since <= ?")
            params.append(self.clock() - seconds(deferred_longer_than))
        if run_id is not None:
            where.append("e.run_id = ?")
            params.append(run_id)
        sql = _SELECT + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY e.rowid"
        with self._using("query executions"):
            return [_record(row) for row in self._r.execute(sql, params)]

    def execution(self, task_id: str) -> ExecutionRecord | None:
        with self._using("query execution"):
            row = self._r.execute(f"{_SELECT} WHERE e.task_id = ?", (task_id,)).fetchone()
        return None if row is None else _record(row)

    def close(self) -> None:
        """Close both connections; idempotent."""
        self._close_quietly()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _durable_connection(self) -> sqlite3.Connection:
        """A connection of its own for `trioexec.durable` (same file, same schema)."""
        with self._errors("cannot open"):
            return self._connect()

    def __repr__(self) -> str:
        return f"<SQLiteStore {self.path!r}>"


def _write_run(conn: sqlite3.Connection, change: Change) -> bool:
    """Apply a run change; False if fenced (the run is not the writer's)."""
    kind = change[0]
    if kind == "run":
        _, run_id, _, workflow, context, owner, created_at = change
        conn.execute(
            "INSERT OR IGNORE INTO workflow_runs (run_id, workflow, status, context, owner,"
            " created_at) VALUES (?, ?, 'running', ?, ?, ?)",
            (run_id, workflow, context, owner, created_at),
        )
        return True
    owned = conn.execute(
        "SELECT 1 FROM workflow_runs WHERE run_id = ? AND owner = ?", (change[1], change[2])
    ).fetchone()
    if owned is None:
        return False
    if kind == "step":
        _, run_id, _, step_id, state, output, task_id = change
        conn.execute(
            "INSERT INTO workflow_steps (run_id, step_id, state, output, task_id)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id, step_id) DO UPDATE SET"
            " state = excluded.state, output = excluded.output, task_id = excluded.task_id",
            (run_id, step_id, _value(state), output, task_id),
        )
    else:
        conn.execute(
            "UPDATE workflow_runs SET status = ?, finished_at = ? WHERE run_id = ?",
            (_value(change[3]), change[4], change[1]),
        )
    return True


def _fold(row: list[object], change: Change) -> bool:
    """`apply_change` for a row not yet inserted, kept as a list in `_ROW_COLUMNS`
    order (cheaper to build than a dict; the store model test holds the two to
    the same rules)."""
    if row[8] != change[2] or row[3] not in LIVE:
        return False
    kind = change[0]
    if kind == "start":
        row[3] = TaskStatus.RUNNING
        row[4] = SubStatus.ACTIVE
        row[5] = change[3]
        if row[10] is None:
            row[10] = change[4]
    elif kind == "finish":
        row[3] = change[3]
        row[4] = row[12] = None
        row[11] = change[4]
        row[13] = change[5]
    elif kind == "sub":
        if row[3] is not TaskStatus.RUNNING:
            return False  # a sub-status exists only while running
        row[4] = change[3]
        row[12] = change[4]
    elif kind == "retry":
        row[3] = TaskStatus.PENDING
        row[4] = row[12] = None
        row[13] = change[3]
    else:  # pragma: no cover - a bug in the executor
        raise ValueError(f"unknown change {change!r}")
    return True


def _value(v: object) -> object:
    return getattr(v, "value", v)


_ROW_COLUMNS = (
    "task_id",
    "name",
    "run_id",
    "status",
    "sub_status",
    "attempt",
    "recovery_attempts",
    "owner",
    "version",
    "submitted_at",
    "started_at",
    "finished_at",
    "deferred_since",
    "error",
    "spec_id",
    "args",
)
_INSERT_ROWS = (
    f"INSERT INTO executions ({', '.join(_ROW_COLUMNS)}) SELECT "
    + ", ".join(f"value ->> {i}" for i in range(len(_ROW_COLUMNS)))
    + " FROM json_each(?)"
)
_INSERT_EACH = (
    f"INSERT INTO executions ({', '.join(_ROW_COLUMNS)})"
    f" VALUES ({', '.join('?' * len(_ROW_COLUMNS))})"
)
_JSON_ARROW = sqlite3.sqlite_version_info >= (3, 38)  # the ->> operator
_GUARD = " WHERE task_id = ? AND version = ? AND status IN ('pending', 'running')"
_UPDATES = {
    "start": "UPDATE executions SET status = 'running', sub_status = 'active', attempt = ?,"
    " started_at = coalesce(started_at, ?)" + _GUARD,
    "sub": "UPDATE executions SET sub_status = ?, deferred_since = ?"
    " WHERE task_id = ? AND version = ? AND status = 'running'",
    "retry": "UPDATE executions SET status = 'pending', sub_status = NULL,"
    " deferred_since = NULL, error = ?" + _GUARD,
    "finish": "UPDATE executions SET status = ?, sub_status = NULL, deferred_since = NULL,"
    " finished_at = ?, error = ?" + _GUARD,
}


def _update_args(change: Change) -> tuple[object, ...]:
    """The parameters of a non-submit change's UPDATE: its fields, then the guard."""
    return (*(_value(v) for v in change[3:]), change[1], change[2])
