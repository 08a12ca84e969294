"""`PostgresStore`: the executor records of many hosts in one PostgreSQL database.

The same rules as the SQLite store (`fold_batch`, the version fence, one lease per
owner); what differs is how they are kept across hosts: a recovery or a run
takeover locks the rows it claims (``FOR UPDATE SKIP LOCKED``: two hosts
recovering at once claim different rows), and a batch's new rows go in with one
``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING``, so an execution
another host inserted meanwhile is refused, not overwritten.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Concatenate, ParamSpec, TypeVar, cast, final

import attrs

from .._errors import StoreError
from .._records import ExecutionRecord, SubStatus, TaskStatus
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
from ._durable_pg import PostgresTables
from ._key_ledger import KeyGrant, KeyRequest
from ._pg_conn import Connection, PGDatabase, redact
from ._sql import SELECT_RECORDS, filter_clause, prune_buckets, record_of, settle_key, write_lease
from ._verdict import Verdict, claimed_attempts, recovery_verdict

_SELECT = SELECT_RECORDS
_RUN_COLUMNS = tuple(f.name for f in attrs.fields(RunRecord) if f.name != "steps")
_LIVE = "('pending', 'running')"
_SCHEDULE_COLUMNS = ", ".join(SCHEDULE_FIELDS)

#: The SQL type of each "row" column, for the arrays `unnest` takes apart.
_ROW_TYPES = {
    "attempt": "integer",
    "recovery_attempts": "integer",
    "version": "bigint",
    "submitted_at": "double precision",
    "started_at": "double precision",
    "finished_at": "double precision",
    "deferred_since": "double precision",
    "priority": "bigint",  # (a priority may be up to 2**62 either way)
}
_INSERT_ROWS = (
    f"INSERT INTO executions ({', '.join(ROW_COLUMNS)})"
    f" SELECT {', '.join(ROW_COLUMNS)} FROM unnest("
    + ", ".join(f"%b::{_ROW_TYPES.get(c, 'text')}[]" for c in ROW_COLUMNS)
    + f") WITH ORDINALITY AS r({', '.join(ROW_COLUMNS)}, n) ORDER BY n"
)
#: (ON CONFLICT's speculative insertion costs the server more per row: only after a race)
_INSERT_NEW_ROWS = _INSERT_ROWS + " ON CONFLICT (task_id) DO NOTHING RETURNING task_id"
_GUARD = " WHERE task_id = %s AND version = %s AND status IN ('pending', 'running')"
_UPDATES = {
    "start": "UPDATE executions SET status = 'running', sub_status = 'active', attempt = %s,"
    " started_at = coalesce(started_at, %s), waiting_on = NULL" + _GUARD,
    "sub": "UPDATE executions SET sub_status = %s, deferred_since = %s, waiting_on = %s"
    " WHERE task_id = %s AND version = %s AND status = 'running'",
    "wait": "UPDATE executions SET waiting_on = %s" + _GUARD,
    "retry": "UPDATE executions SET status = 'pending', sub_status = NULL,"
    " deferred_since = NULL, error = %s, waiting_on = 'retry backoff'" + _GUARD,
    "finish": "UPDATE executions SET status = %s, sub_status = NULL, deferred_since = NULL,"
    " waiting_on = NULL, finished_at = %s, error = %s, traceback = %s,"
    " args = coalesce(args, %s)" + _GUARD,
}


S = TypeVar("S", bound=SQLControl)
P = ParamSpec("P")
R = TypeVar("R")


def _retried(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """A store call, run again while the server ends the connection it used before
    its transaction could commit (a restart): `PGDatabase.retry`."""

    @functools.wraps(method)
    def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return cast("PGDatabase", self._db).retry(lambda: method(self, *args, **kwargs))

    return call


def _value(v: object) -> object:
    """An enum as its value (psycopg would send an Enum's name)."""
    return getattr(v, "value", v)


# Key rounds read each key's rows after taking its lock: every statement must see
# the rounds committed before (a REPEATABLE READ default would read a snapshot
# from before the lock, and grant past the limit).
_READ_COMMITTED = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"


@final
class PostgresStore(SQLControl):
    """Executions, workflow runs, durable promises and durable tasks in a PostgreSQL
    database that executors and durable workers on many hosts share.

    It behaves exactly like `SQLiteStore`: leases and version fences keep one owner
    per execution; an executor whose lease expired loses its executions to the
    next one that recovers. The tables live in their own schema, created or
    migrated on first open (many processes opening a new database at once: one
    migrates). psycopg's synchronous API, in the executor's worker threads,
    through a pool of at most ``max_connections`` connections.

    Args:
      url: a libpq URL or connection string (``postgresql://user@host:5432/db``).
      schema: the PostgreSQL schema of trioexec's tables.
      clock: the wall clock for persisted times.
      inline: call from the Trio thread instead of a worker thread (tests under
        Trio's autojump clock).
      read_only: a view that never writes (every transaction is read-only; the
        schema is checked, never created or migrated).
      max_connections: the pool's size.

    Raises:
      StoreError: naming the server (never its password) and the schema, if the
        server cannot be reached, or the schema holds foreign tables or was written
        by a newer trioexec.
      ModuleNotFoundError: without the ``postgres`` extra
        (``pip install 'trioexec[postgres]'``).

    Example::

        store = trioexec.PostgresStore("postgresql://app@db.internal/app")
        async with trioexec.open_executor(store=store, recover=True) as ex:
            ...
    """

    dialect = "postgres"
    _MARK = "%s"
    _OLDEST = "e.seq"
    _LOCK_ROW = " FOR UPDATE OF e"  # (a command locks the row of the task it reads)

    _db: PGDatabase

    def __init__(
        self,
        url: str,
        *,
        schema: str = "trioexec",
        clock: Callable[[], float] = time.time,
        inline: bool = False,
        read_only: bool = False,
        max_connections: int = 8,
    ) -> None:
        if not isinstance(url, str) or not url:
            raise ValueError(f"url must be a PostgreSQL URL, got {url!r}")
        if isinstance(max_connections, bool) or not (
            isinstance(max_connections, int) and max_connections >= 2
        ):
            raise ValueError(f"max_connections must be an int >= 2, got {max_connections!r}")
        self.clock = clock
        self.inline = inline
        self.read_only = read_only
        self._db = PGDatabase(url, schema=schema, read_only=read_only, max_size=max_connections)
        self.url = url
        self.schema = schema
        self.path = self._db.where  # what messages and views name the store by

    # (SQLControl's calls, run again like the rest: `_retried`)
    command = _retried(SQLControl.command)
    commands = _retried(SQLControl.commands)
    last_command_seq = _retried(SQLControl.last_command_seq)
    pauses = _retried(SQLControl.pauses)
    requeue = _retried(SQLControl.requeue)

    # ------------------------------------------------------------------ writes

    @_retried
    def write(self, changes: Sequence[Change]) -> list[str]:
        with self._db.transaction("write") as conn:
            submitted = [c[1] for c in changes if c[0] == "row" or c[0] == "submit"]
            existing: set[object] = set()
            if submitted:
                existing = {
                    row[0]
                    for row in conn.execute(
                        "SELECT task_id FROM executions WHERE task_id = ANY(%s)",
                        ([str(t) for t in submitted],),
                    )
                }

            def update(change: Change) -> bool:
                if change[0] in RUN_KINDS:
                    return _write_run(conn, change)
                args = (*(_value(v) for v in full_change(change)[3:]), change[1], change[2])
                return int(conn.execute(_UPDATES[str(change[0])], args).rowcount) == 1

            fresh, fenced = fold_batch(changes, existing, update)
            if fresh:
                columns = [[_value(v) for v in col] for col in zip(*fresh, strict=True)][1:]
                try:
                    with conn.transaction():  # a savepoint: a race undoes only the insert
                        conn.execute(_INSERT_ROWS, columns)
                except self._db.unique_violation:
                    # Another host inserted one of these ids since we looked: that
                    # one is refused, like a submission whose id is already stored.
                    inserted = {row[0] for row in conn.execute(_INSERT_NEW_ROWS, columns)}
                    fenced.extend(str(r[1]) for r in fresh if r[1] not in inserted)
        return fenced

    @_retried
    def heartbeat(self, owner: str, lease_expires_at: float) -> None:
        with self._db.transaction("heartbeat") as conn:
            write_lease(conn, "%s", owner, lease_expires_at)

    @_retried
    def renew_lease(self, owner: str, lease: float) -> float:
        """`heartbeat` for ``lease`` seconds from when it is written (this
        store's clock, once its transaction has begun: not from a wait for the
        store's lock). Returns when it expires."""
        with self._db.transaction("heartbeat") as conn:
            at = self.clock() + lease
            write_lease(conn, "%s", owner, at)
        return at

    @_retried
    def release_owner(self, owner: str) -> None:
        with self._db.transaction("release owner") as conn:
            conn.execute(_READ_COMMITTED)
            conn.execute("DELETE FROM owners WHERE owner = %s", (owner,))
            # Its keys' locks first, in a round's order: a round reclaiming these
            # rows holds the lock, and the two would otherwise wait on each other.
            held = conn.execute("SELECT key FROM key_holds WHERE owner = %s", (owner,))
            for key in sorted(row[0] for row in held.fetchall()):
                _lock_key(conn, self.schema, key)
            conn.execute("DELETE FROM key_holds WHERE owner = %s", (owner,))

    @_retried
    def key_round(self, owner: str, requests: Sequence[KeyRequest]) -> list[KeyGrant]:
        """See `Store.key_round`. Each key is settled under a transaction-level
        advisory lock on (schema, key), taken in sorted key order: two hosts
        settling one key take turns, and never wait on each other in a cycle."""
        grants: dict[int, KeyGrant] = {}
        with self._db.transaction("key round") as conn:
            conn.execute(_READ_COMMITTED)  # (whatever the database's default)
            for i in sorted(range(len(requests)), key=lambda i: requests[i].key):
                _lock_key(conn, self.schema, requests[i].key)
                # (read after the lock: under READ COMMITTED each statement sees
                # the commits of the rounds that held the key before)
                grants[i] = settle_key(conn, "%s", owner, requests[i], self.clock())
            prune_buckets(conn, "%s", self.clock(), len(requests), " FOR UPDATE SKIP LOCKED")
        return [grants[i] for i in range(len(requests))]

    @_retried
    def save_schedule(self, record: ScheduleRecord) -> ScheduleRecord | None:
        with self._db.transaction("save schedule") as conn:
            before = conn.execute(
                f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE schedule_id = %s FOR UPDATE",
                (record.schedule_id,),
            ).fetchone()
            conn.execute(
                f"INSERT INTO schedules ({_SCHEDULE_COLUMNS}) VALUES (%s, %s, %s, %s, %s, NULL)"
                " ON CONFLICT (schedule_id) DO UPDATE SET cron = excluded.cron,"
                " tz = excluded.tz, name = excluded.name, next_run = excluded.next_run",
                (record.schedule_id, record.cron, record.tz, record.name, record.next_run),
            )
        return None if before is None else schedule_of(before)

    @_retried
    def schedules(self) -> list[ScheduleRecord]:
        with self._db.reading("query schedules") as conn:
            rows = conn.execute(
                f"SELECT {_SCHEDULE_COLUMNS} FROM schedules ORDER BY schedule_id"
            ).fetchall()
        return [schedule_of(row) for row in rows]

    @_retried
    def claim_occurrence(
        self, schedule_id: str, at: float, owner: str, next_run: float | None
    ) -> bool:
        with self._db.transaction("claim schedule occurrence") as conn:
            won = (
                int(
                    conn.execute(
                        "INSERT INTO schedule_runs (schedule_id, at, owner) VALUES (%s, %s, %s)"
                        " ON CONFLICT DO NOTHING",
                        (schedule_id, at, owner),
                    ).rowcount
                )
                == 1
            )
            if won:
                conn.execute(
                    "UPDATE schedules SET last_run = greatest(last_run, %s), next_run = %s"
                    " WHERE schedule_id = %s",
                    (at, next_run, schedule_id),
                )
        return won

    @_retried
    def release_occurrence(self, schedule_id: str, at: float, owner: str) -> bool:
        with self._db.transaction("release schedule occurrence") as conn:
            released = (
                int(
                    conn.execute(
                        "DELETE FROM schedule_runs WHERE schedule_id = %s AND at = %s"
                        " AND owner = %s",
                        (schedule_id, at, owner),
                    ).rowcount
                )
                == 1
            )
            if released:
                conn.execute(
                    "UPDATE schedules SET last_run = (SELECT max(at) FROM schedule_runs"
                    " WHERE schedule_id = %s) WHERE schedule_id = %s AND last_run = %s",
                    (schedule_id, schedule_id, at),
                )
        return released

    @_retried
    def taken_over(self, owner: str, live: dict[str, int]) -> list[str]:
        if not live:
            return []
        with self._db.reading("check ownership") as conn:
            found = dict(
                conn.execute(
                    "SELECT task_id, version FROM executions WHERE task_id = ANY(%s)"
                    " AND owner = %s AND status IN ('pending', 'running')",
                    (list(live), owner),
                ).fetchall()
            )
            lost = [t for t, v in live.items() if found.get(t, v) != v]
            missing = [t for t in live if t not in found]
            if missing:
                # Either not flushed yet (fine) or taken by someone else (lost).
                lost.extend(
                    row[0]
                    for row in conn.execute(
                        "SELECT task_id FROM executions WHERE task_id = ANY(%s)", (missing,)
                    )
                )
        return lost

    @_retried
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
            conn.execute(_READ_COMMITTED)  # (the second read below needs a new snapshot)
            expired = (
                f" e.status IN {_LIVE} AND e.owner IS DISTINCT FROM %s"
                " AND e.run_id IS NULL"  # a workflow step is resumed with its run
                " AND (o.lease_expires_at IS NULL OR o.lease_expires_at < %s)"
            )
            # Lock the candidates, then read them again in a new statement: under
            # READ COMMITTED a row another host claimed meanwhile is locked with
            # its new owner, but judged against the owners of this statement's
            # snapshot, where that owner's lease may not exist yet.
            locked = conn.execute(
                "SELECT e.task_id FROM executions e LEFT JOIN owners o ON o.owner = e.owner"
                f" WHERE{expired} ORDER BY e.seq FOR UPDATE OF e SKIP LOCKED",
                (owner, now),
            ).fetchall()
            rows = conn.execute(
                f"{_SELECT} WHERE e.task_id = ANY(%s) AND{expired} ORDER BY e.seq",
                ([r[0] for r in locked], owner, now),
            ).fetchall()
            claim: dict[str, int] = {}  # task id -> its recovery attempts once claimed
            for row in rows:
                record = record_of(row, self.path)
                room = limit is None or len(claim) < limit
                verdict = recovery_verdict(record, recreatable(record), max_recovery_attempts, room)
                if verdict is Verdict.ABANDON:
                    self._fail(conn, record, now, abandoned_error(record.recovery_attempts))
                    abandoned.append(self._one(conn, record.task_id))
                elif verdict is Verdict.ORPHAN:
                    self._fail(conn, record, now, ORPHANED)
                    orphaned.append(self._one(conn, record.task_id))
                elif verdict is Verdict.CLAIM:
                    claim[record.task_id] = claimed_attempts(record)
            if claim:  # in two statements, not two per row (they are locked: ours)
                conn.execute(
                    "UPDATE executions e SET owner = %s, version = version + 1,"
                    " status = 'pending', sub_status = NULL, deferred_since = NULL,"
                    " waiting_on = 'slot', recovery_attempts = c.n"
                    " FROM unnest(%s::text[], %s::integer[]) AS c(task_id, n)"
                    " WHERE e.task_id = c.task_id",
                    (owner, list(claim), list(claim.values())),
                )
                claimed = [
                    record_of(row, self.path)
                    for row in conn.execute(
                        f"{_SELECT} WHERE e.task_id = ANY(%s) ORDER BY e.seq", (list(claim),)
                    )
                ]
        return Recovery(claimed, orphaned, abandoned)

    @staticmethod
    def _fail(conn: Connection, record: ExecutionRecord, now: float, error: str) -> None:
        conn.execute(
            "UPDATE executions SET status = 'failed', sub_status = NULL, deferred_since = NULL,"
            " waiting_on = NULL, traceback = NULL,"
            " finished_at = %s, error = %s WHERE task_id = %s AND version = %s",
            (now, error, record.task_id, record.version),
        )

    def _one(self, conn: Connection, task_id: str) -> ExecutionRecord:
        row = conn.execute(f"{_SELECT} WHERE e.task_id = %s", (task_id,)).fetchone()
        return record_of(row, self.path)

    # ------------------------------------------------------------------ commands

    @contextlib.contextmanager
    def _commanding(self, what: str) -> Iterator[Connection]:
        """A command's transaction (`command`, `requeue`): commands take turns (a
        transaction-level advisory lock of the schema's), so their seq order is
        their commit order and a poller never skips one; the listeners
        (`wait_for_command`) are notified when it commits."""
        with self._db.transaction(what) as conn:
            conn.execute(_READ_COMMITTED)  # (its reads see the commands before it)
            _lock_key(conn, self.schema, "", b"commands")
            yield conn
            self._db.notify(conn)

    def wait_for_command(self, timeout: float) -> bool:
        """Block the calling thread until a command is recorded on this store's
        schema (by any process), at most ``timeout`` seconds. Returns True if one
        was (or may have been: a wake-up is only a hint to read `commands`), False
        once the time is up. The first call opens a connection of its own that
        LISTENs (closed by `close`); commands recorded before it are not
        reported, so read `commands` after the first call too. While that
        connection is lost (the server ended it, or is restarting), each call
        waits ``timeout`` and returns True (the caller polls), and later calls
        connect again, backing off.

        Only PostgreSQL stores have it: an executor looks for it with
        ``getattr(store, "wait_for_command", None)`` and polls otherwise. Call it
        from a worker thread, never the Trio thread (it blocks); `close` wakes a
        call in progress.

        Raises:
          StoreError: the store is closed.
        """
        return self._db.wait_notify(timeout)

    # ------------------------------------------------------------------ workflow runs

    @_retried
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
            conn.execute(_READ_COMMITTED)  # (see `recover`)
            expired = (
                " FROM workflow_runs r LEFT JOIN owners o ON o.owner = r.owner"
                " WHERE r.status = 'running' AND r.owner IS DISTINCT FROM %s"
                " AND (o.lease_expires_at IS NULL OR o.lease_expires_at < %s)"
            )
            # Lock, then judge again in a new statement (see `recover`).
            locked = conn.execute(
                f"SELECT r.run_id{expired} ORDER BY r.seq FOR UPDATE OF r SKIP LOCKED",
                (owner, now),
            ).fetchall()
            rows = conn.execute(
                f"SELECT r.run_id, r.workflow, r.recovery_attempts{expired}"
                " AND r.run_id = ANY(%s) ORDER BY r.seq",
                (owner, now, [r[0] for r in locked]),
            ).fetchall()
            for run_id, workflow, attempts in rows:
                if workflow not in known or attempts >= max_recovery_attempts:
                    error = RUN_ORPHANED if workflow not in known else abandoned_error(attempts)
                    conn.execute(
                        "UPDATE workflow_runs SET status = 'failed', finished_at = %s"
                        " WHERE run_id = %s",
                        (now, run_id),
                    )
                    self._end_steps(conn, run_id, "failed", now, error)
                    (orphaned if workflow not in known else abandoned).append(
                        self._run(conn, run_id)
                    )
                    continue
                conn.execute(
                    "UPDATE workflow_runs SET owner = %s,"
                    " recovery_attempts = recovery_attempts + 1 WHERE run_id = %s",
                    (owner, run_id),
                )
                self._end_steps(conn, run_id, "cancelled", now, SUPERSEDED)
                claimed.append(self._run(conn, run_id))
        return RunRecovery(claimed, orphaned, abandoned)

    @staticmethod
    def _end_steps(conn: Connection, run_id: str, status: str, now: float, error: str) -> None:
        conn.execute(
            "UPDATE executions SET status = %s, sub_status = NULL, deferred_since = NULL,"
            " waiting_on = NULL, traceback = NULL,"
            f" finished_at = %s, error = %s WHERE run_id = %s AND status IN {_LIVE}",
            (status, now, error, run_id),
        )

    @staticmethod
    def _run(conn: Connection, run_id: str) -> RunRecord:
        row = conn.execute(
            f"SELECT {', '.join(_RUN_COLUMNS)} FROM workflow_runs WHERE run_id = %s", (run_id,)
        ).fetchone()
        steps = {
            step_id: (state, output)
            for step_id, state, output in conn.execute(
                "SELECT step_id, state, output FROM workflow_steps WHERE run_id = %s ORDER BY seq",
                (run_id,),
            )
        }
        values = dict(zip(_RUN_COLUMNS, row, strict=True))
        return RunRecord(**{**values, "graph": graph_of(values["graph"])}, steps=steps)

    @_retried
    def runs_taken_over(self, owner: str, run_ids: Collection[str]) -> list[str]:
        with self._db.reading("check run ownership") as conn:
            return [
                row[0]
                for row in conn.execute(
                    "SELECT run_id FROM workflow_runs WHERE run_id = ANY(%s)"
                    " AND owner IS DISTINCT FROM %s",
                    (list(run_ids), owner),
                )
            ]

    @_retried
    def run(self, run_id: str) -> RunRecord | None:
        if not matches_some(run_id=run_id):
            return None
        with self._db.reading("query workflow run", snapshot=True) as conn:
            found = conn.execute(
                "SELECT 1 FROM workflow_runs WHERE run_id = %s", (run_id,)
            ).fetchone()
            return None if found is None else self._run(conn, run_id)

    @_retried
    def runs(self, *, status: str | None = None) -> list[RunRecord]:
        if not matches_some(status=status):
            return []
        with self._db.reading("query workflow runs", snapshot=True) as conn:
            if status is None:
                cur = conn.execute("SELECT run_id FROM workflow_runs ORDER BY seq")
            else:
                cur = conn.execute(
                    "SELECT run_id FROM workflow_runs WHERE status = %s ORDER BY seq", (status,)
                )
            return [self._run(conn, run_id) for (run_id,) in cur.fetchall()]

    # ------------------------------------------------------------------ reads

    @_retried
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
        were submitted with), in ``order`` (see `Order`), at most ``limit`` of
        them: sorted and cut in SQL."""
        check_query(limit, order)
        where, params = filter_clause(
            "%s", self.clock, status, sub_status, deferred_longer_than, run_id, key
        )
        if not matches_some(run_id=run_id, key=key):
            return []
        if order == "oldest":
            by = "e.seq"
        elif order == "newest":
            by = "e.seq DESC"
        else:  # (NULLs last: executions that are not deferred)
            by = "e.deferred_since ASC NULLS LAST, e.seq"
        sql = f"{_SELECT}{where} ORDER BY {by}"
        if limit is not None:
            sql += " LIMIT %s"
            params.append(limit)
        with self._db.reading("query executions") as conn:
            rows = conn.execute(sql, params).fetchall()
        return [record_of(row, self.path) for row in rows]

    @_retried
    def counts(
        self,
        *,
        sub_status: SubStatus | str | None = None,
        deferred_longer_than: float | datetime.timedelta | None = None,
        run_id: str | None = None,
        key: str | None = None,
    ) -> dict[TaskStatus, int]:
        """How many executions match the filters, per status (every status present,
        zeros included)."""
        where, params = filter_clause(
            "%s", self.clock, None, sub_status, deferred_longer_than, run_id, key
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
                        "SELECT task_id FROM executions WHERE status = %s LIMIT 1", (value,)
                    ).fetchone()
                    raise StoreError(
                        f"{self.path}: execution {bad[0]!r} has an unreadable row"
                        f" (status {value!r})"
                    ) from None
        return counts

    @_retried
    def execution(self, task_id: str) -> ExecutionRecord | None:
        if not matches_some(task_id=task_id):
            return None
        with self._db.reading("query execution") as conn:
            row = conn.execute(f"{_SELECT} WHERE e.task_id = %s", (task_id,)).fetchone()
        return None if row is None else record_of(row, self.path)

    def close(self) -> None:
        """Close the pool's connections; idempotent."""
        self._db.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<PostgresStore {redact(self.url)!r} schema={self.schema!r}>"

    def durable_tables(self) -> PostgresTables:
        """The durable tables of this store's schema, for `trioexec.durable`, on a
        connection of their own (read-only if the store is; closed by their
        ``close``)."""
        return PostgresTables(self._db)


def _lock_key(conn: Connection, schema: str, key: str, person: bytes = b"") -> None:
    """Take the transaction's advisory lock of ``key`` in ``schema`` (a 64-bit
    hash of both: rounds on other schemas of the database never wait for it).
    ``person`` picks another space of locks: the commands' turn is
    ``("", b"commands")``, never a key's."""
    digest = hashlib.blake2b(f"{schema}\0{key}".encode(), digest_size=8, person=person).digest()
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (int.from_bytes(digest, "big", signed=True),))


def _write_run(conn: Connection, change: Change) -> bool:
    """Apply a run change; False if fenced (the run is not the writer's)."""
    kind = change[0]
    if kind == "run":
        run_id, _, workflow, context, owner, created_at = change[1:7]
        conn.execute(
            "INSERT INTO workflow_runs (run_id, workflow, status, context, owner, created_at,"
            " graph) VALUES (%s, %s, 'running', %s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING",
            (run_id, workflow, context, owner, created_at, run_graph(change)),
        )
        return True
    owned = conn.execute(
        "SELECT 1 FROM workflow_runs WHERE run_id = %s AND owner = %s", (change[1], change[2])
    ).fetchone()
    if owned is None:
        return False
    if kind == "step":
        _, run_id, _, step_id, state, output, task_id = change
        conn.execute(
            "INSERT INTO workflow_steps (run_id, step_id, state, output, task_id)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id, step_id) DO UPDATE SET"
            " state = excluded.state, output = excluded.output, task_id = excluded.task_id",
            (run_id, step_id, _value(state), output, task_id),
        )
    else:
        conn.execute(
            "UPDATE workflow_runs SET status = %s, finished_at = %s WHERE run_id = %s",
            (_value(change[3]), change[4], change[1]),
        )
    return True
