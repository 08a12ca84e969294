"""Prometheus metrics for an executor (extra ``prometheus``: prometheus-client).

docs/howto/prometheus.rst documents each metric, its labels, what counts how and the
cost per task: keep it in step with this module.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, ClassVar, final

import attrs
import trio
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import _observe
from .._executor import Executor
from .._records import TaskStatus, check_number

if TYPE_CHECKING:
    from .._taskref import Job

__all__ = ["Instrumentation", "instrument", "BUCKETS", "MAX_TASK_NAMES", "OTHER"]

#: Prometheus' default buckets, then minutes to an hour (tasks wait that long).
BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600,
)  # fmt: skip

#: The ``task`` label of the names past ``max_task_names``.
OTHER = "other"

#: ``max_task_names`` unless told: at some 50 series a name, 5,000 an executor, room
#: for most applications' task functions and a ceiling a name made per task cannot pass.
MAX_TASK_NAMES = 100

#: How tasks end, each a ``status`` series from the start (at 0 until it happens).
ENDS = (
    TaskStatus.COMPLETED,
    TaskStatus.FAILED,
    TaskStatus.CANCELLED,
    TaskStatus.TIMED_OUT,
    TaskStatus.DROPPED,
)


def instrument(
    ex: Executor,
    registry: CollectorRegistry | None = None,
    *,
    name: str = "default",
    buckets: Iterable[float] | None = None,
    max_task_names: int | None = MAX_TASK_NAMES,
) -> Instrumentation:
    """Count ``ex``'s tasks into ``registry`` (`prometheus_client.REGISTRY` if
    None), under the label ``executor=name``. Never blocks.

    ``buckets``: the upper bounds (seconds, increasing, finite, > 0; ``+Inf`` is
    always added) of both histograms, the attempt durations and the deferrals.
    The metrics are made once per registry, by the first `instrument` on it:
    None takes theirs (`BUCKETS` for the first: 5 ms to an hour); others must
    be the same.

    ``max_task_names``: at most this many ``task`` label values for ``ex``
    (`MAX_TASK_NAMES`, 100, unless told); tasks of any further name are counted
    under ``task="other"`` (`OTHER`). None: no bound. Only a bound holds whatever
    the names turn out to be: one made per user fills ``other``, not the memory of
    the process and of Prometheus. The first names seen get series of their own
    and keep them while instrumented (after a restart, a name may fall on the other
    side). Give tasks stable names (``submit(..., name=...)``) and keep the bound
    above their number: then ``other`` staying at 0 says the names are as you thought.

    Raises:
      TypeError: ``ex`` is not an ``Executor`` (a ``DeterministicExecutor`` has no slots).
      ValueError: ``ex`` is instrumented on ``registry`` already, or another
        open executor is, under ``name``; ``buckets`` is empty, not increasing,
        holds a value that is not a finite number > 0, or differs from the
        buckets the registry's histograms have; ``max_task_names`` is not an
        int >= 0 (each error names the value).

    Example::

        instrument(ex, name="ingest")
        prometheus_client.start_http_server(9100)  # (or your web framework's route)
    """
    if not isinstance(ex, Executor):  # (a DeterministicExecutor has no slots to scrape)
        raise TypeError(f"instrument() takes an Executor, not {type(ex).__name__}")
    wanted = None if buckets is None else _check_buckets(buckets)
    if max_task_names is not None:
        must = "None or an int >= 0"
        check_number("max_task_names", max_task_names, int, must, ge=0)
    metrics = _Metrics.of(REGISTRY if registry is None else registry, wanted)
    for other in list(metrics.executors.values()):
        if other.executor is ex:
            raise ValueError(f"executor already instrumented on this registry as {other.name!r}")
        if other.name == name:
            if other.executor is None or other.executor.closed:
                other.close()  # its executor has closed: the name is free
            else:
                raise ValueError(
                    f"executor name {name!r} is taken on this registry: give this one another"
                )
    instrumentation = Instrumentation(ex, metrics, name, max_task_names)
    metrics.executors[name] = instrumentation
    return instrumentation


def _check_buckets(buckets: Iterable[float]) -> tuple[float, ...]:
    """``buckets`` as upper bounds, each checked (``+Inf`` last: dropped, it is
    always there)."""
    if isinstance(buckets, str | bytes):
        raise ValueError(f"buckets must be numbers of seconds, got {buckets!r}")
    bounds = list(buckets)
    if bounds and bounds[-1] == math.inf:
        bounds.pop()
    if not bounds:
        raise ValueError(f"buckets must hold at least one finite bound, got {buckets!r}")
    previous = 0.0
    for bound in bounds:
        must, typed = "a finite number of seconds > 0", "a number of seconds"
        check_number("a bucket", bound, float, must, typed=typed, gt=0, lt=math.inf)
        if bound <= previous:
            raise ValueError(
                f"buckets must increase: {bound!r} comes after {previous!r} in {buckets!r}"
            )
        previous = bound
    return tuple(float(bound) for bound in bounds)


@final
class Instrumentation:
    """One executor's metrics on one registry (what `instrument` returns)."""

    def __init__(
        self, ex: Executor, metrics: _Metrics, name: str, max_task_names: int | None = None
    ) -> None:
        self.name = name  #: The ``executor`` label.
        self._ex = weakref.ref(ex)
        self._metrics = metrics
        self._lifecycle = _observe.lifecycle_of(ex)
        self._observer = _Observer(metrics, name, max_task_names)
        self._lifecycle.add_observer(self._observer)

    @property
    def executor(self) -> Executor | None:
        """The instrumented executor (None once it is gone)."""
        return self._ex()

    def close(self) -> None:
        """Stop counting: the executor's tasks are no longer observed, its gauges
        (active, deferred, queue depth, slots) are no longer scraped and its name
        is free. Idempotent. (Once the executor has closed or its store failed,
        its gauges are gone already.)"""
        if self._metrics.executors.get(self.name) is not self:
            return
        del self._metrics.executors[self.name]
        self._lifecycle.remove_observer(self._observer)
        self._observer.forget()

    def __repr__(self) -> str:
        return f"<Instrumentation executor={self.name!r}>"


@final
class _Metrics(Collector):
    """The metrics on one registry, shared by its instrumented executors; also
    the collector of their own gauges (queue depth, slots), read when scraped."""

    # Per registry, which outlives any one Trio run: a registry takes each metric
    # name once, and the application may instrument its executors one by one.
    _registered: ClassVar[weakref.WeakKeyDictionary[CollectorRegistry, _Metrics]] = (
        weakref.WeakKeyDictionary()
    )

    @classmethod
    def of(cls, registry: CollectorRegistry, buckets: tuple[float, ...] | None) -> _Metrics:
        metrics = cls._registered.get(registry)
        if metrics is None:
            metrics = cls._registered[registry] = cls(registry, buckets or BUCKETS)
        elif buckets is not None and buckets != metrics.buckets:
            raise ValueError(
                f"the histograms on this registry have the buckets {metrics.buckets} (from"
                f" its first instrument()), not {buckets}: give the same, or leave buckets out"
            )
        return metrics

    def __init__(self, registry: CollectorRegistry, buckets: tuple[float, ...]) -> None:
        labels = ("executor", "task")
        self.buckets = tuple(float(bound) for bound in buckets)
        self.executors: dict[str, Instrumentation] = {}

        def counter(name: str, text: str, *more: str) -> Counter:
            return Counter(name, text, (*labels, *more), registry=registry)

        def histogram(name: str, text: str) -> Histogram:
            return Histogram(name, text, labels, registry=registry, buckets=buckets)

        self.submitted = counter("trioexec_tasks_submitted", "Tasks accepted.")
        self.completed = counter("trioexec_tasks_completed", "Tasks ended, by status.", "status")
        self.fenced_out = counter(
            "trioexec_tasks_fenced_out",
            "Task ends counted as completed (by status) that the store then refused:"
            " another executor had taken the task over.",
            "status",
        )
        self.duration = histogram(
            "trioexec_task_duration_seconds",
            "Attempts, from start to end (time deferred included).",
        )
        self.deferral = histogram(
            "trioexec_task_deferred_seconds",
            "Deferrals, from defer_until to resumption (or the attempt's end).",
        )
        registry.register(self)

    def describe(self) -> list[Metric]:
        # (the names it takes, so a registry refuses a clash at once)
        return [GaugeMetricFamily(name, "", labels=labels) for name, _, labels in _GAUGES]

    def collect(self) -> Iterator[Metric]:
        """The gauges of what is now, of the executors still running: one that has
        closed or whose store failed has none (its series end, as a thing that no
        longer exists does), its counters and histograms stay."""
        active, deferred, depth, slots = (
            GaugeMetricFamily(name, text, labels=labels) for name, text, labels in _GAUGES
        )
        for name, instrumentation in list(self.executors.items()):
            ex = instrumentation.executor
            if ex is None or _observe.ended(ex):
                continue
            for series in instrumentation._observer.series():
                active.add_metric([name, series.task], series.active)
                deferred.add_metric([name, series.task], series.deferred)
            depth.add_metric([name], ex.metrics.queue_depth)
            slots.add_metric([name, "in_use"], ex.slots.in_use)
            slots.add_metric([name, "available"], ex.slots.available)
        yield from (active, deferred, depth, slots)


#: The gauges `_Metrics.collect` reads when scraped: name, help, labels.
_GAUGES = (
    ("trioexec_tasks_active", "Tasks running and holding a slot.", ["executor", "task"]),
    (
        "trioexec_tasks_deferred",
        "Tasks running and deferred (holding no slot).",
        ["executor", "task"],
    ),
    (
        "trioexec_queue_depth",
        "Tasks accepted and waiting for a slot (or between attempts).",
        ["executor"],
    ),
    (
        "trioexec_slots",
        "The executor's slots, in use or available (together: all of them).",
        ["executor", "state"],
    ),
)


@final
class _Series:
    """One task name's metrics in one executor: the labelled children, looked up
    once, and the counts the gauges read when scraped (``active``, ``deferred``)."""

    __slots__ = ("active", "completed", "deferral", "deferred", "duration", "submitted", "task")

    def __init__(self, metrics: _Metrics, executor: str, task: str) -> None:
        self.task = task  # (the label: the task's name, or `OTHER`)
        self.submitted = metrics.submitted.labels(executor, task)
        self.active = 0
        self.deferred = 0
        self.duration = metrics.duration.labels(executor, task)
        self.deferral = metrics.deferral.labels(executor, task)
        self.completed = {
            status: metrics.completed.labels(executor, task, status.value) for status in ENDS
        }


@final
@attrs.define(eq=False)
class _Observer:
    """The `trioexec._observe.Observer` that keeps one executor's metrics."""

    _metrics: _Metrics
    _executor: str
    _max_names: int | None = None  # (None: no bound)
    _series: dict[str, _Series] = attrs.field(init=False, factory=dict)  # names with their own
    _other: _Series | None = attrs.field(init=False, default=None)  # those past the bound's
    _started: dict[Job, float] = attrs.field(init=False, factory=dict)  # attempts' start times
    _deferred_since: dict[Job, float] = attrs.field(init=False, factory=dict)  # deferred ones'

    def _of(self, job: Job) -> _Series:
        series = self._series.get(job.name)
        if series is None:
            if self._max_names is not None and len(self._series) >= self._max_names:
                # Past the bound: not kept by name (its names are unbounded).
                if self._other is None:
                    self._other = _Series(self._metrics, self._executor, OTHER)
                return self._other
            series = self._series[job.name] = _Series(self._metrics, self._executor, job.name)
        return series

    def series(self) -> list[_Series]:
        """Every name's series (for a scrape, which may run in another thread)."""
        other = self._other
        return [*self._series.values()] if other is None else [*self._series.values(), other]

    def submitted(self, job: Job) -> None:
        self._of(job).submitted.inc()

    def started(self, job: Job) -> None:
        self._of(job).active += 1
        self._started[job] = trio.current_time()

    def deferred(self, job: Job) -> None:
        if job not in self._started:
            return  # (its attempt started before `instrument`: not in the gauges)
        series = self._of(job)
        series.active -= 1
        series.deferred += 1
        self._deferred_since[job] = trio.current_time()

    def resumed(self, job: Job) -> None:
        since = self._deferred_since.pop(job, None)
        if since is None:
            return  # (deferred before `instrument`)
        series = self._of(job)
        series.deferral.observe(trio.current_time() - since)
        series.deferred -= 1
        series.active += 1

    def retrying(self, job: Job, status: TaskStatus, delay: float) -> None:
        self._attempt_ended(job, self._of(job))

    def finished(self, job: Job, status: TaskStatus) -> None:
        series = self._of(job)
        series.completed[status].inc()  # (a task ends with one of `ENDS`)
        self._attempt_ended(job, series)

    def overruled(self, job: Job, status: TaskStatus) -> None:
        # (rare: a lease lost as the task ended; the labelled child is looked up here)
        self._metrics.fenced_out.labels(self._executor, self._of(job).task, status.value).inc()

    def _attempt_ended(self, job: Job, series: _Series) -> None:
        start = self._started.pop(job, None)
        if start is None:
            return  # it never started (cancelled or dropped while pending)
        now = trio.current_time()
        since = self._deferred_since.pop(job, None)
        if since is None:
            series.active -= 1
        else:  # (it ends while deferred)
            series.deferral.observe(now - since)
            series.deferred -= 1
        series.duration.observe(now - start)

    def forget(self) -> None:
        """No longer observed: the running tasks leave the gauges."""
        for job in self._started:
            series = self._of(job)
            if job in self._deferred_since:
                series.deferred -= 1
            else:
                series.active -= 1
        self._started.clear()
        self._deferred_since.clear()
