"""The durable tables on PostgreSQL, for many processes on many hosts.

The protocol (`trioexec.durable._protocol.Core`) reads a row, decides, and writes it
back. Under PostgreSQL's READ COMMITTED that is safe because every row the
protocol reads to change is read locked (``SELECT ... FOR UPDATE``): a concurrent
transaction waits for it and then sees what this one wrote. What time does to the
rows (timed-out promises, lapsed leases, due retries) and a worker's claim take
their rows with ``FOR UPDATE SKIP LOCKED``: two transactions doing it at once take
different rows instead of waiting for each other. A claim is one statement (the
batch's rows locked, acquired and returned with their promises' data).

When a task becomes claimable (created pending, released, resumed, its lease
lapsed), the transaction sends ``NOTIFY`` on the schema's channel with the task's
target, delivered at its commit: idle workers listening there (`Listener`) wake at
once instead of waiting for their next poll.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

from .._errors import StoreError
from ._durable_rows import (
    Overlay,
    PromiseState,
    Row,
    TaskState,
    TransactionAborted,
    copy_promise,
    due_at,
    keep,
    merge_rows,
    note,
)
from ._pg_conn import Connection, PGDatabase, load_psycopg, rolled_back

_P_COLS = ("id", "state", "data", "timeout_at", "ikc", "iku", "tags", "created_at", "settled_at")
_T_COLS = ("id", "state", "version", "target", "pid", "ttl", "lease_expires_at", "timeout_at")
_PROMISE_STATES = frozenset(s.value for s in PromiseState)
_TASK_STATES = frozenset(s.value for s in TaskState)
_PENDING = TaskState.PENDING.value
_P_SELECT = f"SELECT {', '.join(_P_COLS)} FROM durable_promises"
_T_SELECT = f"SELECT {', '.join(_T_COLS)} FROM durable_tasks"
_CLAIM = (
    "WITH c AS (SELECT id FROM durable_tasks WHERE state = 'pending' AND target = %s"
    " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)"
    " UPDATE durable_tasks t SET state = 'acquired', version = t.version + 1, pid = %s,"
    # (By key, = ANY: a join with ``c`` may be planned as a hash join over the table.)
    " ttl = %s, lease_expires_at = %s, timeout_at = NULL"
    " WHERE t.id = ANY((SELECT array_agg(id) FROM c)::text[]) RETURNING "
    + ", ".join(f"t.{c}" for c in _T_COLS)
    + ", (SELECT p.data FROM durable_promises p WHERE p.id = t.id)"
)
_P_TYPES = ("text", "text", "text", "float8", "text", "text", "text", "float8", "float8")
_T_TYPES = ("text", "text", "bigint", "text", "text", "float8", "float8", "float8")
# A batch's rows go as one JSON parameter (json.dumps, in C), not an array per column:
# psycopg builds those in Python (1.8 ms of CPU for 64 creates, 0.4 ms as JSON).
_FULFIL_MANY = (
    "WITH f AS (SELECT * FROM json_to_recordset(%s::json)"
    " AS f(id text, version bigint, state text, data text)),"
    # Each row found (and locked) by its primary key: a join on the state columns
    # would scan every acquired task's index entries, dead ones included.
    " ok AS (SELECT f.id, f.state, f.data FROM f"
    " CROSS JOIN LATERAL (SELECT 1 FROM durable_tasks t WHERE t.id = f.id"
    " AND t.state = 'acquired' AND t.version = f.version FOR UPDATE) AS t"
    " CROSS JOIN LATERAL (SELECT 1 FROM durable_promises p WHERE p.id = f.id"
    " AND p.state = 'pending' FOR UPDATE) AS p),"
    " go AS (SELECT array_agg(id) AS ids FROM ok HAVING count(*) = %s),"
    # The rows to write found by their keys too (= ANY: an index scan), not by a
    # join with ``ok``, which the planner may make a hash join over a whole table.
    " t AS (UPDATE durable_tasks t SET state = 'fulfilled', pid = NULL,"
    " lease_expires_at = NULL, timeout_at = NULL"
    " WHERE t.id = ANY((SELECT ids FROM go)::text[]) RETURNING t.id),"
    " p AS (UPDATE durable_promises p SET state = ok.state, data = ok.data, iku = NULL,"
    " settled_at = %s FROM ok WHERE p.id = ANY((SELECT ids FROM go)::text[]) AND p.id = ok.id"
    " RETURNING " + ", ".join(f"p.{c}" for c in _P_COLS) + f") SELECT {', '.join(_P_COLS)},"
    " EXISTS (SELECT 1 FROM durable_callbacks c WHERE c.promise_id = p.id),"
    " (SELECT count(*) FROM t) FROM p"
)
_CREATE_MANY = (
    "WITH r AS (SELECT * FROM json_to_recordset(%s::json)"
    f" AS r({', '.join(f'{c} {t}' for c, t in zip(_P_COLS, _P_TYPES, strict=True))})),"
    # Nothing is inserted if a promise of the batch exists already.
    " seen AS (SELECT 1 FROM r JOIN durable_promises p ON p.id = r.id LIMIT 1),"
    f" p AS (INSERT INTO durable_promises ({', '.join(_P_COLS)}) SELECT * FROM r"
    " WHERE NOT EXISTS (SELECT FROM seen) ON CONFLICT (id) DO NOTHING RETURNING 1),"
    " k AS (SELECT * FROM json_to_recordset(%s::json)"
    f" AS k({', '.join(f'{c} {t}' for c, t in zip(_T_COLS, _T_TYPES, strict=True))})),"
    f" t AS (INSERT INTO durable_tasks ({', '.join(_T_COLS)}) SELECT * FROM k"
    " WHERE NOT EXISTS (SELECT FROM seen) ON CONFLICT (id) DO NOTHING RETURNING 1)"
    " SELECT (SELECT count(*) FROM seen), (SELECT count(*) FROM p), (SELECT count(*) FROM t)"
)
#: Whether any row is due at ``now`` for each of the three queries of time (a
#: simple query: ``now`` is a float's repr, sent with the transaction's BEGIN).
_ANY_DUE = (
    "SELECT EXISTS (SELECT 1 FROM durable_promises WHERE state = 'pending'"
    " AND timeout_at <= {now}),"
    " EXISTS (SELECT 1 FROM durable_tasks WHERE state = 'acquired'"
    " AND lease_expires_at <= {now}),"
    " EXISTS (SELECT 1 FROM durable_tasks WHERE state = 'pending' AND timeout_at <= {now})"
)
#: Whether psycopg prepares the batch statements (claims, fulfils, creates): no,
#: each is planned for its batch. A prepared one is soon run by a generic plan,
#: made once while the tables may still be nearly empty, which then serves them
#: grown (5,000 tasks created and run at once: 12 ms a fulfil of a batch, against
#: 1.1 ms planned each time).
_PLANNED = False
#: A NOTIFY payload must stay under 8,000 bytes; a longer target wakes everyone.
_MAX_PAYLOAD = 4_000


def channel(schema: str) -> str:
    """The NOTIFY channel of a schema's durable tasks (at most 63 bytes: a long
    schema name is hashed; two schemas sharing a channel only wake each other)."""
    name = f"trioexec_durable_{schema}"
    if len(name.encode()) <= 63:
        return name
    return f"trioexec_durable_{hashlib.sha1(schema.encode()).hexdigest()[:32]}"


def payload(target: str) -> str:
    """What a task of ``target`` notifies ("": a target too long to send; it wakes
    every listener)."""
    return target if len(target.encode()) <= _MAX_PAYLOAD else ""


class PostgresTables:
    """The durable_* tables of a `PostgresStore`'s schema, on one connection of
    their own (autocommit; each transaction an explicit ``BEGIN``/``COMMIT``).

    On a read-only store, a transaction is one snapshot (REPEATABLE READ READ
    ONLY) and locks nothing. The effects of time every operation applies first are
    kept in memory for the rest of the operation (as `SQLiteTables` does), so a
    search answers what a writer's would; any other write raises
    ``StoreError("...: opened read-only")``. A connection lost is opened again at
    the next transaction.
    """

    def __init__(self, db: PGDatabase) -> None:
        self._psycopg = load_psycopg()[0]
        self.db = db
        self.path = db.where  # what messages name the store by
        self._read_only = db.read_only
        self._lock = "" if db.read_only else " FOR UPDATE"
        self._skip = "" if db.read_only else " FOR UPDATE SKIP LOCKED"
        self.channel = channel(db.schema)
        self._raw: Connection = db.connect()
        self._open = False  # a transaction is open (calls run in one thread at a time)
        # The BEGIN of the open transaction until it is sent: with its first statement
        # (the look for what time has done, in one round trip), or before it.
        self._begin: list[str] = []
        # Whether time has done anything (timed-out promises, lapsed leases, due
        # retries) at the moment of this transaction, found by one look.
        self._due: tuple[bool, bool, bool] | None = None
        # A read-only transaction's effects of time, kept in memory (never written).
        self._overlay: Overlay | None = None
        # (table, id) -> the row's stored values as read in this transaction: a
        # write then updates only the columns that changed, or nothing.
        self._stored: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._wake: set[str] = set()  # targets with newly claimable tasks, to NOTIFY
        # `AloneTables`: an operation that fails having written nothing needs no
        # savepoint (two round trips fewer) to be undone.
        self.writes = 0  # statements that changed rows
        self.errors = (self._psycopg.Error, TransactionAborted)  # those fail the transaction

    def close(self) -> None:
        """Close the connection; idempotent."""
        self._raw.close()

    @property
    def conn(self) -> Connection:
        """The connection, inside a transaction with the transaction begun."""
        if self._begin:
            self._raw.execute(self._begin.pop())
        return self._raw

    # ------------------------------------------------------------------ transactions

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction; inside one already open, part of it (a no-op)."""
        if self._open:
            yield
            return
        self._open = True
        try:
            with _errors(self._psycopg.Error, self.db):
                if self._raw.broken or self._raw.closed:
                    self._raw.close()
                    # (a server restarting is waited for, up to the store's timeout)
                    self._raw = self.db.connect(wait=True)
                self._overlay = Overlay() if self._read_only else None
                self._begin[:] = [
                    "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
                    if self._read_only
                    else "BEGIN"
                ]
                try:
                    try:
                        yield
                    except self._psycopg.Error as exc:
                        # Before the COMMIT was sent: the connection lost (a restart)
                        # wrote nothing, and the next try connects again.
                        aborted = self.db.aborted("durable store", exc, self._raw)
                        if aborted is None:
                            raise
                        raise aborted from exc
                    if not self._begin:  # (else nothing was sent: nothing to end)
                        self._raw.execute(_commit(self._psycopg, self.channel, self._wake))
                except BaseException:
                    if not self._begin and not self._raw.broken and not self._raw.closed:
                        with contextlib.suppress(self._psycopg.Error):
                            self._raw.execute("ROLLBACK")
                    raise
        finally:
            self._open = False
            self._begin.clear()
            self._due = None
            self._overlay = None
            self._stored.clear()
            self._wake.clear()

    def attempt(self, call: Callable[[], Any]) -> tuple[bool, Any]:
        """``call()`` as a unit inside the open transaction (a savepoint): ``(True, its
        value)``, or ``(False, its exception)`` with its writes undone. An error of
        the database itself is raised: the whole transaction fails."""
        conn = self.conn
        conn.execute("SAVEPOINT durable_call")
        wake = set(self._wake)
        try:
            value = call()
        except (self._psycopg.Error, TransactionAborted):
            raise
        except Exception as exc:
            conn.execute("ROLLBACK TO SAVEPOINT durable_call")
            conn.execute("RELEASE SAVEPOINT durable_call")
            self._stored.clear()  # what it wrote is undone
            self._wake = wake
            return False, exc
        conn.execute("RELEASE SAVEPOINT durable_call")
        return True, value

    # ------------------------------------------------------------------ rows

    def _promise(self, row: tuple[Any, ...]) -> Row:
        self._stored["durable_promises", row[0]] = row
        out = dict(zip(_P_COLS, row, strict=True))
        try:
            if out["state"] not in _PROMISE_STATES:
                raise ValueError(f"unknown state {out['state']!r}")
            out["tags"] = json.loads(out["tags"])
            if not isinstance(out["tags"], dict):
                raise ValueError(f"tags are not a JSON object: {out['tags']!r}")
        except (TypeError, ValueError) as exc:
            raise StoreError(
                f"{self.path}: durable promise {out['id']!r} has an unreadable row: {exc}"
            ) from None
        return out

    def _task(self, row: tuple[Any, ...]) -> Row:
        self._stored["durable_tasks", row[0]] = row
        out = dict(zip(_T_COLS, row, strict=True))
        if out["state"] not in _TASK_STATES:
            raise StoreError(
                f"{self.path}: durable task {out['id']!r} has an unreadable row:"
                f" unknown state {out['state']!r}"
            )
        return out

    def _write(self, table: str, cols: tuple[str, ...], values: tuple[Any, ...]) -> None:
        """Store a row: only its changed columns if it was read (and so locked) in
        this transaction, nothing if none changed; else insert it. A row inserted
        by another transaction meanwhile aborts this one (`TransactionAborted`: run
        it again, and the row is read)."""
        key = (table, values[0])
        before = self._stored.get(key)
        if before is None:
            inserted = self.conn.execute(
                f"INSERT INTO {table} ({', '.join(cols)})"
                f" VALUES ({', '.join(['%s'] * len(cols))}) ON CONFLICT (id) DO NOTHING",
                values,
            ).rowcount
            self.writes += 1
            if inserted != 1:
                raise TransactionAborted(
                    f"{self.path}: durable store: {table} {values[0]!r} was inserted"
                    " by another transaction meanwhile"
                )
        else:
            changed = [i for i, (a, b) in enumerate(zip(before, values, strict=True)) if a != b]
            if not changed:
                return
            self.conn.execute(
                f"UPDATE {table} SET {', '.join(f'{cols[i]} = %s' for i in changed)} WHERE id = %s",
                [*(values[i] for i in changed), values[0]],
            )
            self.writes += 1
        self._stored[key] = values

    def _keep(self, call: str) -> Overlay | None:
        """Where a write goes on a read-only store (its overlay), or None: write it."""
        return keep(self._overlay, self._read_only, self.path, call)

    def promise(self, id: str) -> Row | None:
        overlay = note(self._overlay, "promise")
        if overlay is not None and id in overlay.promises:
            return copy_promise(overlay.promises[id])
        row = self.conn.execute(f"{_P_SELECT} WHERE id = %s{self._lock}", (id,)).fetchone()
        return None if row is None else self._promise(row)

    def put_promise(self, row: Row) -> None:
        overlay = self._keep("put_promise")
        if overlay is not None:
            overlay.promises[row["id"]] = copy_promise(row)
            return
        values = [row[c] for c in _P_COLS]
        values[_P_COLS.index("tags")] = json.dumps(row["tags"], sort_keys=True)
        self._write("durable_promises", _P_COLS, tuple(values))

    def task(self, id: str) -> Row | None:
        overlay = note(self._overlay, "task")
        if overlay is not None and id in overlay.tasks:
            return dict(overlay.tasks[id])
        row = self.conn.execute(f"{_T_SELECT} WHERE id = %s{self._lock}", (id,)).fetchone()
        return None if row is None else self._task(row)

    def put_task(self, row: Row) -> None:
        overlay = self._keep("put_task")
        if overlay is not None:
            overlay.tasks[row["id"]] = dict(row)
            return
        before = self._stored.get(("durable_tasks", row["id"]))
        self._write("durable_tasks", _T_COLS, tuple(row[c] for c in _T_COLS))
        if row["state"] == _PENDING and (before is None or before[1] != _PENDING):
            self._wake.add(payload(row["target"]))

    def update_task(self, id: str, expect: Row, changes: Row) -> bool:
        self._keep("update_task")  # never part of applying time: refused if read-only
        rows = _update(self.conn, "durable_tasks", id, expect, changes, _T_COLS)
        if rows:
            self.writes += 1
            self._task(rows[0])
        return bool(rows)

    def update_promise(self, id: str, expect: Row, changes: Row) -> Row | None:
        self._keep("update_promise")
        rows = _update(self.conn, "durable_promises", id, expect, changes, _P_COLS)
        if not rows:
            return None
        self.writes += 1
        return self._promise(rows[0])

    def claim(
        self, target: str, limit: int, pid: str, ttl: float, now: float
    ) -> list[tuple[Row, str | None]]:
        """Acquire up to ``limit`` pending tasks of ``target`` (oldest id first,
        skipping rows another transaction holds), in one statement."""
        self._keep("claim")
        args = (target, limit, pid, ttl, now + ttl)
        rows = self.conn.execute(_CLAIM, args, prepare=_PLANNED).fetchall()
        self.writes += bool(rows)
        rows.sort(key=lambda r: r[0])
        return [(self._task(r[:-1]), r[-1]) for r in rows]

    def fulfil_many(
        self, items: list[tuple[str, int, str, str | None]], now: float
    ) -> list[tuple[Row, bool]] | None:
        """`BulkTables.fulfil_many`: one statement, which writes only if every task
        is acquired at its version and every promise pending (rows locked)."""
        self._keep("fulfil_many")
        batch = _json([{"id": i, "version": v, "state": s, "data": d} for i, v, s, d in items])
        args = (batch, len(items), now)
        rows = self.conn.execute(_FULFIL_MANY, args, prepare=_PLANNED).fetchall()
        if len(rows) != len(items):
            return None
        self.writes += 1
        settled = {r[0]: (self._promise(r[:-2]), bool(r[-2])) for r in rows}
        for id, *_ in items:
            self._stored.pop(("durable_tasks", id), None)
        return [settled[id] for id, *_ in items]

    def create_many(self, promises: list[Row], tasks: list[Row]) -> bool:
        """`BulkTables.create_many`: one statement, which inserts the rows unless a
        promise of the batch exists (one inserted meanwhile by another transaction
        aborts this one: `TransactionAborted`)."""
        self._keep("create_many")
        p_values = [tuple(row[c] for c in _P_COLS) for row in promises]
        t_values = [tuple(row[c] for c in _T_COLS) for row in tasks]
        tags = _P_COLS.index("tags")
        p_values = [
            (*v[:tags], json.dumps(v[tags], sort_keys=True), *v[tags + 1 :]) for v in p_values
        ]
        try:
            p_batch = _json([dict(zip(_P_COLS, v, strict=True)) for v in p_values])
            t_batch = _json([dict(zip(_T_COLS, v, strict=True)) for v in t_values])
        except ValueError:
            return False  # (a float JSON cannot hold: one by one)
        args = (p_batch, t_batch)
        seen, *inserted = self.conn.execute(_CREATE_MANY, args, prepare=_PLANNED).fetchone()
        if seen:
            return False
        self.writes += 1
        if tuple(inserted) != (len(promises), len(tasks)):
            raise TransactionAborted(
                f"{self.path}: durable store: a promise of this batch was inserted"
                " by another transaction meanwhile"
            )
        for values in p_values:
            self._stored["durable_promises", values[0]] = values
        for values, row in zip(t_values, tasks, strict=True):
            self._stored["durable_tasks", values[0]] = values
            self._wake.add(payload(row["target"]))
        return True

    def add_callback(self, promise_id: str, task_id: str) -> None:
        self._keep("add_callback")
        self.conn.execute(
            "INSERT INTO durable_callbacks (promise_id, task_id) VALUES (%s, %s)"
            " ON CONFLICT DO NOTHING",
            (promise_id, task_id),
        )
        self.writes += 1

    def tasks_awaiting(self, promise_id: str) -> list[str]:
        overlay = note(self._overlay, "tasks_awaiting")
        found = [
            r[0]
            for r in self.conn.execute(
                "SELECT task_id FROM durable_callbacks WHERE promise_id = %s ORDER BY seq",
                (promise_id,),
            )
        ]
        return found if overlay is None else [t for t in found if t not in overlay.dropped]

    def awaited_by(self, task_id: str) -> list[str]:
        overlay = note(self._overlay, "awaited_by")
        if overlay is not None and task_id in overlay.dropped:
            return []
        return [
            r[0]
            for r in self.conn.execute(
                "SELECT promise_id FROM durable_callbacks WHERE task_id = %s ORDER BY seq",
                (task_id,),
            )
        ]

    def drop_callbacks(self, task_id: str) -> None:
        overlay = self._keep("drop_callbacks")
        if overlay is not None:
            overlay.dropped.add(task_id)
            return
        self.conn.execute("DELETE FROM durable_callbacks WHERE task_id = %s", (task_id,))
        self.writes += 1

    def timed_out_promises(self, now: float) -> list[Row]:
        overlay = note(self._overlay, "timed_out_promises")
        # The protocol's first call of a transaction: one look (with the BEGIN) says
        # whether any of the three queries of time would find a row.
        if self._begin and math.isfinite(now):
            begin = self._begin.pop()
            found = self._raw.execute(f"{begin}; {_ANY_DUE.format(now=repr(float(now)))}")
            found.nextset()
            self._due = tuple(found.fetchone())
        rows = []
        if self._due is None or self._due[0]:
            rows = _due(self.conn, _P_SELECT, "timeout_at", now, "pending", self._skip)
        promises = [self._promise(r) for r in rows]
        if overlay is None:
            return promises
        return merge_rows(
            promises, overlay.promises, lambda r: due_at(r, "pending", "timeout_at", now)
        )

    def expired_leases(self, now: float) -> list[Row]:
        overlay = note(self._overlay, "expired_leases")
        rows = []
        if self._due is None or self._due[1]:
            rows = _due(self.conn, _T_SELECT, "lease_expires_at", now, "acquired", self._skip)
        tasks = [self._task(r) for r in rows]
        if overlay is None:
            return tasks
        return merge_rows(
            tasks, overlay.tasks, lambda r: due_at(r, "acquired", "lease_expires_at", now)
        )

    def due_pending_tasks(self, now: float) -> list[Row]:
        overlay = note(self._overlay, "due_pending_tasks")
        rows = []
        if self._due is None or self._due[2]:
            rows = _due(self.conn, _T_SELECT, "timeout_at", now, "pending", self._skip)
        tasks = [self._task(r) for r in rows]
        if overlay is None:
            return tasks
        return merge_rows(tasks, overlay.tasks, lambda r: due_at(r, "pending", "timeout_at", now))

    def search_promises(
        self, state: str | None, tag: tuple[str, str] | None, limit: int, cursor: str | None
    ) -> list[Row]:
        overlay = note(self._overlay, "search_promises")
        where, params = _page_where(state, cursor)
        if tag is not None:
            where.append("(tags::jsonb ->> %s) = %s")
            params.extend(tag)
        more = 0 if overlay is None else len(overlay.promises)
        rows = self.conn.execute(
            f"{_P_SELECT} WHERE {' AND '.join(where)} ORDER BY id LIMIT %s",
            (*params, limit + more),
        )
        promises = [self._promise(r) for r in rows]
        if overlay is None:
            return promises

        def match(row: Row) -> bool:
            return (
                (cursor is None or row["id"] > cursor)
                and (state is None or row["state"] == state)
                and (tag is None or row["tags"].get(tag[0]) == tag[1])
            )

        return merge_rows(promises, overlay.promises, match)[:limit]

    def search_tasks(
        self, state: str | None, target: str | None, limit: int, cursor: str | None
    ) -> list[Row]:
        overlay = note(self._overlay, "search_tasks")
        where, params = _page_where(state, cursor)
        if target is not None:
            where.append("target = %s")
            params.append(target)
        more = 0 if overlay is None else len(overlay.tasks)
        rows = self.conn.execute(
            f"{_T_SELECT} WHERE {' AND '.join(where)} ORDER BY id LIMIT %s",
            (*params, limit + more),
        )
        tasks = [self._task(r) for r in rows]
        if overlay is None:
            return tasks

        def match(row: Row) -> bool:
            return (
                (cursor is None or row["id"] > cursor)
                and (state is None or row["state"] == state)
                and (target is None or row["target"] == target)
            )

        return merge_rows(tasks, overlay.tasks, match)[:limit]

    def all_promises(self) -> Iterator[Row]:
        overlay = note(self._overlay, "all_promises")
        promises = [self._promise(r) for r in self.conn.execute(_P_SELECT).fetchall()]
        if overlay is not None:
            promises = merge_rows(promises, overlay.promises, lambda r: True)
        return iter(promises)

    def all_tasks(self) -> Iterator[Row]:
        overlay = note(self._overlay, "all_tasks")
        tasks = [self._task(r) for r in self.conn.execute(_T_SELECT).fetchall()]
        if overlay is not None:
            tasks = merge_rows(tasks, overlay.tasks, lambda r: True)
        return iter(tasks)

    def all_callbacks(self) -> Iterator[tuple[str, str]]:
        overlay = note(self._overlay, "all_callbacks")
        rows = self.conn.execute(
            "SELECT promise_id, task_id FROM durable_callbacks ORDER BY seq"
        ).fetchall()
        dropped = set() if overlay is None else overlay.dropped
        return iter([(r[0], r[1]) for r in rows if r[1] not in dropped])


def _json(rows: list[dict[str, Any]]) -> str:
    """A batch's rows as one JSON parameter (ValueError: a float JSON cannot hold)."""
    return json.dumps(rows, allow_nan=False)


def _commit(psycopg: Any, channel: str, wake: set[str]) -> Any:
    """COMMIT, after the NOTIFY of the targets with newly claimable tasks (one round
    trip: the values are quoted here)."""
    if not wake:
        return "COMMIT"
    sql = psycopg.sql
    notify = sql.SQL("SELECT pg_notify({}, t) FROM unnest({}::text[]) t; COMMIT")
    return notify.format(sql.Literal(channel), sql.Literal(sorted(wake)))


@contextlib.contextmanager
def _errors(error: type[Exception], db: PGDatabase) -> Iterator[None]:
    """psycopg's errors (``error``) as `StoreError` naming the server; those of a
    transaction the server aborted for a concurrent one as `TransactionAborted`."""
    try:
        yield
    except error as exc:
        message = str(db.error("durable store", exc))
        raise (TransactionAborted if rolled_back(exc) else StoreError)(message) from exc


def _update(
    conn: Connection, table: str, id: str, expect: Row, changes: Row, cols: tuple[str, ...]
) -> list[tuple[Any, ...]]:
    """Change row ``id`` if its columns hold ``expect``'s values; the row as changed
    (``cols``), if it did."""
    return list(
        conn.execute(
            f"UPDATE {table} SET {', '.join(f'{c} = %s' for c in changes)}"
            f" WHERE id = %s{''.join(f' AND {c} = %s' for c in expect)}"
            f" RETURNING {', '.join(cols)}",
            (*changes.values(), id, *expect.values()),
        )
    )


def _due(
    conn: Connection, select: str, when: str, now: float, state: str, skip: str
) -> list[tuple[Any, ...]]:
    """Rows in ``state`` whose ``when`` column has come (<= now), by id; with ``skip``
    (a writable store), those no other transaction holds (locked)."""
    # (``state`` written in: the partial index of those rows serves only a query
    # that names its state.)
    return list(
        conn.execute(f"{select} WHERE state = '{state}' AND {when} <= %s ORDER BY id{skip}", (now,))
    )


def _page_where(state: str | None, cursor: str | None) -> tuple[list[str], list[Any]]:
    where, params = ["TRUE"], []
    if cursor is not None:
        where.append("id > %s")
        params.append(cursor)
    if state is not None:
        where.append("state = %s")
        params.append(state)
    return where, params


class Listener:
    """A connection of its own, listening on a schema's channel: which targets had
    tasks become claimable. Its socket (`fileno`) turns readable when a
    notification arrives; `received` then reads what came without blocking."""

    def __init__(self, db: PGDatabase, channel: str) -> None:
        psycopg = load_psycopg()[0]
        self._errors = psycopg.Error
        self.conn: Connection = db.connect()
        try:
            with db.errors("cannot listen"):
                self.conn.execute(
                    psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel))
                )
        except BaseException:
            self.conn.close()
            raise

    def fileno(self) -> int:
        return int(self.conn.fileno())

    def received(self) -> set[str] | None:
        """The payloads received so far (targets; "" wakes everyone), without
        blocking; None if the connection is lost (the caller polls instead)."""
        try:
            return {n.payload for n in self.conn.notifies(timeout=0)}
        except self._errors:
            return None

    def close(self) -> None:
        self.conn.close()
