"""`Lifecycle`: each step of a task's life, counted, journaled and published.

Every transition goes through here (cancelling, and losing a task to another
owner, too), so the `Tally` counts it once, the `Journal` records it once (with
a store) and the waiters of a finished task are woken once its completion is
durable. Who waits for a task to end or for idle waits in the shell
(`trioexec._waits.LifecycleWaits`), told through its `Listener`.
"""

from __future__ import annotations

import heapq
import json
import math
import traceback
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, final

import attrs

from .._changes import R_WAITING, ExecutionRow, Finish, Kept, Retry, Start, Sub, Wait
from .._errors import StoreError, TaskCancelled, TaskRejected, TaskTimeout
from .._metrics import Tally
from .._observe import (
    Observer,
    combine,
    log_failure,
    log_lease_lost,
    log_overruled,
    log_retry,
    without,
)
from .._records import (
    ACTIVE,
    CANCELLED,
    COMPLETED,
    DEFERRED,
    DROPPED,
    FAILED,
    FAILURES,
    PENDING,
    REJECTED,
    RUNNING,
    TASK_DEFERRED,
    TASK_RESUMED,
    TIMED_OUT,
    HealthEventKind,
    TaskStatus,
    safe_repr,
)

if TYPE_CHECKING:
    from .._changes import Transition
    from .._events import EventStream
    from .._taskref import Extras, Job
    from ._pending import Pending


class Gate(Protocol):
    """What the lifecycle asks of the admission gate (`trioexec._admission.Gate`)."""

    @property
    def waiters(self) -> Any:
        """The ``BLOCK`` submitters in line (true while there is one)."""

    def wake_next(self, *, handing_place: bool = False) -> None: ...
    def publish_refusal(self, kind: HealthEventKind, job: Job, reason: str) -> None: ...


class Journal(Protocol):
    """What the lifecycle asks of the journal (`trioexec._journal.Journal`)."""

    notify: list[Any]
    batch: int

    @property
    def failure(self) -> StoreError | None: ...
    def failure_error(self) -> StoreError: ...
    def new_row(self, job: Job, owner_id: str) -> ExecutionRow | None: ...
    def dead_letter(self, job: Job) -> tuple[str | None, str | None]: ...
    def append(self, change: ExecutionRow) -> None: ...
    def fold(self, job: Job, change: Transition) -> None: ...
    def hurry(self) -> None: ...


class Listener(Protocol):
    """What the lifecycle tells the shell (the executor's core)."""

    def space_freed(self) -> None:
        """A task ended while recovery waits for room (`space_wanted`)."""

    def idle(self) -> None:
        """Nothing is outstanding any more, and someone waits for that
        (`idle_wanted`), or the store failed: wake them."""

    def deadline_due(self, at: float) -> None:
        """Call `Lifecycle.expire` at ``at`` (the executor's clock), or soon after."""


class Runs(Protocol):
    """What the lifecycle tells the workflow runs of its executor about their
    steps (the workflow coordinator implements it)."""

    @property
    def open(self) -> int:
        """Runs not finished (an executor with one is not idle)."""

    def step_changed(self, run_id: str) -> None: ...
    def step_completed(self, job: Job) -> None: ...
    def lost(self, run_ids: Iterable[str]) -> None: ...


_STOPPED = (CANCELLED, TIMED_OUT)  # (what ends a task's descendants)
_OVERRULED = (COMPLETED, FAILED, TIMED_OUT, DROPPED)  # (the ends `overrule` takes back)


@final
class Lifecycle:
    """The transitions of one executor's tasks, and who is told of each."""

    remote = False  # (`trioexec._taskref.Owner`: its jobs are its own)

    def __init__(
        self,
        tally: Tally,
        pending: Pending,
        gate: Gate,
        events: EventStream,
        journal: Journal | None,
        wall: Callable[[], float],
        owner_id: str,
        listener: Listener,
        runs: Runs | None = None,
        keep_results: bool = False,
    ) -> None:
        self.tally = tally
        self.pending = pending
        self.journal = journal
        self.wall = wall
        self.runs = runs  # the workflow runs, if the executor has them
        self.live: dict[str, Job] = {}  # with a store: accepted and not finished
        self._listener = listener
        self.space_wanted = False  # recovery waits for a task to end (the shell sets it)
        self._named: dict[str, Job] = {}  # tasks with a chosen id, from submission to end
        self._gate = gate
        self._blocked = gate.waiters  # BLOCK submitters (read on every finish)
        self.events = events  # (the shutdown publishes on it too)
        self._owner_id = owner_id
        self.idle_wanted = 0  # how many wait for idle (the shell counts them)
        self.backing_off: set[Job] = set()  # (the workers keep it) between attempts
        self.cancelled_by: dict[str, str] = {}  # task id -> who sent the cancel command
        # the store error of the tasks a shutdown cancels because the block raised
        self.cancel_reason: str | None = None
        self.observer: Observer | None = None  # (`add_observer`)
        self.unread = UnreadFailures()  # failed tasks whose completion nobody read
        self.keep_results = keep_results  # a task's value is kept unless it says not
        #: a job may have `Job.extras` (or every value is kept): see `use_extras`
        self.uses_extras = False
        # The JSON of the value `finish` keeps (`_ending`: a cancelled or timed
        # out task's descendants end within it, and none of them keeps one).
        self._kept: str | None = None
        #: (deadline, seq, job): pending tasks whose inherited deadline no
        #: ancestor's end will carry out any more (`expire`); ``_stale``: how
        #: many of them have ended since (dropped once they are half)
        self._deadlines: list[tuple[float, int, Job]] = []
        self._stale = 0
        if keep_results:
            self.use_extras()
        #: dedupe key -> the latest execution submitted with it here (`Dedupes`)
        self.dedupes: dict[str, Job] = {}

    # ------------------------------------------------------------ accepted

    def add_observer(self, observer: Observer) -> None:
        """Tell ``observer`` of every transition from now on, after the
        observers added before (`trioexec.contrib`)."""
        self.observer = combine(self.observer, observer)

    def remove_observer(self, observer: Observer) -> None:
        self.observer = without(self.observer, observer)

    def is_live(self, task_id: str) -> bool:
        return task_id in self.live or task_id in self._named

    def track_named(self, job: Job) -> None:
        """``job`` has a caller-chosen id: it is taken from now (while the
        submission waits for space too) until the job ends or is not accepted."""
        self._named[job.task_id] = job

    def untrack(self, job: Job) -> None:
        """``job`` was not accepted after all: its chosen id is free again."""
        if self._named.get(job.task_id) is job:
            del self._named[job.task_id]
        extras = job.extras
        if extras is not None:
            if extras.parent is not None:
                leave_parent(job, extras)
            if extras.dedupe_key is not None:
                self._refused_with_key(job, extras.dedupe_key)

    def _refused_with_key(self, job: Job, key: str) -> None:
        """A submission with a dedupe key was refused after it took the key (with
        a store: after its row was stored): it ends ``REJECTED``, for its record
        and for whoever was handed it as a duplicate meanwhile."""
        if self.dedupes.get(key) is job:
            del self.dedupes[key]
        job.status = REJECTED
        job.finished_at = self.wall()
        job.error = TaskRejected(f"task {job.name!r} ({job.task_id}) was not admitted")
        journal = self.journal
        if journal is None:
            job.wake_waiters()
            return
        error = safe_repr(job.error)
        finish = (job.task_id, job.version, job.status, job.finished_at, error, None, None)
        journal.fold(job, Finish(finish))
        journal.notify.append(job)  # (acknowledged once its record says so)

    def accept(self, job: Job, *, recovered: bool = False, displace: bool = False) -> None:
        """Queue ``job`` (``displace``: dropping the oldest pending task for its
        place, `DROP_OLDEST`). What may raise comes first (its row, its key's
        state), so a submission that raises leaves no trace: nothing counted,
        queued, journaled or dropped. (The caller wakes a worker for it.)"""
        journal = self.journal
        row = None if journal is None or recovered else journal.new_row(job, self._owner_id)
        if displace:
            self.drop_oldest()
        self.pending.append(job)
        tally = self.tally
        tally.queued_count += 1
        tally.queue_depth += 1
        if journal is not None:
            self.live[job.task_id] = job
            if row is not None:
                self.log_submit(job, row)
            elif job.key is not None or job.paused:
                journal_waiting(self, job)  # (recovered as waiting for a slot)
        inflight = tally.queue_depth + tally.active_count
        if inflight > tally.max_inflight_count or tally.deferred_count:
            tally.note_high_water()  # (a new mark is rare)
        if self.observer is not None:
            self.observer.submitted(job)

    def waiting_on(self, job: Job) -> str | None:
        """Why ``job`` is not running now (`TaskRef.waiting_on`)."""
        status = job.status
        if status is PENDING:
            if job.paused or job in self.pending.pauses.retries:
                return "paused"
            if job.key is not None and (reason := self.pending.waiting_on(job)) is not None:
                return reason
            return "retry backoff" if job in self.backing_off else "slot"
        handle = job.handle
        if status is not RUNNING or handle is None:
            return None
        waiting = handle.waiting_on
        if waiting == "slot" and job.key is not None:
            return self.pending.waiting_on(job) or waiting
        return waiting

    def drop_new(self, job: Job) -> None:
        """``job`` arrived at a full executor under ``DROP_NEWEST``."""
        journal = self.journal
        row = None if journal is None else journal.new_row(job, self._owner_id)  # (may raise)
        self._gate.publish_refusal(HealthEventKind.TASK_DROP, job, "queue_full")
        if row is not None:
            self.log_submit(job, row)
        self.finish(job, DROPPED, freed=False)

    def drop_oldest(self) -> None:
        """Make room under ``DROP_OLDEST``: the oldest pending task is dropped."""
        oldest = self.pending.pop_oldest()
        assert oldest is not None
        self._gate.publish_refusal(HealthEventKind.TASK_DROP, oldest, "queue_full")
        self.tally.queue_depth -= 1
        self.finish(oldest, DROPPED)

    def log_submit(self, job: Job, row: ExecutionRow) -> None:
        """Journal a new execution's `ExecutionRow`; its next changes are folded into
        it while the journal has not taken it (`Journal.fold`)."""
        journal = self.journal
        assert journal is not None
        if job.key is not None or job.paused:  # (held back by its key or a pause)
            row[R_WAITING] = self.pending.waiting_on(job) or "slot"
        job.row = row
        job.row_batch = journal.batch
        journal.append(row)

    # ------------------------------------------------------------ running

    def started(self, job: Job) -> None:
        """An attempt of ``job`` begins, holding a slot."""
        tally = self.tally
        tally.queue_depth -= 1
        tally.active_count += 1
        job.status = RUNNING
        job.attempts += 1
        now = self.wall()
        journal = self.journal
        if journal is not None:
            journal.fold(job, Start((job.task_id, job.version, job.attempts, now)))
        if job.run_id is not None and self.runs is not None:
            self.runs.step_changed(job.run_id)
        if job.started_at is None:
            job.started_at = now
        if self.observer is not None:
            self.observer.started(job)

    def retrying(self, job: Job, status: TaskStatus, delay: float) -> None:
        """The attempt failed (``status``) and another follows after ``delay``
        seconds: ``job`` is pending again, without a slot, meanwhile."""
        tally = self.tally
        tally.active_count -= 1
        tally.queue_depth += 1
        job.status = PENDING
        error = safe_repr(job.error)
        journal = self.journal
        if journal is not None:
            journal.fold(job, Retry((job.task_id, job.version, error)))
        self.events.publish(
            HealthEventKind.TASK_RETRY_SCHEDULED,
            job.task_id,
            reason=status.value,
            attributes={"attempt": job.attempts, "delay": delay, "error": error},
        )
        log_retry(job, status, delay)
        if self.observer is not None:
            self.observer.retrying(job, status, delay)
        job.error = None

    def deferred(self, job: Job) -> None:
        tally = self.tally
        tally.active_count -= 1
        tally.deferred_count += 1
        tally.deferral_count += 1
        if tally.deferred_count > tally.max_deferred_count:
            tally.max_deferred_count = tally.deferred_count
        self.events.note(TASK_DEFERRED, job.task_id)
        journal = self.journal
        if journal is not None:
            waiting = self.waiting_on(job)  # (what the handle waits for)
            journal.fold(job, Sub((job.task_id, job.version, DEFERRED, self.wall(), waiting)))
        if job.run_id is not None and self.runs is not None:
            self.runs.step_changed(job.run_id)
        if self.observer is not None:
            self.observer.deferred(job)

    def resumed(self, job: Job) -> None:
        tally = self.tally
        tally.deferred_count -= 1
        tally.active_count += 1
        tally.resumed_count += 1
        self.events.note(TASK_RESUMED, job.task_id)
        journal = self.journal
        if journal is not None:
            journal.fold(job, Sub((job.task_id, job.version, ACTIVE, None, None)))
        if job.run_id is not None and self.runs is not None:
            self.runs.step_changed(job.run_id)
        if tally.queue_depth + tally.active_count > tally.max_inflight_count:
            tally.note_high_water()  # (one more in flight; as many outstanding)
        if self.observer is not None:
            self.observer.resumed(job)

    def deferral_abandoned(self) -> None:
        """A task ends (or its attempt does) while deferred: it is counted
        active again for the moment it takes to end, without a slot."""
        self.tally.deferred_count -= 1
        self.tally.active_count += 1

    def ended(self, job: Job, status: TaskStatus) -> None:
        """A worker is done with ``job``: its last attempt ended with ``status``
        (CANCELLED if cancelled between attempts)."""
        if job.key is not None:
            self.pending.keys.ended(job)
        if job.status is RUNNING:
            self.tally.active_count -= 1
            self.finish(job, status)
        else:  # cancelled between attempts (PENDING), or finished already
            self.tally.queue_depth -= 1
            if job.status is PENDING:
                self.finish(job, status)

    # ------------------------------------------------------------ finished

    def finish(self, job: Job, status: TaskStatus, *, freed: bool = True) -> None:
        """Record the one completion of ``job`` and wake whoever waits on it.
        ``freed``: the task counted against capacity until now (False only for a
        submission dropped on arrival)."""
        job.status = status
        job.finished_at = self.wall()
        tally = self.tally
        if status is COMPLETED:
            tally.completed_count += 1
        elif status is FAILED:
            tally.failed_count += 1
            if job.run_id is None:  # (a workflow's step is read by its run)
                self.unread.add(job)
        elif status is CANCELLED:
            tally.cancelled_count += 1
            if job.cancel_requested:
                tally.cancellation_observed_count += 1
        elif status is TIMED_OUT:
            tally.timed_out_count += 1
            if job.run_id is None:
                self.unread.add(job)
        else:
            tally.dropped_count += 1
        if self._named:
            self._named.pop(job.task_id, None)
        journal = self.journal
        if journal is None:
            if job.done is not None or job.on_done is not None:  # (`Job.waited_on`)
                job.wake_waiters()
        else:
            # Acknowledged (wait() returns) only once the record is durable.
            self.live.pop(job.task_id, None)
            if self.cancelled_by:
                who = self.cancelled_by.pop(job.task_id, None)
                if who is not None and status is CANCELLED and job.error is None:
                    job.error = TaskCancelled(f"cancelled by {who}")  # (as the store says)
            if status is CANCELLED and job.error is None and self.cancel_reason is not None:
                job.error = TaskCancelled(self.cancel_reason)  # (as the store says)
            error = None if job.error is None else safe_repr(job.error)
            dead = job.error is not None and status in FAILURES
            # (a dead letter keeps what operators look at: its traceback and arguments)
            traceback, args = journal.dead_letter(job) if dead else (None, None)
            change = (job.task_id, job.version, status, job.finished_at, error, traceback, args)
            journal.fold(job, Finish(change))
            job.row = None
            if job.run_id is not None and status is COMPLETED and self.runs is not None:
                # A completed step's record goes into the same transaction as its
                # execution's, so a crash cannot leave one without the other.
                self.runs.step_completed(job)
            journal.notify.append(job)
            if job.done is not None or job.on_done is not None:  # (`Job.waited_on`)
                journal.hurry()  # someone waits for it
            if self.space_wanted:  # (recovery only happens with a store)
                self.space_wanted = False
                self._listener.space_freed()
        if freed and self._blocked:
            # Hand the freed place to the longest-waiting BLOCK submitter.
            self._gate.wake_next(handing_place=True)
        if self.idle_wanted and self.is_idle():
            self._listener.idle()
        if self.observer is not None:
            self.observer.finished(job, status)
        if status is FAILED or status is TIMED_OUT:
            self.events.publish(
                HealthEventKind.TASK_FAILED,
                job.task_id,
                reason=status.value,
                attributes={"error": safe_repr(job.error), "name": job.name},
            )
            log_failure(job, status)

    def use_extras(self) -> None:
        """A job has `Job.extras` from now on (or every value is kept): `finish`
        reads them (`_ending`) from now on. A plain task's path is picked at
        open, not checked per task: until then, `finish` is the plain one."""
        if not self.uses_extras:
            self.uses_extras = True
            self.finish = self._finish_with_extras  # type: ignore[method-assign]
            self.accept = self._accept_with_extras  # type: ignore[method-assign]

    def _accept_with_extras(
        self, job: Job, *, recovered: bool = False, displace: bool = False
    ) -> None:
        Lifecycle.accept(self, job, recovered=recovered, displace=displace)
        extras = job.extras
        if extras is not None and extras.parent is not None:
            # Accepted: one of its parent's children (cancelled with it).
            parent = extras.parent
            above = parent.extras
            assert above is not None
            if above.children is None:
                above.children = set()
            above.children.add(job)
            if parent.cancel_requested or parent.status in _STOPPED:
                # (its parent was cancelled while this waited for room: so is it)
                stopped = parent.status if parent.status in _STOPPED else CANCELLED
                self.end_under(job, stopped, above.ended_by or parent.task_id)

    def _finish_with_extras(self, job: Job, status: TaskStatus, *, freed: bool = True) -> None:
        Lifecycle.finish(self, job, self._ending(job, status), freed=freed)
        kept, self._kept = self._kept, None
        if kept is not None and self.journal is not None:
            self.journal.fold(job, Kept((job.task_id, job.version, kept)))

    def _ending(self, job: Job, status: TaskStatus) -> TaskStatus:
        """What `finish` does for what ``job`` uses beyond a plain task: keep its
        value (`_kept`: its JSON, or None if not kept; its status is FAILED if
        JSON refuses it), leave its parent, and end its descendants if it was
        cancelled or timed out. Returns its status."""
        extras = job.extras
        self._kept = kept = None
        if status is COMPLETED:
            keep = None if extras is None else extras.keep_result
            if self.keep_results if keep is None else keep:
                self._kept = kept = kept_result(job)
                if kept is None:
                    status = FAILED
        if extras is None:
            return status
        if extras.watched:  # (its entry in the deadlines is stale now)
            self._unwatch(extras)
        if status is CANCELLED and isinstance(job.error, TaskTimeout):
            status = TIMED_OUT  # (an ancestor's deadline passed)
        if extras.parent is not None:
            leave_parent(job, extras)
        if extras.children:
            if status is CANCELLED or status is TIMED_OUT:
                self._end_descendants(job, status, extras.ended_by or job.task_id)
            else:  # (they keep the deadline they inherited: see that it is kept)
                self._watch_deadlines(extras.children)
        return status

    def _watch_deadlines(self, children: Iterable[Job]) -> None:
        """These tasks' parent ended (completed or failed): those still pending
        with an inherited deadline end ``TIMED_OUT`` when it passes (`expire`)."""
        earliest = math.inf
        for child in children:
            extras = child.extras
            if extras is None or extras.watched:
                continue
            deadline = extras.deadline
            if deadline < math.inf and child.scope is None and not child.ended:
                extras.watched = True
                heapq.heappush(self._deadlines, (deadline, id(child), child))
                earliest = min(earliest, deadline)
        if earliest < math.inf:
            self._listener.deadline_due(earliest)

    def _unwatch(self, extras: Extras) -> None:
        """A watched task has ended: its entry is stale. Once half of them are, they
        are dropped (a day-long parent's many children do not stay for the day)."""
        extras.watched = False
        self._stale += 1
        deadlines = self._deadlines
        if self._stale * 2 > len(deadlines):
            deadlines[:] = [e for e in deadlines if e[2].extras is not None and e[2].extras.watched]
            heapq.heapify(deadlines)
            self._stale = 0

    def next_deadline(self) -> float:
        """When `expire` is due next (inf: never)."""
        return self._deadlines[0][0] if self._deadlines else math.inf

    def expire(self) -> None:
        """End the pending tasks whose inherited deadline has passed, without
        running (those that started carry it out themselves)."""
        now = self.pending.clock()
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            job = heapq.heappop(deadlines)[2]
            extras = job.extras
            if extras is None or not extras.watched:
                self._stale -= 1  # (it ended meanwhile)
                continue
            extras.watched = False
            if job.scope is None and extras.deadline_of:
                self.end_under(job, TIMED_OUT, extras.deadline_of)

    def _end_descendants(self, job: Job, status: TaskStatus, origin: str) -> None:
        """``job`` was cancelled (or ended ``status``: CANCELLED or TIMED_OUT): so
        are its unfinished descendants, pending ones without running, each with
        an error naming ``origin``, the ancestor where it began. (A detached task
        is nobody's descendant.)"""
        found: list[Job] = []
        stack = [job]
        while stack:
            extras = stack.pop().extras
            if extras is not None and extras.children:
                found.extend(extras.children)
                stack.extend(extras.children)  # (an ended child's own may run on)
        for child in found:
            self.end_under(child, status, origin)

    def end_under(self, job: Job, status: TaskStatus, origin: str) -> None:
        """End ``job`` (CANCELLED or TIMED_OUT) because its ancestor ``origin``
        did; nothing if it has ended, or is being cancelled, already."""
        if job.ended or job.cancel_requested:
            return
        if status is TIMED_OUT:
            job.error = past_deadline(job, origin)
        else:
            why = f"its ancestor {origin!r} was cancelled"
            job.error = TaskCancelled(f"task {job.name!r} ({job.task_id}) was cancelled: {why}")
        assert job.extras is not None  # (a descendant: it has a parent)
        job.extras.ended_by = origin
        self._interrupt(job, descendants=False)

    def written(self, notify: list[Job], fenced: list[str]) -> None:
        """A batch is durable (the journal's callback): acknowledge its
        completions; deal with what the store fenced out (another owner has it)."""
        if fenced:
            lost = set(fenced)
            if self.runs is not None:
                self.runs.lost(lost)
            for job in notify:
                if job.task_id in lost:
                    self.overrule(job)
            for task_id in lost:
                self.lose(task_id)
        for job in notify:
            job.pending_ack = False
            if job.waited_on:
                job.wake_waiters()
        self._gate.wake_next()  # the store caught up: there may be room

    # ------------------------------------------------------------ cancelled, lost

    def cancel(self, job: Job) -> None:
        """`TaskRef.cancel`: a pending task ends now; a running one is interrupted.
        Its unfinished descendants end too, also if it has ended itself (as a
        cancel command through the store does)."""
        if not job.ended and not job.cancel_requested:
            self._interrupt(job)
        elif job.extras is not None and job.extras.children:
            self._end_descendants(job, CANCELLED, job.task_id)

    def _interrupt(self, job: Job, *, descendants: bool = True) -> None:
        self.tally.cancellation_requested_count += 1
        job.cancel_requested = True
        if descendants and job.extras is not None and job.extras.children:
            self._end_descendants(job, CANCELLED, job.task_id)
        scope = job.scope
        if scope is None:  # still in the pending queue: end it now
            self.tally.queue_depth -= 1
            self.finish(job, CANCELLED)
            self.pending.discard(job)
            return
        if job.handle is not None:
            job.handle._request_cancel()  # (its cancelled() fires, a reclaim stops)
        scope.cancel()

    def cancel_pending(self, into: list[Job] | None = None) -> int:
        """End every task not started as ``CANCELLED`` (appended to ``into``); return how many."""
        jobs = self.pending.take_all()
        for job in jobs:
            self.tally.cancellation_requested_count += 1
            job.cancel_requested = True
            self.tally.queue_depth -= 1
            self.finish(job, CANCELLED)
        if into is not None:
            into.extend(jobs)
        return len(jobs)

    def lose(self, task_id: str) -> None:
        """Another owner has this execution now: stop running it here, no retry."""
        job = self.live.pop(task_id, None)
        if job is None or job.ended:
            return
        job.version = -1  # nothing more of it can be written
        job.error = TaskCancelled(
            f"lease_lost: task {job.name!r} ({task_id}) was taken over by another executor"
        )
        log_lease_lost(job)
        self._interrupt(job)

    def overrule(self, job: Job) -> None:
        """``job`` ended here, but its completion was fenced out: another owner has
        the execution (or its record never existed). Its waiter learns that, not a
        result that was never recorded."""
        tally = self.tally
        told = job.status  # (what the observers were told)
        if told not in _OVERRULED:
            return  # already cancelled (or never admitted)
        counter = f"{told.value}_count"  # (the `Tally` counter `finish` added it to)
        setattr(tally, counter, getattr(tally, counter) - 1)
        if told in FAILURES:
            self.unread.forget(job)
        tally.cancelled_count += 1
        job.status = CANCELLED
        job.result = None
        job.completion = None
        job.error = TaskCancelled(
            f"lease_lost: task {job.name!r} ({job.task_id}) is another executor's now; "
            "its result here was not recorded"
        )
        log_overruled(job)
        if self.observer is not None:  # (told its end already: now that it did not count)
            self.observer.overruled(job, told)

    # ------------------------------------------------------------ idle, failure

    def is_idle(self) -> bool:
        tally = self.tally
        idle = tally.queue_depth == tally.active_count == tally.deferred_count == 0
        return idle and (self.runs is None or self.runs.open == 0)

    def maybe_idle(self) -> None:
        """Something other than a task ended (a run, the store): wake the
        `wait_for_idle` callers if that was the last of it."""
        if self.idle_wanted and self.is_idle():
            self._listener.idle()

    def wake_all_waiters(self) -> None:
        """The store failed: every waiter (and `wait_for_idle`) learns of it."""
        journal = self.journal
        assert journal is not None
        for job in [*self.live.values(), *journal.notify]:
            job.wake_waiters()
        self._listener.idle()

    def hurry(self) -> None:
        """Someone waits for a completion: the journal writes without gathering."""
        if self.journal is not None:
            self.journal.hurry()

    @property
    def failure(self) -> StoreError | None:
        """The store's failure, which stopped this executor (or None)."""
        return None if self.journal is None else self.journal.failure

    def failure_error(self) -> StoreError:
        assert self.journal is not None
        return self.journal.failure_error()


def journal_waiting(lifecycle: Lifecycle, job: Job) -> None:
    """What ``job`` waits on changed without a transition of its own (its key let
    it through or held it back, its condition held, its backoff is over): journal
    it as a "wait" change, once its submission is journaled (which carries the
    value) and until it ends. Never on the hot path of an unkeyed task."""
    journal = lifecycle.journal
    if journal is not None and job.task_id in lifecycle.live and not job.ended:
        journal.fold(job, Wait((job.task_id, job.version, lifecycle.waiting_on(job))))


@final
@attrs.define(eq=False)
class UnreadFailures:
    """The failed tasks (FAILED or TIMED_OUT, not a workflow's steps) whose
    completion nobody has read yet: how many, and the first few of them (bounded:
    a long run keeps no more), for the executor to say so as it closes."""

    KEPT = 16  # (to name the first one still unread)

    count: int = 0
    first: list[Job] = attrs.Factory(list)

    def add(self, job: Job) -> None:
        """``job`` ended failed (the failure path only)."""
        self.count += 1
        if len(self.first) < self.KEPT:
            self.first.append(job)

    def read(self) -> None:
        """A failed job's completion was made, for whoever reads it."""
        self.count -= 1

    def forget(self, job: Job) -> None:
        """``job`` did not fail after all: another owner had it (`Lifecycle.overrule`)."""
        if job.run_id is None and job.completion is None:  # (counted, and not read)
            self.count -= 1
            if job in self.first:
                self.first.remove(job)

    def report(self) -> str | None:
        """What to say at close (None: nothing unread): how many, and the first
        one's error with its traceback."""
        n = self.count
        if n <= 0:
            return None
        lines = [
            f"trioexec: {n} failed task{'s' if n != 1 else ''} whose completion nobody read"
            " (await ref.wait(), or open_executor(report_unread_failures=False) for quiet)"
        ]
        job = next((job for job in self.first if job.completion is None), None)
        if job is not None:
            error = job.error
            lines.append(
                f"the first: {job.name!r} (task {job.task_id}) {job.status.value}:"
                f" {safe_repr(error)}"
            )
            if error is not None:
                lines.append("".join(traceback.format_exception(error)).rstrip("\n"))
        return "\n".join(lines)


def past_deadline(job: Job, origin: str) -> TaskTimeout:
    """The error of ``job``, ended because the deadline it inherited from its
    ancestor ``origin`` passed (whether it noticed first, or the ancestor did)."""
    return TaskTimeout(
        f"task {job.name!r} ({job.task_id}) timed out: the deadline of its ancestor"
        f" {origin!r} passed"
    )


def leave_parent(job: Job, extras: Extras) -> None:
    """``job`` ended (or was not accepted): its parent's unfinished children no
    longer hold it, and its own go up a level (their ``parent_id`` stays), so
    that cancelling an ancestor of its still reaches them."""
    parent = extras.parent
    assert parent is not None
    assert parent.extras is not None
    siblings = parent.extras.children
    assert siblings is not None
    siblings.discard(job)
    if extras.children:
        for child in extras.children:
            assert child.extras is not None
            child.extras.parent = parent
        siblings |= extras.children


def kept_result(job: Job) -> str | None:
    """``job``'s value as the JSON a store keeps; None if ``json.dumps`` refuses
    it (``job.error`` then says so: the task failed, with no retry)."""
    try:
        # (strict JSON: NaN and infinities would be refused by other readers)
        return json.dumps(job.result, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:  # (a circular reference, NaN)
        error = TypeError(
            f"task {job.name!r} ({job.task_id}) returned a value of type"
            f" {type(job.result).__qualname__!r}, which cannot be kept as JSON: {exc}"
        )
        error.__cause__ = exc
        job.error, job.result = error, None
        return None
