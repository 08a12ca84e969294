"""The durable tables on PostgreSQL, for many processes on many hosts.

The protocol (`trioexec.durable._protocol.Core`) reads a row, decides, and writes it
back: safe under READ COMMITTED, as it reads every row it changes ``FOR UPDATE`` (a
concurrent transaction waits, then sees what this one wrote) and those it only looks
at ``FOR SHARE`` (lookers do not wait for each other, so group commits looking at the
same promises in different orders do not deadlock). Time's queries and a claim (one
statement) take ``FOR UPDATE SKIP LOCKED``: two at once take different rows instead
of waiting for each other.

A transaction that makes a task claimable (created pending, released, resumed, its
lease lapsed) sends ``NOTIFY`` on the schema's channel with the task's target,
delivered at its commit: idle workers listening there (`Listener`) wake at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from typing import Any

from ._durable_rows import Row, TaskState, TransactionAborted, keep
from ._durable_sql import PROMISES, TASKS, SQLTables
from ._pg_conn import XID, Connection, PGDatabase, load_psycopg

_P_COLS, _T_COLS = PROMISES.cols, TASKS.cols
_PENDING = TaskState.PENDING.value
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


class PostgresTables(SQLTables):
    """The durable_* tables of a `PostgresStore`'s schema, on one connection of
    their own (autocommit; each transaction an explicit ``BEGIN``/``COMMIT``).

    On a read-only store, a transaction is one snapshot (REPEATABLE READ READ
    ONLY) and locks nothing. The effects of time every operation applies first are
    kept in memory for the rest of the operation (as `SQLiteTables` does), so a
    search answers what a writer's would; any other write raises
    ``StoreError("...: opened read-only")``. A connection lost is opened again at
    the next transaction.
    """

    MARK = "%s"
    # A row not read in this transaction was inserted by another meanwhile if this
    # inserts nothing (`TransactionAborted`: run it again, and the row is read).
    INSERT = "INSERT INTO {table} ({cols}) VALUES ({marks}) ON CONFLICT (id) DO NOTHING"
    READ_BACK = True  # (in the update's round trip; a later write of the row updates it)
    TAGGED = "(tags::jsonb ->> %s) = %s"
    SEQ = "seq"

    def __init__(self, db: PGDatabase) -> None:
        self._psycopg = load_psycopg()[0]
        # `AloneTables`: an operation that fails having written nothing needs no
        # savepoint (two round trips fewer) to be undone.
        self.errors = (self._psycopg.Error, TransactionAborted)  # those fail the transaction
        read_only = db.read_only
        super().__init__(
            db.connect(), db.where, read_only=read_only, locks=not read_only, fatal=self.errors
        )
        self.db = db
        self.channel = channel(db.schema)
        # The BEGIN of the open transaction until it is sent: with its first statement
        # (the look for what time has done, in one round trip), or before it.
        self._begin: list[str] = []
        self._wake: set[str] = set()  # targets with newly claimable tasks, to NOTIFY

    @property
    def conn(self) -> Connection:
        """The connection, inside a transaction with the transaction begun."""
        if self._begin:
            self._raw.execute(self._begin.pop())
        return self._raw

    @contextlib.contextmanager
    def _begun(self) -> Iterator[None]:
        try:
            # (a transaction the server rolled back is a `TransactionAborted` by now)
            with self.db.errors("durable store"):
                if self._raw.broken or self._raw.closed:
                    self._raw.close()
                    # (a server restarting is waited for, up to the store's timeout)
                    self._raw = self.db.connect(wait=True)
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
                        raise self.db.in_doubt("durable store", exc, self._raw) from exc
                    if not self._begin:  # (else nothing was sent: nothing to end)
                        self._commit()
                except BaseException:
                    if not self._begin and not self._raw.broken and not self._raw.closed:
                        with contextlib.suppress(self._psycopg.Error):
                            self._raw.execute("ROLLBACK")
                    raise
        finally:
            self._begin.clear()
            self._wake.clear()

    def _commit(self) -> None:
        """COMMIT the open transaction, after the NOTIFY of the targets with newly
        claimable tasks. A connection lost before the COMMIT (a restart) wrote
        nothing: `TransactionAborted` (the operation is run again). One lost during
        the COMMIT is settled by asking the server, on another connection, whether
        the transaction took effect: if it did, as if nothing happened."""
        raw = self._raw
        xid, committing = None, False
        try:
            if not self._read_only:
                sql = _before_commit(self._psycopg, self.channel, self._wake)
                (xid,) = raw.execute(sql).fetchone()
            committing = True
            raw.execute("COMMIT")
        except self._psycopg.Error as exc:
            aborted = self.db.in_doubt("durable store", exc, raw, committing)
            if self.db.committed("durable store", exc, xid):
                return
            raise aborted from exc

    def attempt(self, call: Callable[[], Any]) -> tuple[bool, Any]:
        wake = set(self._wake)
        done = super().attempt(call)
        if not done[0]:
            self._wake = wake  # its tasks made claimable are undone too
        return done

    def put_task(self, row: Row) -> None:
        before = self._stored.get((TASKS.name, row["id"]))
        super().put_task(row)
        written = self._overlay is None  # (a read-only store's goes to its overlay)
        if written and row["state"] == _PENDING and (before is None or before[1] != _PENDING):
            self._wake.add(payload(row["target"]))

    def timed_out_promises(self, now: float) -> list[Row]:
        # The protocol's first call of a transaction: one look (with the BEGIN) says
        # whether any of the three queries of time would find a row.
        if self._begin and math.isfinite(now):
            begin = self._begin.pop()
            found = self._raw.execute(f"{begin}; {_ANY_DUE.format(now=repr(float(now)))}")
            found.nextset()
            self._due = tuple(found.fetchone())
        return super().timed_out_promises(now)

    def claim(
        self, target: str, limit: int, pid: str, ttl: float, now: float
    ) -> list[tuple[Row, str | None]]:
        """Acquire up to ``limit`` pending tasks of ``target`` (oldest id first,
        skipping rows another transaction holds), in one statement."""
        keep(self._overlay, self._read_only, self.path, "claim")
        args = (target, limit, pid, ttl, now + ttl)
        rows = self.conn.execute(_CLAIM, args, prepare=_PLANNED).fetchall()
        self.writes += bool(rows)
        rows.sort(key=lambda r: r[0])
        return [(self._row(TASKS, r[:-1]), r[-1]) for r in rows]

    def fulfil_many(
        self, items: list[tuple[str, int, str, str | None]], now: float
    ) -> list[tuple[Row, bool]] | None:
        """`BulkTables.fulfil_many`: one statement, which writes only if every task
        is acquired at its version and every promise pending (rows locked)."""
        keep(self._overlay, self._read_only, self.path, "fulfil_many")
        batch = _json([{"id": i, "version": v, "state": s, "data": d} for i, v, s, d in items])
        args = (batch, len(items), now)
        rows = self.conn.execute(_FULFIL_MANY, args, prepare=_PLANNED).fetchall()
        if len(rows) != len(items):
            return None
        self.writes += 1
        settled = {r[0]: (self._row(PROMISES, r[:-2]), bool(r[-2])) for r in rows}
        for id, *_ in items:
            self._stored.pop((TASKS.name, id), None)
        return [settled[id] for id, *_ in items]

    def create_many(self, promises: list[Row], tasks: list[Row]) -> bool:
        """`BulkTables.create_many`: one statement, which inserts the rows unless a
        promise of the batch exists (one inserted meanwhile by another transaction
        aborts this one: `TransactionAborted`)."""
        keep(self._overlay, self._read_only, self.path, "create_many")
        p_values = [PROMISES.values(row) for row in promises]
        t_values = [TASKS.values(row) for row in tasks]
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
            self._stored[PROMISES.name, values[0]] = values
        for values, row in zip(t_values, tasks, strict=True):
            self._stored[TASKS.name, values[0]] = values
            self._wake.add(payload(row["target"]))
        return True


def _json(rows: list[dict[str, Any]]) -> str:
    """A batch's rows as one JSON parameter (ValueError: a float JSON cannot hold)."""
    return json.dumps(rows, allow_nan=False)


def _before_commit(psycopg: Any, channel: str, wake: set[str]) -> Any:
    """The transaction's id (None if it wrote nothing), then the NOTIFY of the
    targets with newly claimable tasks (one round trip: the values are quoted here)."""
    if not wake:
        return XID
    sql = psycopg.sql
    notify = sql.SQL("; SELECT pg_notify({}, t) FROM unnest({}::text[]) t")
    return sql.SQL(XID) + notify.format(sql.Literal(channel), sql.Literal(sorted(wake)))


class Listener:
    """A connection of its own, listening on a schema's channel: which targets had
    tasks become claimable. Its socket (`fileno`) turns readable when a
    notification arrives; `received` then reads what came without blocking."""

    def __init__(self, db: PGDatabase, channel: str) -> None:
        psycopg = load_psycopg()[0]
        self._errors = psycopg.Error
        listen = psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel))
        self.conn: Connection = db.connect(listen=listen)

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
