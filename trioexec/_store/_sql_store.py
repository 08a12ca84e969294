"""`SQLStore`: every operation of a SQL store, written once over a database's
connections (`SQLiteFile`, `PGDatabase`) and a `Dialect`. `SQLiteStore` and
`PostgresStore` say only how they connect and the little that truly differs:
how a batch of new rows goes in, how claims lock, how commands take turns.

**Claims lock, then judge.** A recovery or a run takeover first takes the
candidate rows (PostgreSQL: ``FOR UPDATE ... SKIP LOCKED``, so two hosts
recovering at once claim different rows; SQLite: the write transaction holds
the whole file), then reads them again in a new statement and judges them (the
verdicts of `_verdict`): under READ COMMITTED a row another host claimed
meanwhile is locked with its new owner, but judged against the owners of the
first statement's snapshot, where that owner's lease may not exist yet.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
from collections.abc import Callable, Collection, Sequence
from typing import Any, ClassVar, Concatenate, ParamSpec, Protocol, TypeVar

from .._changes import (
    R_DEDUPE,
    R_ID,
    Change,
    ExecutionRow,
    RunChange,
    RunCreated,
    StepRecorded,
    Transition,
)
from .._errors import StoreError
from .._records import TYPED, ExecutionRecord, SubStatus, TaskStatus, check_number
from ._base import (
    ORDERS,
    ORPHANED,
    RUN_COLUMNS,
    RUN_ORPHANED,
    SCHEDULE_FIELDS,
    SELECT_RECORDS,
    SUPERSEDED,
    Command,
    Order,
    Pause,
    Recovery,
    Requeued,
    RunRecord,
    RunRecovery,
    ScheduleRecord,
    abandoned_error,
    check_limit,
    fold_batch,
    matches_some,
    record_by_id,
    records_of,
    run_of,
    schedule_of,
    update_sql,
    upsert_sql,
)
from ._control import (
    COMMAND_COLUMNS,
    check_command,
    check_requeue,
    command_of,
    descendants_sql,
    sql_command,
    sql_requeue,
)
from ._dialect import Dialect
from ._key_ledger import PRUNE_MORE, Hold, KeyGrant, KeyRequest, full_at, settle
from ._verdict import Verdict, claimed_attempts, recovery_verdict

T = TypeVar("T")
S = TypeVar("S", bound="SQLStore")
P = ParamSpec("P")
R = TypeVar("R")

_SCHEDULE_COLUMNS = ", ".join(SCHEDULE_FIELDS)
_LIVE = "('pending', 'running')"


class Database(Protocol):
    """A SQL store's connections (`SQLiteFile`, `PGDatabase`)."""

    def transaction(self, what: str, /) -> contextlib.AbstractContextManager[Any]: ...

    def reading(
        self, what: str, /, *, snapshot: bool = False
    ) -> contextlib.AbstractContextManager[Any]: ...

    def retry(self, call: Callable[[], T], /) -> T: ...

    def close(self) -> None: ...


def _retried(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """A store call, run again while its database says it may be (PostgreSQL: the
    server ended the connection before the transaction could commit, a restart:
    `PGDatabase.retry`; SQLite never does)."""

    @functools.wraps(method)
    def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._db.retry(lambda: method(self, *args, **kwargs))

    return call


def _value(v: object) -> object:
    """An enum as its value (psycopg would send an Enum's name)."""
    return getattr(v, "value", v)


class SQLStore:
    """The `Store` operations of a SQL database, one body for `SQLiteStore` and
    `PostgresStore`."""

    #: Which SQL the store speaks (the dashboard's reads, `_browse`, use it too).
    dialect: ClassVar[Dialect]
    _db: Database
    path: str  #: what messages and views name the store by
    clock: Callable[[], float]

    # ------------------------------------------------------------------ what differs

    def _insert_rows(self, conn: Any, rows: list[ExecutionRow]) -> list[str]:
        """Insert a batch's new rows; the ids of those refused: an execution of
        that id is stored already (another executor's, or a batch written again
        after a failure that may have passed). Those rows, the changes folded
        into them and only they go unwritten."""
        raise NotImplementedError

    def _begin(self, conn: Any) -> None:
        """Start a transaction whose later statements must see what committed
        since its first (PostgreSQL: READ COMMITTED whatever the default)."""

    def _lock_key(self, conn: Any, key: str, person: bytes = b"") -> None:
        """Take the transaction's lock of ``key`` (PostgreSQL: an advisory lock;
        SQLite's write transaction holds the whole file already). ``person``
        picks another space of locks (a dedupe key's is ``b"dedupe"``)."""

    def _commanding(self, what: str) -> contextlib.AbstractContextManager[Any]:
        """The write transaction of a command."""
        return self._db.transaction(what)

    def _wrote(self, conn: Any, changes: Sequence[Change]) -> None:
        """A write's last statement before it commits (PostgreSQL: wake
        `trioexec.wait_result`'s listeners if it ended an execution)."""

    # ------------------------------------------------------------------ writes

    @_retried
    def write(self, changes: Sequence[Change]) -> list[str]:
        m = self.dialect.mark
        with self._db.transaction("write") as conn:

            def update(change: Transition | RunChange) -> bool:
                if isinstance(change, RunChange):
                    return self._write_run(conn, m, change)
                args = (*(_value(v) for v in change[2:]), change[0], change[1])
                return int(conn.execute(update_sql(change.kind, m), args).rowcount) == 1

            fresh, fenced = fold_batch(changes, update)
            if fresh:
                fenced.extend(self._insert_rows(conn, fresh))
            self._wrote(conn, changes)
        return fenced

    @staticmethod
    def _write_run(conn: Any, m: str, change: RunChange) -> bool:
        """Apply a run change; False if fenced (the run is not the writer's)."""
        if isinstance(change, RunCreated):
            run_id, owner, workflow, context, created_at, graph = change
            conn.execute(
                "INSERT INTO workflow_runs (run_id, workflow, status, context, owner,"
                f" created_at, graph) VALUES ({m}, {m}, 'running', {m}, {m}, {m}, {m})"
                " ON CONFLICT (run_id) DO NOTHING",
                (run_id, workflow, context, owner, created_at, graph),
            )
            return True
        owned = conn.execute(
            f"SELECT 1 FROM workflow_runs WHERE run_id = {m} AND owner = {m}",
            (change[0], change[1]),
        ).fetchone()
        if owned is None:
            return False
        if isinstance(change, StepRecorded):
            run_id, _, step_id, state, output, task_id = change
            conn.execute(
                "INSERT INTO workflow_steps (run_id, step_id, state, output, task_id)"
                f" VALUES ({m}, {m}, {m}, {m}, {m}) ON CONFLICT (run_id, step_id) DO UPDATE"
                " SET state = excluded.state, output = excluded.output,"
                " task_id = excluded.task_id",
                (run_id, step_id, _value(state), output, task_id),
            )
        else:
            conn.execute(
                f"UPDATE workflow_runs SET status = {m}, finished_at = {m} WHERE run_id = {m}",
                (_value(change[2]), change[3], change[0]),
            )
        return True

    # ------------------------------------------------------------------ leases

    @_retried
    def heartbeat(self, owner: str, lease_expires_at: float) -> None:
        with self._db.transaction("heartbeat") as conn:
            write_lease(conn, self.dialect.mark, owner, lease_expires_at)

    @_retried
    def renew_lease(self, owner: str, lease: float) -> float:
        """`heartbeat` for ``lease`` seconds from when it is written (this
        store's clock, once its transaction has begun: not from a wait for the
        store's lock). Returns when it expires."""
        with self._db.transaction("heartbeat") as conn:
            at = self.clock() + lease
            write_lease(conn, self.dialect.mark, owner, at)
        return at

    @_retried
    def release_owner(self, owner: str) -> None:
        m = self.dialect.mark
        with self._db.transaction("release owner") as conn:
            self._begin(conn)
            conn.execute(f"DELETE FROM owners WHERE owner = {m}", (owner,))
            # Its keys' locks first, in a round's order: a round reclaiming these
            # rows holds the lock, and the two would otherwise wait on each other.
            held = conn.execute(f"SELECT key FROM key_holds WHERE owner = {m}", (owner,))
            for key in sorted(row[0] for row in held.fetchall()):
                self._lock_key(conn, key)
            conn.execute(f"DELETE FROM key_holds WHERE owner = {m}", (owner,))

    @_retried
    def taken_over(self, owner: str, live: dict[str, int]) -> list[str]:
        if not live:
            return []
        d = self.dialect
        with self._db.reading("check ownership") as conn:
            found = dict(
                conn.execute(
                    f"SELECT task_id, version FROM executions WHERE {d.in_list('task_id')}"
                    f" AND owner = {d.mark} AND status IN {_LIVE}",
                    (d.list_param(live), owner),
                ).fetchall()
            )
            lost = [t for t, v in live.items() if found.get(t, v) != v]
            missing = [t for t in live if t not in found]
            if missing:
                # Either not flushed yet (fine) or taken by someone else (lost).
                sql = f"SELECT task_id FROM executions WHERE {d.in_list('task_id')}"
                lost += [row[0] for row in conn.execute(sql, (d.list_param(missing),))]
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
        d = self.dialect
        m = d.mark
        claimed: list[ExecutionRecord] = []
        orphaned: list[ExecutionRecord] = []
        abandoned: list[ExecutionRecord] = []
        with self._db.transaction("recover") as conn:
            self._begin(conn)  # (the second read below needs a new snapshot)
            expired = (
                f" e.status IN {_LIVE} AND e.owner {d.is_not} {m}"
                " AND e.run_id IS NULL"  # a workflow step is resumed with its run
                f" AND (o.lease_expires_at IS NULL OR o.lease_expires_at < {m})"
            )
            locked = conn.execute(  # (lock, then judge: see the module's docstring)
                "SELECT e.task_id FROM executions e LEFT JOIN owners o ON o.owner = e.owner"
                f" WHERE{expired} ORDER BY e.{d.seq}{d.skip_locked.format(alias='e')}",
                (owner, now),
            ).fetchall()
            if not locked:
                return Recovery([], [], [])
            of_ids = f"{SELECT_RECORDS} WHERE {d.in_list('e.task_id')}"
            by_seq = f" ORDER BY e.{d.seq}"
            params = (d.list_param([r[0] for r in locked]), owner, now)
            candidates = records_of(conn, self.path, f"{of_ids} AND{expired}{by_seq}", params)
            claim: dict[str, tuple[int, int]] = {}  # task id -> (version, attempts once claimed)
            for record in candidates:
                room = limit is None or len(claim) < limit
                verdict = recovery_verdict(record, recreatable(record), max_recovery_attempts, room)
                if verdict is Verdict.ABANDON or verdict is Verdict.ORPHAN:
                    abandon = verdict is Verdict.ABANDON
                    error = abandoned_error(record.recovery_attempts) if abandon else ORPHANED
                    args = ("failed", now, error, record.task_id, record.version)
                    conn.execute(update_sql("end", m), args)
                    ended = record_by_id(conn, m, self.path, record.task_id)
                    assert ended is not None  # (its row, just written)
                    (abandoned if abandon else orphaned).append(ended)
                elif verdict is Verdict.CLAIM:
                    claim[record.task_id] = (record.version, claimed_attempts(record))
            if claim:
                conn.cursor().executemany(  # (psycopg's connections have no executemany)
                    update_sql("claim", m),
                    [(owner, n, task_id, version) for task_id, (version, n) in claim.items()],
                )
                claimed = records_of(conn, self.path, of_ids + by_seq, (d.list_param(claim),))
        return Recovery(claimed, orphaned, abandoned)

    # ------------------------------------------------------------------ dedupe keys

    @_retried
    def dedupe(self, row: ExecutionRow, window: float | None) -> ExecutionRecord | None:
        """See `Store.dedupe`: under the key's lock, so that two hosts submitting
        one key at once take turns (and the unique index of live keys refuses a
        second live one whatever happens)."""
        m = self.dialect.mark
        key = row[R_DEDUPE]
        recent = "" if window is None else f" AND e.finished_at > {m}"  # (less than ago)
        sql = (
            f"{SELECT_RECORDS} WHERE e.dedupe_key = {m} AND (e.status IN {_LIVE}"
            f" OR (e.status = 'completed'{recent})) ORDER BY e.{self.dialect.seq} DESC LIMIT 1"
        )
        with self._db.transaction("dedupe") as conn:
            self._begin(conn)
            self._lock_key(conn, key, b"dedupe")
            args = (key,) if window is None else (key, self.clock() - window)
            found = records_of(conn, self.path, sql, args)
            if found:
                return found[0]
            if self._insert_rows(conn, [row]):
                raise ValueError(f"task id {row[R_ID]!r} is already recorded in the store")
        return None

    @_retried
    def descendants(self, task_id: str) -> list[ExecutionRecord]:
        """See `Store.descendants`."""
        with self._db.reading("read descendants") as conn:
            return records_of(conn, self.path, *descendants_sql(self.dialect, task_id))

    # ------------------------------------------------------------------ keys

    @_retried
    def key_round(self, owner: str, requests: Sequence[KeyRequest]) -> list[KeyGrant]:
        """See `Store.key_round`. Each key is settled under its lock (`_lock_key`),
        taken in sorted key order: two hosts settling one key take turns, and
        never wait on each other in a cycle."""
        m = self.dialect.mark
        grants: dict[int, KeyGrant] = {}
        with self._db.transaction("key round") as conn:
            self._begin(conn)
            for i in sorted(range(len(requests)), key=lambda i: requests[i].key):
                self._lock_key(conn, requests[i].key)
                # (read after the lock, and the clock too: rounds see it in order)
                grants[i] = settle_key(conn, m, owner, requests[i], self.clock())
            # Then the buckets full by now (the same as none; a key used once is
            # never settled again to delete its own), earliest first, at most
            # PRUNE_MORE beyond one per key settled. PostgreSQL skips a row another
            # round is writing: this one never waits for it, holding keys that
            # round may wait for.
            lock = self.dialect.skip_locked.format(alias="key_buckets")
            now = self.clock()
            conn.execute(
                "DELETE FROM key_buckets WHERE key IN (SELECT key FROM key_buckets"
                f" WHERE full_at <= {m} ORDER BY full_at, key LIMIT {m}{lock})"
                f" AND full_at <= {m}",
                (now, len(requests) + PRUNE_MORE, now),
            )
        return [grants[i] for i in range(len(requests))]

    # ------------------------------------------------------------------ schedules

    @_retried
    def save_schedule(self, record: ScheduleRecord) -> ScheduleRecord | None:
        m = self.dialect.mark
        lock = self.dialect.for_update
        with self._db.transaction("save schedule") as conn:
            before = conn.execute(
                f"SELECT {_SCHEDULE_COLUMNS} FROM schedules WHERE schedule_id = {m}{lock}",
                (record.schedule_id,),
            ).fetchone()
            conn.execute(  # (its last run, if any, is kept)
                upsert_sql(m, "schedules", "schedule_id, cron, tz, name, next_run", "schedule_id"),
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
        m = self.dialect.mark
        with self._db.transaction("claim schedule occurrence") as conn:
            inserted = conn.execute(
                f"INSERT INTO schedule_runs (schedule_id, at, owner) VALUES ({m}, {m}, {m})"
                " ON CONFLICT DO NOTHING",
                (schedule_id, at, owner),
            )
            won = int(inserted.rowcount) == 1
            if won:
                conn.execute(
                    f"UPDATE schedules SET last_run = {self.dialect.greatest}"
                    f"(coalesce(last_run, {m}), {m}), next_run = {m} WHERE schedule_id = {m}",
                    (at, at, next_run, schedule_id),
                )
        return won

    @_retried
    def release_occurrence(self, schedule_id: str, at: float, owner: str) -> bool:
        m = self.dialect.mark
        with self._db.transaction("release schedule occurrence") as conn:
            deleted = conn.execute(
                f"DELETE FROM schedule_runs WHERE schedule_id = {m} AND at = {m} AND owner = {m}",
                (schedule_id, at, owner),
            )
            released = int(deleted.rowcount) == 1
            if released:
                conn.execute(
                    "UPDATE schedules SET last_run = (SELECT max(at) FROM schedule_runs"
                    f" WHERE schedule_id = {m}) WHERE schedule_id = {m} AND last_run = {m}",
                    (schedule_id, schedule_id, at),
                )
        return released

    # ------------------------------------------------------------------ workflow runs

    @_retried
    def claim_runs(
        self,
        owner: str,
        now: float,
        workflows: Collection[str],
        max_recovery_attempts: int,
    ) -> RunRecovery:
        d = self.dialect
        m = d.mark
        known = set(workflows)
        claimed: list[RunRecord] = []
        orphaned: list[RunRecord] = []
        abandoned: list[RunRecord] = []
        with self._db.transaction("claim workflow runs") as conn:
            self._begin(conn)
            expired = (
                " FROM workflow_runs r LEFT JOIN owners o ON o.owner = r.owner"
                f" WHERE r.status = 'running' AND r.owner {d.is_not} {m}"
                f" AND (o.lease_expires_at IS NULL OR o.lease_expires_at < {m})"
            )
            locked = conn.execute(  # (lock, then judge: see the module's docstring)
                f"SELECT r.run_id{expired} ORDER BY r.{d.seq}{d.skip_locked.format(alias='r')}",
                (owner, now),
            ).fetchall()
            if not locked:
                return RunRecovery([], [], [])
            rows = conn.execute(
                f"SELECT r.run_id, r.workflow, r.recovery_attempts{expired}"
                f" AND {d.in_list('r.run_id')} ORDER BY r.{d.seq}",
                (owner, now, d.list_param([r[0] for r in locked])),
            ).fetchall()
            end_steps = update_sql("end", m, "run_id = {m}")  # (a run's live step executions)
            the_run = f"WHERE run_id = {m}"
            for run_id, workflow, attempts in rows:
                if workflow in known and attempts < max_recovery_attempts:
                    conn.execute(
                        f"UPDATE workflow_runs SET owner = {m},"
                        f" recovery_attempts = recovery_attempts + 1 WHERE run_id = {m}",
                        (owner, run_id),
                    )
                    conn.execute(end_steps, ("cancelled", now, SUPERSEDED, run_id))
                    claimed += self._runs(conn, the_run, (run_id,))
                    continue
                orphan = workflow not in known
                conn.execute(
                    f"UPDATE workflow_runs SET status = 'failed', finished_at = {m}"
                    f" WHERE run_id = {m}",
                    (now, run_id),
                )
                error = RUN_ORPHANED if orphan else abandoned_error(attempts)
                conn.execute(end_steps, ("failed", now, error, run_id))
                (orphaned if orphan else abandoned).extend(self._runs(conn, the_run, (run_id,)))
        return RunRecovery(claimed, orphaned, abandoned)

    def _runs(self, conn: Any, where: str, params: Sequence[object]) -> list[RunRecord]:
        """The runs ``where`` (its conditions and order) finds, with their steps."""
        d = self.dialect
        sql = f"SELECT {', '.join(RUN_COLUMNS)} FROM workflow_runs {where}"
        steps = f"SELECT step_id, state, output FROM workflow_steps WHERE run_id = {d.mark}"
        runs = []
        for row in conn.execute(sql, params).fetchall():
            found = conn.execute(f"{steps} ORDER BY {d.seq}", (row[0],)).fetchall()
            runs.append(run_of(row, {step: (state, out) for step, state, out in found}))
        return runs

    @_retried
    def runs_taken_over(self, owner: str, run_ids: Collection[str]) -> list[str]:
        d = self.dialect
        sql = f"SELECT run_id FROM workflow_runs WHERE {d.in_list('run_id')} AND owner {d.is_not} "
        with self._db.reading("check run ownership") as conn:
            return [row[0] for row in conn.execute(sql + d.mark, (d.list_param(run_ids), owner))]

    @_retried
    def run(self, run_id: str) -> RunRecord | None:
        """One workflow run, or None: a few primary-key reads in one snapshot
        (never waits behind a write)."""
        if not matches_some(run_id=run_id):
            return None
        with self._db.reading("query workflow run", snapshot=True) as conn:
            found = self._runs(conn, f"WHERE run_id = {self.dialect.mark}", (run_id,))
        return found[0] if found else None

    @_retried
    def runs(self, *, status: str | None = None) -> list[RunRecord]:
        if not matches_some(status=status):
            return []
        d = self.dialect
        where, params = ("", ()) if status is None else (f"WHERE status = {d.mark} ", (status,))
        with self._db.reading("query workflow runs", snapshot=True) as conn:
            return self._runs(conn, f"{where}ORDER BY {d.seq}", params)

    # ------------------------------------------------------------------ commands

    @_retried
    def command(
        self,
        kind: str,
        *,
        name: str | None = None,
        key: str | None = None,
        task_id: str | None = None,
        who: str,
        at: float | None = None,
    ) -> Command:
        """See `Store.command`: one write transaction (a bad argument is refused
        before its lock is waited for)."""
        asked = check_command(kind, name, key, task_id, who, at)
        with self._commanding("record a command") as conn:
            now = self.clock()  # (its turn taken: commands see the clock in order)
            return sql_command(conn, self.dialect, self.path, now, asked)

    @_retried
    def commands(self, after: int = 0, limit: int | None = None) -> list[Command]:
        """See `Store.commands`: a range of the primary key (never waits for a write)."""
        check_number("after", after, int, "an int >= 0 (a command's seq)", ge=0, stored=True)
        check_limit(limit)
        m = self.dialect.mark
        sql = f"SELECT {COMMAND_COLUMNS} FROM commands WHERE seq > {m} ORDER BY seq"
        params: list[object] = [after]
        if limit is not None:
            sql += f" LIMIT {m}"
            params.append(limit)
        with self._db.reading("query commands") as conn:
            return [command_of(row) for row in conn.execute(sql, params).fetchall()]

    @_retried
    def last_command_seq(self) -> int:
        """See `Store.last_command_seq`: the primary key's end."""
        with self._db.reading("query commands") as conn:
            row = conn.execute("SELECT max(seq) FROM commands").fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    @_retried
    def pauses(self) -> list[Pause]:
        """See `Store.pauses`."""
        with self._db.reading("query pauses") as conn:
            rows = conn.execute("SELECT kind, value, who, at FROM pauses WHERE paused").fetchall()
        pauses = [Pause(kind=k, value=v, who=w, at=a) for k, v, w, a in rows]
        return sorted(pauses, key=lambda p: (p.kind, p.value))  # (not a database's collation)

    @_retried
    def requeue(
        self,
        task_ids: Sequence[str] | None = None,
        *,
        name: str | None = None,
        since: float | None = None,
        who: str,
    ) -> Requeued:
        """See `Store.requeue`: one write transaction."""
        checked = check_requeue(task_ids, name, since, who)
        with self._commanding("requeue") as conn:
            now = self.clock()
            return sql_requeue(conn, self.dialect, self.path, now, checked, who)

    def snapshot(self, doing: str) -> contextlib.AbstractContextManager[Any]:
        """A read connection whose statements see one state of the database (never
        waits for a write; read-only stores too), for the dashboard's reads
        (`trioexec._store._browse`). ``doing`` names the read in a `StoreError`."""
        return self._db.reading(doing, snapshot=True)

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
        """See `Store.executions`: sorted and cut in SQL, on an index where the
        filters allow."""
        check_limit(limit)
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
        found = self._where(status, sub_status, deferred_longer_than, run_id, key)
        if found is None:
            return []
        where, params, deferred_only = found
        d = self.dialect
        seq = f"e.{d.seq}"
        # (only deferred ones: no NULLs, the index's order)
        deferred = "e.deferred_since" if deferred_only else d.deferred_last
        by = {"oldest": seq, "newest": f"{seq} DESC", "longest_deferred": f"{deferred}, {seq}"}
        sql = f"{SELECT_RECORDS}{where} ORDER BY {by[order]}"
        if limit is not None:
            sql += f" LIMIT {d.mark}"
            params.append(limit)
        with self._db.reading("query executions") as conn:
            return records_of(conn, self.path, sql, params)

    def _where(
        self, status: str | None, sub_status: str | None, since: object, run_id: object, key: object
    ) -> tuple[str, list[object], bool] | None:
        """The ``WHERE`` (on ``e``) of `executions`' and `counts`' filters (None: not
        filtered; ValueError or TypeError naming a bad one; ``since``: their
        ``deferred_longer_than``), its parameters, and whether only deferred
        executions match; None if none can (a ``run_id`` or ``key`` no store can hold)."""
        equal: dict[str, object] = {
            "status": None if status is None else TaskStatus(status).value,
            "sub_status": None if sub_status is None else SubStatus(sub_status).value,
        }
        if isinstance(since, datetime.timedelta):
            since = since.total_seconds()
        elif since is not None:
            must = "seconds or a timedelta"
            since = check_number(
                "deferred_longer_than", since, float, must, errors=TYPED, stored=True
            )
        if not matches_some(run_id=run_id, key=key):
            return None
        equal.update(run_id=run_id, key=key)
        m = self.dialect.mark
        where = [f"e.{column} = {m}" for column, value in equal.items() if value is not None]
        params: list[object] = [value for value in equal.values() if value is not None]
        if since is not None:  # (deferred since then or before, on the store's clock)
            where.append(f"e.sub_status = 'deferred' AND e.deferred_since <= {m}")
            params.append(self.clock() - since)
        deferred_only = equal["sub_status"] == "deferred" or since is not None
        return (" WHERE " + " AND ".join(where) if where else ""), params, deferred_only

    @_retried
    def counts(
        self,
        *,
        sub_status: SubStatus | str | None = None,
        deferred_longer_than: float | datetime.timedelta | None = None,
        run_id: str | None = None,
        key: str | None = None,
    ) -> dict[TaskStatus, int]:
        """How many executions match the filters, per status (every status
        present, zeros included): one ``GROUP BY`` on the status index."""
        counts = dict.fromkeys(TaskStatus, 0)
        found = self._where(None, sub_status, deferred_longer_than, run_id, key)
        if found is None:
            return counts
        m = self.dialect.mark
        where, params, _ = found
        sql = f"SELECT e.status, count(*) FROM executions e{where} GROUP BY e.status"
        with self._db.reading("count executions") as conn:
            for value, n in conn.execute(sql, params).fetchall():
                try:
                    counts[TaskStatus(value)] = n
                except ValueError:
                    bad = conn.execute(
                        f"SELECT task_id FROM executions WHERE status = {m} LIMIT 1", (value,)
                    ).fetchone()
                    raise StoreError(
                        f"{self.path}: execution {bad[0]!r} has an unreadable row"
                        f" (status {value!r})"
                    ) from None
        return counts

    @_retried
    def execution(self, task_id: str) -> ExecutionRecord | None:
        """See `Store.execution`: a primary-key read on a read connection (never
        waits behind a write)."""
        if not matches_some(task_id=task_id):
            return None
        with self._db.reading("query execution") as conn:
            return record_by_id(conn, self.dialect.mark, self.path, task_id)

    def close(self) -> None:
        """Close every connection; idempotent."""
        self._db.close()

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def settle_key(conn: Any, mark: str, owner: str, request: KeyRequest, now: float) -> KeyGrant:
    """One key of a SQL store's `Store.key_round` (``mark``: the placeholder, ``?``
    or ``%s``): reclaim dead owners' slots, `settle`, write the owner's row and the
    key's bucket back. ``conn`` is in the round's transaction."""
    key = request.key
    conn.execute(
        f"DELETE FROM key_holds WHERE key = {mark} AND owner <> {mark} AND owner NOT IN"
        f" (SELECT owner FROM owners WHERE lease_expires_at >= {mark})",
        (key, owner, now),
    )
    sql = f"SELECT owner, held, wanted, since FROM key_holds WHERE key = {mark}"
    rows = [Hold(o, held=h, wanted=w, since=s) for o, h, w, s in conn.execute(sql, (key,))]
    others = [h for h in rows if h.owner != owner]
    mine = next((h for h in rows if h.owner == owner), None)
    sql = f"SELECT tokens, stamp FROM key_buckets WHERE key = {mark}"
    found = conn.execute(sql, (key,)).fetchone()
    grant, row, bucket = settle(request, others, None if found is None else tuple(found), now, mine)
    if row is None:
        conn.execute(f"DELETE FROM key_holds WHERE key = {mark} AND owner = {mark}", (key, owner))
    else:
        sql = upsert_sql(mark, "key_holds", "key, owner, held, wanted, since", "key, owner")
        conn.execute(sql, (key, owner, row.held, row.wanted, row.since))
    if bucket is None:
        conn.execute(f"DELETE FROM key_buckets WHERE key = {mark}", (key,))
    else:
        sql = upsert_sql(mark, "key_buckets", "key, tokens, stamp, full_at", "key")
        conn.execute(sql, (key, *bucket, full_at(request, bucket)))
    return grant


def write_lease(conn: Any, mark: str, owner: str, lease_expires_at: float) -> None:
    """Create or renew ``owner``'s lease (``mark``: the placeholder)."""
    lease = upsert_sql(mark, "owners", "owner, lease_expires_at", "owner")
    conn.execute(lease, (owner, lease_expires_at))
