"""The lease a heartbeat writes runs from when it is written, not from when it
queued behind the executor's other store calls (a long recovery pass)."""

from __future__ import annotations

import threading

import trio
import trio.testing

from trioexec import MemoryStore
from trioexec._journal import Journal


class SlowStore(MemoryStore):
    """A MemoryStore whose calls run in worker threads (like SQLiteStore's), with
    a ``slow`` call that moves its own clock on by 100 s while it runs."""

    inline = False

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.release = threading.Event()
        self.entered = threading.Event()
        self.written: list[tuple[str, float]] = []

    def slow(self) -> None:
        self.entered.set()
        self.release.wait(10)
        self.now += 100.0  # the time the call took

    def heartbeat(self, owner: str, lease_expires_at: float) -> None:
        self.written.append((owner, lease_expires_at))
        super().heartbeat(owner, lease_expires_at)


async def test_a_queued_heartbeat_computes_its_lease_when_its_turn_comes():
    store = SlowStore()
    journal = Journal(store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(journal.call, store.slow)
        await trio.to_thread.run_sync(store.entered.wait)
        nursery.start_soon(journal.call_with, store.heartbeat, lambda: ("me", store.now + 30.0))
        await trio.testing.wait_all_tasks_blocked()
        assert store.written == []  # queued behind the slow call
        store.release.set()
    assert store.written == [("me", 130.0)]  # from the end of the slow call, not 30.0
