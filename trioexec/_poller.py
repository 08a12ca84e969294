"""One task that polls every deferred task's sync predicate, from a deadline heap.

A task polling its own predicate wakes up (a timer, a reschedule, a task switch)
every interval just to call a function that is usually false. The executor instead
keeps one poller: it sleeps until the earliest deadline, calls every predicate that
is due, and wakes only the tasks whose predicate came true (or raised).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import final

import trio

from ._backoff import Backoff


@final
class Entry:
    """One deferred task's predicate, as the poller holds it."""

    __slots__ = ("cancelled", "error", "event", "interval", "n", "predicate")

    def __init__(self, predicate: Callable[[], object], interval: float | Backoff) -> None:
        self.predicate = predicate
        self.interval = interval
        self.n = 0
        self.event = trio.Event()
        self.error: BaseException | None = None
        self.cancelled = False

    def next_wait(self) -> float:
        self.n += 1
        interval = self.interval
        return interval.delay(self.n) if isinstance(interval, Backoff) else float(interval)


@final
class Poller:
    """Run `run` as a task; `wait` from any task of the same run."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Entry]] = []
        self._seq = itertools.count()
        self._changed = trio.Event()  # an entry due earlier than the poller sleeps for
        self._closed = False

    async def wait(self, predicate: Callable[[], object], interval: float | Backoff) -> None:
        """Wait until ``predicate()`` is truthy, checking it every ``interval`` (the
        first check one interval from now). Raises what the predicate raises."""
        entry = Entry(predicate, interval)
        self._push(trio.current_time(), entry)
        try:
            await entry.event.wait()
        except BaseException:
            entry.cancelled = True  # dropped when it comes due
            raise
        if entry.error is not None:
            raise entry.error

    def _push(self, base: float, entry: Entry) -> None:
        deadline = base + entry.next_wait()
        earliest = self._heap[0][0] if self._heap else math.inf
        heapq.heappush(self._heap, (deadline, next(self._seq), entry))
        if deadline < earliest:
            self._changed.set()

    def close(self) -> None:
        """Let `run` return once nothing waits."""
        self._closed = True
        self._changed.set()

    async def run(self) -> None:
        heap = self._heap
        while True:
            if self._closed and all(entry.cancelled for _, _, entry in heap):
                return  # nobody waits any more (cancelled entries would only linger)
            deadline = heap[0][0] if heap else math.inf
            if deadline > trio.current_time():
                with trio.move_on_at(deadline):
                    await self._changed.wait()
                self._changed = trio.Event()
                continue
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                due, _, entry = heapq.heappop(heap)
                if entry.cancelled:
                    continue
                try:
                    if entry.predicate():
                        entry.event.set()
                        continue
                except Exception as exc:
                    entry.error = exc
                    entry.event.set()
                    continue
                self._push(due, entry)  # from its deadline, so intervals do not drift
            await trio.lowlevel.checkpoint()
