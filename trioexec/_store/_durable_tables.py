"""The two backends of the protocol's table layer: dicts, and SQLite tables in the
same database file as the executor's store."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .._errors import StoreError
from ._durable_rows import Row, claim_by_search, due_at, keep
from ._durable_sql import SQLTables
from ._sqlite_file import SQLiteFile


class DictTables:
    """In memory. A transaction works on copies, so a failed operation changes nothing,
    and holds a lock, so threads sharing the tables take turns."""

    def __init__(self) -> None:
        self.promises: dict[str, Row] = {}
        self.tasks: dict[str, Row] = {}
        self.callbacks: dict[tuple[str, str], None] = {}  # (promise id, task id), ordered
        self._lock = threading.RLock()
        self._depth = 0  # transactions open in the thread holding the lock
        # `AloneTables`: an operation that fails having changed nothing needs no
        # copy of the tables to be undone.
        self.writes = 0  # changes made
        self.errors: tuple[type[Exception], ...] = ()  # none fails the transaction

    def _saved(self) -> tuple[dict[str, Row], dict[str, Row], dict[tuple[str, str], None]]:
        # Shallow: a stored row is never changed in place, only replaced (every
        # write puts a new dict), so the rows of a copy stay as they were.
        return dict(self.promises), dict(self.tasks), dict(self.callbacks)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction; inside one already open, part of it (a no-op)."""
        with self._lock:
            if self._depth:
                yield
                return
            saved = self._saved()
            self._depth += 1
            try:
                yield
            except BaseException:
                self.promises, self.tasks, self.callbacks = saved
                raise
            finally:
                self._depth -= 1

    def attempt(self, call: Callable[[], Any]) -> tuple[bool, Any]:
        """``call()`` as a unit inside the open transaction: ``(True, its value)``, or
        ``(False, its exception)`` with everything it changed undone."""
        saved = self._saved()
        try:
            return True, call()
        except Exception as exc:
            self.promises, self.tasks, self.callbacks = saved
            return False, exc

    def promise(self, id: str, *, shared: bool = False) -> Row | None:
        row = self.promises.get(id)
        return None if row is None else dict(row, tags=dict(row["tags"]))

    def put_promise(self, row: Row) -> None:
        self.writes += 1
        self.promises[row["id"]] = dict(row, tags=dict(row["tags"]))

    def task(self, id: str, *, shared: bool = False) -> Row | None:
        row = self.tasks.get(id)
        return None if row is None else dict(row)

    def put_task(self, row: Row) -> None:
        self.writes += 1
        self.tasks[row["id"]] = dict(row)

    def update_task(self, id: str, expect: Row, changes: Row) -> bool:
        row = self.tasks.get(id)
        if row is None or any(row[k] != v for k, v in expect.items()):
            return False
        self.writes += 1
        self.tasks[id] = {**row, **changes}
        return True

    def update_promise(self, id: str, expect: Row, changes: Row) -> Row | None:
        row = self.promises.get(id)
        if row is None or any(row[k] != v for k, v in expect.items()):
            return None
        self.writes += 1
        new = {**row, **changes}
        self.promises[id] = dict(new, tags=dict(new["tags"]))
        return self.promise(id)

    def claim(
        self, target: str, limit: int, pid: str, ttl: float, now: float
    ) -> list[tuple[Row, str | None]]:
        return claim_by_search(self, target, limit, pid, ttl, now)

    def add_callback(self, promise_id: str, task_id: str) -> None:
        self.writes += 1
        self.callbacks[(promise_id, task_id)] = None

    def tasks_awaiting(self, promise_id: str) -> list[str]:
        return [t for p, t in self.callbacks if p == promise_id]

    def awaited_by(self, task_id: str) -> list[str]:
        return [p for p, t in self.callbacks if t == task_id]

    def drop_callbacks(self, task_id: str) -> None:
        for key in [k for k in self.callbacks if k[1] == task_id]:
            self.writes += 1
            del self.callbacks[key]

    def timed_out_promises(self, now: float) -> list[Row]:
        return _due(self.promises, "pending", "timeout_at", now)

    def expired_leases(self, now: float) -> list[Row]:
        return _due(self.tasks, "acquired", "lease_expires_at", now)

    def due_pending_tasks(self, now: float) -> list[Row]:
        return _due(self.tasks, "pending", "timeout_at", now)

    def search_promises(
        self, state: str | None, tag: tuple[str, str] | None, limit: int, cursor: str | None
    ) -> list[Row]:
        def match(row: Row) -> bool:
            return tag is None or row["tags"].get(tag[0]) == tag[1]

        rows = _page(self.promises, state, match, limit, cursor)
        return [dict(r, tags=dict(r["tags"])) for r in rows]

    def search_tasks(
        self, state: str | None, target: str | None, limit: int, cursor: str | None
    ) -> list[Row]:
        def match(row: Row) -> bool:
            return target is None or row["target"] == target

        return [dict(r) for r in _page(self.tasks, state, match, limit, cursor)]

    def all_promises(self) -> Iterator[Row]:
        return iter([dict(r) for r in self.promises.values()])

    def all_tasks(self) -> Iterator[Row]:
        return iter([dict(r) for r in self.tasks.values()])

    def all_callbacks(self) -> Iterator[tuple[str, str]]:
        return iter(list(self.callbacks))


def _due(rows: dict[str, Row], state: str, when: str, now: float) -> list[Row]:
    """The rows in ``state`` whose ``when`` has come (<= now), by id."""
    due = [dict(r) for r in rows.values() if due_at(r, state, when, now)]
    return sorted(due, key=lambda r: r["id"])


def _page(
    rows: dict[str, Row],
    state: str | None,
    match: Callable[[Row], bool],
    limit: int,
    cursor: str | None,
) -> list[Row]:
    """Up to ``limit`` rows by id after ``cursor``, in ``state``, that ``match``."""
    out = []
    for id in sorted(rows):
        row = rows[id]
        if cursor is not None and id <= cursor:
            continue
        if (state is None or row["state"] == state) and match(row):
            out.append(row)
            if len(out) == limit:
                break
    return out


class SQLiteTables(SQLTables):
    """The durable_* tables of a trioexec database, on one connection.

    Every protocol operation is one ``BEGIN IMMEDIATE`` transaction, so operations
    from several processes on one file are serialised by SQLite (a read takes no
    row lock, a claim skips none), and (on a connection from
    `SQLiteStore.durable_tables`) it holds the store's lock, so they never
    interleave with the store's own writes in this process, and checks that the file
    was not deleted or replaced underneath.

    On a read-only store's connection, a transaction only reads (``BEGIN``: one
    snapshot, no lock). The effects of time that every operation applies first
    (timed-out promises settle, expired leases lapse) are kept in memory for the rest
    of the operation, so a search answers what a writer's search would; any other
    write raises ``StoreError("<path>: opened read-only")``.
    """

    MARK = "?"
    # (No other transaction writes meanwhile: a row not read in this one is replaced.)
    INSERT = "INSERT OR REPLACE INTO {table} ({cols}) VALUES ({marks})"
    READ_BACK = False  # (a RETURNING costs SQLite more than the whole row's write)
    # json_each, not a JSON path: a path has no escapes for '"' in a key.
    TAGGED = (
        "EXISTS (SELECT 1 FROM json_each(durable_promises.tags) j WHERE j.key = ? AND j.value = ?)"
    )
    SEQ = "rowid"

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        # The store's SQLiteFile, if a store opened the connection: its lock and
        # file check guard every write transaction.
        self._file: SQLiteFile | None = getattr(conn, "file", None)
        read_only = bool(self._file is not None and self._file.read_only)
        super().__init__(conn, path, read_only=read_only, locks=False, fatal=(sqlite3.Error,))
        # How long a write waits for another connection's write lock (ms).
        self._busy_ms = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])

    @contextlib.contextmanager
    def _begun(self) -> Iterator[None]:
        conn: sqlite3.Connection = self._raw
        file = None if self._read_only else self._file
        with contextlib.nullcontext() if file is None else file.exclusive():
            try:
                if self._read_only:
                    conn.execute("BEGIN")
                else:
                    _begin_immediate(conn, self._busy_ms)
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: durable store: {exc}") from None
            try:
                yield
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise StoreError(f"{self.path}: durable store: {exc}") from None
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def claim(
        self, target: str, limit: int, pid: str, ttl: float, now: float
    ) -> list[tuple[Row, str | None]]:
        """(One transaction at a time holds the file's write lock: no skipping.)"""
        keep(self._overlay, self._read_only, self.path, "claim")  # refused if read-only
        return claim_by_search(self, target, limit, pid, ttl, now)


def _begin_immediate(conn: sqlite3.Connection, busy_ms: int) -> None:
    """``BEGIN IMMEDIATE``, waiting for the write lock at most ``busy_ms``.

    SQLite's own wait sleeps 1, 2, 5, 10 ... 100 ms between tries, so a lock
    freed meanwhile stays idle while every writer sleeps; workers of many
    processes contending for it (their transactions last a millisecond or so)
    then spend more time asleep than writing. Here the tries come every 0.1 ms
    at first, then at most 1 ms apart. (Only the wait for the write lock: the
    statements inside the transaction keep SQLite's busy handling.)
    """
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        deadline = time.monotonic() + busy_ms / 1000
        delay = 0.0001
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                busy = exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
                if not busy or time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.001)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
