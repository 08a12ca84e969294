"""The connections to one SQLite database file: the writer (behind a lock), a reader
per thread, the check that the path still names the file opened, and the one place
where ``sqlite3`` errors become `StoreError`, naming the file."""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import stat
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar, final

from .._columns import refuse_unmigrated
from .._errors import StoreError

T = TypeVar("T")

#: How long a writer waits for another connection's write lock before giving up.
WRITE_BUSY_TIMEOUT = 10.0
#: How long a read-only store waits: WAL readers never need the write lock, so only
#: a checkpoint or a crashed writer's recovery can hold them up, and briefly.
READ_ONLY_BUSY_TIMEOUT = 1.0


class _Connection(sqlite3.Connection):
    """A connection a `SQLiteFile` opened: the durable tables find the file (its
    lock, its file check, whether it is read-only) through ``file``."""

    # (weak: a store dropped unclosed closes its connections at once, not at a
    # cycle collection)
    _file_ref: weakref.ref[SQLiteFile] | None = None

    @property
    def file(self) -> SQLiteFile | None:
        return None if self._file_ref is None else self._file_ref()


def _uri(path: str, **params: str) -> str:
    """A ``file:`` URI naming the absolute ``path``: every byte that means something
    in a URI (``?``, ``#``, ``%``, spaces, quotes, non-ASCII) percent-encoded."""
    quoted = urllib.parse.quote(os.fsencode(path), safe="/")
    return f"file://{quoted}?{urllib.parse.urlencode(params)}"


# How long a store being opened waits before it tries the file's lock again.
_OPEN_RETRY = 0.02


@functools.cache
def _schema() -> bytes:
    """An empty database of the current schema, made once (by any thread, maybe
    twice): a database in memory starts as its copy, far quicker than the
    migrations."""
    import sqlite_utils

    from ._sqlite_schema import migrate

    with contextlib.closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
        migrate(sqlite_utils.Database(conn), "memory store")
        return conn.serialize()


def _close_quietly(*groups: Iterable[sqlite3.Connection | None]) -> None:
    """Close connections, their errors ignored (closing one twice is nothing): also
    those whose owner was dropped unclosed, without the ResourceWarning an unclosed
    connection gives."""
    for conns in groups:
        for conn in list(conns):
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()


@final
class SQLiteFile:
    """The connections a `SQLiteStore` holds to its file, opened (created, checked
    and migrated unless ``read_only``) on construction: `StoreError` naming the
    path if it is not (or not yet, or no longer) a trioexec database this trioexec
    can use. Writes take the lock; a reader never waits behind a write (WAL; a
    database in memory has none: they take turns)."""

    def __init__(
        self, path: str, *, read_only: bool, busy_timeout: float, memory: bool = False
    ) -> None:
        self.path = path
        self.read_only = read_only
        self.busy_timeout = busy_timeout
        # ``memory``: a database in memory (SQLite's memdb), named so that this
        # file's connections share it, and gone with the last of them. Else
        # absolute: a later chdir must not point the store at another file.
        self.memory = memory
        self._file = (
            f"file:/trioexec-{uuid.uuid4().hex}?vfs=memdb" if memory else os.path.abspath(path)
        )
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file opened
        self._lock = threading.Lock()  # the write connection, and durable writes
        self._write_conn: _Connection | None = None
        # Read connections, lent to one reader at a time (any thread): none is
        # shared by two threads at once, none is left to the garbage collector.
        self._readers: set[_Connection] = set()
        self._idle: list[_Connection] = []
        self._readers_lock = threading.Lock()  # _readers, _idle and _closed
        self._closed = False
        with self._errors("cannot open"):
            if read_only:
                self._open_read_only()
            else:
                self._open_writer()

    def _open_writer(self) -> None:
        self._write_conn = conn = self._connect(read_only=False)
        if self.memory:
            with contextlib.closing(sqlite3.connect(":memory:")) as schema:
                schema.deserialize(_schema())
                schema.backup(conn)
            weakref.finalize(self, _close_quietly, self._readers, [conn])
        else:
            self._migrate(conn)
        self._identity = self._stat()
        self._checkin(self._checkout())  # a reader at once: a file it cannot read fails here

    def _migrate(self, conn: sqlite3.Connection) -> None:
        # (sqlite_utils, and the click and pluggy it loads, only once a file is opened)
        import sqlite_utils

        from ._sqlite_schema import migrate, schema_version

        db = sqlite_utils.Database(conn)
        # Another process may be creating or migrating the file right now. Switching
        # to WAL and migrating need its lock, and SQLite refuses a connection that
        # read first at once (its busy handler would deadlock): try again until
        # ``busy_timeout`` has passed.
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                schema_version(db, self.path)  # before anything writes: a foreign file is kept
                conn.execute("PRAGMA journal_mode=WAL")
                migrate(db, self.path)
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                time.sleep(_OPEN_RETRY)

    def _open_read_only(self) -> None:
        import sqlite_utils

        from ._sqlite_schema import SCHEMA_VERSION, schema_version

        try:
            st = os.stat(self._file)
        except FileNotFoundError:
            raise StoreError(f"{self.path}: no such database file") from None
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open: {exc.strerror}") from None
        if stat.S_ISDIR(st.st_mode):
            raise StoreError(f"{self.path}: is a directory, not a database file")
        if st.st_size == 0 and not os.path.exists(self._file + "-wal"):
            raise StoreError(f"{self.path}: not a trioexec database (empty file)")
        self._identity = (st.st_dev, st.st_ino)
        conn = self._checkout()
        try:
            found = schema_version(sqlite_utils.Database(conn), self.path)
        finally:
            self._checkin(conn)
        none = "not a trioexec database (no trioexec schema)"
        refuse_unmigrated(self.path, found, SCHEMA_VERSION, none)

    def _connect(self, *, read_only: bool) -> _Connection:
        conn = sqlite3.connect(
            _uri(self._file, mode="ro") if read_only else self._file,
            uri=read_only or self.memory,
            factory=_Connection,
            check_same_thread=False,
            isolation_level=None,
            timeout=self.busy_timeout,
        )
        try:
            if read_only:
                conn.execute("PRAGMA query_only=ON")
            else:
                conn.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            conn.close()  # (a file that is no database fails here)
            raise
        conn._file_ref = weakref.ref(self)
        return conn

    def _checkout(self) -> _Connection:
        """A read connection for this reader alone (an idle one, or a new one)."""
        with self._readers_lock:
            if self._closed:
                raise StoreError(f"{self.path}: the store is closed")
            if self._idle:
                return self._idle.pop()
        return self._new_reader()

    def _new_reader(self) -> _Connection:
        conn = self._connect(read_only=self.read_only)
        with self._readers_lock:
            if not self._closed:
                self._readers.add(conn)
                return conn
        conn.close()  # closed meanwhile
        raise StoreError(f"{self.path}: the store is closed")

    def _checkin(self, conn: _Connection) -> None:
        with self._readers_lock:
            if not self._closed:
                self._idle.append(conn)
                return
        _close_quietly([conn])

    def _stat(self) -> tuple[int, int]:
        if self.memory:  # (nothing on disk to be replaced)
            return (0, 0)
        st = os.stat(self._file)
        return (st.st_dev, st.st_ino)

    def _check_same_file(self) -> None:
        """Raise unless ``path`` still names the file this store opened. SQLite would
        go on writing into a deleted (unlinked) or replaced file, and lose it all."""
        try:
            same = self._stat() == self._identity
        except FileNotFoundError:
            same = False
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot check the database file: {exc}") from None
        if not same:
            raise StoreError(
                f"{self.path}: the database file was deleted or replaced while open; "
                "refusing to write into the old file (the writes would be lost): "
                "close this store and open the file again"
            )

    def _describe(self, doing: str, exc: sqlite3.Error) -> str:
        message = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and "locked" in message:
            return (
                f"{self.path}: {doing}: database is locked (another connection has held"
                f" its lock for over {self.busy_timeout:g} s)"
            )
        return f"{self.path}: {doing}: {message}"

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except StoreError:
            self._close_all()
            raise
        except sqlite3.DatabaseError as exc:
            self._close_all()
            message = str(exc)
            if "not a database" in message or "malformed" in message:
                raise StoreError(
                    f"{self.path}: not a usable SQLite database (corrupt?): {message}"
                ) from None
            raise StoreError(self._describe(doing, exc)) from None
        except OSError as exc:
            self._close_all()
            raise StoreError(f"{self.path}: {doing}: {exc.strerror or exc}") from None

    @contextlib.contextmanager
    def using(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(self._describe(doing, exc)) from None

    def _close_all(self) -> None:
        with self._readers_lock:
            self._closed = True
            conns = [*self._readers, self._write_conn]
            self._readers.clear()
            self._idle.clear()
            self._write_conn = None
        _close_quietly(conns)

    def retry(self, call: Callable[[], T]) -> T:
        """``call()``: a SQLite store call is never run again (its errors are its
        answer; `PGDatabase.retry` rides out a server restart)."""
        return call()

    @contextlib.contextmanager
    def reading(self, doing: str, *, snapshot: bool = False) -> Iterator[sqlite3.Connection]:
        """A read connection of this reader's own; with ``snapshot``, the statements
        inside see one state of the database (a read transaction: never a write lock)."""
        with self.using(doing):
            conn = self._checkout()
            try:
                if not snapshot:
                    yield conn
                    return
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")  # nothing to keep; never leave a snapshot open
            finally:
                self._checkin(conn)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the store's lock, on the file this store opened: around every write of
        the durable tables (their own connection, this store's lock)."""
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only")
        with self._lock:
            self._check_same_file()
            yield

    @contextlib.contextmanager
    def transaction(self, doing: str) -> Iterator[sqlite3.Connection]:
        if self.read_only:
            raise StoreError(f"{self.path}: opened read-only")
        with self._lock:
            conn = self._write_conn
            if conn is None or self._closed:
                raise StoreError(f"{self.path}: the store is closed")
            self._check_same_file()  # once per batch: a stat, cheap beside the commit
            with self.using(doing):
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise

    def close(self) -> None:
        """Close every connection (each thread's reader and the writer); idempotent.
        Waits for a write in progress in another thread to end first."""
        with self._lock:
            self._close_all()

    def open_connection(self) -> sqlite3.Connection:
        """A connection of its own (same file; read-only if this file is), for the
        durable tables: its transactions take this file's lock (`exclusive`)."""
        if self._closed:
            raise StoreError(f"{self.path}: the store is closed")
        with self.using("cannot open"):
            return self._connect(read_only=self.read_only)

    def closes_with(self, owner: object, conn: sqlite3.Connection) -> None:
        """In memory, ``conn`` closes quietly when ``owner`` is dropped unclosed."""
        if self.memory:
            weakref.finalize(owner, _close_quietly, [conn])
