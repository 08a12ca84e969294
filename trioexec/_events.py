"""`HealthEvent` and the bounded stream the executor publishes them on.

Events are observers only: publishing never blocks or fails. When the reader falls
behind, the oldest unread events are dropped and counted.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, final

import attrs
import trio

from ._records import HealthEventKind, Overflow

_COALESCING = frozenset({HealthEventKind.TASK_REJECT, HealthEventKind.TASK_DROP})


@attrs.frozen(kw_only=True)
class HealthEvent:
    """One observation. ``at`` is wall-clock Unix seconds. Reject and drop events
    carry ``pending_depth``, ``active_count``, ``deferred_count`` and ``capacity`` in
    ``attributes``; ``occurrence_count`` says how many like it were merged into it
    while it was unread. A ``shutdown_grace_expired`` event (a shutdown's grace ran
    out; what is left is cancelled next) carries ``grace`` and the same three counts
    of what was left. A ``schedule_skipped`` event (a schedule's occurrence this
    executor did not run: its submission was refused) has the occurrence's task id,
    ``reason`` ``"refused"`` (its claim went back to the store, for another
    executor) or ``"task_id_in_use"`` (submitted before), and ``schedule_id``,
    ``at`` (wall-clock seconds) and ``error`` in ``attributes``."""

    kind: HealthEventKind
    task_id: str | None = None
    policy: Overflow | None = None
    reason: str | None = None
    attributes: dict[str, Any] = attrs.field(factory=dict)
    occurrence_count: int = 1
    at: float = 0.0


@final
class EventStream:
    """A bounded buffer of `HealthEvent` read with ``async for``.

    Iteration ends once the executor has closed and the buffer is empty. Meant for
    one reader; several readers share the events between them.
    """

    def __init__(self, capacity: int, clock: Callable[[], float] = time.time) -> None:
        self._capacity = capacity
        self._clock = clock
        # Boxes, so an unread reject/drop event can be replaced by its merged
        # successor; any other event is a tuple of its fields (`note`'s three, or
        # `publish`'s six), made into a HealthEvent only if it is read.
        self._buffer: deque[list[HealthEvent] | tuple[Any, ...]] = deque()
        self._unread: dict[tuple[Any, ...], list[HealthEvent]] = {}
        self._lot = trio.lowlevel.ParkingLot()
        self._closed = False
        self.dropped = 0

    def publish(
        self,
        kind: HealthEventKind,
        task_id: str | None = None,
        *,
        policy: Overflow | None = None,
        reason: str | None = None,
        attributes: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """Add an event. Never blocks; drops the oldest unread event when full.
        ``attributes`` may be a function that makes them, called if the event is
        read (not for a reject or drop event)."""
        if kind not in _COALESCING:
            # (a tuple: most are never read, and a workflow step publishes two)
            self._push((kind, task_id, self._clock(), policy, reason, attributes))
            return
        assert not callable(attributes)
        key = (kind, policy, reason)
        box = self._unread.get(key)
        event = HealthEvent(
            kind=kind,
            task_id=task_id,
            policy=policy,
            reason=reason,
            attributes=attributes or {},
            occurrence_count=1 if box is None else box[0].occurrence_count + 1,
            at=self._clock(),
        )
        if box is not None:
            box[0] = event
            return
        box = [event]
        self._push(box)
        self._unread[key] = box

    def note(self, kind: HealthEventKind, task_id: str) -> None:
        """`publish` an event with no policy, reason or attributes (not a coalescing
        kind): the cheap path for one per deferral and resumption."""
        self._push((kind, task_id, self._clock()))

    def _push(self, box: list[HealthEvent] | tuple[Any, ...]) -> None:
        buffer = self._buffer
        if len(buffer) >= self._capacity:
            old = buffer.popleft()
            if not isinstance(old, tuple):  # (a tuple is forgotten as it goes)
                self._forget(old)
            self.dropped += 1
        buffer.append(box)
        if self._lot:
            self._lot.unpark_all()

    def _forget(self, box: list[HealthEvent]) -> None:
        event = box[0]
        key = (event.kind, event.policy, event.reason)
        if self._unread.get(key) is box:
            del self._unread[key]

    def close(self) -> None:
        """No more events will come; readers finish once the buffer is empty."""
        self._closed = True
        self._lot.unpark_all()

    def get_nowait(self) -> HealthEvent | None:
        """The oldest unread event, or None."""
        if not self._buffer:
            return None
        box = self._buffer.popleft()
        if isinstance(box, tuple):
            if len(box) == 3:  # (`note`)
                return HealthEvent(kind=box[0], task_id=box[1], at=box[2])
            kind, task_id, at, policy, reason, attributes = box
            return HealthEvent(
                kind=kind,
                task_id=task_id,
                policy=policy,
                reason=reason,
                attributes=attributes() if callable(attributes) else attributes or {},
                at=at,
            )
        self._forget(box)
        return box[0]

    def __len__(self) -> int:
        return len(self._buffer)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> HealthEvent:
        """Wait for the next event (a checkpoint); StopAsyncIteration once closed and empty."""
        while True:
            # Like MemoryReceiveChannel: a cancelled read takes nothing.
            await trio.lowlevel.checkpoint_if_cancelled()
            event = self.get_nowait()
            if event is not None:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return event
            if self._closed:
                raise StopAsyncIteration
            await self._lot.park()
