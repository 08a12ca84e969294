"""`Recovery`: the executor's lease on its executions, and taking over the
executions (and workflow runs) of owners whose lease expired.

One lease covers every execution of an executor, renewed at a third of its
length (`trio_util.periodic`: a slow renewal does not push the next one back).
Each renewal also asks the store which executions another owner has taken over
meanwhile; those are stopped here (``lease_lost``). Recovery claims as many
expired executions as there is room for, so it keeps to the admission bound,
and several recovering executors share a dead one's backlog.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, final

import attrs
import trio
from trio_util import periodic

from ._admission import Gate
from ._changes import Release
from ._events import EventStream
from ._journal import Journal
from ._machine._lifecycle import Lifecycle, Runs
from ._observe import log_abandoned
from ._records import ExecutionRecord, HealthEventKind
from ._shutdown import Shutdown
from ._spec import TaskSpec
from ._waits import LifecycleWaits

if TYPE_CHECKING:
    from ._store import RunRecord


class RecoverableRuns(Runs, Protocol):
    """The executor's workflow runs, as the lifecycle and recovery see them."""

    def names(self) -> list[str]: ...
    def active_ids(self) -> list[str]: ...
    def resume(self, record: RunRecord) -> None: ...


@final
@attrs.define(eq=False)
class Recovery:
    """The lease of one executor (with a store), and what it recovers."""

    _journal: Journal
    _lifecycle: Lifecycle
    _waits: LifecycleWaits
    _gate: Gate
    _shutdown: Shutdown
    _events: EventStream
    _owner_id: str
    _specs: dict[str, TaskSpec]
    _recovered: Callable[[TaskSpec, tuple[Any, ...], ExecutionRecord], None]
    runs: RecoverableRuns | None = None
    _poked: trio.Event = attrs.field(factory=trio.Event, init=False)  # (`poke`)
    # Renewals take turns with `close` only, not with the journal's calls: one
    # queued behind a long recovery pass or a slow write could let the lease lapse.
    _lease_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _released: bool = attrs.field(default=False, init=False)

    async def take_lease(self, lease: float) -> None:
        journal = self._journal
        await journal.call(journal.store.heartbeat, self._owner_id, self._lifecycle.wall() + lease)

    async def heartbeat(self, lease: float) -> None:
        """Renew the lease at a third of it, forever; stop what was taken over."""
        journal = self._journal
        store = journal.store
        owner = self._owner_id
        lifecycle = self._lifecycle
        async with contextlib.aclosing(periodic(lease / 3)) as beats:
            async for _, since_last in beats:
                if since_last is None:
                    continue  # renewed on entry
                await self._renew(lease)
                # What was taken over is asked in order with the writes: a
                # version written but not yet committed is not "taken over".
                live = {task_id: job.version for task_id, job in lifecycle.live.items()}
                for task_id in await journal.call(store.taken_over, owner, live):
                    lifecycle.lose(task_id)
                runs = self.runs
                if runs is not None and (active := runs.active_ids()):
                    runs.lost(await journal.call(store.runs_taken_over, owner, active))

    async def _renew(self, lease: float) -> None:
        """Renew the lease now, beside the journal's calls (every store is
        thread-safe), unless it was given up."""
        store = self._journal.store
        async with self._lease_lock:
            if self._released:
                return
            # The lease runs from when it is written: a store that can counts
            # it once it has its own lock (another call of ours may hold it).
            renew = getattr(store, "renew_lease", None)
            if renew is not None:
                call, args = renew, (self._owner_id, lease)
            else:
                call, args = store.heartbeat, (self._owner_id, self._lifecycle.wall() + lease)
            if store.inline:
                call(*args)
            else:
                await trio.to_thread.run_sync(call, *args)

    async def recover(self, max_recovery_attempts: int) -> bool:
        """Claim the executions of owners whose lease expired, as many as there is
        room for, and queue them here. Returns True if it filled the room (more
        may be waiting)."""
        journal = self._journal
        store = journal.store
        specs = self._specs
        lifecycle = self._lifecycle
        owner = self._owner_id

        def recreatable(record: ExecutionRecord) -> bool:
            return record.args is not None and record.spec_id in specs

        if self._shutdown.closing:
            return False
        gate = self._gate
        room = gate.room
        gate.hold(room)  # submissions meanwhile must not take recovery's room
        try:
            result = await journal.call(
                store.recover, owner, lifecycle.wall(), recreatable, max_recovery_attempts, room
            )
        finally:
            gate.release(room)  # (what it claims it accepts below, before it yields)
        for record in result.abandoned:
            self._events.publish(
                HealthEventKind.TASK_ABANDONED,
                record.task_id,
                reason="abandoned",
                attributes={"name": record.name, "recovery_attempts": record.recovery_attempts},
            )
            log_abandoned(record.task_id, record.name, record.attempt, record.recovery_attempts)
        if self._is_closing():  # (the store call above awaited)
            await self._give_back(result.claimed)
            return False
        for record in result.claimed:
            assert record.spec_id is not None
            assert record.args is not None
            self._recovered(specs[record.spec_id], tuple(json.loads(record.args)), record)
        runs = self.runs
        if runs is not None and not self._is_closing():
            claimed = await journal.call(
                store.claim_runs, owner, lifecycle.wall(), runs.names(), max_recovery_attempts
            )
            for run in claimed.abandoned:
                self._events.publish(
                    HealthEventKind.TASK_ABANDONED,
                    None,
                    reason="abandoned",
                    attributes={"run_id": run.run_id, "workflow": run.workflow},
                )
            for run_record in claimed.claimed:
                if self._is_closing():
                    break  # claimed under our lease, which lapses: recovered again later
                runs.resume(run_record)
        return len(result.claimed) >= room

    async def _give_back(self, claimed: list[ExecutionRecord]) -> None:
        """Executions claimed while the executor began to close go back, ownerless,
        so any executor recovers them at once and counts no recovery more (counted
        twice, a few unlucky closings would abandon a task that never ran). Best
        effort: after a store failure, or while tasks of ours are live, close does
        not wait for it and the claims lapse with the lease; a store error here
        fails the close as any write's would."""
        if claimed:
            journal = self._journal
            released = [Release((r.task_id, r.version)) for r in claimed]
            await journal.call(journal.store.write, released)

    def _is_closing(self) -> bool:
        # A method, not the attribute: type checkers keep `closing` narrowed
        # across awaits, though shutdown can begin during one.
        return self._shutdown.closing

    async def run(self, lease: float, max_recovery_attempts: int, more: bool) -> None:
        """Recover again every ``lease`` seconds; after a pass that filled the
        room, as soon as half of the capacity is free."""
        lifecycle = self._lifecycle
        tally = lifecycle.tally
        half = self._gate.capacity // 2
        while True:
            if more:
                while tally.outstanding > half:
                    await self._waits.wait_space_freed()
            else:
                with trio.move_on_after(lease):
                    await self._poked.wait()
            self._poked = trio.Event()
            more = await self.recover(max_recovery_attempts)

    def poke(self) -> None:
        """Recover now (executions were requeued), not at the next period."""
        self._poked.set()

    async def close(self) -> None:
        """Write what is left and give up the lease (if nothing of ours is live).
        Raises what the store raises."""
        journal = self._journal
        await journal.write()
        if journal.failure is None and not self._lifecycle.live and not journal.changes:
            async with self._lease_lock:  # (not while a renewal is being written)
                self._released = True
                await journal.call(journal.store.release_owner, self._owner_id)
