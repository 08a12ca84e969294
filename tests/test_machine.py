"""The machine without Trio (issue 31): `Pending` driven as the shell drives it —
submit, start, defer and resume, retry, finish, cancel, pause, the clock moving
and the key timers ticking — against a model of what the runtime promises:

- a key's concurrency bound and its rate (over any span of ``s`` seconds at most
  ``burst + rate * s / per`` starts) are never exceeded;
- tasks start best first: no queued task without a limit outranks the one that
  starts (priority, then submission order), nor does a task of the same key;
- a paused task does not start; nothing is lost: the queue's counts are the
  model's, and once everything is let go every task starts and ends.

No Trio run, no store: the machine reads the clock it is given and sets the
wakes the shell gave it (here, flags).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from trioexec import KeyLimit, ShutdownPolicy, TaskStatus
from trioexec._changes import Finish, submitted
from trioexec._machine._closing import Closing
from trioexec._machine._lifecycle import Lifecycle
from trioexec._machine._pending import Pending
from trioexec._metrics import Tally
from trioexec._spec import call_info
from trioexec._taskref import Job

LIMITS = {
    "a": KeyLimit(concurrency=2),
    "b": KeyLimit(concurrency=1),
    "r": KeyLimit(rate=2, per=10.0),
    "ar": KeyLimit(concurrency=1, rate=1, per=5.0),
}
KEYS = [None, "a", "b", "b", "r", "ar", "ar", "free"]  # ("free": a key with no limit)
NAMES = ["n0", "n1"]


async def noop():
    pass


class Flag:
    """The wake a shell hands the machine (a `trio.Event` in the real one)."""

    def __init__(self) -> None:
        self.is_set = False

    def set(self) -> None:
        self.is_set = True


class Listener:
    def __init__(self) -> None:
        self.readies = 0
        self.parks: list[Job] = []
        self.timers: list[float] = []

    def ready(self) -> None:
        self.readies += 1

    def waiting(self, job: Job) -> None:
        pass

    def want(self, state: object) -> None:
        raise AssertionError("no key is shared here")

    def parked(self, job: Job) -> None:
        self.parks.append(job)

    def timer(self, at: float) -> None:
        self.timers.append(at)


class MachineAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.listener = Listener()
        self.pending = Pending(lambda: self.now, LIMITS, None, listener=self.listener)
        self.made = 0
        self.queued: list[Job] = []  # submitted, not started, not cancelled
        self.running: list[Job] = []  # hold their key (and a slot)
        self.deferred: list[Job] = []  # gave it back, will resume
        self.retrying: list[Job] = []  # between attempts, will retry
        self.lines: list[tuple[Job, object, bool]] = []  # (job, waiter, retry) in a key's line
        self.held: list[tuple[Job, Flag]] = []  # retries a pause holds
        self.rank: dict[Job, tuple[int, int]] = {}
        self.behind_line: dict[Job, bool] = {}
        self.starts: dict[str, list[float]] = {}
        self.paused: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())

    # ---------------------------------------------------------------- helpers

    def is_paused(self, job: Job) -> bool:
        names, keys = self.paused
        return job.name in names or job.key in keys

    def started(self, job: Job) -> None:
        if job.key is not None:
            self.starts.setdefault(job.key, []).append(self.now)
        self.running.append(job)

    def woken(self) -> None:
        """Tasks whose wait in their key's line is over go on, as the shell does;
        so do retries a pause held, once it is lifted."""
        for entry in list(self.held):
            job, flag = entry
            if flag.is_set and entry in self.held:
                self.held.remove(entry)
                again = Flag()
                if self.pending.pauses.hold_retry(job, again):  # (paused again: waits on)
                    self.held.append((job, again))
                    continue
                self.pending.pauses.retries.pop(job, None)
                self.rejoin(job, True)
        for entry in list(self.lines):
            job, waiter, retry = entry
            if waiter.wake.is_set:
                assert waiter.granted
                self.lines.remove(entry)
                if retry:
                    self.pending.keys.attempt_starts(job)
                self.started(job) if retry else self.running.append(job)

    # ---------------------------------------------------------------- rules

    @rule(
        key=st.sampled_from(KEYS),
        priority=st.sampled_from([0, 0, 1, 5]),
        name=st.sampled_from(NAMES),
    )
    def submit(self, key, priority, name):
        job = Job(
            None,
            noop,
            (),
            call_info(noop),
            f"t{self.made}",
            name,
            None,
            None,
            None,
            None,
            0.0,
            False,
            True,
        )
        job.key, job.priority = key, priority
        self.rank[job] = (-priority, self.made)
        # Tasks of its key waiting in the key's line go first: then a task the
        # key let through keeps its room, however good this one is.
        self.behind_line[job] = any(j.key == key for j, _, _ in self.lines)
        self.made += 1
        self.pending.append(job)
        self.queued.append(job)

    @rule()
    def start(self):
        job = self.pending.pop()
        if job is None:
            return
        assert job in self.queued
        assert not self.is_paused(job)
        for other in self.queued:
            if other is job or self.is_paused(other):
                continue
            if other.key in (None, "free") or (
                other.key == job.key and not self.behind_line[other]
            ):
                assert self.rank[job] < self.rank[other], (job, other)
        self.queued.remove(job)
        job.status = TaskStatus.RUNNING
        self.started(job)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), how=st.sampled_from(["finish", "defer", "retry"]))
    def leave(self, data, how):
        job = data.draw(st.sampled_from(self.running))
        if how != "finish" and job.key is None:
            how = "finish"
        self.running.remove(job)
        if how == "finish":
            job.status = TaskStatus.COMPLETED
            if job.key is not None:
                self.pending.keys.ended(job)
        elif how == "defer":
            self.pending.keys.release(job, deferred=True)
            self.deferred.append(job)
        else:
            self.pending.keys.release(job)
            self.retrying.append(job)
        self.woken()

    @precondition(lambda self: self.deferred or self.retrying)
    @rule(data=st.data())
    def come_back(self, data):
        self.come_back_one(data.draw(st.sampled_from(self.deferred + self.retrying)))

    @precondition(lambda self: self.queued)
    @rule()
    def drop_oldest(self):
        job = self.pending.pop_oldest()
        first = min(
            (j for j in self.queued if not self.is_paused(j)), key=self.rank.get, default=None
        )
        if first is None or job is None:
            assert job is first
            return
        oldest = min(
            (j for j in self.queued if not self.is_paused(j)), key=lambda j: self.rank[j][1]
        )
        assert job is oldest
        self.queued.remove(job)
        job.status = TaskStatus.DROPPED
        self.woken()

    @precondition(lambda self: self.queued)
    @rule()
    def take_all(self):
        jobs = self.pending.take_all()
        assert sorted(jobs, key=id) == sorted(self.queued, key=id)
        for job in jobs:
            job.status = TaskStatus.CANCELLED
        self.queued.clear()
        self.woken()

    @precondition(lambda self: any(not w.granted for _, w, _ in self.lines))
    @rule(data=st.data())
    def give_up_waiting(self, data):
        """A task waiting in its key's line is cancelled: it takes nothing."""
        entry = data.draw(st.sampled_from([e for e in self.lines if not e[1].granted]))
        self.lines.remove(entry)
        job, waiter, _retry = entry
        self.pending.keys.leave_line(waiter)
        job.status = TaskStatus.CANCELLED
        self.pending.keys.ended(job)
        self.woken()

    @precondition(lambda self: self.queued)
    @rule(data=st.data())
    def cancel(self, data):
        job = data.draw(st.sampled_from(self.queued))
        self.queued.remove(job)
        job.status = TaskStatus.CANCELLED
        self.pending.discard(job)
        self.woken()

    @rule(
        names=st.sets(st.sampled_from(NAMES)), keys=st.sets(st.sampled_from(KEYS[1:]), max_size=1)
    )
    def pause(self, names, keys):
        self.paused = (frozenset(names), frozenset(keys))
        self.pending.set_paused(*self.paused)
        self.woken()

    @rule(seconds=st.sampled_from([0.5, 2.5, 5.0, 11.0]))
    def advance(self, seconds):
        self.now += seconds
        if self.pending.keys.timers.next() <= self.now:
            self.pending.keys.tick()
        self.woken()

    # ---------------------------------------------------------------- what holds

    @invariant()
    def bounds_hold(self):
        for key, limit in LIMITS.items():
            if limit.concurrency is not None:
                holding = [j for j in self.running if j.key == key]
                assert len(holding) <= limit.concurrency, (key, holding)
            if limit.rate is not None:
                times = self.starts.get(key, [])
                for i, t0 in enumerate(times):
                    for j in range(i, len(times)):
                        span = times[j] - t0
                        assert j - i + 1 <= limit.burst + limit.rate * span / limit.per + 1e-9

    @invariant()
    def counts_are_the_models(self):
        pending = self.pending
        counted = pending.startable + pending.keys.held + len(pending.pauses.parked)
        assert counted == len(self.queued)
        assert set(pending.pauses.parked) == {j for j in self.queued if self.is_paused(j)}
        assert math.isinf(pending.keys.timers.next()) or self.listener.timers
        assert set(pending.pauses.retries) == {job for job, _ in self.held}

    def teardown(self):
        """Let everything go: every task starts and ends, within a bound."""
        self.pause(set(), set())
        for _ in range(4 * self.made + 10):
            if not (self.queued or self.running or self.deferred or self.retrying or self.lines):
                assert not self.held
                return
            while self.running:
                self.leave_one()
            for job in [*self.deferred, *self.retrying]:
                self.come_back_one(job)
            while (job := self.pending.pop()) is not None:
                self.queued.remove(job)
                job.status = TaskStatus.RUNNING
                self.started(job)
            self.bounds_hold()
            if not self.running and self.pending.keys.timers.next() < math.inf:
                self.now = max(self.now, self.pending.keys.timers.next())
                self.pending.keys.tick()
                self.woken()
        raise AssertionError(f"stuck: {self.queued=} {self.lines=} {self.pending!r}")

    def leave_one(self):
        job = self.running.pop()
        job.status = TaskStatus.COMPLETED
        if job.key is not None:
            self.pending.keys.ended(job)
        self.woken()

    def come_back_one(self, job):
        retry = job in self.retrying
        (self.retrying if retry else self.deferred).remove(job)
        if retry:
            flag = Flag()
            if self.pending.hold_retry(job, flag):
                assert self.is_paused(job)
                self.held.append((job, flag))
                return
        self.rejoin(job, retry)

    def rejoin(self, job, retry):
        waiter = self.pending.keys.rejoin(job, Flag)
        if waiter is None:
            if retry:
                self.pending.keys.attempt_starts(job)
                self.started(job)
            else:
                self.running.append(job)
        else:
            self.lines.append((job, waiter, retry))
        self.woken()


TestMachine = MachineAgainstModel.TestCase
# (`nox -s soak` runs it again and again under new seeds)
TestMachine.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


def test_the_machine_runs_without_trio():
    """Importing the machine's modules on their own loads no Trio and no store."""
    import subprocess
    import sys

    code = """
import sys, types, importlib.util, pathlib
import trioexec
path = list(trioexec.__path__)
for name in list(sys.modules):
    if name == "trio" or name.startswith(("trio.", "trioexec", "outcome", "sqlite")):
        del sys.modules[name]
package = types.ModuleType("trioexec")
package.__path__ = path
sys.modules["trioexec"] = package
import trioexec._machine._pending, trioexec._machine._admit, trioexec._machine._lifecycle
import trioexec._machine._closing, trioexec._machine._pauses
roots = ("trio", "trioexec", "sqlite3", "sqlite_utils")
print(sorted(n for n in sys.modules if n.split(".")[0] in roots))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = eval(out.stdout)
    assert "trio" not in loaded
    assert not any(n.startswith("trioexec._store") for n in loaded)
    assert "trioexec._machine._pending" in loaded


# ---------------------------------------------------------------- the lifecycle


class Recorder:
    """The shell's parts the lifecycle tells, as records: the journal, the gate,
    the event stream, its listener and an observer."""

    def __init__(self) -> None:
        self.notify: list[Job] = []
        self.batch = 0
        self.failure = None
        self.finishes: dict[str, int] = {}  # task id -> Finish changes journaled
        self.rows: list[object] = []
        self.waiters: list[object] = []  # (the gate's BLOCK line: nobody)
        self.events: list[object] = []
        self.space = 0
        self.idles = 0
        self.told: dict[str, list[str]] = {}  # task id -> what the observer heard

    # the journal
    def dead_letter(self, job):
        return "Traceback ...", None

    def new_row(self, job, owner_id):
        return submitted(job.task_id, job.version, job.name, None, None, None, owner_id, 0.0)

    def append(self, change):
        self.rows.append(change)

    def fold(self, job, change):
        if isinstance(change, Finish):
            self.finishes[job.task_id] = self.finishes.get(job.task_id, 0) + 1

    def hurry(self):
        pass

    def failure_error(self):
        raise AssertionError("the store never fails here")

    # the gate
    def wake_next(self, *, handing_place=False):
        pass

    def publish_refusal(self, kind, job, reason):
        self.events.append((kind, job.task_id))

    # the event stream
    def publish(self, kind, task_id=None, **fields):
        self.events.append((kind, task_id))

    def note(self, kind, task_id):
        self.events.append((kind, task_id))

    # the listener
    def space_freed(self):
        self.space += 1

    def idle(self):
        self.idles += 1

    # an observer
    def _hear(self, what, job):
        self.told.setdefault(job.task_id, []).append(what)

    def submitted(self, job):
        self._hear("submitted", job)

    def started(self, job):
        self._hear("started", job)

    def deferred(self, job):
        self._hear("deferred", job)

    def resumed(self, job):
        self._hear("resumed", job)

    def retrying(self, job, status, delay):
        self._hear("retrying", job)

    def finished(self, job, status):
        self._hear(f"finished {status}", job)

    def overruled(self, job, status):
        self._hear("overruled", job)


class Scope:
    """A running attempt's cancel scope, as the lifecycle sees it."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


ENDINGS = [TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.TIMED_OUT]


class LifecycleAgainstModel(RuleBasedStateMachine):
    """The lifecycle driven as the shell drives it (the workers run attempts,
    defer, resume and retry them; callers cancel; the writer says a batch is
    durable), with and without a journal: its counts are always the model's,
    and every accepted task ends exactly once (observed once, journaled once)."""

    @initialize(store=st.booleans())
    def setup(self, store):
        self.rec = Recorder()
        self.pending = Pending(lambda: 0.0)
        self.lifecycle = Lifecycle(
            Tally(),
            self.pending,
            self.rec,
            self.rec,
            self.rec if store else None,
            lambda: 0.0,
            "owner",
            self.rec,
        )
        self.lifecycle.add_observer(self.rec)
        self.store = store
        self.made = 0
        self.state: dict[Job, str] = {}  # queued, running, deferred, between, ended
        self.ended: dict[Job, TaskStatus] = {}
        self.lost: set[Job] = set()  # taken over by another owner (`lose`)

    def jobs(self, *states):
        return [job for job, state in self.state.items() if state in states]

    def new(self):
        job = Job(
            self.lifecycle, noop, (), call_info(noop), f"t{self.made}", "n", None, None,
            None, None, 0.0, self.store, True,
        )  # fmt: skip
        self.made += 1
        return job

    def end(self, job, status):
        assert job not in self.ended
        self.ended[job] = status
        self.state[job] = "ended"

    @rule()
    def submit(self):
        job = self.new()
        self.lifecycle.accept(job)
        self.state[job] = "queued"

    @precondition(lambda self: self.jobs("queued"))
    @rule(how=st.sampled_from(["drop_oldest", "drop_new"]))
    def overflow(self, how):
        job = self.new()
        if how == "drop_new":
            self.lifecycle.drop_new(job)
            self.end(job, TaskStatus.DROPPED)
            return
        oldest = self.jobs("queued")[0]
        self.lifecycle.accept(job, displace=True)
        self.end(oldest, TaskStatus.DROPPED)
        self.state[job] = "queued"

    @rule()
    def start(self):
        job = self.pending.pop()
        if job is None:
            assert not self.jobs("queued")
            return
        assert job is self.jobs("queued")[0]  # (first in, first out)
        job.scope = Scope()
        self.lifecycle.started(job)
        self.state[job] = "running"

    @precondition(lambda self: self.jobs("running", "deferred", "between"))
    @rule(data=st.data(), status=st.sampled_from(ENDINGS))
    def attempt(self, data, status):
        """A worker moves a started task on: defer, resume, retry, or end it
        (as it was asked to, if it was cancelled)."""
        job = data.draw(st.sampled_from(self.jobs("running", "deferred", "between")))
        state = self.state[job]
        if job.scope.cancelled:
            status = TaskStatus.CANCELLED
        if state == "deferred":
            if status is TaskStatus.CANCELLED or data.draw(st.booleans()):
                self.lifecycle.deferral_abandoned()  # (it ends without a slot back)
                self.lifecycle.ended(job, status)
                self.end(job, status)
            else:
                self.lifecycle.resumed(job)
                self.state[job] = "running"
        elif state == "between":
            if status is TaskStatus.CANCELLED:
                self.lifecycle.ended(job, status)
                self.end(job, status)
            else:
                self.lifecycle.started(job)  # (its next attempt)
                self.state[job] = "running"
        elif status is TaskStatus.CANCELLED:
            self.lifecycle.ended(job, status)
            self.end(job, status)
        else:
            how = data.draw(st.sampled_from(["defer", "retry", "end"]))
            if how == "defer":
                self.lifecycle.deferred(job)
                self.state[job] = "deferred"
            elif how == "retry":
                job.error = ValueError("again")
                self.lifecycle.retrying(job, TaskStatus.FAILED, 1.0)
                self.state[job] = "between"
            else:
                if status is not TaskStatus.COMPLETED:
                    job.error = ValueError("no")  # (a dead letter, with a store)
                self.lifecycle.ended(job, status)
                self.end(job, status)

    @precondition(lambda self: self.store and self.jobs("running", "deferred"))
    @rule(data=st.data())
    def lose(self, data):
        """Another owner took one over: it stops here, no retry (its worker ends it)."""
        job = data.draw(st.sampled_from(self.jobs("running", "deferred")))
        self.lifecycle.lose(job.task_id)
        self.lost.add(job)
        assert job.scope.cancelled
        assert job.version == -1

    @precondition(lambda self: self.jobs("queued", "running", "deferred", "between"))
    @rule(data=st.data())
    def cancel(self, data):
        job = data.draw(st.sampled_from(self.jobs("queued", "running", "deferred", "between")))
        self.lifecycle.cancel(job)
        if self.state[job] == "queued":
            self.end(job, TaskStatus.CANCELLED)  # (at once)
        else:
            assert job.scope.cancelled  # (its worker ends it: `attempt`)

    @precondition(lambda self: self.jobs("queued"))
    @rule()
    def cancel_pending(self):
        queued = self.jobs("queued")
        assert self.lifecycle.cancel_pending() == len(queued)
        for job in queued:
            self.end(job, TaskStatus.CANCELLED)

    @precondition(lambda self: self.store)
    @rule()
    def recovery_waits_for_room(self):
        self.lifecycle.space_wanted = True
        self.space_before = self.rec.space

    @precondition(lambda self: self.store and self.rec.notify)
    @rule(data=st.data())
    def written(self, data):
        """A batch is durable; some of it was fenced out (another owner has it)."""
        notify, self.rec.notify = self.rec.notify, []
        fenced = data.draw(st.lists(st.sampled_from(notify), unique=True))
        self.lifecycle.written(notify, [job.task_id for job in fenced])
        for job in fenced:
            self.ended[job] = TaskStatus.CANCELLED  # (overruled: its result not recorded)
        assert all(not job.pending_ack for job in notify)

    @invariant()
    def counts_are_the_models(self):
        tally = self.lifecycle.tally
        assert tally.queue_depth == len(self.jobs("queued", "between"))
        assert tally.active_count == len(self.jobs("running"))
        assert tally.deferred_count == len(self.jobs("deferred"))
        ended = list(self.ended.values())
        assert tally.completed_count == ended.count(TaskStatus.COMPLETED)
        assert tally.failed_count == ended.count(TaskStatus.FAILED)
        assert tally.timed_out_count == ended.count(TaskStatus.TIMED_OUT)
        assert tally.cancelled_count == ended.count(TaskStatus.CANCELLED)
        assert tally.dropped_count == ended.count(TaskStatus.DROPPED)
        assert self.lifecycle.is_idle() == (len(self.ended) == len(self.state))
        unread = [j for j in self.ended if j.status in (TaskStatus.FAILED, TaskStatus.TIMED_OUT)]
        assert self.lifecycle.unread.count == len(unread)  # (nobody made a completion)
        assert (self.lifecycle.unread.report() is None) == (not unread)
        for job, status in self.ended.items():
            assert job.status is status
            heard = [w for w in self.rec.told.get(job.task_id, []) if w.startswith("finished")]
            assert len(heard) == 1, (job, heard)
            if self.store:
                assert self.rec.finishes.get(job.task_id) == 1  # (journaled once)
                assert job.task_id not in self.lifecycle.live
        if self.store:
            live = {j.task_id for j in self.state if j not in self.ended and j not in self.lost}
            assert set(self.lifecycle.live) == live

    @invariant()
    def a_waiting_recovery_hears_of_a_freed_place(self):
        if self.store and not self.lifecycle.space_wanted and hasattr(self, "space_before"):
            assert self.rec.space == self.space_before + 1
            del self.space_before


TestLifecycle = LifecycleAgainstModel.TestCase
TestLifecycle.settings = settings(max_examples=200, stateful_step_count=100, deadline=None)


# ---------------------------------------------------------------- closing


@pytest.mark.parametrize(
    ("policy", "cancels"),
    [
        (ShutdownPolicy.DRAIN, (False, False)),
        (ShutdownPolicy.CANCEL_PENDING, (True, False)),
        (ShutdownPolicy.CANCEL, (True, True)),
    ],
)
def test_what_each_shutdown_policy_cancels_and_still_admits(policy, cancels):
    closing = Closing()
    asked = []

    def own_task():
        asked.append(True)
        return True

    assert closing.admits(False, own_task)
    assert not asked  # (open: who asks is not looked up)
    assert closing.close(policy) == cancels
    drain = policy is ShutdownPolicy.DRAIN
    assert closing.admits(True, own_task) is drain  # a workflow run's step
    assert closing.admits(False, own_task) is drain  # one of its own running tasks
    assert closing.admits(False, lambda: False) is False  # anyone else


def test_a_grace_sets_one_timer_for_the_earliest_end():
    closing = Closing()
    closing.close(ShutdownPolicy.DRAIN)
    assert closing.grace_deadline(ShutdownPolicy.DRAIN, None, 10.0, idle=False) is None
    assert closing.grace_deadline(ShutdownPolicy.CANCEL, 5.0, 10.0, idle=False) is None
    assert closing.grace_deadline(ShutdownPolicy.DRAIN, 5.0, 10.0, idle=True) is None
    assert closing.grace_deadline(ShutdownPolicy.DRAIN, 5.0, 10.0, idle=False) == 15.0
    closing.grace_ends = 15.0  # (the shell set its timer)
    assert closing.grace_deadline(ShutdownPolicy.DRAIN, 9.0, 10.0, idle=False) is None  # later
    assert closing.grace_deadline(ShutdownPolicy.DRAIN, 1.0, 10.0, idle=False) == 11.0  # sooner
    closing.expired = True
    assert closing.grace_deadline(ShutdownPolicy.DRAIN, 1.0, 10.0, idle=False) is None
