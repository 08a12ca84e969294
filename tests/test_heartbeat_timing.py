"""A lease is renewed beside the executor's other store calls, not queued
behind them (a long recovery pass, a slow write): a renewal that waited let a
live executor's lease lapse on a loaded machine, and another took its tasks."""

from __future__ import annotations

import threading

import trio
import trio.testing
from store_rows import select

from trioexec import MemoryStore, SQLiteStore, open_executor
from trioexec._journal import GATHER_SECONDS


class HeldWrite(MemoryStore):
    """A MemoryStore in worker threads whose next `write` (once ``hold`` is set)
    waits until a renewal of the lease has been written beside it."""

    inline = False

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.beats = 0
        self.renewed = threading.Event()
        self.waited: bool | None = None

    def heartbeat(self, owner: str, lease_expires_at: float) -> None:
        super().heartbeat(owner, lease_expires_at)
        self._beat()

    def renew_lease(self, owner: str, lease: float) -> float:
        at = super().renew_lease(owner, lease)
        self._beat()
        return at

    def _beat(self) -> None:
        self.beats += 1
        if self.beats >= 2:  # (the first takes the lease)
            self.renewed.set()

    def write(self, changes):
        if self.hold:
            self.hold = False
            self.waited = self.renewed.wait(10)  # a failsafe: it comes at once, or never
        return super().write(changes)


async def test_a_renewal_does_not_wait_for_the_executors_other_store_calls(mock_clock):
    # (A clock moved by hand: autojump would also jump while threads run.)
    store = HeldWrite()
    async with open_executor(store=store, lease=3.0) as ex:
        store.hold = True
        await ex.submit(_noop)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(GATHER_SECONDS)  # the write starts, and is held
        await trio.testing.wait_all_tasks_blocked()
        assert store.beats == 1
        mock_clock.jump(1.0)  # a renewal is due (at a third of the lease)
    assert store.waited is True
    assert store.beats >= 2
    assert select(store, "SELECT * FROM owners") == []  # given up at the end, after the renewals


async def _noop() -> None:
    pass


class HeldLock(SQLiteStore):
    """A SQLite store whose next write (once ``hold`` is set) holds the store's
    own lock, as a long write or recovery pass of this process does, until
    ``release``; its clock is moved by hand (``now``)."""

    def __init__(self, path: str) -> None:
        self.now = 1000.0
        super().__init__(path, clock=lambda: self.now)
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.renewed = threading.Event()
        self.leases: list[tuple[float, float]] = []  # (expires at, written at)

    def write(self, changes):
        if self.hold:
            self.hold = False
            with self._db._lock:
                self.entered.set()
                self.release.wait(10)  # a failsafe: released at once
        return super().write(changes)

    def renew_lease(self, owner: str, lease: float) -> float:
        at = super().renew_lease(owner, lease)
        self.leases.append((at, self.now))
        self.renewed.set()
        return at


async def test_a_renewal_that_waits_for_the_stores_lock_counts_its_lease_from_the_write(
    mock_clock, tmp_path
):
    with HeldLock(str(tmp_path / "db.sqlite")) as store:
        async with open_executor(store=store, lease=3.0) as ex:
            store.hold = True
            await ex.submit(_noop)
            await trio.testing.wait_all_tasks_blocked()
            mock_clock.jump(GATHER_SECONDS)  # the write starts, and holds the lock
            await trio.to_thread.run_sync(store.entered.wait)
            mock_clock.jump(1.0)  # a renewal is due: it waits for the lock
            await trio.testing.wait_all_tasks_blocked()
            store.now += 2.5  # the write took 2.5 s
            store.release.set()
            assert await trio.to_thread.run_sync(store.renewed.wait, 10)
    expires, written = store.leases[0]
    assert expires - written == 3.0  # a whole lease left, not 0.5
