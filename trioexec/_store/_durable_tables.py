"""The protocol's table layer on SQLite: the durable tables in the same database as
the executor's store (a file, or a `MemoryStore`'s database in memory)."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator

from .._errors import StoreError
from ._durable_rows import Row, TaskState, acquired, keep
from ._durable_sql import SQLTables
from ._sqlite_file import SQLiteFile


class SQLiteTables(SQLTables):
    """The durable_* tables of a trioexec database, on one connection.

    Every protocol operation is one ``BEGIN IMMEDIATE`` transaction: SQLite
    serialises operations from several processes on one file (a read takes no row
    lock, a claim skips none). On a connection from `SQLiteStore.durable_tables` it
    holds the store's lock (never interleaving with the store's own writes in this
    process) and checks that the file was not deleted or replaced underneath.

    On a read-only store's connection, a transaction only reads (``BEGIN``: one
    snapshot, no lock); the effects of time are kept in memory, as `PostgresTables`
    says; any other write raises ``StoreError("<path>: opened read-only")``.
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
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"{self.path}: durable store: {exc}") from None
                raise

    def claim(
        self, target: str, limit: int, pid: str, ttl: float, now: float
    ) -> list[tuple[Row, str | None]]:
        """The oldest pending tasks of ``target``, each acquired and written back
        (one transaction at a time holds the file's write lock: no skipping)."""
        keep(self._overlay, self._read_only, self.path, "claim")  # refused if read-only
        claimed = []
        for row in self.search_tasks(TaskState.PENDING.value, target, limit, None):
            self.put_task(acquired(row, row["version"] + 1, pid, ttl, now))
            promise = self.promise(row["id"])
            claimed.append((row, None if promise is None else promise["data"]))
        return claimed


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
