"""The lease a heartbeat writes runs from when it is written, not from when it
queued behind the executor's other store calls (a long recovery pass)."""

from __future__ import annotations

import threading
import time

import trio
import trio.testing

from trioexec import MemoryStore
from trioexec._journal import Journal


class SlowStore(MemoryStore):
    """A MemoryStore whose calls run in worker threads (like SQLiteStore's), and
    whose ``recover`` takes as long as the test says."""

    inline = False

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()
        self.written: list[tuple[str, float, float]] = []

    def slow(self) -> None:
        self.entered.set()
        self.release.wait(10)

    def heartbeat(self, owner: str, lease_expires_at: float) -> None:
        self.written.append((owner, lease_expires_at, time.time()))
        super().heartbeat(owner, lease_expires_at)


async def test_a_queued_heartbeat_computes_its_lease_when_its_turn_comes():
    store = SlowStore()
    journal = Journal(store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(journal.call, store.slow)
        await trio.to_thread.run_sync(store.entered.wait)
        queued_at = time.time()
        nursery.start_soon(journal.call_with, store.heartbeat, lambda: ("me", time.time() + 30.0))
        await trio.testing.wait_all_tasks_blocked()
        assert store.written == []  # queued behind the slow call
        await trio.to_thread.run_sync(time.sleep, 0.2)  # the slow call's work
        store.release.set()
    [(owner, expires, written_at)] = store.written
    assert owner == "me"
    assert expires >= written_at + 30.0 - 0.01 >= queued_at + 30.0 + 0.2 - 0.01
