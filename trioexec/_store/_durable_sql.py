"""The durable tables on a SQL database, written once for SQLite (`SQLiteTables`)
and PostgreSQL (`PostgresTables`): rows read, checked and written back, the
queries of time, searches, callbacks, and a read-only store's overlay.

Each backend gives its dialect (the placeholder, how a row not read in this
transaction is inserted, how a tag is matched, the callbacks' order, whether a
read locks its rows), how a transaction begins and ends, and its claim.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import attrs

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


@attrs.frozen
class Table:
    """One durable table, as the shared code reads and writes its rows."""

    name: str
    noun: str  # what messages call a row
    cols: tuple[str, ...]
    states: frozenset[str]
    copy: Callable[[Row], Row]  # a copy of a row, to be changed alone
    of: Callable[[Overlay], dict[str, Row]]  # the overlay's rows of this table
    select: str = attrs.field(init=False)

    @select.default
    def _select(self) -> str:
        return f"SELECT {', '.join(self.cols)} FROM {self.name}"

    def values(self, row: Row) -> tuple[Any, ...]:
        """``row``'s values as stored (a promise's tags as JSON text)."""
        return tuple(
            json.dumps(row[c], sort_keys=True) if c == "tags" else row[c] for c in self.cols
        )


PROMISES = Table(
    name="durable_promises",
    noun="promise",
    cols=("id", "state", "data", "timeout_at", "ikc", "iku", "tags", "created_at", "settled_at"),
    states=frozenset(s.value for s in PromiseState),
    copy=copy_promise,
    of=lambda overlay: overlay.promises,
)
TASKS = Table(
    name="durable_tasks",
    noun="task",
    cols=("id", "state", "version", "target", "pid", "ttl", "lease_expires_at", "timeout_at"),
    states=frozenset(s.value for s in TaskState),
    copy=dict,
    of=lambda overlay: overlay.tasks,
)


class SQLTables:
    """The durable_* tables on one connection, inside a transaction: the row access
    the durable protocol runs on. Rows are plain dicts; ``put_*`` writes back.

    ``promise(id)``/``task(id)`` read a row to change it: a backend several processes
    share locks it (a concurrent transaction waits, then sees what this one wrote).
    With ``shared`` it is only looked at: unchanged until the transaction ends, but
    lookers do not wait for each other (nor deadlock, reading in different orders).
    ``update_task/update_promise(id, expect, changes)`` change a row only if its
    columns hold ``expect``'s (non-None) values, and say whether they did (the
    promise: its row as changed, or None). ``claim(target, limit, pid, ttl, now)``
    acquires (`acquired`: version + 1) up to ``limit`` pending tasks of ``target``,
    oldest id first, each returned with its promise's data; a shared backend skips
    the rows a concurrent transaction holds, so concurrent claims differ.

    A backend sets its dialect: ``MARK``, the placeholder; ``INSERT``, which stores a
    row not read in this transaction (no row changed: another transaction inserted
    it meanwhile, `TransactionAborted`); ``READ_BACK``, whether a task's update reads
    back the row, kept as stored (else a later write stores the whole row);
    ``TAGGED``, that a promise has the tag given as two parameters; ``SEQ``, the
    column ordering callbacks as added. It gives `_begun` and ``claim``. ``writes``
    counts the statements that changed rows; a backend that also names its
    ``errors`` is an `AloneTables` (no savepoint per operation).
    """

    MARK: str
    INSERT: str
    READ_BACK: bool
    TAGGED: str
    SEQ: str
    #: One transaction begun, ended at the end of the block.
    _begun: Callable[[], contextlib.AbstractContextManager[None]]
    claim: Callable[[str, int, str, float, float], list[tuple[Row, str | None]]]

    def __init__(
        self,
        conn: Any,
        path: str,
        *,
        read_only: bool,
        locks: bool,
        fatal: tuple[type[Exception], ...],
    ) -> None:
        self._raw = conn
        self.path = path  # what messages name the store by
        self._read_only = read_only
        # With ``locks``: rows read to change, looked at (``shared``), and found
        # by time's queries (skipping those another transaction holds).
        self._lock = " FOR UPDATE" if locks else ""
        self._share = " FOR SHARE" if locks else ""
        self._skip = " FOR UPDATE SKIP LOCKED" if locks else ""
        self._fatal = fatal  # the database's errors: they fail the transaction
        self._open = False  # a transaction is open (calls run in one thread at a time)
        # A read-only transaction's effects of time, kept in memory (never written).
        self._overlay: Overlay | None = None
        # (table, id) -> the row's stored values as read in this transaction: a
        # write then updates only the columns that changed (fewer index entries,
        # fewer pages to commit), or nothing if none did.
        self._stored: dict[tuple[str, str], tuple[Any, ...]] = {}
        # Whether time has done anything (timed-out promises, lapsed leases, due
        # retries) at the moment of this transaction, if a backend looked at once.
        self._due: tuple[bool, bool, bool] | None = None
        self.writes = 0

    @property
    def conn(self) -> Any:
        """The connection, inside a transaction with the transaction begun."""
        return self._raw

    def close(self) -> None:
        """Close the connection; idempotent."""
        self._raw.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction; inside one already open, part of it (a no-op)."""
        if self._open:
            yield
            return
        self._open = True
        try:
            self._overlay = Overlay() if self._read_only else None
            with self._begun():
                yield
        finally:
            self._open = False
            self._overlay = None
            self._due = None
            self._stored.clear()

    def attempt(self, call: Callable[[], Any]) -> tuple[bool, Any]:
        """``call()`` as a unit inside the open transaction (a savepoint): ``(True, its
        value)``, or ``(False, its exception)`` with its writes undone. An error of
        the database itself is raised: the whole transaction fails."""
        conn = self.conn
        conn.execute("SAVEPOINT durable_call")
        try:
            done: tuple[bool, Any] = (True, call())
        except self._fatal:
            raise
        except Exception as exc:
            conn.execute("ROLLBACK TO SAVEPOINT durable_call")
            self._stored.clear()  # what it wrote is undone
            done = (False, exc)
        conn.execute("RELEASE SAVEPOINT durable_call")
        return done

    # ------------------------------------------------------------------ rows

    def _row(self, table: Table, values: tuple[Any, ...]) -> Row:
        """A row of ``table`` as read (and kept as stored), its tags decoded
        (StoreError: a row this trioexec cannot read)."""
        self._stored[table.name, values[0]] = values
        out = dict(zip(table.cols, values, strict=True))
        try:
            if out["state"] not in table.states:
                raise ValueError(f"unknown state {out['state']!r}")
            if table is PROMISES:
                out["tags"] = json.loads(out["tags"])
                if not isinstance(out["tags"], dict):
                    raise ValueError(f"tags are not a JSON object: {out['tags']!r}")
        except (TypeError, ValueError) as exc:
            raise StoreError(
                f"{self.path}: durable {table.noun} {out['id']!r} has an unreadable row: {exc}"
            ) from None
        return out

    def _get(self, table: Table, id: str, shared: bool) -> Row | None:
        overlay = note(self._overlay, table.noun)
        if overlay is not None and id in table.of(overlay):
            return table.copy(table.of(overlay)[id])
        lock = self._share if shared else self._lock
        row = self.conn.execute(f"{table.select} WHERE id = {self.MARK}{lock}", (id,)).fetchone()
        return None if row is None else self._row(table, row)

    def _put(self, table: Table, row: Row) -> None:
        """Store ``row``: on a read-only store in its overlay; else only its changed
        columns if it was read (and so locked) in this transaction, nothing if none
        changed; else insert it."""
        overlay = keep(self._overlay, self._read_only, self.path, f"put_{table.noun}")
        if overlay is not None:
            table.of(overlay)[row["id"]] = table.copy(row)
            return
        values = table.values(row)
        key = (table.name, values[0])
        before = self._stored.get(key)
        if before is None:
            cols, marks = ", ".join(table.cols), ", ".join([self.MARK] * len(values))
            sql = self.INSERT.format(table=table.name, cols=cols, marks=marks)
            if self.conn.execute(sql, values).rowcount != 1:
                raise TransactionAborted(
                    f"{self.path}: durable store: {table.name} {values[0]!r} was inserted"
                    " by another transaction meanwhile"
                )
        else:
            changed = [i for i, (a, b) in enumerate(zip(before, values, strict=True)) if a != b]
            if not changed:
                return
            self.conn.execute(
                f"UPDATE {table.name}"
                f" SET {', '.join(f'{table.cols[i]} = {self.MARK}' for i in changed)}"
                f" WHERE id = {self.MARK}",
                [*(values[i] for i in changed), values[0]],
            )
        self.writes += 1
        self._stored[key] = values

    def promise(self, id: str, *, shared: bool = False) -> Row | None:
        return self._get(PROMISES, id, shared)

    def put_promise(self, row: Row) -> None:
        self._put(PROMISES, row)

    def task(self, id: str, *, shared: bool = False) -> Row | None:
        return self._get(TASKS, id, shared)

    def put_task(self, row: Row) -> None:
        self._put(TASKS, row)

    def _update(self, table: Table, id: str, expect: Row, changes: Row, back: bool) -> Row | None:
        """Change row ``id`` if its columns hold ``expect``'s values: the row as
        changed (read ``back``, and kept as stored), or ``{}`` (the row is no longer
        known as stored), if it did."""
        keep(self._overlay, self._read_only, self.path, f"update_{table.noun}")
        mark = self.MARK
        cursor = self.conn.execute(
            f"UPDATE {table.name} SET {', '.join(f'{c} = {mark}' for c in changes)}"
            f" WHERE id = {mark}{''.join(f' AND {c} = {mark}' for c in expect)}"
            + (f" RETURNING {', '.join(table.cols)}" if back else ""),
            (*changes.values(), id, *expect.values()),
        )
        if back:
            rows = cursor.fetchall()
            if not rows:
                return None
            self.writes += 1
            return self._row(table, rows[0])
        self._stored.pop((table.name, id), None)
        if cursor.rowcount != 1:
            return None
        self.writes += 1
        return {}

    def update_task(self, id: str, expect: Row, changes: Row) -> bool:
        return self._update(TASKS, id, expect, changes, self.READ_BACK) is not None

    def update_promise(self, id: str, expect: Row, changes: Row) -> Row | None:
        return self._update(PROMISES, id, expect, changes, True)

    # ------------------------------------------------------------------ callbacks

    def add_callback(self, promise_id: str, task_id: str) -> None:
        keep(self._overlay, self._read_only, self.path, "add_callback")
        self.conn.execute(
            "INSERT INTO durable_callbacks (promise_id, task_id)"
            f" VALUES ({self.MARK}, {self.MARK}) ON CONFLICT DO NOTHING",
            (promise_id, task_id),
        )
        self.writes += 1

    def _callbacks(self, col: str, where: str, value: str) -> list[str]:
        sql = f"SELECT {col} FROM durable_callbacks WHERE {where} = {self.MARK} ORDER BY {self.SEQ}"
        return [r[0] for r in self.conn.execute(sql, (value,)).fetchall()]

    def tasks_awaiting(self, promise_id: str) -> list[str]:
        overlay = note(self._overlay, "tasks_awaiting")
        found = self._callbacks("task_id", "promise_id", promise_id)
        return found if overlay is None else [t for t in found if t not in overlay.dropped]

    def awaited_by(self, task_id: str) -> list[str]:
        overlay = note(self._overlay, "awaited_by")
        if overlay is not None and task_id in overlay.dropped:
            return []
        return self._callbacks("promise_id", "task_id", task_id)

    def drop_callbacks(self, task_id: str) -> None:
        overlay = keep(self._overlay, self._read_only, self.path, "drop_callbacks")
        if overlay is not None:
            overlay.dropped.add(task_id)
            return
        self.conn.execute(f"DELETE FROM durable_callbacks WHERE task_id = {self.MARK}", (task_id,))
        self.writes += 1

    def all_callbacks(self) -> Iterator[tuple[str, str]]:
        overlay = note(self._overlay, "all_callbacks")
        rows = self.conn.execute(
            f"SELECT promise_id, task_id FROM durable_callbacks ORDER BY {self.SEQ}"
        ).fetchall()
        dropped = set() if overlay is None else overlay.dropped
        return iter([(r[0], r[1]) for r in rows if r[1] not in dropped])

    # ------------------------------------------------------------------ queries

    def timed_out_promises(self, now: float) -> list[Row]:
        return self._due_rows("timed_out_promises", 0, PROMISES, "pending", "timeout_at", now)

    def expired_leases(self, now: float) -> list[Row]:
        return self._due_rows("expired_leases", 1, TASKS, "acquired", "lease_expires_at", now)

    def due_pending_tasks(self, now: float) -> list[Row]:
        return self._due_rows("due_pending_tasks", 2, TASKS, "pending", "timeout_at", now)

    def _due_rows(
        self, call: str, which: int, table: Table, state: str, when: str, now: float
    ) -> list[Row]:
        """Rows of ``table`` in ``state`` whose ``when`` column has come (<= now), by
        id (unless `_due` says there are none: ``which`` of its three); on a
        store that locks, those no other transaction holds (locked)."""
        overlay = note(self._overlay, call)
        rows = []
        if self._due is None or self._due[which]:
            # (``state`` written in: a partial index of those rows serves only a
            # query that names its state.)
            rows = self.conn.execute(
                f"{table.select} WHERE state = '{state}' AND {when} <= {self.MARK}"
                f" ORDER BY id{self._skip}",
                (now,),
            ).fetchall()
        found = [self._row(table, r) for r in rows]
        if overlay is None:
            return found
        return merge_rows(found, table.of(overlay), lambda r: due_at(r, state, when, now))

    def search_promises(
        self, state: str | None, tag: tuple[str, str] | None, limit: int, cursor: str | None
    ) -> list[Row]:
        where = None
        if tag is not None:
            key, value = tag
            where = (self.TAGGED, tag, lambda r: r["tags"].get(key) == value)
        return self._search("search_promises", PROMISES, state, where, limit, cursor)

    def search_tasks(
        self, state: str | None, target: str | None, limit: int, cursor: str | None
    ) -> list[Row]:
        where = None
        if target is not None:
            where = (f"target = {self.MARK}", (target,), lambda r: r["target"] == target)
        return self._search("search_tasks", TASKS, state, where, limit, cursor)

    def _search(
        self,
        call: str,
        table: Table,
        state: str | None,
        where: tuple[str, tuple[str, ...], Callable[[Row], bool]] | None,
        limit: int,
        cursor: str | None,
    ) -> list[Row]:
        """Up to ``limit`` rows of ``table`` by id after ``cursor``, in ``state``,
        matching ``where`` (a condition, its parameters, and the same test of a
        row in the overlay), if any."""
        overlay = note(self._overlay, call)
        mark = self.MARK
        tests = [(f"id > {mark}", cursor), (f"state = {mark}", state)]
        conditions = ["TRUE", *(c for c, v in tests if v is not None)]
        params = [v for _, v in tests if v is not None]
        if where is not None:
            conditions.append(where[0])
            params.extend(where[1])
        more = 0 if overlay is None else len(table.of(overlay))
        rows = self.conn.execute(
            f"{table.select} WHERE {' AND '.join(conditions)} ORDER BY id LIMIT {mark}",
            (*params, limit + more),
        ).fetchall()
        found = [self._row(table, r) for r in rows]
        if overlay is None:
            return found

        def match(row: Row) -> bool:
            return (
                (cursor is None or row["id"] > cursor)
                and (state is None or row["state"] == state)
                and (where is None or where[2](row))
            )

        return merge_rows(found, table.of(overlay), match)[:limit]

    def all_promises(self) -> Iterator[Row]:
        return self._all("all_promises", PROMISES)

    def all_tasks(self) -> Iterator[Row]:
        return self._all("all_tasks", TASKS)

    def _all(self, call: str, table: Table) -> Iterator[Row]:
        overlay = note(self._overlay, call)
        found = [self._row(table, r) for r in self.conn.execute(table.select).fetchall()]
        if overlay is not None:
            found = merge_rows(found, table.of(overlay), lambda r: True)
        return iter(found)
