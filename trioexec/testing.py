"""Helpers for testing code built on trioexec."""

from __future__ import annotations

from typing import final

import trio


@final
class FakeWallClock:
    """A wall clock that follows Trio's clock: ``start`` plus the Trio time elapsed
    since this object was made. Pass it as a store's ``clock`` so persisted times,
    leases and ``deferred_longer_than`` move with ``trio.testing.MockClock``.

    Must be created and called inside ``trio.run``.

    Example::

        store = trioexec.MemoryStore(clock=FakeWallClock(start=1_000.0))
    """

    __slots__ = ("_origin", "start")

    def __init__(self, start: float = 0.0) -> None:
        self.start = start
        self._origin = trio.current_time()

    def __call__(self) -> float:
        return self.start + (trio.current_time() - self._origin)

    def __repr__(self) -> str:
        return f"<FakeWallClock at {self():.3f}>"
