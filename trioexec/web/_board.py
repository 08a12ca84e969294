"""`Board`: what the dashboard keeps while it serves: the read-only store, its durable
view, and one poller for every open page, which samples the counts every second (the
overview's chart) and bumps `version` when they or the command log change (what the
event stream tells pages). Store calls run in worker threads (`Board.read`): a read
waiting on a busy SQLite file or a slow PostgreSQL server holds a thread, not the event
loop (every other page).
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, final

import attrs
import trio

import trioexec
from trioexec import PostgresStore, SQLiteStore, StoreError, SubStatus, TaskStatus
from trioexec._store._open import is_postgres_url

if TYPE_CHECKING:
    from trioexec.durable import DurableStore

T = TypeVar("T")

#: How often the poller looks at the store (seconds), and how many samples it keeps
#: (one hour at one a second).
POLL = 1.0
SAMPLES = 3600


@attrs.frozen
class Counts:
    """The overview's numbers: executions per status, and running ones split into
    active (holding a slot) and deferred (waiting without one)."""

    by_status: dict[str, int]
    active: int
    deferred: int
    last_command: int  #: the newest command's seq (0: none)

    def get(self, what: str) -> int:
        if what == "active":
            return self.active
        if what == "deferred":
            return self.deferred
        return self.by_status.get(what, 0)


def read_counts(store: SQLiteStore | PostgresStore, after: int) -> Counts:
    """Three GROUP BYs on the status index and the commands after ``after``."""
    by_status = {s.value: n for s, n in store.counts().items()}
    active = store.counts(sub_status=SubStatus.ACTIVE)[TaskStatus.RUNNING]
    deferred = store.counts(sub_status=SubStatus.DEFERRED)[TaskStatus.RUNNING]
    newer = store.commands(after)
    return Counts(by_status, active, deferred, newer[-1].seq if newer else after)


@final
class Board:
    """The dashboard's state for one database. `open` and `close` are sync (they
    run in a thread); `poll` runs as a task beside the server until cancelled."""

    def __init__(self, db: str) -> None:
        self.db = db
        self._store: SQLiteStore | PostgresStore | None = None
        self._file: tuple[int, int] | None = None  #: a SQLite file's (device, inode) as opened
        self._durable: DurableStore | None = None
        #: (time, active, deferred), oldest first
        self.samples: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=SAMPLES)
        self.counts: Counts | None = None
        self.version = 0  #: bumped when `counts` changes
        self._changed = trio.Event()
        self.closing = trio.Event()  #: set when the server stops: event streams end

    @property
    def store(self) -> SQLiteStore | PostgresStore:
        if self._store is None:
            raise RuntimeError("the dashboard's store is not open (run the app's lifespan)")
        return self._store

    @property
    def durable(self) -> DurableStore:
        if self._durable is None:
            raise RuntimeError("the dashboard's store is not open (run the app's lifespan)")
        return self._durable

    def open(self) -> None:
        """Open the store read-only (it never creates, migrates or locks it)."""
        from trioexec.durable import DurableStore

        self._store = trioexec.open_store(self.db, read_only=True)
        if not is_postgres_url(self.db):
            found = os.stat(self.db)
            self._file = (found.st_dev, found.st_ino)
        try:
            self._durable = DurableStore(self._store)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._durable is not None:
            self._durable.close()
            self._durable = None
        if self._store is not None:
            self._store.close()
            self._store = None

    def check_file(self) -> None:
        """Raise StoreError if the SQLite file opened is no longer at its path
        (deleted, or replaced by another file): its open handle would go on
        reading the old data, and an action would create or write another file."""
        if self._file is None:
            return
        try:
            found = os.stat(self.db)
            now: tuple[int, int] | None = (found.st_dev, found.st_ino)
        except FileNotFoundError:
            now = None
        if now != self._file:
            what = "deleted" if now is None else "replaced by another file"
            raise StoreError(
                f"{self.db}: the database file was {what} after the dashboard opened it;"
                " restart the dashboard to read what is there now"
            )

    async def read(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> T:
        """``fn(self.store, *args, **kwargs)`` in a worker thread (after `check_file`)."""

        def call() -> T:
            self.check_file()
            return fn(self.store, *args, **kwargs)

        # PostgreSQL: abandoned if cancelled (the server stopping). A read there
        # holds nothing that must be given back in order (closing the pool fails
        # a wait for a connection; one in use is closed when given back), and one
        # waiting on an unreachable server would hold the shutdown for the pool's
        # timeout. SQLite: never; closing the store closes the connection a
        # thread would still be reading (a crash), and its reads are local.
        return await trio.to_thread.run_sync(call, abandon_on_cancel=self._file is None)

    async def poll(self) -> None:
        """Sample the counts every `POLL` seconds until cancelled (a failed read is
        skipped: the next second tries again, and the pages say what failed)."""
        while True:
            after = 0 if self.counts is None else self.counts.last_command
            try:
                counts = await self.read(read_counts, after)
            except (StoreError, OSError):  # (a locked file, a dropped connection)
                counts = None
            if counts is not None:
                self.samples.append((time.time(), counts.active, counts.deferred))
                if counts != self.counts:
                    self.counts = counts
                    self.version += 1
                    self._changed.set()
                    self._changed = trio.Event()
            await trio.sleep(POLL)

    def stop(self) -> None:
        """The server stops: every event stream ends at once."""
        self.closing.set()
        self._changed.set()

    async def wait_for_change(self, seen: int) -> None:
        """Wait until `version` is past ``seen`` or the server stops."""
        while self.version <= seen and not self.closing.is_set():
            await self._changed.wait()
