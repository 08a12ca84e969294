"""The connections to one PostgreSQL database: a psycopg pool (its size bounds the
threads that talk to the server), every connection's ``search_path`` set to the
store's schema, and the one place where psycopg's errors become `StoreError`,
naming the server (never its password) and the schema.

psycopg's synchronous API only: on Trio the store's calls run in worker threads
(psycopg's async API needs asyncio)."""

from __future__ import annotations

import contextlib
import math
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, final

from .._columns import refuse_unmigrated
from .._errors import StoreError
from .._records import check_number
from ._durable_rows import TransactionAborted
from ._pg_schema import SCHEMA_VERSION, migrate, schema_version

T = TypeVar("T")

Connection = Any  # psycopg.Connection[tuple[Any, ...]] (psycopg is an optional extra)

#: How long to wait for the server, or for a connection of the pool (a URL's own
#: ``connect_timeout`` says otherwise): a server away for less (a restart) is
#: waited for, one away for longer fails the call.
CONNECT_TIMEOUT = 10.0
#: How long `close` waits for a connection to send its wake-up notification, and
#: for each of the pool's workers to stop (one still connecting to a server gone
#: unreachable is a daemon thread, left to its connect timeout).
CLOSE_TIMEOUT = 0.5
_SCHEMA = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
#: The channel commands are notified on; the payload is the store's schema (a
#: channel name of the schema's own could pass PostgreSQL's 63-byte limit).
COMMANDS_CHANNEL = "trioexec_commands"
#: The channel a write that ended executions is notified on (`trioexec.wait_result`).
ENDED_CHANNEL = "trioexec_ended"
#: SQLSTATEs of a transaction the server rolled back because of a concurrent one:
#: serialization_failure, deadlock_detected, lock_not_available.
_ROLLED_BACK = frozenset({"40001", "40P01", "55P03"})
#: The transaction's id, if it has one (it wrote), asked before its COMMIT: if the
#: connection is lost during the COMMIT, the server says after whether it took effect.
XID = "SELECT txid_current_if_assigned()"  # (None: the transaction wrote nothing yet)


def load_psycopg() -> tuple[Any, Any]:
    """psycopg and psycopg_pool, or an error saying which extra to install."""
    try:
        import psycopg
        import psycopg_pool
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"PostgreSQL stores need the 'postgres' extra ({exc.name} is missing):"
            " pip install 'trioexec[postgres]'"
        ) from exc
    return psycopg, psycopg_pool


#: A URL's password (``scheme://user:PASSWORD@``: up to the last ``@`` before a
#: blank, so a password with a raw ``@``, ``/`` or ``%`` is masked whole), a
#: ``password=`` of a query string or of a ``key=value`` connection string.
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@\[\]]*:)[^\s]*@")
_KEY_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&'\"]+)", re.IGNORECASE)
MASK = "***"


#: The password of the URL a store was given (all of it is the URL: anything up
#: to its last ``@``, blanks too).
_GIVEN_PASSWORD = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://[^:/@\[\]]*:(.*)@", re.DOTALL)


def _secrets(url: str) -> list[str]:
    """The password ``url`` holds, as typed and as it decodes (longest first)."""
    found = [m.group(1) for m in [_GIVEN_PASSWORD.match(url)] if m is not None]
    found += [m.group(2) for m in _KEY_PASSWORD.finditer(url)]
    forms = {f for s in found for f in (s, s.strip("'"), urllib.parse.unquote(s)) if f}
    return sorted(forms, key=len, reverse=True)


def mask(text: str, url: str | None = None) -> str:
    """``text`` with every password masked: each URL's and ``password=``'s in it,
    and, wherever else it quotes it, the password ``url`` holds (libpq's message
    about a mistyped URL quotes pieces of it: ``invalid percent-encoded token:
    "..."``). The one place messages are masked."""
    text = _URL_PASSWORD.sub(rf"\1{MASK}@", text)
    text = _KEY_PASSWORD.sub(rf"\1{MASK}", text)
    if url is not None:
        for secret in _secrets(url):
            # (as a token: a password "postgres" leaves the word "postgresql" alone)
            token = rf"(?<![\w%]){re.escape(secret)}(?![\w%])"
            text = re.sub(token, MASK, text)
    return text


def redact(url: str) -> str:
    """``url`` (a URL or a ``key=value`` connection string, parsable or not)
    without its password, for messages and reprs."""
    return mask(url, url)


def mask_chain(exc: BaseException, url: str) -> None:
    """Mask ``url``'s password in ``exc`` and its causes and contexts (psycopg's
    errors quote the URL), in place: a traceback printed later shows none."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        todo += [e.__cause__, e.__context__]
        e.args = tuple(mask(a, url) if isinstance(a, str) else a for a in e.args)


def reconnect_delay(failures: int) -> float:
    """How long to wait before connecting again after ``failures`` attempts in a
    row failed (the server is away): 0.1 s doubling up to 2 s, give or take a
    fifth (the clients of a restarted server do not all come back at once)."""
    return min(0.1 * 2.0 ** min(failures - 1, 5), 2.0) * random.uniform(0.8, 1.2)


def rolled_back(exc: BaseException) -> bool:
    """Whether psycopg's ``exc`` says the server rolled its transaction back because
    of a concurrent one (at any statement, COMMIT too): nothing was written."""
    return getattr(exc, "sqlstate", None) in _ROLLED_BACK


def check_schema(schema: object) -> str:
    if not isinstance(schema, str) or not _SCHEMA.fullmatch(schema) or len(schema) > 63:
        raise ValueError(
            "schema must be a PostgreSQL identifier (letters, digits, _ and $, not"
            f" starting with a digit, at most 63 characters), got {schema!r}"
        )
    return schema


@final
class PGDatabase:
    """A pool of connections to ``url`` whose tables live in ``schema``; the schema
    is created or migrated (or, ``read_only``, only checked) on construction.

    Raises:
      StoreError: naming the server and schema, if it cannot be reached, or the
        schema is not (or not yet) trioexec's, or is from a newer trioexec.
    """

    def __init__(self, url: str, *, schema: str, read_only: bool, max_size: int = 8) -> None:
        psycopg, psycopg_pool = load_psycopg()
        self.url = url
        self.schema = check_schema(schema)
        self.read_only = read_only
        self.where = f"{redact(url)} (schema {schema})"
        self._psycopg = psycopg
        #: psycopg's error for a duplicate key (to catch around a savepoint)
        self.unique_violation: type[Exception] = psycopg.errors.UniqueViolation
        self._pool: Any = None  # a psycopg_pool.ConnectionPool until closed
        self._closing = False  # (set by `close` before it wakes a waiter)
        self._woken = threading.Event()  # (set by `close`: a waiter that polls returns)
        #: who waits for commands (`wait_for_command`), and for executions to end
        #: (`trioexec.wait_result`): each on a connection of its own, opened lazily
        self.commands = Listener(self, COMMANDS_CHANNEL)
        self.ended = Listener(self, ENDED_CHANNEL)
        self.timeout, self._connect_args = _timeout_of(psycopg, url)
        with self.errors("cannot open"):
            with psycopg.connect(url, **self._connect_args) as conn:
                self._configure(conn)
                if read_only:
                    found = schema_version(conn, self.where, schema)
                    refuse_unmigrated(self.where, found, SCHEMA_VERSION, "no trioexec schema there")
                else:
                    migrate(conn, self.where, schema)
            self._pool = psycopg_pool.ConnectionPool(
                url,
                min_size=1,
                max_size=max_size,
                kwargs=self._connect_args,
                configure=self._configure,
                # A connection the server ended while it sat in the pool (a restart,
                # an idle timeout) is found out and replaced before it is handed out.
                check=psycopg_pool.ConnectionPool.check_connection,
                timeout=self.timeout,
                name=f"trioexec-{schema}",
                open=True,
            )
            self._pool.wait(timeout=self.timeout)

    def _configure(self, conn: Connection) -> None:
        sql = self._psycopg.sql
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        if self.read_only:
            conn.execute("SET default_transaction_read_only TO on")

    @contextlib.contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """psycopg's errors (and the pool's) as one `StoreError` naming the server."""
        try:
            yield
        except StoreError:
            raise
        except self._psycopg.Error as exc:  # (the pool's PoolTimeout is one)
            raise self.error(what, exc) from exc

    def error(self, what: str, exc: BaseException) -> StoreError:
        """``exc`` (psycopg's) as a `StoreError` naming the server and ``what``
        failed, with the password masked there and in ``exc``'s own chain."""
        mask_chain(exc, self.url)
        text = str(exc).strip()
        detail = text.splitlines()[0] if text else type(exc).__name__
        return StoreError(f"{self.where}: {what}: {detail}")

    @contextlib.contextmanager
    def transaction(self, what: str) -> Iterator[Connection]:
        """A connection inside one transaction, committed at the end of the block
        (rolled back if it raises).

        Raises:
          TransactionAborted: nothing was written, and the block may be run
            again (`retry`): the server ended the connection (a restart) before
            the COMMIT took effect, or rolled the transaction back for a
            concurrent one. A connection lost during the COMMIT itself is
            settled by asking the server, on a new connection, whether the
            transaction committed (then the block ends as if nothing happened).
          StoreError: any other failure, naming the server and ``what``.
        """
        if self.read_only:
            raise StoreError(f"{self.where}: opened read-only")
        lost: tuple[TransactionAborted, BaseException, int | None] | None = None
        with self.errors(what), self._connection() as conn:
            xid: int | None = None
            committing = False
            try:
                with conn.transaction():
                    yield conn
                    xid = conn.execute(XID).fetchone()[0]
                    committing = True  # (COMMIT is sent as the block ends)
            except self._psycopg.Error as exc:
                # (lost during the COMMIT: asked once this connection is back)
                lost = (self.in_doubt(what, exc, conn, committing), exc, xid)
        if lost is not None and not self.committed(what, lost[1], lost[2]):
            raise lost[0] from lost[1]

    def in_doubt(
        self, what: str, exc: BaseException, conn: Connection, committing: bool = False
    ) -> TransactionAborted:
        """The verdict on psycopg's ``exc``, met on ``conn`` inside a transaction
        (``committing``: its COMMIT was sent). Raises ``exc`` if it is the call's
        own, or a `TransactionAborted` if nothing was written (the server rolled it
        back, `rolled_back`, or ended the connection, a restart, before the
        COMMIT). Returns that `TransactionAborted` if the connection was lost
        during the COMMIT: to raise unless `committed` says the transaction took
        effect."""
        if not (rolled_back(exc) or conn.broken):
            raise exc
        aborted = TransactionAborted(str(self.error(what, exc)))
        if not committing or rolled_back(exc):
            raise aborted from exc
        return aborted

    def committed(self, what: str, exc: BaseException, xid: int | None) -> bool:
        """Whether the transaction ``xid`` (None: it wrote nothing), whose
        connection was lost (``exc``) after its COMMIT was sent, took effect: the
        server is asked on another connection (waited for, up to the store's
        timeout, while it restarts; a transaction still in progress there, its
        old connection not yet ended, is asked about again). A `StoreError` if
        it cannot be known."""
        if xid is None:
            return False
        deadline = time.monotonic() + self.timeout
        failures = 0
        while True:
            with self.errors(what), self._connection(deadline) as conn:
                status = conn.execute("SELECT txid_status(%s)", (xid,)).fetchone()[0]
            if status in ("committed", "aborted"):
                return bool(status == "committed")
            failures += 1
            pause = reconnect_delay(failures)
            if status is None or self._closing or time.monotonic() + pause > deadline:
                raise StoreError(
                    f"{self.error(what, exc)} (during COMMIT; whether it took effect is"
                    f" unknown: transaction {xid} is {status or 'forgotten'})"
                ) from exc
            self._woken.wait(pause)

    def retry(self, call: Callable[[], T]) -> T:
        """``call()`` (a store call: its transactions and reads), run again while it
        raises `TransactionAborted` (nothing was written), for up to the store's
        timeout after the first: a server restarting is waited for (a connection
        of the pool, checked); one away for longer fails the call with a
        `StoreError` (never a `TransactionAborted`: a retry around it does not
        run it again)."""
        deadline: float | None = None
        failures = 0
        while True:
            try:
                return call()
            except TransactionAborted as exc:
                if deadline is None:
                    deadline = time.monotonic() + self.timeout
                failures += 1
                if failures > 1:  # (transactions that met each other: not in step)
                    pause = reconnect_delay(failures - 1)
                    self._woken.wait(min(pause, max(0.0, deadline - time.monotonic())))
                if self._closing or time.monotonic() >= deadline or not self._back(deadline):
                    raise StoreError(f"{exc} (tried again for {self.timeout:g} s)") from exc

    def _back(self, deadline: float) -> bool:
        """Whether the pool hands out a connection (checked) before ``deadline``: the
        server is back."""
        try:
            with self._connection(deadline):
                return True
        except self._psycopg.Error:  # (the pool's PoolTimeout)
            return False

    @contextlib.contextmanager
    def reading(self, what: str, *, snapshot: bool = False) -> Iterator[Connection]:
        """A connection for reads: each statement sees the latest commits, or, with
        ``snapshot``, the block sees one snapshot. Raises as `transaction` does."""
        with self.errors(what), self._connection() as conn:
            try:
                if not snapshot:
                    yield conn
                    return
                with conn.transaction():
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    yield conn
            except self._psycopg.Error as exc:
                raise self.in_doubt(what, exc, conn) from exc  # (it raises)

    @contextlib.contextmanager
    def _connection(self, deadline: float | None = None) -> Iterator[Connection]:
        """A connection of the pool (waited for up to the store's timeout, or until
        ``deadline``, a `time.monotonic` time)."""
        if self._pool is None:
            raise StoreError(f"{self.where}: the store is closed")
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        with self._pool.connection(timeout=timeout) as conn:
            yield conn

    def connect(self, *, wait: bool = False, listen: Any = None) -> Connection:
        """A connection of its own (not the pool's): the durable tables' one
        connection, or one that runs ``listen`` (a LISTEN statement). The caller
        closes it. ``wait``: a server that refuses it (restarting) is tried again,
        for up to the store's timeout."""
        deadline = time.monotonic() + self.timeout
        failures = 0
        while True:
            try:
                with self.errors("cannot connect"):
                    conn = self._psycopg.connect(self.url, **self._connect_args)
                    try:
                        self._configure(conn)
                        if listen is not None:
                            with self.errors("cannot listen"):
                                conn.execute(listen)
                    except BaseException:
                        conn.close()
                        raise
                    return conn
            except StoreError:
                failures += 1
                pause = reconnect_delay(failures)
                if not wait or time.monotonic() + pause > deadline or self._closing:
                    raise
                self._woken.wait(pause)

    def notify(self, conn: Connection, channel: str = COMMANDS_CHANNEL) -> None:
        """Notify the listeners of ``channel`` on this schema when ``conn``'s
        transaction commits."""
        conn.execute("SELECT pg_notify(%s, %s)", (channel, self.schema))

    def close(self) -> None:
        self._closing = True
        self._woken.set()
        if self._pool is not None:
            # Wake the waits in progress (each holds its listener, or is starting
            # to listen: then it sees ``_closing``): notifications of our own, and
            # they return at once instead of at their timeout.
            # (A short wait: a server gone unreachable must not hold a close.)
            with (
                contextlib.suppress(self._psycopg.Error),
                self._pool.connection(timeout=CLOSE_TIMEOUT) as conn,
            ):
                for listener in (self.commands, self.ended):
                    self.notify(conn, listener.channel)
        for listener in (self.commands, self.ended):
            listener.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close(timeout=CLOSE_TIMEOUT)


@final
class Listener:
    """A connection of its own that LISTENs on ``channel`` for its database's
    schema, shared by every thread that waits on it: one of them reads the
    connection at a time, and each wait returns once `heard` moves past the
    count it saw (a notification heard by any of them)."""

    def __init__(self, db: PGDatabase, channel: str) -> None:
        self._db = db
        self.channel = channel
        #: notifications heard (or maybe missed: while nobody listened)
        self.heard = 0
        self._conn: Connection | None = None
        self._turn = threading.Condition()  # (guards everything below)
        self._reading = False  # a waiter reads the connection now
        self._closed = False
        self._failures = 0  # attempts to listen that failed in a row
        self._listen_at = 0.0  # (time.monotonic) when to try to listen again
        self._unheard = False  # notifications may have been sent while nobody listened

    def wait(self, seen: int, timeout: float) -> int:
        """Block the calling thread until `heard` is past ``seen``, at most
        ``timeout`` seconds; returns `heard`. While the connection is lost (the
        server ended it, or is restarting), a wait lasts ``timeout`` and counts as
        heard (the caller polls), and later waits connect again, backing off.

        Raises:
          StoreError: the store is closed.
        """
        check_number("timeout", timeout, float, "seconds >= 0", ge=0, lt=math.inf)
        deadline = time.monotonic() + timeout
        with self._turn:
            while True:
                if self._closed:
                    raise StoreError(f"{self._db.where}: the store is closed")
                if self.heard != seen:
                    return self.heard
                if not self._reading:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._turn.wait(remaining):
                    return self.heard
            self._reading = True
        heard = False
        try:
            heard = self._read(deadline)
        finally:
            with self._turn:
                self._reading = False
                self.heard += heard
                self._turn.notify_all()
        return self.heard

    def _read(self, deadline: float) -> bool:
        """Read the connection until a notification for the schema, or ``deadline``:
        True if one came (or may have been missed), False if not or if `close` woke it."""
        db = self._db
        if self._conn is None and time.monotonic() >= self._listen_at:
            self._listen()
        if db._closing:  # (listening since after close's wake-up: it missed it)
            return False
        conn = self._conn
        if conn is None:  # not listening: this call is one poll interval
            db._woken.wait(max(0.0, deadline - time.monotonic()))
            return not db._closing
        if self._unheard:  # listening again: what was sent meanwhile was not heard
            self._unheard = False
            return True
        try:
            while True:
                remaining = max(0.0, deadline - time.monotonic())
                for notify in conn.notifies(timeout=remaining, stop_after=1):
                    if notify.payload == db.schema:
                        return not db._closing  # (False: `close` woke it)
                if remaining == 0.0:
                    return False
        except db._psycopg.Error:
            # The connection is lost (the server ended it): listen again
            # later; meanwhile the caller polls.
            self._conn = None
            conn.close()
            self._failed()
            return not db._closing

    def _listen(self) -> None:
        """Open the listening connection, or set when to try again."""
        try:
            self._conn = self._db.connect(listen=f"LISTEN {self.channel}")
        except StoreError:
            self._failed()
            return
        self._failures = 0

    def _failed(self) -> None:
        self._failures += 1
        self._listen_at = time.monotonic() + reconnect_delay(self._failures)
        self._unheard = True

    def close(self) -> None:
        """Close the connection once the waiter reading it has returned (`close`
        of the database woke it)."""
        with self._turn:
            self._closed = True
            while self._reading:
                self._turn.wait()
            conn, self._conn = self._conn, None
            self._turn.notify_all()
        if conn is not None:
            conn.close()


def _timeout_of(psycopg: Any, url: str) -> tuple[float, dict[str, Any]]:
    """How long to wait for the server (the URL's ``connect_timeout``, if it has
    one, else `CONNECT_TIMEOUT`), and the arguments of every connection."""
    args: dict[str, Any] = {"autocommit": True}
    try:
        given = psycopg.conninfo.conninfo_to_dict(url).get("connect_timeout")
    except psycopg.Error:
        given = None  # (connecting says what is wrong with it)
    if given is None:
        args["connect_timeout"] = CONNECT_TIMEOUT
        return CONNECT_TIMEOUT, args
    try:
        seconds = float(given)
    except ValueError:
        return CONNECT_TIMEOUT, args  # (libpq says what is wrong with it)
    # (libpq waits at least 2 seconds; 0 means forever)
    return (max(seconds, 2.0) if seconds > 0 else CONNECT_TIMEOUT), args
