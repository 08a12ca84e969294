"""`Shutdown`: closing an executor under one of the three policies, with a grace.

What a policy decides is the machine's `Closing` (`trioexec._machine._closing`);
this shell carries it out. New submissions raise `ExecutorClosed`, and
submitters blocked for space wake up to learn it. A grace is kept by a timer
in the executor's nursery, so it holds whoever waits (or does not) for the
shutdown to end.
"""

from __future__ import annotations

from typing import final

import trio

from ._admission import Gate
from ._causation import current_job
from ._errors import ExecutorClosed
from ._machine._closing import Closing
from ._machine._lifecycle import Lifecycle
from ._records import HealthEventKind, ShutdownPolicy
from ._taskref import Job
from ._waits import LifecycleWaits
from ._workers import Workers


@final
class Shutdown(Closing):
    """One executor's shutdown: the machine's `Closing`, carried out."""

    __slots__ = ("_begun", "_gate", "_lifecycle", "_waits", "_workers")

    def __init__(
        self, gate: Gate, lifecycle: Lifecycle, waits: LifecycleWaits, workers: Workers
    ) -> None:
        super().__init__()
        self._gate = gate
        self._lifecycle = lifecycle
        self._waits = waits
        self._workers = workers
        self._begun = trio.Event()

    def check_open(self, internal: bool = False) -> None:
        """Raise `ExecutorClosed` if a submission may not be accepted now.
        ``internal``: a workflow run's step."""
        if not self.admits(internal, self.called_by_own_task):
            raise ExecutorClosed("the executor is shutting down; no new submissions")

    def called_by_own_task(self) -> bool:
        """The caller is (inside) one of this executor's running tasks."""
        caller = current_job()
        return caller is not None and caller.owner is self._lifecycle

    def begin(
        self, policy: ShutdownPolicy, grace: float | None = None, *, reason: str | None = None
    ) -> None:
        """Stop accepting work and apply ``policy``; what is still outstanding
        ``grace`` seconds from now (checked by the caller) is cancelled as under
        ``CANCEL``. Never blocks; may be called again with a stricter policy or a
        shorter grace. ``reason`` (the block ended by an exception) is what the
        tasks it cancels end with in the store."""
        lifecycle = self._lifecycle
        if reason is not None:
            lifecycle.cancel_reason = reason
        cancel_pending, cancel_running = self.close(policy)
        self._begun.set()
        # Blocked submitters decide again: ExecutorClosed (or, fan-out under
        # DRAIN, back in line).
        self._gate.wake_all()
        if cancel_pending:
            lifecycle.cancel_pending()
        # What a pause holds would never start (nor would a task paused from now on).
        pending = lifecycle.pending
        for job in [*pending.pauses.parked, *pending.pauses.retries]:
            lifecycle.cancel(job)
        if cancel_running:
            for job in self._workers.started_jobs():
                lifecycle.cancel(job)
        self._workers.close()
        if grace is None:
            return
        deadline = self.grace_deadline(policy, grace, trio.current_time(), lifecycle.is_idle())
        nursery = self._workers.nursery
        if deadline is not None and nursery is not None:
            self.grace_ends = deadline
            nursery.start_soon(self._expire_at, deadline, grace, name="trioexec shutdown grace")

    def parked(self, job: Job) -> None:
        """A pause parked ``job``, or holds its retry: during a shutdown it is
        cancelled, once its caller is done with it (it is being queued or
        parked right now), since it would never start."""
        if not self.closing:
            return
        trio.lowlevel.current_trio_token().run_sync_soon(self._lifecycle.cancel, job)

    async def wait_closed(self) -> None:
        """Wait until a shutdown has begun (by anyone) and nothing is outstanding. A checkpoint."""
        await self._begun.wait()
        await self._waits.wait_for_idle()

    def over(self) -> bool:
        """What `wait_closed` waits for holds now: a shutdown has begun and nothing
        is outstanding, or the store failed (that stopped it). Reads only."""
        lifecycle = self._lifecycle
        return self.closing and (lifecycle.is_idle() or lifecycle.failure is not None)

    async def _expire_at(self, deadline: float, grace: float) -> None:
        """At ``deadline``, cancel what is left (nothing to do if idle by then)."""
        with trio.move_on_at(deadline) as scope:
            await self._waits.wait_for_idle()
        if not scope.cancelled_caught or self.expired or self.over():
            return
        self.expired = True
        tally = self._lifecycle.tally
        self._lifecycle.events.publish(
            HealthEventKind.SHUTDOWN_GRACE_EXPIRED,
            reason="grace_expired",
            attributes={
                "grace": grace,
                "pending_depth": tally.queue_depth,
                "active_count": tally.active_count,
                "deferred_count": tally.deferred_count,
            },
        )
        self.begin(ShutdownPolicy.CANCEL)
