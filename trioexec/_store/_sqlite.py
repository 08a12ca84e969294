"""`SQLiteStore`: executions in a SQLite file (WAL), schema by sqlite-utils migrations.

The SQLite store is this module (the queries), ``_sqlite_file`` (the connections,
and the one place a ``sqlite3.Error`` becomes a `StoreError` naming the file) and
``_sqlite_schema`` (the migrations): the only modules that import ``sqlite3`` or
``sqlite_utils``, with the durable tables' SQLite backend.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Sequence
from typing import final

import attrs

from .._errors import StoreError
from .._records import ExecutionRecord, SubStatus, TaskStatus, stored_float
from ._base import (
    ORPHANED,
    ROW_COLUMNS,
    RUN_KINDS,
    RUN_ORPHANED,
    SCHEDULE_FIELDS,
    SUPERSEDED,
    Change,
    Order,
    Recovery,
    RunRecord,
    RunRecovery,
    ScheduleRecord,
    abandoned_error,
    check_query,
    fold_batch,
    full_change,
    graph_of,
    matches_some,
    run_graph,
    schedule_of,
)
from ._control import SQLControl
from ._durable_tables import SQLiteTables
from ._key_ledger import KeyGrant, KeyRequest
from ._sql import SELECT_RECORDS, filter_clause, prune_buckets, record_of, settle_key, write_lease
from ._sqlite_file import READ_ONLY_BUSY_TIMEOUT, WRITE_BUSY_TIMEOUT, SQLiteFile
from ._verdict import Verdict, claimed_attempts, recovery_verdict

#: `ExecutionRecord`'s fields: the executions table's columns, and the owner's lease.
_SELECT = SELECT_RECORDS
#: `RunRecord`'s fields but its steps: the workflow_runs table's columns.
_RUN_COLUMNS = tuple(f.name for f in attrs.fields(RunRecord) if f.name != "steps")
#: A list passed as one JSON parameter (any length: no limit on ``?`` to mind).
_JSON_LIST = "(SELECT value FROM json_each(?))"


@final
class SQLiteStore(SQLControl):
    """Executions in a SQLite file, shared safely by several processes, and by
    several executors and threads of one process.

    WAL journal, ``synchronous=NORMAL`` (a commit survives a crash of the process;
    the last commits before a power cut may not). The schema is created or migrated
    on open. Writes (group-committed batches, heartbeats, recovery, the durable tables)
    take the store's lock, so they never interleave; each thread reads through a
    connection of its own, so a read (`execution`, `executions`, `run`, ...) never
    waits behind a write batch another thread is committing. Before every write
    transaction the store checks that ``path`` still names the file it opened: a
    database deleted or replaced underneath raises `StoreError` instead of losing
    the writes into an unlinked file.

    Args:
      path: the database file (created if missing, unless ``read_only``).
      clock: the wall clock for persisted times.
      inline: write from the Trio thread instead of a worker thread. For tests
        under Trio's autojump clock, where threads would stall virtual time.
      read_only: a view that never writes: the file is opened with ``mode=ro``; it
        is never created, migrated, switched to WAL or write-locked, and reading
        works while another process holds the write lock. A file that does not
        exist, is empty, or has no trioexec schema raises `StoreError`; so does a
        file written by an older trioexec (its schema needs migrating: open it once
        read-write first). Every write method raises ``StoreError("<path>: opened
        read-only")``.
      busy_timeout: seconds to wait for another connection's lock before raising
        `StoreError` (default 10 s; 1 s when ``read_only``).

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

    _db: SQLiteFile

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        inline: bool = False,
        read_only: bool = False,
        busy_timeout: float | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.clock = clock
        self.inline = inline
        self.read_only = read_only
        if busy_timeout is None:
            busy_timeout = READ_ONLY_BUSY_TIMEOUT if read_only else WRITE_BUSY_TIMEOUT
        if isinstance(busy_timeout, bool) or not (
            isinstance(busy_timeout, int | float)
            and 0 <= stored_float("busy_timeout", busy_timeout) < math.inf
        ):
            raise ValueError(f"busy_timeout must be seconds >= 0, got {busy_timeout!r}")
        self._db = SQLiteFile(self.path, read_only=read_only, busy_timeout=float(busy_timeout))

    # ------------------------------------------------------------------ writes

    def write(self, changes: Sequence[Change]) -> list[str]:
        with self._db.transaction("write") as conn:
            submitted = [c[1] for c in changes if c[0] == "row" or c[0] == "submit"]
            existing = self._existing(conn, submitted) if submitted else set()

            def update(change: Change) -> bool:
                if change[0] in RUN_KINDS:
                    return _write_run(conn, change)
                return conn.execute(_UPDATES[str(change[0])], _update_args(change)).rowcount == 1

            fresh, fenced = fold_batch(changes, existing, update)
            if fresh:
                # One statement for all the rows: sqlite3's executemany would let
                # go of the GIL and wait to get it back for every row, while the
                # Trio thread wants it (statuses are StrEnums: JSON text).
                if _JSON_ARROW:
                    conn.execute(_INSERT_ROWS, (json.dumps(fresh),))
                else:
                    conn.executemany(_INSERT_EACH, (row[1:] for row in fresh))
        return fenced

    @staticmethod
    def _existing(conn: sqlite3.Connection, task_ids: list[object]) -> set[object]:
        return {
            row[0]
            for row in conn.execute(
                f"SELECT task_id FROM executions WHERE task_id IN {_JSON_LIST}",
                (json.dumps(task_ids),),
            )
        }

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
        with self._db.transaction("claim workflow runs") as conn:
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
            " waiting_on = NULL, traceback = NULL,"
            " finished_at = ?, error = ? WHERE run_id = ? AND status IN ('pending', 'running')",
            (status, now, error, run_id),
        )

    @staticmethod
    def _run(conn: sqlite3.Connection, run_id: str) -> RunRecord:
        row = conn.execute(
            f"SELECT {', '.join(_RUN_COLUMNS)} FROM workflow_runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        steps = {
            step_id: (state, output)
            for step_id, state, output in conn.execute(
                "SELECT step_id, state, output FROM workflow_steps WHERE run_id = ? ORDER BY rowid",
                (run_id,),
            )
        }
        values = dict(zip(_RUN_COLUMNS, row, strict=True))
        return RunRecord(**{**values, "graph": graph_of(values["graph"])}, steps=steps)

    def runs_taken_over(self, owner: str, run_ids: Collection[str]) -> list[str]:
        with self._db.reading("check run ownership") as conn:
            return [
                row[0]
                for row in conn.execute(
                    f"SELECT run_id FROM workflow_runs WHERE run_id IN {_JSON_LIST}"
                    " AND owner IS NOT ?",
                    (json.dumps(list(run_ids)), owner),
                )
            ]

    def run(self, run_id: str) -> RunRecord | None:
        """One workflow run, or None: a few primary-key reads on this thread's read
        connection (never waits behind a write)."""
        if not matches_some(run_id=run_id):
            return None
        with self._db.reading("query workflow run", snapshot=True) as conn:
            found = conn.execute(
                "SELECT 1 FROM workflow_runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            return None if found is None else self._run(conn, run_id)

    def runs(self, *, status: str | None = None) -> list[RunRecord]:
        if not matches_some(status=status):
            return []
        with self._db.reading("query workflow runs", snapshot=True) as conn:
            sql = "SELECT run_id FROM workflow_runs"
            params: tuple[object, ...] = ()
            if status is not None:
                sql += " WHERE status = ?"
                params = (status,)
            ids = [row[0] for row in conn.execute(sql + " ORDER BY rowid", params)]
            return [self._run(conn, run_id) for run_id in ids]

    def heartbeat(self, owner: str, lease_expires_at: float) -> None:
        with self._db.transaction("heartbeat") as conn:
            write_lease(conn, "?", owner, lease_expires_at)

    def renew_lease(self, owner: str, lease: float) -> float:
        """`heartbeat` for ``lease`` seconds from when it is written (this
        store's clock, once its transaction has begun: not from a wait for the
        store's lock). Returns when it expires."""
        with self._db.transaction("heartbeat") as conn:
            at = self.clock() + lease
            write_lease(conn, "?", owner, at)
        return at

    def release_owner(self, owner: str) -> None:
        with self._db.transaction("release owner") as conn:
            conn.execute("DELETE FROM owners WHERE owner = ?", (owner,))
            conn.execute("DELETE FROM key_holds WHERE owner = ?", (owner,))

    def key_round(self, owner: str, requests: Sequence[KeyRequest]) -> list[KeyGrant]:
        grants: dict[int, KeyGrant] = {}
        with self._db.transaction("key round") as conn:
            now = self.clock()  # (under the write lock: rounds see the clock in order)
            for i in sorted(range(len(requests)), key=lambda i: requests[i].key):
                grants[i] = settle_key(conn, "?", owner, requests[i], now)
            prune_buckets(conn, "?", now, len(requests))
        return [grants[i] for i in range(len(requests))]

    def save_schedule(self, record: ScheduleRecord) -> ScheduleRecord | None:
        with self._db.transaction("save schedule") as conn:
            before = conn.execute(
                f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE schedule_id = ?",
                (record.schedule_id,),
            ).fetchone()
            conn.execute(
                f"INSERT INTO schedules ({_SCHEDULE_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL)"
                " ON CONFLICT (schedule_id) DO UPDATE SET cron = excluded.cron,"
                " tz = excluded.tz, name = excluded.name, next_run = excluded.next_run",
                (record.schedule_id, record.cron, record.tz, record.name, record.next_run),
            )
        return None if before is None else schedule_of(before)

    def schedules(self) -> list[ScheduleRecord]:
        with self._db.reading("query schedules") as conn:
            rows = conn.execute(
                f"SELECT {_SCHEDULE_COLUMNS} FROM schedules ORDER BY schedule_id"
            ).fetchall()
        return [schedule_of(row) for row in rows]

    def claim_occurrence(
        self, schedule_id: str, at: float, owner: str, next_run: float | None
    ) -> bool:
        with self._db.transaction("claim schedule occurrence") as conn:
            won = (
                conn.execute(
                    "INSERT INTO schedule_runs (schedule_id, at, owner) VALUES (?, ?, ?)"
                    " ON CONFLICT DO NOTHING",
                    (schedule_id, at, owner),
                ).rowcount
                == 1
            )
            if won:
                conn.execute(
                    "UPDATE schedules SET last_run = max(coalesce(last_run, ?), ?),"
                    " next_run = ? WHERE schedule_id = ?",
                    (at, at, next_run, schedule_id),
                )
        return won

    def release_occurrence(self, schedule_id: str, at: float, owner: str) -> bool:
        with self._db.transaction("release schedule occurrence") as conn:
            released = (
                int(
                    conn.execute(
                        "DELETE FROM schedule_runs WHERE schedule_id = ? AND at = ? AND owner = ?",
                        (schedule_id, at, owner),
                    ).rowcount
                )
                == 1
            )
            if released:
                conn.execute(
                    "UPDATE schedules SET last_run = (SELECT max(at) FROM schedule_runs"
                    " WHERE schedule_id = ?) WHERE schedule_id = ? AND last_run = ?",
                    (schedule_id, schedule_id, at),
                )
        return released

    def taken_over(self, owner: str, live: dict[str, int]) -> list[str]:
        if not live:
            return []
        with self._db.reading("check ownership") as conn:
            mine = dict(
                conn.execute(
                    "SELECT task_id, version FROM executions"
                    " WHERE owner = ? AND status IN ('pending', 'running')",
                    (owner,),
                ).fetchall()
            )
            lost = [t for t, v in live.items() if mine.get(t, v) != v]
            missing = [t for t in live if t not in mine]
            if missing:
                # Either not flushed yet (fine) or taken by someone else (lost).
                lost.extend(
                    row[0]
                    for row in conn.execute(
                        f"SELECT task_id FROM executions WHERE task_id IN {_JSON_LIST}",
                        (json.dumps(missing),),
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
        with self._db.transaction("recover") as conn:
            rows = conn.execute(
                f"{_SELECT} WHERE e.status IN ('pending', 'running') AND e.owner IS NOT ?"
                " AND e.run_id IS NULL"  # a workflow step is resumed with its run
                " AND (o.lease_expires_at IS NULL OR o.lease_expires_at < ?)"
                " ORDER BY e.rowid",
                (owner, now),
            ).fetchall()
            for row in rows:
                record = record_of(row, self.path)
                room = limit is None or len(claimed) < limit
                verdict = recovery_verdict(record, recreatable(record), max_recovery_attempts, room)
                if verdict is Verdict.ABANDON:
                    error = abandoned_error(record.recovery_attempts)
                    self._fail(conn, record, now, error)
                    abandoned.append(self._one(conn, record.task_id))
                elif verdict is Verdict.ORPHAN:
                    self._fail(conn, record, now, ORPHANED)
                    orphaned.append(self._one(conn, record.task_id))
                elif verdict is Verdict.CLAIM:
                    conn.execute(
                        "UPDATE executions SET owner = ?, version = version + 1,"
                        " status = 'pending', sub_status = NULL, deferred_since = NULL,"
                        " waiting_on = 'slot', recovery_attempts = ?"
                        " WHERE task_id = ? AND version = ?",
                        (owner, claimed_attempts(record), record.task_id, record.version),
                    )
                    claimed.append(self._one(conn, record.task_id))
        return Recovery(claimed, orphaned, abandoned)

    @staticmethod
    def _fail(conn: sqlite3.Connection, record: ExecutionRecord, now: float, error: str) -> None:
        conn.execute(
            "UPDATE executions SET status = 'failed', sub_status = NULL, deferred_since = NULL,"
            " waiting_on = NULL, traceback = NULL,"
            " finished_at = ?, error = ? WHERE task_id = ? AND version = ?",
            (now, error, record.task_id, record.version),
        )

    def _one(self, conn: sqlite3.Connection, task_id: str) -> ExecutionRecord:
        row = conn.execute(f"{_SELECT} WHERE e.task_id = ?", (task_id,)).fetchone()
        return record_of(row, self.path)

    # ------------------------------------------------------------------ reads

    def executions(
        self,
        *,
        status: TaskStatus | str | None = None,
        sub_status: SubStatus | str | None = None,
        deferred_longer_than: float | datetime.timedelta | None = None,
        run_id: str | None = None,
        key: str | None = None,
        limit: int | None = None,
        order: Order = "oldest",
    ) -> list[ExecutionRecord]:
        """Executions matching every given filter (``key``: the admission key they
        were submitted with), in ``order`` (see `Order`), at most ``limit`` of them:
        sorted and cut in SQL, on an index where the filters allow.

        Raises:
          StoreError: naming the path and the task id, for a row this trioexec
            cannot read (an unknown status, say).
        """
        check_query(limit, order)
        where, params = filter_clause(
            "?", self.clock, status, sub_status, deferred_longer_than, run_id, key
        )
        if not matches_some(run_id=run_id, key=key):
            return []
        if order == "oldest":
            by = "e.rowid"
        elif order == "newest":
            by = "e.rowid DESC"
        elif sub_status is not None and SubStatus(sub_status) is SubStatus.DEFERRED:
            by = "e.deferred_since, e.rowid"  # all deferred (no NULLs): the index's order
        elif deferred_longer_than is not None:
            by = "e.deferred_since, e.rowid"
        else:
            by = "e.deferred_since IS NULL, e.deferred_since, e.rowid"
        sql = f"{_SELECT}{where} ORDER BY {by}"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._db.reading("query executions") as conn:
            rows = conn.execute(sql, params).fetchall()
        return [record_of(row, self.path) for row in rows]

    def counts(
        self,
        *,
        sub_status: SubStatus | str | None = None,
        deferred_longer_than: float | datetime.timedelta | None = None,
        run_id: str | None = None,
        key: str | None = None,
    ) -> dict[TaskStatus, int]:
        """How many executions match the filters, per status (every status present,
        zeros included): one ``GROUP BY`` on the status index, no rows loaded."""
        where, params = filter_clause(
            "?", self.clock, None, sub_status, deferred_longer_than, run_id, key
        )
        sql = f"SELECT e.status, count(*) FROM executions e{where} GROUP BY e.status"
        counts = dict.fromkeys(TaskStatus, 0)
        if not matches_some(run_id=run_id, key=key):
            return counts
        with self._db.reading("count executions") as conn:
            for value, n in conn.execute(sql, params).fetchall():
                try:
                    counts[TaskStatus(value)] = n
                except ValueError:
                    bad = conn.execute(
                        "SELECT task_id FROM executions WHERE status IS ? LIMIT 1", (value,)
                    ).fetchone()
                    raise StoreError(
                        f"{self.path}: execution {bad[0]!r} has an unreadable row"
                        f" (status {value!r})"
                    ) from None
        return counts

    def execution(self, task_id: str) -> ExecutionRecord | None:
        """One execution, or None: a primary-key read on this thread's read
        connection, so it never waits behind a write batch."""
        if not matches_some(task_id=task_id):
            return None
        with self._db.reading("query execution") as conn:
            row = conn.execute(f"{_SELECT} WHERE e.task_id = ?", (task_id,)).fetchone()
        return None if row is None else record_of(row, self.path)

    def close(self) -> None:
        """Close every connection (each thread's reader and the writer); idempotent.
        Waits for a write in progress in another thread to end first."""
        self._db.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def durable_tables(self) -> SQLiteTables:
        """The durable tables of this store's file, for `trioexec.durable`, on a
        connection of their own (read-only if the store is; closed by their
        ``close``). Their transactions take this store's lock."""
        return SQLiteTables(self._db.open_connection(), self.path)

    def __repr__(self) -> str:
        return f"<SQLiteStore {self.path!r}>"


def _write_run(conn: sqlite3.Connection, change: Change) -> bool:
    """Apply a run change; False if fenced (the run is not the writer's)."""
    kind = change[0]
    if kind == "run":
        run_id, _, workflow, context, owner, created_at = change[1:7]
        conn.execute(
            "INSERT OR IGNORE INTO workflow_runs (run_id, workflow, status, context, owner,"
            " created_at, graph) VALUES (?, ?, 'running', ?, ?, ?, ?)",
            (run_id, workflow, context, owner, created_at, run_graph(change)),
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


def _value(v: object) -> object:
    return getattr(v, "value", v)


_INSERT_ROWS = (
    f"INSERT INTO executions ({', '.join(ROW_COLUMNS)}) SELECT "
    + ", ".join(f"value ->> {i + 1}" for i in range(len(ROW_COLUMNS)))  # (0: the kind)
    + " FROM json_each(?)"
)
_INSERT_EACH = (
    f"INSERT INTO executions ({', '.join(ROW_COLUMNS)})"
    f" VALUES ({', '.join('?' * len(ROW_COLUMNS))})"
)
_JSON_ARROW = sqlite3.sqlite_version_info >= (3, 38)  # the ->> operator
_SCHEDULE_COLUMNS = ", ".join(SCHEDULE_FIELDS)
_GUARD = " WHERE task_id = ? AND version = ? AND status IN ('pending', 'running')"
_UPDATES = {
    "start": "UPDATE executions SET status = 'running', sub_status = 'active', attempt = ?,"
    " started_at = coalesce(started_at, ?), waiting_on = NULL" + _GUARD,
    "sub": "UPDATE executions SET sub_status = ?, deferred_since = ?, waiting_on = ?"
    " WHERE task_id = ? AND version = ? AND status = 'running'",
    "wait": "UPDATE executions SET waiting_on = ?" + _GUARD,
    "retry": "UPDATE executions SET status = 'pending', sub_status = NULL,"
    " deferred_since = NULL, error = ?, waiting_on = 'retry backoff'" + _GUARD,
    "finish": "UPDATE executions SET status = ?, sub_status = NULL, deferred_since = NULL,"
    " waiting_on = NULL, finished_at = ?, error = ?, traceback = ?, args = coalesce(args, ?)"
    + _GUARD,
}


def _update_args(change: Change) -> tuple[object, ...]:
    """The parameters of a non-submit change's UPDATE: its fields, then the guard."""
    return (*(_value(v) for v in full_change(change)[3:]), change[1], change[2])
