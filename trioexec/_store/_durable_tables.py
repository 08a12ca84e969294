"""The two backends of the protocol's table layer: dicts, and SQLite tables in the
same database file as the executor's store."""

from __future__ import annotations

import contextlib
import copy
import json
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

from .._errors import StoreError
from ..durable._protocol import Row
from ..durable._records import PromiseState, TaskState

_PENDING = PromiseState.PENDING.value


class DictTables:
    """In memory. A transaction works on copies, so a failed operation changes nothing."""

    def __init__(self) -> None:
        self.promises: dict[str, Row] = {}
        self.tasks: dict[str, Row] = {}
        self.callbacks: dict[tuple[str, str], None] = {}  # (promise id, task id), ordered

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        saved = (copy.deepcopy(self.promises), copy.deepcopy(self.tasks), dict(self.callbacks))
        try:
            yield
        except BaseException:
            self.promises, self.tasks, self.callbacks = saved
            raise

    def promise(self, id: str) -> Row | None:
        row = self.promises.get(id)
        return None if row is None else dict(row, tags=dict(row["tags"]))

    def put_promise(self, row: Row) -> None:
        self.promises[row["id"]] = dict(row, tags=dict(row["tags"]))

    def task(self, id: str) -> Row | None:
        row = self.tasks.get(id)
        return None if row is None else dict(row)

    def put_task(self, row: Row) -> None:
        self.tasks[row["id"]] = dict(row)

    def add_callback(self, promise_id: str, task_id: str) -> None:
        self.callbacks[(promise_id, task_id)] = None

    def tasks_awaiting(self, promise_id: str) -> list[str]:
        return [t for p, t in self.callbacks if p == promise_id]

    def awaited_by(self, task_id: str) -> list[str]:
        return [p for p, t in self.callbacks if t == task_id]

    def drop_callbacks(self, task_id: str) -> None:
        for key in [k for k in self.callbacks if k[1] == task_id]:
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


class SQLiteTables:
    """The durable_* tables of a trioexec database, on one connection.

    Every protocol operation is one ``BEGIN IMMEDIATE`` transaction, so operations
    from several processes on one file are serialised by SQLite.
    """

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self.conn = conn
        self.path = path

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
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

    @staticmethod
    def _promise(row: tuple[Any, ...]) -> Row:
        out = dict(zip(_P_COLS, row, strict=True))
        out["tags"] = json.loads(out["tags"])
        return out

    @staticmethod
    def _task(row: tuple[Any, ...]) -> Row:
        return dict(zip(_T_COLS, row, strict=True))

    def promise(self, id: str) -> Row | None:
        row = self.conn.execute(
            f"SELECT {', '.join(_P_COLS)} FROM durable_promises WHERE id = ?", (id,)
        ).fetchone()
        return None if row is None else self._promise(row)

    def put_promise(self, row: Row) -> None:
        values = [row[c] for c in _P_COLS]
        values[_P_COLS.index("tags")] = json.dumps(row["tags"], sort_keys=True)
        self.conn.execute(
            f"INSERT OR REPLACE INTO durable_promises ({', '.join(_P_COLS)})"
            f" VALUES ({', '.join('?' * len(_P_COLS))})",
            values,
        )

    def task(self, id: str) -> Row | None:
        row = self.conn.execute(
            f"SELECT {', '.join(_T_COLS)} FROM durable_tasks WHERE id = ?", (id,)
        ).fetchone()
        return None if row is None else self._task(row)

    def put_task(self, row: Row) -> None:
        self.conn.execute(
            f"INSERT OR REPLACE INTO durable_tasks ({', '.join(_T_COLS)})"
            f" VALUES ({', '.join('?' * len(_T_COLS))})",
            [row[c] for c in _T_COLS],
        )

    def add_callback(self, promise_id: str, task_id: str) -> None:
        self.conn.execute(
            "INSERT OR IGNORE INTO durable_callbacks (promise_id, task_id) VALUES (?, ?)",
            (promise_id, task_id),
        )

    def tasks_awaiting(self, promise_id: str) -> list[str]:
        return [
            r[0]
            for r in self.conn.execute(
                "SELECT task_id FROM durable_callbacks WHERE promise_id = ? ORDER BY rowid",
                (promise_id,),
            )
        ]

    def awaited_by(self, task_id: str) -> list[str]:
        return [
            r[0]
            for r in self.conn.execute(
                "SELECT promise_id FROM durable_callbacks WHERE task_id = ? ORDER BY rowid",
                (task_id,),
            )
        ]

    def drop_callbacks(self, task_id: str) -> None:
        self.conn.execute("DELETE FROM durable_callbacks WHERE task_id = ?", (task_id,))

    def timed_out_promises(self, now: float) -> list[Row]:
        return [self._promise(r) for r in self._due("durable_promises", _P_COLS, "timeout_at", now)]

    def expired_leases(self, now: float) -> list[Row]:
        rows = self._due("durable_tasks", _T_COLS, "lease_expires_at", now, "acquired")
        return [self._task(r) for r in rows]

    def due_pending_tasks(self, now: float) -> list[Row]:
        return [self._task(r) for r in self._due("durable_tasks", _T_COLS, "timeout_at", now)]

    def _due(
        self, table: str, cols: tuple[str, ...], when: str, now: float, state: str = "pending"
    ) -> list[tuple[Any, ...]]:
        """Rows of ``table`` in ``state`` whose ``when`` column has come (<= now)."""
        return self.conn.execute(
            f"SELECT {', '.join(cols)} FROM {table} WHERE state = ? AND {when} <= ? ORDER BY id",
            (state, now),
        ).fetchall()

    def search_promises(
        self, state: str | None, tag: tuple[str, str] | None, limit: int, cursor: str | None
    ) -> list[Row]:
        # json_each, not a JSON path: a path has no escapes for '"' in a key.
        extra = (
            "EXISTS (SELECT 1 FROM json_each(durable_promises.tags) j"
            " WHERE j.key = ? AND j.value = ?)",
            tag,
        )
        rows = self._page("durable_promises", _P_COLS, state, extra, limit, cursor)
        return [self._promise(r) for r in rows]

    def search_tasks(
        self, state: str | None, target: str | None, limit: int, cursor: str | None
    ) -> list[Row]:
        extra = ("target = ?", None if target is None else (target,))
        rows = self._page("durable_tasks", _T_COLS, state, extra, limit, cursor)
        return [self._task(r) for r in rows]

    def _page(
        self,
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
        return self.conn.execute(
            f"SELECT {', '.join(cols)} FROM {table} WHERE {' AND '.join(where)}"
            " ORDER BY id LIMIT ?",
            (*params, limit),
        ).fetchall()

    def all_promises(self) -> Iterator[Row]:
        rows = self.conn.execute(f"SELECT {', '.join(_P_COLS)} FROM durable_promises").fetchall()
        return iter([self._promise(r) for r in rows])

    def all_tasks(self) -> Iterator[Row]:
        rows = self.conn.execute(f"SELECT {', '.join(_T_COLS)} FROM durable_tasks").fetchall()
        return iter([self._task(r) for r in rows])

    def all_callbacks(self) -> Iterator[tuple[str, str]]:
        rows = self.conn.execute(
            "SELECT promise_id, task_id FROM durable_callbacks ORDER BY rowid"
        ).fetchall()
        return iter([(r[0], r[1]) for r in rows])
