"""`SQLiteStore`: executions in a SQLite file (WAL), schema by sqlite-utils migrations;
`MemoryStore`: the same store on a database in memory. Both are `SQLStore` over a
`SQLiteFile` (``_sqlite_file``: the connections, where a ``sqlite3.Error`` becomes a
`StoreError`; ``_sqlite_schema``: the migrations).
"""

from __future__ import annotations

import json
import math
import operator
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, final

from .._changes import DENSE, R_ID, R_OWNER, ExecutionRow, widen
from .._columns import EXECUTIONS, ROW_COLUMNS
from .._errors import StoreError
from .._records import check_number
from ._dialect import SQLITE
from ._durable_tables import SQLiteTables
from ._sql_store import SQLStore
from ._sqlite_file import READ_ONLY_BUSY_TIMEOUT, WRITE_BUSY_TIMEOUT, SQLiteFile


class _OnSQLite(SQLStore):
    """What `SQLiteStore` and `MemoryStore` share: the dialect, how a batch of rows
    goes in, and the durable tables."""

    dialect = SQLITE
    _db: SQLiteFile

    def _insert_rows(self, conn: sqlite3.Connection, rows: list[ExecutionRow]) -> list[str]:
        # Inserted as if none were stored (the common case: no lookup first), in a
        # savepoint; if one was, the insert is undone and done again without it.
        conn.execute("SAVEPOINT new_rows")
        try:
            try:
                _insert(conn, rows)
                return []
            except sqlite3.IntegrityError:
                conn.execute("ROLLBACK TO new_rows")
            ids = [row[R_ID] for row in rows]
            stored = {
                found
                for (found,) in conn.execute(
                    f"SELECT task_id FROM executions WHERE {SQLITE.in_list('task_id')}",
                    (SQLITE.list_param(ids),),
                )
            }
            _insert(conn, [row for row in rows if row[R_ID] not in stored])
            return [str(i) for i in ids if i in stored]
        finally:
            conn.execute("RELEASE new_rows")

    def durable_tables(self) -> SQLiteTables:
        """The durable tables of this store's database, for `trioexec.durable`, on a
        connection of their own (read-only if the store is; closed by their
        ``close``). Their transactions take this store's lock."""
        tables = SQLiteTables(conn := self._db.open_connection(), self.path)
        self._db.closes_with(tables, conn)  # (a DurableStore on a MemoryStore, dropped)
        return tables


@final
class SQLiteStore(_OnSQLite):
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
        busy_timeout = check_number(
            "busy_timeout", busy_timeout, float, "seconds >= 0", ge=0, lt=math.inf, stored=True
        )
        self._db = SQLiteFile(self.path, read_only=read_only, busy_timeout=busy_timeout)

    def __repr__(self) -> str:
        return f"<SQLiteStore {self.path!r}>"


@final
class MemoryStore(_OnSQLite):
    """An in-memory store: for tests, and for executors that only want the
    recording (sub-status, queries) without a file. It is a `SQLiteStore` on a
    database in memory (SQLite's ``memdb``, SQLite 3.36 or later): the same
    answers, nothing on disk. The database goes when the store is closed (or
    dropped) and every `DurableStore` on it too.

    Several executors and threads may share one. It writes from the Trio thread:
    under Trio's autojump clock, threads would stall virtual time. Unlike a file's
    WAL, a database in memory lets a write and a read take turns (each is short).
    It holds up to 1 GiB (SQLite's limit for a database in memory), then refuses
    writes with `StoreError`.

    Args:
      clock: the wall clock for persisted times (``trioexec.testing.FakeWallClock``
        follows Trio's mock clock).

    Raises:
      StoreError: this Python's SQLite is older than 3.36.
    """

    inline = True
    read_only = False

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.path = "memory store"  # what messages name the store by
        self.clock = clock
        if sqlite3.sqlite_version_info < (3, 36):  # (a memdb its connections share)
            raise StoreError(
                f"MemoryStore needs SQLite 3.36 or later; this Python's is {sqlite3.sqlite_version}"
            )
        self._db = SQLiteFile(
            self.path, read_only=False, busy_timeout=WRITE_BUSY_TIMEOUT, memory=True
        )

    def __repr__(self) -> str:
        return "<MemoryStore>"


# A batch's rows go in as one JSON parameter, and json.dumps would write each time
# as its shortest decimal text: the largest part of a row's cost (then SQLite's
# parse of it). A time goes times 2**22 instead (exact: a power of two), which
# SQLite divides back to the same float; from 2**30 (a Unix time after 2004) a
# float is a multiple of 2**-22, so that is an integer, and written as one.
_TIMES = tuple(i for i, c in enumerate(EXECUTIONS) if c.kind == "real")
_SCALE, _WHOLE = 2.0**22, 2.0**52
_Send = Callable[[list[ExecutionRow]], str]


def _layout(columns: list[int], *, owner: bool = False) -> tuple[str, _Send]:
    """How a batch's rows go in naming these columns (by index in a row): the insert,
    whose last parameter is the rows as JSON arrays of those columns' values, and
    the function that writes that JSON, compiled (as the folds are: one list
    display a row, the journal's rows left as they are); ``owner``: the first
    parameter is the owner of all the rows (``?`` placeholders: Python 3.12 warns
    of numbered ones given a sequence)."""
    names = [ROW_COLUMNS[i] for i in columns] + ["owner"] * owner
    reads = [
        f"(value ->> {at}) / {_SCALE}" if i in _TIMES else f"value ->> {at}"
        for at, i in enumerate(columns)
    ] + ["?"] * owner
    sql = f"INSERT INTO executions ({', '.join(names)}) SELECT {', '.join(reads)} FROM json_each(?)"
    values = [
        # (inf past 2**1000: refused as JSON, as inf always was)
        f"None if (t := r[{i}]) is None else int(t) if WHOLE <= (t := t * SCALE) < inf else t"
        if i in _TIMES
        else f"r[{i}]"
        for i in columns
    ]
    scope: dict[str, Any] = {"dumps": json.dumps, "WHOLE": _WHOLE, "SCALE": _SCALE, "inf": math.inf}
    source = f"def send(rows):\n    return dumps([[{', '.join(values)}] for r in rows])\n"
    exec(compile(source, f"<send {len(columns)} columns>", "exec"), scope)
    send: _Send = scope["send"]
    return sql, send


# (SQLite before 3.42 parses a row's JSON again for every value it reads: a
# batch whose rows have no sparse value, plain tasks' rows, reads none of them;
# nor, if its rows are all plain tasks' (their `Column.rare` columns as the table
# would have them, and one owner), does it read those)
_INSERT_ROWS, _send_rows = _layout(list(range(len(ROW_COLUMNS))))
_INSERT_DENSE, _send_dense = _layout(list(range(DENSE)))
_RARE = [i for i, c in enumerate(EXECUTIONS[:DENSE]) if c.rare]
_USUAL = tuple(EXECUTIONS[i].default for i in _RARE)
_rare = operator.itemgetter(*_RARE, R_OWNER)
_INSERT_PLAIN, _send_plain = _layout(
    [i for i in range(DENSE) if i not in _RARE and i != R_OWNER], owner=True
)
_INSERT_EACH = (
    f"INSERT INTO executions ({', '.join(ROW_COLUMNS)})"
    f" VALUES ({', '.join('?' * len(ROW_COLUMNS))})"
)
_JSON_ARROW = sqlite3.sqlite_version_info >= (3, 38)  # the ->> operator


def _insert(conn: sqlite3.Connection, rows: list[ExecutionRow]) -> None:
    # One statement for all the rows: sqlite3's executemany would let go of the
    # GIL and wait to get it back for every row, while the Trio thread wants it
    # (statuses are StrEnums: JSON text).
    if not rows:
        return
    if _JSON_ARROW:
        owner = rows[0][R_OWNER]
        if max(map(len, rows)) > DENSE:
            conn.execute(_INSERT_ROWS, (_send_rows([widen(list(row)) for row in rows]),))
        elif all(map((*_USUAL, owner).__eq__, map(_rare, rows))):  # (plain tasks' rows)
            conn.execute(_INSERT_PLAIN, (owner, _send_plain(rows)))
        else:
            conn.execute(_INSERT_DENSE, (_send_dense(rows),))
    else:
        conn.executemany(_INSERT_EACH, [widen(list(row)) for row in rows])
