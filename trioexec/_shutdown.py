"""`Shutdown`: closing an executor under one of the three policies, with a grace.

``DRAIN`` lets everything accepted finish (and started workflow runs, and the
executor's own running tasks, may still submit until the drain ends);
``CANCEL_PENDING`` also cancels what has not started; ``CANCEL`` also
cancels what is running. Whichever: new submissions raise `ExecutorClosed`, and
submitters blocked for space wake up to learn it.

A grace bounds the first two: once it has run out, what is left is cancelled as
``CANCEL`` would. A timer in the executor's nursery keeps it, so the grace holds
whoever waits (or does not) for the shutdown to end.
"""

from __future__ import annotations

import math
from typing import final

import trio

from ._admission import Gate
from ._causation import current_job
from ._errors import ExecutorClosed
from ._machine._lifecycle import Lifecycle
from ._records import HealthEventKind, ShutdownPolicy
from ._taskref import Job
from ._waits import LifecycleWaits
from ._workers import Workers


@final
class Shutdown:
    """Whether one executor is closing, and under which policy."""

    def __init__(
        self, gate: Gate, lifecycle: Lifecycle, waits: LifecycleWaits, workers: Workers
    ) -> None:
        self.closing = False
        self._drain_runs = True  # under DRAIN, started runs and own tasks may still submit
        self._gate = gate
        self._lifecycle = lifecycle
        self._waits = waits
        self._workers = workers
        self._deadline = math.inf  # (Trio's clock) when the earliest grace runs out
        self._expired = False
        self._begun = trio.Event()

    def check_open(self, internal: bool = False) -> None:
        """Raise `ExecutorClosed` if a submission may not be accepted now.
        ``internal``: a workflow run's step."""
        if self.closing and not (self._drain_runs and (internal or self.called_by_own_task())):
            raise ExecutorClosed("the executor is shutting down; no new submissions")

    def called_by_own_task(self) -> bool:
        """The caller is (inside) one of this executor's running tasks."""
        caller = current_job()
        return caller is not None and caller.owner is self._lifecycle

    def begin(
        self, policy: ShutdownPolicy, grace: float | None = None, *, reason: str | None = None
    ) -> None:
        """Stop accepting work and apply ``policy``. Never blocks; may be called
        again with a stricter policy or a shorter grace.

        With a ``grace`` (seconds, checked by the caller), what is still outstanding
        that long from now is cancelled as under ``CANCEL``. A ``reason`` (the
        executor's block ended by an exception: "interrupted") is what the tasks
        it cancels end with in the store.
        """
        if reason is not None:
            self._lifecycle.cancel_reason = reason
        self.closing = True
        self._begun.set()
        if policy is not ShutdownPolicy.DRAIN:
            self._drain_runs = False
        # Blocked submitters decide again: ExecutorClosed (or, fan-out under
        # DRAIN, back in line).
        self._gate.wake_all()
        if policy is not ShutdownPolicy.DRAIN:
            self._lifecycle.cancel_pending()
        # What a pause holds would never start (nor would a task paused from now on).
        pending = self._lifecycle.pending
        for job in [*pending.pauses.parked, *pending.pauses.retries]:
            self._lifecycle.cancel(job)
        if policy is ShutdownPolicy.CANCEL:
            for job in list(self._workers.taken):
                self._lifecycle.cancel(job)
        self._workers.close()
        if grace is not None and policy is not ShutdownPolicy.CANCEL:
            self._start_grace(grace)

    def parked(self, job: Job) -> None:
        """A pause parked ``job``, or holds its retry: during a shutdown it is
        cancelled, once its caller is done with it (it is being queued or
        parked right now), since it would never start."""
        if not self.closing:
            return
        trio.lowlevel.current_trio_token().run_sync_soon(self._lifecycle.cancel, job)

    async def wait_closed(self) -> None:
        """Wait until a shutdown has begun (whoever began it) and nothing is
        outstanding any more. A checkpoint."""
        await self._begun.wait()
        await self._waits.wait_for_idle()

    def over(self) -> bool:
        """What `wait_closed` waits for holds now: a shutdown has begun and nothing
        is outstanding, or the store failed (that stopped it). Reads only."""
        lifecycle = self._lifecycle
        return self.closing and (lifecycle.is_idle() or lifecycle.failure is not None)

    def _start_grace(self, grace: float) -> None:
        nursery = self._workers.nursery
        deadline = trio.current_time() + grace
        # An earlier grace's timer already covers a later deadline.
        if self._expired or deadline >= self._deadline or self._lifecycle.is_idle():
            return
        if nursery is not None:
            self._deadline = deadline
            nursery.start_soon(self._expire_at, deadline, grace, name="trioexec shutdown grace")

    async def _expire_at(self, deadline: float, grace: float) -> None:
        """At ``deadline``, cancel what is left (nothing to do if idle by then)."""
        lifecycle = self._lifecycle
        with trio.move_on_at(deadline) as scope:
            await self._waits.wait_for_idle()
        if not scope.cancelled_caught or self._expired:
            return
        if lifecycle.is_idle() or lifecycle.failure is not None:
            return
        self._expired = True
        tally = lifecycle.tally
        lifecycle.events.publish(
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
