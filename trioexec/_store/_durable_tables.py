"""The two backends of the protocol's table layer: dicts, and SQLite tables in the
same database file as the executor's store."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .._errors import StoreError
from ._durable_rows import (
    Overlay,
    PromiseState,
    Row,
    TaskState,
    claim_by_search,
    copy_promise,
    due_at,
    keep,
    merge_rows,
    note,
)
from ._sqlite_file import SQLiteFile

_PENDING = PromiseState.PENDING.value


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

    def promise(self, id: str) -> Row | None:
        row = self.promises.get(id)
        return None if row is None else dict(row, tags=dict(row["tags"]))

    def put_promise(self, row: Row) -> None:
        self.writes += 1
        self.promises[row["id"]] = dict(row, tags=dict(row["tags"]))

    def task(self, id: str) -> Row | None:
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
        rows = [r for r in self.promises.values() if r["state"] == _PENDING]
        return [dict(r) for r in sorted(rows, key=lambda r: r["id"]) if r["timeout_at"] <= now]

    def expired_leases(self, now: float) -> list[Row]:
        return [
            dict(r)
            for r in sorted(self.tasks.values(), key=lambda r: r["id"])
            if r["state"] == TaskState.ACQUIRED.value and r["lease_expires_at"] <= now
        ]

    def due_pending_tasks(self, now: float) -> list[Row]:
        return [
            dict(r)
            for r in sorted(self.tasks.values(), key=lambda r: r["id"])
            if r["state"] == TaskState.PENDING.value and r["timeout_at"] <= now
        ]

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


_P_COLS = ("id", "state", "data", "timeout_at", "ikc", "iku", "tags", "created_at", "settled_at")
_T_COLS = ("id", "state", "version", "target", "pid", "ttl", "lease_expires_at", "timeout_at")
_PROMISE_STATES = frozenset(s.value for s in PromiseState)
_TASK_STATES = frozenset(s.value for s in TaskState)


class SQLiteTables:
    """The durable_* tables of a trioexec database, on one connection.

    Every protocol operation is one ``BEGIN IMMEDIATE`` transaction, so operations
    from several processes on one file are serialised by SQLite, and (on a connection
    from `SQLiteStore.durable_tables`) it holds the store's lock, so they never
    interleave with the store's own writes in this process, and checks that the file
    was not deleted or replaced underneath.

    On a read-only store's connection, a transaction only reads (``BEGIN``: one
    snapshot, no lock). The effects of time that every operation applies first
    (timed-out promises settle, expired leases lapse) are kept in memory for the rest
    of the operation, so a search answers what a writer's search would; any other
    write raises ``StoreError("<path>: opened read-only")``.
    """

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self.conn = conn
        self.path = path
        # The store's SQLiteFile, if a store opened the connection: its lock and
        # file check guard every write transaction.
        self._file: SQLiteFile | None = getattr(conn, "file", None)
        self._read_only = bool(self._file is not None and self._file.read_only)
        self._overlay: Overlay | None = None
        self._open = False  # a transaction is open (calls run in one thread at a time)
        # (table, id) -> the row's stored values as read in this transaction: a
        # write then updates only the columns that changed (fewer index entries,
        # fewer pages to commit), or nothing if none did.
        self._stored: dict[tuple[str, str], tuple[Any, ...]] = {}
        # How long a write waits for another connection's write lock (ms).
        self._busy_ms = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])

    def close(self) -> None:
        """Close the connection; idempotent."""
        self.conn.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction; inside one already open, part of it (a no-op)."""
        if self._open:
            yield
            return
        self._open = True
        try:
            if self._read_only:
                with self._transaction("BEGIN"):
                    self._overlay = Overlay()
                    try:
                        yield
                    finally:
                        self._overlay = None
            elif self._file is not None:
                with self._file.exclusive(), self._transaction("BEGIN IMMEDIATE"):
                    yield
            else:
                with self._transaction("BEGIN IMMEDIATE"):
                    yield
        finally:
            self._open = False
            self._stored.clear()

    @contextlib.contextmanager
    def _transaction(self, begin: str) -> Iterator[None]:
        conn = self.conn
        try:
            if begin == "BEGIN IMMEDIATE":
                _begin_immediate(conn, self._busy_ms)
            else:
                conn.execute(begin)
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

    def attempt(self, call: Callable[[], Any]) -> tuple[bool, Any]:
        """``call()`` as a unit inside the open transaction (a savepoint): ``(True, its
        value)``, or ``(False, its exception)`` with its writes undone. An error of
        SQLite itself is raised: the whole transaction fails."""
        conn = self.conn
        conn.execute("SAVEPOINT durable_call")
        try:
            value = call()
        except sqlite3.Error:
            raise
        except Exception as exc:
            conn.execute("ROLLBACK TO durable_call")
            conn.execute("RELEASE durable_call")
            self._stored.clear()  # what it wrote is undone
            return False, exc
        conn.execute("RELEASE durable_call")
        return True, value

    # ------------------------------------------------------------------ read-only

    def _note(self, call: str) -> Overlay | None:
        """The read-only overlay (None on a writable store), ending its time phase
        at the first call that is not part of applying time."""
        return note(self._overlay, call)

    def _keep(self, call: str) -> Overlay | None:
        """Where a write goes on a read-only store (its overlay), or None: write it."""
        return keep(self._overlay, self._read_only, self.path, call)

    # ------------------------------------------------------------------ rows

    def _write(self, table: str, cols: tuple[str, ...], values: tuple[Any, ...]) -> None:
        """Store a row: only its changed columns if it was read in this transaction
        (nothing if none changed), else the whole row."""
        key = (table, values[0])
        before = self._stored.get(key)
        if before is None:
            self.conn.execute(
                f"INSERT OR REPLACE INTO {table} ({', '.join(cols)})"
                f" VALUES ({', '.join('?' * len(cols))})",
                values,
            )
        else:
            changed = [i for i, (a, b) in enumerate(zip(before, values, strict=True)) if a != b]
            if not changed:
                return
            self.conn.execute(
                f"UPDATE {table} SET {', '.join(f'{cols[i]} = ?' for i in changed)} WHERE id = ?",
                [*(values[i] for i in changed), values[0]],
            )
        self._stored[key] = values

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

    def promise(self, id: str) -> Row | None:
        overlay = self._note("promise")
        if overlay is not None and id in overlay.promises:
            return copy_promise(overlay.promises[id])
        row = self.conn.execute(
            f"SELECT {', '.join(_P_COLS)} FROM durable_promises WHERE id = ?", (id,)
        ).fetchone()
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
        overlay = self._note("task")
        if overlay is not None and id in overlay.tasks:
            return dict(overlay.tasks[id])
        row = self.conn.execute(
            f"SELECT {', '.join(_T_COLS)} FROM durable_tasks WHERE id = ?", (id,)
        ).fetchone()
        return None if row is None else self._task(row)

    def put_task(self, row: Row) -> None:
        overlay = self._keep("put_task")
        if overlay is not None:
            overlay.tasks[row["id"]] = dict(row)
            return
        self._write("durable_tasks", _T_COLS, tuple(row[c] for c in _T_COLS))

    def _update(self, table: str, id: str, expect: Row, changes: Row, returning: str) -> Any:
        self._keep(f"update {table}")  # never part of applying time: refused if read-only
        self._stored.pop((table, id), None)
        return self.conn.execute(
            f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in changes)}"
            f" WHERE id = ?{''.join(f' AND {c} = ?' for c in expect)}{returning}",
            (*changes.values(), id, *expect.values()),
        )

    def update_task(self, id: str, expect: Row, changes: Row) -> bool:
        return bool(self._update("durable_tasks", id, expect, changes, "").rowcount == 1)

    def update_promise(self, id: str, expect: Row, changes: Row) -> Row | None:
        returning = f" RETURNING {', '.join(_P_COLS)}"
        rows = self._update("durable_promises", id, expect, changes, returning).fetchall()
        return self._promise(rows[0]) if rows else None

    def claim(
        self, target: str, limit: int, pid: str, ttl: float, now: float
    ) -> list[tuple[Row, str | None]]:
        """(One transaction at a time holds the file's write lock: no skipping.)"""
        self._keep("claim")  # never part of applying time: refused if read-only
        return claim_by_search(self, target, limit, pid, ttl, now)

    def add_callback(self, promise_id: str, task_id: str) -> None:
        self._keep("add_callback")  # never part of applying time: refused if read-only
        self.conn.execute(
            "INSERT OR IGNORE INTO durable_callbacks (promise_id, task_id) VALUES (?, ?)",
            (promise_id, task_id),
        )

    def tasks_awaiting(self, promise_id: str) -> list[str]:
        overlay = self._note("tasks_awaiting")
        found = [
            r[0]
            for r in self.conn.execute(
                "SELECT task_id FROM durable_callbacks WHERE promise_id = ? ORDER BY rowid",
                (promise_id,),
            )
        ]
        return found if overlay is None else [t for t in found if t not in overlay.dropped]

    def awaited_by(self, task_id: str) -> list[str]:
        overlay = self._note("awaited_by")
        if overlay is not None and task_id in overlay.dropped:
            return []
        return [
            r[0]
            for r in self.conn.execute(
                "SELECT promise_id FROM durable_callbacks WHERE task_id = ? ORDER BY rowid",
                (task_id,),
            )
        ]

    def drop_callbacks(self, task_id: str) -> None:
        overlay = self._keep("drop_callbacks")
        if overlay is not None:
            overlay.dropped.add(task_id)
            return
        self.conn.execute("DELETE FROM durable_callbacks WHERE task_id = ?", (task_id,))

    def timed_out_promises(self, now: float) -> list[Row]:
        overlay = self._note("timed_out_promises")
        rows = _due(self.conn, "durable_promises", _P_COLS, "timeout_at", now)
        promises = [self._promise(r) for r in rows]
        if overlay is None:
            return promises
        return merge_rows(
            promises, overlay.promises, lambda r: due_at(r, "pending", "timeout_at", now)
        )

    def expired_leases(self, now: float) -> list[Row]:
        overlay = self._note("expired_leases")
        rows = _due(self.conn, "durable_tasks", _T_COLS, "lease_expires_at", now, "acquired")
        tasks = [self._task(r) for r in rows]
        if overlay is None:
            return tasks
        return merge_rows(
            tasks, overlay.tasks, lambda r: due_at(r, "acquired", "lease_expires_at", now)
        )

    def due_pending_tasks(self, now: float) -> list[Row]:
        overlay = self._note("due_pending_tasks")
        rows = _due(self.conn, "durable_tasks", _T_COLS, "timeout_at", now)
        tasks = [self._task(r) for r in rows]
        if overlay is None:
            return tasks
        return merge_rows(tasks, overlay.tasks, lambda r: due_at(r, "pending", "timeout_at", now))

    def search_promises(
        self, state: str | None, tag: tuple[str, str] | None, limit: int, cursor: str | None
    ) -> list[Row]:
        overlay = self._note("search_promises")
        # json_each, not a JSON path: a path has no escapes for '"' in a key.
        extra = (
            "EXISTS (SELECT 1 FROM json_each(durable_promises.tags) j"
            " WHERE j.key = ? AND j.value = ?)",
            tag,
        )
        more = 0 if overlay is None else len(overlay.promises)
        rows = _page_rows(
            self.conn, "durable_promises", _P_COLS, state, extra, limit + more, cursor
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
        overlay = self._note("search_tasks")
        extra = ("target = ?", None if target is None else (target,))
        more = 0 if overlay is None else len(overlay.tasks)
        rows = _page_rows(self.conn, "durable_tasks", _T_COLS, state, extra, limit + more, cursor)
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
        overlay = self._note("all_promises")
        rows = self.conn.execute(f"SELECT {', '.join(_P_COLS)} FROM durable_promises").fetchall()
        promises = [self._promise(r) for r in rows]
        if overlay is not None:
            promises = merge_rows(promises, overlay.promises, lambda r: True)
        return iter(promises)

    def all_tasks(self) -> Iterator[Row]:
        overlay = self._note("all_tasks")
        rows = self.conn.execute(f"SELECT {', '.join(_T_COLS)} FROM durable_tasks").fetchall()
        tasks = [self._task(r) for r in rows]
        if overlay is not None:
            tasks = merge_rows(tasks, overlay.tasks, lambda r: True)
        return iter(tasks)

    def all_callbacks(self) -> Iterator[tuple[str, str]]:
        overlay = self._note("all_callbacks")
        rows = self.conn.execute(
            "SELECT promise_id, task_id FROM durable_callbacks ORDER BY rowid"
        ).fetchall()
        dropped = set() if overlay is None else overlay.dropped
        return iter([(r[0], r[1]) for r in rows if r[1] not in dropped])


def _page_rows(
    conn: sqlite3.Connection,
    table: str,
    cols: tuple[str, ...],
    state: str | None,
    extra: tuple[str, tuple[str, ...] | None],
    limit: int,
    cursor: str | None,
) -> list[tuple[Any, ...]]:
    """Rows by id after ``cursor``, in ``state``, matching ``extra`` (a condition
    and its parameters; None parameters: no condition)."""
    where, params = ["1"], []
    if cursor is not None:
        where.append("id > ?")
        params.append(cursor)
    if state is not None:
        where.append("state = ?")
        params.append(state)
    condition, extra_params = extra
    if extra_params is not None:
        where.append(condition)
        params.extend(extra_params)
    return conn.execute(
        f"SELECT {', '.join(cols)} FROM {table} WHERE {' AND '.join(where)} ORDER BY id LIMIT ?",
        (*params, limit),
    ).fetchall()


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


def _due(
    conn: sqlite3.Connection,
    table: str,
    cols: tuple[str, ...],
    when: str,
    now: float,
    state: str = "pending",
) -> list[tuple[Any, ...]]:
    """Rows of ``table`` in ``state`` whose ``when`` column has come (<= now)."""
    return conn.execute(
        f"SELECT {', '.join(cols)} FROM {table} WHERE state = ? AND {when} <= ? ORDER BY id",
        (state, now),
    ).fetchall()
