"""What the executor tells observers (`trioexec.contrib`: Prometheus metrics,
OpenTelemetry spans) as its tasks move, and the ``trioexec`` logger.

An observer sees each accepted task (`Observer.submitted`, in the submitter's
task), each attempt's start (in the worker's task), deferrals and resumptions,
retries, and the one end (`Observer.finished`); with a store, also an end the
store then refused (`Observer.overruled`). With none registered the executor
pays one ``None`` check per step. An observer must be quick (it runs between a
task's steps); per task the calls come in order, and a task that ends (or
retries) while deferred gets no ``resumed`` first.

The logger writes one record per failure (ERROR), retry (INFO), abandonment
(ERROR) and lease loss (WARNING), with ``task_id``, ``task_name`` and ``attempt``
as extra fields (``name`` is the logging module's own: the logger's name). It
prints nothing until the application configures logging.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol, cast, final

from ._records import safe_repr

if TYPE_CHECKING:
    from ._records import TaskStatus
    from ._taskref import Job

logger = logging.getLogger("trioexec")
logger.addHandler(logging.NullHandler())


class Observer(Protocol):
    """What an observer is told (all synchronous, all quick, none may raise)."""

    def submitted(self, job: Job) -> None: ...
    def started(self, job: Job) -> None: ...
    def deferred(self, job: Job) -> None: ...
    def resumed(self, job: Job) -> None: ...
    def retrying(self, job: Job, status: TaskStatus, delay: float) -> None: ...
    def finished(self, job: Job, status: TaskStatus) -> None: ...
    def overruled(self, job: Job, status: TaskStatus) -> None:
        """``job``'s end, told as ``status`` (`finished`), was fenced out by the
        store: another owner has the task, and nothing of this end was recorded
        (its status is now ``CANCELLED``, its waiters told ``lease_lost``)."""
        ...


class Observed(Protocol):
    """An executor's lifecycle as `trioexec.contrib` sees it: the observer it tells
    (an `Observers` once one is added), and what a live task waits on."""

    @property
    def observer(self) -> Observer | None: ...
    def add_observer(self, observer: Observer) -> None: ...
    def remove_observer(self, observer: Observer) -> None: ...

    def waiting_on(self, job: Job) -> str | None: ...


@final
class Observers:
    """The observers of one executor, told in the order they were added. One
    that raises is logged and dropped: the executor's step goes on (an
    observer runs in the middle of it, between counts and wake-ups)."""

    __slots__ = ("all",)

    def __init__(self, *observers: Observer) -> None:
        self.all = list(observers)

    def submitted(self, job: Job) -> None:
        self._tell("submitted", job)

    def started(self, job: Job) -> None:
        self._tell("started", job)

    def deferred(self, job: Job) -> None:
        self._tell("deferred", job)

    def resumed(self, job: Job) -> None:
        self._tell("resumed", job)

    def retrying(self, job: Job, status: TaskStatus, delay: float) -> None:
        self._tell("retrying", job, status, delay)

    def finished(self, job: Job, status: TaskStatus) -> None:
        self._tell("finished", job, status)

    def overruled(self, job: Job, status: TaskStatus) -> None:
        self._tell("overruled", job, status)

    def _tell(self, step: str, *args: Any) -> None:
        for observer in self.all:
            try:
                getattr(observer, step)(*args)
            except Exception:
                logger.exception(
                    "observer %r raised in %s: it is told nothing more", observer, step
                )
                self.remove(observer)

    def add(self, observer: Observer) -> None:
        # A new list: a loop telling the others goes on over the old one.
        self.all = [*self.all, observer]

    def remove(self, observer: Observer) -> None:
        self.all = [o for o in self.all if o is not observer]


def combine(current: Observer | None, new: Observer) -> Observers:
    """``current`` (if any) and ``new``, as one observer (each guarded)."""
    if isinstance(current, Observers):
        current.add(new)
        return current
    return Observers(new) if current is None else Observers(current, new)


def without(current: Observer | None, gone: Observer) -> Observer | None:
    """``current`` without ``gone``; None if nothing is left to tell (a
    transition then costs no call at all)."""
    if current is gone:
        return None
    if isinstance(current, Observers):
        current.remove(gone)
        if not current.all:
            return None
    return current


def lifecycle_of(ex: Any) -> Observed:
    """Where ``ex`` (an `Executor` or a `DeterministicExecutor`) tells its
    observer (``.observer``, several through `combine`), for `trioexec.contrib`."""
    return cast("Observed", ex._core.lifecycle)


def owner_of(ex: Any) -> str:
    """``ex``'s owner id (`Executor.owner`; a `DeterministicExecutor` has one too),
    which tells executors apart."""
    return cast(str, ex._core.owner_id)


def ended(ex: Any) -> bool:
    """``ex`` runs nothing more: closed (its shutdown over) or stopped by its
    store's failure. Reads only (a scrape may ask from another thread)."""
    return cast(bool, ex._core.shutdown.over())


def fields(task_id: str, name: str, attempt: int) -> dict[str, object]:
    """The extra fields of a task's log record."""
    return {"task_id": task_id, "task_name": name, "attempt": attempt}


def _log(level: int, job: Job, msg: str, *args: object, **kwargs: Any) -> None:
    """Log ``msg`` of ``job``: its name and id, then ``args``; its extra fields."""
    extra = fields(job.task_id, job.name, job.attempts)
    logger.log(level, msg, job.name, job.task_id, *args, extra=extra, stacklevel=2, **kwargs)


def log_failure(job: Job, status: TaskStatus) -> None:
    if logger.isEnabledFor(logging.ERROR):
        error = job.error
        exc = None if error is None else (type(error), error, error.__traceback__)
        msg = "task %s (%s) %s after %d attempt(s): %s"
        _log(logging.ERROR, job, msg, status.value, job.attempts, safe_repr(error), exc_info=exc)


def log_retry(job: Job, status: TaskStatus, delay: float) -> None:
    if logger.isEnabledFor(logging.INFO):
        msg = "task %s (%s) attempt %d %s: %s; retrying in %.3g s"
        _log(logging.INFO, job, msg, job.attempts, status.value, safe_repr(job.error), delay)


def log_lease_lost(job: Job) -> None:
    if logger.isEnabledFor(logging.WARNING):
        msg = "task %s (%s): lease lost, another executor has it now; stopped here"
        _log(logging.WARNING, job, msg)


def log_abandoned(task_id: str, name: str, attempt: int, recovery_attempts: int) -> None:
    if logger.isEnabledFor(logging.ERROR):
        msg = "task %s (%s) abandoned after %d recoveries"
        logger.error(msg, name, task_id, recovery_attempts, extra=fields(task_id, name, attempt))


def log_overruled(job: Job) -> None:
    if logger.isEnabledFor(logging.WARNING):
        msg = (
            "task %s (%s): its end here was not recorded, another executor has it"
            " (its lease was lost)"
        )
        _log(logging.WARNING, job, msg)
