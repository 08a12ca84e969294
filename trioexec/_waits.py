"""The machine's waits, carried out in Trio (the machine decides them): the task
that sleeps until a limited key or a deadline is due (`Timer`), a started task waiting in
its key's line (`rejoin`), a retry waiting out a pause (`wait_unpaused`), and
who waits for the executor to be idle or for a task to end (`LifecycleWaits`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import final

import attrs
import trio

from ._machine._lifecycle import Lifecycle
from ._machine._pending import Pending
from ._taskref import Job


@final
@attrs.define(eq=False)
class Timer:
    """One task (started in ``nursery`` when first needed) sleeps until
    ``next_due()`` and calls ``tick()`` then, for as long as something is due: the
    queue's limited keys (`KeyGate.tick`), the deadlines of pending tasks whose
    ancestors have ended (`Lifecycle.expire`)."""

    _next_due: Callable[[], float]
    _tick: Callable[[], None]
    _name: str
    nursery: trio.Nursery | None = attrs.field(default=None, init=False)  # (set by `start`)
    _scope: trio.CancelScope | None = attrs.field(default=None, init=False)

    def due_at(self, at: float) -> None:
        """Something is due at ``at`` (`Listener.timer`, `Listener.deadline_due`)."""
        scope = self._scope
        if scope is not None:
            scope.deadline = min(scope.deadline, at)
        elif self.nursery is not None:
            self._spawn(self.nursery)

    def start(self, nursery: trio.Nursery) -> None:
        """The task runs in ``nursery`` from now on (at once if something is due
        already: `DeterministicExecutor` gives each `run_ready` a nursery of its own)."""
        self.nursery = nursery
        if self._scope is None and not math.isinf(self._next_due()):
            self._spawn(nursery)

    def _spawn(self, nursery: trio.Nursery) -> None:
        self._scope = trio.CancelScope(deadline=self._next_due())
        nursery.start_soon(self._run, self._scope, name=self._name)

    async def _run(self, scope: trio.CancelScope) -> None:
        while self._scope is scope:
            with scope:
                await trio.sleep_forever()
            if self._scope is not scope:
                return
            self._tick()
            scope = self._scope = trio.CancelScope(deadline=self._next_due())

    def close(self) -> None:
        """The task ends, and none starts until `start` is called again."""
        self.nursery = None
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.cancel()


@final
@attrs.define(eq=False)
class LifecycleWaits:
    """Who waits on the lifecycle: for nothing to be outstanding (`wait_for_idle`:
    the executor's close, a shutdown), and recovery for a task to end
    (`wait_space_freed`). The lifecycle tells when, through the core."""

    _lifecycle: Lifecycle
    _idle: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False)
    _space: trio.Event = attrs.field(factory=trio.Event, init=False)

    async def wait_for_idle(self) -> None:
        """Until nothing is pending, active or deferred (or the store failed)."""
        lifecycle = self._lifecycle
        if lifecycle.is_idle() or lifecycle.failure is not None:
            await trio.lowlevel.checkpoint()
            return
        while not lifecycle.is_idle() and lifecycle.failure is None:
            lifecycle.idle_wanted += 1
            try:
                await self._idle.park()
            finally:
                lifecycle.idle_wanted -= 1

    def idle(self) -> None:
        self._idle.unpark_all()

    async def wait_space_freed(self) -> None:
        """Wait until a task ends (with a store: recovery waits for room)."""
        self._space = trio.Event()
        self._lifecycle.space_wanted = True
        await self._space.wait()

    def space_freed(self) -> None:
        self._space.set()


async def rejoin(pending: Pending, job: Job) -> None:
    """Take ``job``'s key back (`KeyGate.rejoin`), waiting in its key's line if
    it must. If cancelled while waiting, it takes nothing. Not a checkpoint when
    the key has room."""
    waiter = pending.keys.rejoin(job, trio.Event)
    if waiter is None:
        return
    try:
        await waiter.wake.wait()
    except BaseException:
        pending.keys.leave_line(waiter)
        raise


async def wait_unpaused(pending: Pending, job: Job) -> None:
    """Wait while ``job``'s name or key is paused: a pause holds a retry's next
    attempt too (`Pending.hold_retry`). Not a checkpoint if it is not paused."""
    pauses = pending.pauses
    if pauses.now is None:
        return
    wake = trio.Event()
    if not pending.hold_retry(job, wake):
        return
    try:
        while True:
            await wake.wait()
            # (Lifted; but paused again before this task ran, it waits on.)
            wake = trio.Event()
            if not pauses.hold_retry(job, wake):
                return
    finally:
        pauses.retries.pop(job, None)
