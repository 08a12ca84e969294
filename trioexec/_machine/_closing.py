"""`Closing`: what a shutdown decides (`Executor.shutdown`, the end of the
``async with``), apart from carrying it out (`trioexec._shutdown.Shutdown`).

Under ``DRAIN``, started workflow runs and the executor's own running tasks may
still submit until the drain ends. A grace bounds ``DRAIN`` and
``CANCEL_PENDING``: once it has run out, what is left is cancelled as under ``CANCEL``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from .._records import ShutdownPolicy


@attrs.define(eq=False)
class Closing:
    """Whether one executor is closing, what its policy still admits, and when
    the earliest grace runs out (on the executor's clock)."""

    closing: bool = False
    drain_runs: bool = True  # under DRAIN, started runs and own tasks may still submit
    grace_ends: float = math.inf  # when the earliest grace's timer fires
    expired: bool = False  # a grace ran out: what was left was cancelled

    def admits(self, internal: bool, own_task: Callable[[], bool]) -> bool:
        """A submission may be accepted now: the executor is open, or a drain
        still lets a workflow run's step (``internal``) or one of its own
        running tasks (``own_task()``, asked only then) submit."""
        return not self.closing or (self.drain_runs and (internal or own_task()))

    def close(self, policy: ShutdownPolicy) -> tuple[bool, bool]:
        """Closing from now on, under ``policy`` (a later call may be stricter).
        Returns what to cancel now: the tasks not started, the running ones.
        (What a pause holds is cancelled under every policy: it would never start.)"""
        self.closing = True
        self.drain_runs &= policy is ShutdownPolicy.DRAIN
        return policy is not ShutdownPolicy.DRAIN, policy is ShutdownPolicy.CANCEL

    def grace_deadline(
        self, policy: ShutdownPolicy, grace: float | None, now: float, idle: bool
    ) -> float | None:
        """When a timer is to cancel what is left, for a ``grace`` given at
        ``now``; None if none is needed (no grace, ``CANCEL``, idle already, a
        grace that ran out, or an earlier timer covers it)."""
        if grace is None or policy is ShutdownPolicy.CANCEL or self.expired or idle:
            return None
        deadline = now + grace
        return None if deadline >= self.grace_ends else deadline
