"""`PostgresStore`: the executor records of many hosts in one PostgreSQL database.
`SQLStore`'s queries; what differs: key rounds and commands take advisory locks,
and a batch's new rows go in with one ``INSERT ... SELECT FROM unnest(...)``
(after a race, ``ON CONFLICT DO NOTHING``: an execution another host inserted
meanwhile is refused, not overwritten).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import final

from .._changes import DENSE, R_ID, R_STATUS, Change, ExecutionRow, Finish, widen
from .._columns import EXECUTIONS, ROW_COLUMNS
from .._records import check_number
from ._base import LIVE
from ._dialect import POSTGRES
from ._durable_pg import PostgresTables
from ._pg_conn import ENDED_CHANNEL, Connection, PGDatabase, redact
from ._sql_store import SQLStore


def _insert(count: int) -> str:
    """The insert of a batch's rows, one array per column, of the first ``count``
    columns (`DENSE`: a batch of plain tasks' rows; all of them)."""
    names = ", ".join(ROW_COLUMNS[:count])
    return (
        f"INSERT INTO executions ({names}) SELECT {names} FROM unnest("
        + ", ".join(f"%b::{c.postgres_type}[]" for c in EXECUTIONS[:count])
        + f") WITH ORDINALITY AS r({names}, n) ORDER BY n"
    )


_INSERT = {DENSE: _insert(DENSE), len(ROW_COLUMNS): _insert(len(ROW_COLUMNS))}
#: (ON CONFLICT's speculative insertion costs the server more per row: only after a race)
_ONLY_NEW = " ON CONFLICT (task_id) DO NOTHING RETURNING task_id"


@final
class PostgresStore(SQLStore):
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

    dialect = POSTGRES

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
        check_number("max_connections", max_connections, int, "an int >= 2", ge=2)
        self.clock = clock
        self.inline = inline
        self.read_only = read_only
        self._db = PGDatabase(url, schema=schema, read_only=read_only, max_size=max_connections)
        self.url = url
        self.schema = schema
        self.path = self._db.where  # what messages and views name the store by

    def _insert_rows(self, conn: Connection, rows: list[ExecutionRow]) -> list[str]:
        if max(map(len, rows)) > DENSE:  # (a row with a sparse value: all have them)
            rows = [widen(list(row)) for row in rows]
        columns = [[getattr(v, "value", v) for v in col] for col in zip(*rows, strict=True)]
        insert = _INSERT[len(columns)]
        try:
            with conn.transaction():  # a savepoint: a race undoes only the insert
                conn.execute(insert, columns)
        except self._db.unique_violation:
            # Another host inserted one of these ids since we looked: that one is
            # refused, like a submission whose id is already stored.
            inserted = {row[0] for row in conn.execute(insert + _ONLY_NEW, columns)}
            return [str(r[R_ID]) for r in rows if r[R_ID] not in inserted]
        return []

    def _begin(self, conn: Connection) -> None:
        # (whatever the database's default: under REPEATABLE READ a key round would
        # read the key's rows as they were before its lock, and grant past the limit)
        conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")

    def _lock_key(self, conn: Connection, key: str, person: bytes = b"") -> None:
        """Take the transaction's advisory lock of ``key`` in this schema (a 64-bit
        hash of both: rounds on other schemas of the database never wait for it).
        ``person`` picks another space of locks: the commands' turn is
        ``("", b"commands")``, never a key's."""
        data = f"{self.schema}\0{key}".encode()
        digest = hashlib.blake2b(data, digest_size=8, person=person).digest()
        conn.execute(
            "SELECT pg_advisory_xact_lock(%s)", (int.from_bytes(digest, "big", signed=True),)
        )

    @contextlib.contextmanager
    def _commanding(self, what: str) -> Iterator[Connection]:
        """A command's transaction (`command`, `requeue`): commands take turns (a
        transaction-level advisory lock of the schema's), so their seq order is
        their commit order and a poller never skips one; the listeners
        (`wait_for_command`) are notified when it commits."""
        with self._db.transaction(what) as conn:
            self._begin(conn)  # (its reads see the commands before it)
            self._lock_key(conn, "", b"commands")
            yield conn
            self._db.notify(conn)
            self._db.notify(conn, ENDED_CHANNEL)  # (a cancel may end an execution)

    def _wrote(self, conn: Connection, changes: Sequence[Change]) -> None:
        # (an execution that ended in the batch it was submitted in is a row)
        for change in changes:
            if type(change) is Finish or (type(change) is list and change[R_STATUS] not in LIVE):
                self._db.notify(conn, ENDED_CHANNEL)
                return

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
        commands = self._db.commands
        seen = commands.heard
        return commands.wait(seen, timeout) != seen

    @property
    def ends_heard(self) -> int:
        """How many notifications `wait_for_end` has heard so far (in this process)."""
        return self._db.ended.heard

    def wait_for_end(self, seen: int, timeout: float) -> int:
        """Block the calling thread until an execution on this store's schema may
        have ended (by any process) after `ends_heard` was ``seen``, at most
        ``timeout`` seconds; returns `ends_heard`. A wake-up is only a hint to
        read the execution again (`trioexec.wait_result` does). Many threads
        may wait at once; the first call opens a connection of its own that
        LISTENs (closed by `close`). Call it from a worker thread, never the Trio
        thread (it blocks).

        Raises:
          StoreError: the store is closed.
        """
        return self._db.ended.wait(seen, timeout)

    def __repr__(self) -> str:
        return f"<PostgresStore {redact(self.url)!r} schema={self.schema!r}>"

    def durable_tables(self) -> PostgresTables:
        """The durable tables of this store's schema, for `trioexec.durable`, on a
        connection of their own (read-only if the store is; closed by their
        ``close``)."""
        return PostgresTables(self._db)
