"""`ExecutorMetrics`: a frozen snapshot of the executor's counters."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class ExecutorMetrics:
    """Counters and gauges of one executor, exact at the instant of the snapshot.

    ``*_count`` fields are totals since the executor opened, except the gauges
    ``active_count``, ``deferred_count`` and ``queue_depth`` and the high-water
    marks ``max_*``.
    """

    submitted_count: int = 0  #: every submit call, accepted or not
    queued_count: int = 0  #: accepted submissions
    active_count: int = 0  #: running and holding a slot, now
    deferred_count: int = 0  #: running and deferred, now
    completed_count: int = 0
    failed_count: int = 0
    cancelled_count: int = 0
    rejected_count: int = 0
    dropped_count: int = 0
    timed_out_count: int = 0
    deferral_count: int = 0  #: times a task gave its slot back in defer_until
    resumed_count: int = 0  #: times a deferred task took a slot back
    cancellation_requested_count: int = 0
    cancellation_observed_count: int = 0
    timeout_budget_exceeded_count: int = 0
    max_inflight_count: int = 0  #: high-water of pending + active
    max_outstanding_count: int = 0  #: high-water of pending + active + deferred
    max_deferred_count: int = 0
    queue_depth: int = 0  #: pending, now
    events_dropped_count: int = 0
