"""`Pending`: accepted tasks that have not started, in the order they start.

Two shapes. Until a task with a key or a priority arrives, a plain deque in
submission order (the fast path: most executors never use either). From then
on, ranked: a heap of the tasks that may start now (``ready``), best first, and
for each limited key a line of its own held-back tasks, let through to
``ready`` as the key's room allows (`KeyState`). A key at its limit therefore
never delays another key's tasks.

Rank: higher priority first, then submission order. With ``priority_aging``,
a waiting task's priority rises by 1 for every ``priority_aging`` seconds it has
waited (continuously), so two tasks compare by ``queued_at - priority *
priority_aging``: a static order, kept in a heap. ``queued_at`` is the executor's clock
when the task was queued (for the tasks already waiting when the first key or
priority arrives, worked out from their ``submitted_at``), made monotonic, so
equal priorities keep submission order.

A task cancelled while pending leaves a tombstone the workers skip, so a cancel
costs O(1); the structures are compacted when tombstones outnumber the entries of queued tasks.

Part of the machine (`trioexec._machine`): no Trio here. It reads the clock it is
given, tells its `Listener` what to carry out, and sets the `Wake` a waiting
task's shell gave it (`trioexec._waits` does the waiting).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol, final

from .._records import TaskStatus
from ._keys import DEFAULT_KEY, KeyLimit, KeyState, KeyStatistics, KeyTimers, W, Waiter, Wake
from ._pauses import Pauses

if TYPE_CHECKING:
    from .._taskref import Job

# Compact only past this many tombstones (and when they are the majority).
_COMPACT_AFTER = 64
# Keep this many keys' states (their counts) before dropping idle ones.
_KEEP_IDLE = 1024

_Entry = tuple[float, int, "Job"]


class Listener(Protocol):
    """What the queue decides that other parts carry out (the executor's core
    hands each to the part that does it)."""

    def ready(self) -> None:
        """A task a key or a pause held back may start now: wake a worker."""

    def waiting(self, job: Job) -> None:
        """What ``job`` waits on changed without a transition of its own (its
        key let it through or held it back, a pause parked it)."""

    def want(self, state: KeyState) -> None:
        """What a shared key's tasks hold or wait for changed: the store hears."""

    def parked(self, job: Job) -> None:
        """A pause parked ``job``, or holds its retry (a shutdown cancels it)."""

    def timer(self, at: float) -> None:
        """A key is due at ``at``, sooner than any before: call `Pending.tick` then."""


@final
class _Deaf:
    """The listener of a queue on its own (tests): nobody to tell."""

    def ready(self) -> None:
        pass

    def waiting(self, job: Job) -> None:
        pass

    def want(self, state: KeyState) -> None:
        pass

    def parked(self, job: Job) -> None:
        pass

    def timer(self, at: float) -> None:
        pass


_DEAF = _Deaf()


def _queued(job: Job) -> bool:
    """``job`` is still waiting in the queue (not started, not ended)."""
    return job.status is TaskStatus.PENDING and job.scope is None


@final
class Pending:
    """The pending queue. ``startable`` is how many tasks may start now, tombstones
    aside (a plain attribute: the workers read it on every turn); ``held`` is
    how many more wait for their key.

    What it decides that others carry out (wake a worker, journal what a task
    waits on, tell the store of a shared key, cancel what a pause holds during
    a shutdown) it tells its `Listener`, given when it is made.
    """

    __slots__ = (
        "_aging",
        "_jobs",
        "_last",
        "_limits",
        "_order",
        "_ranked",
        "_ready",
        "_seq",
        "_shared",
        "_tombstones",
        "_wall",
        "clock",
        "held",
        "inline",
        "keys",
        "listener",
        "pauses",
        "startable",
        "timers",
    )

    def __init__(
        self,
        clock: Callable[[], float],
        key_limits: Mapping[str, KeyLimit] | None = None,
        priority_aging: float | None = 60.0,
        wall: Callable[[], float] | None = None,
        shared: bool = False,
        inline: bool = False,
        listener: Listener | None = None,
    ) -> None:
        self.clock = clock  # the executor's (Trio's, in the shell)
        self.listener = _DEAF if listener is None else listener
        self._jobs: deque[Job] = deque()
        self.startable = 0
        self.held = 0
        self._ranked = False
        self._ready: list[_Entry] = []
        self._order: deque[Job] = deque()  # ranked: every queued task, oldest first
        self._seq = 0
        self._last = -math.inf  # the latest submission time ranked (monotonic)
        self._aging = priority_aging
        self._wall = wall  # the clock of ``Job.submitted_at``
        self._limits = dict(key_limits or {})
        self._tombstones = 0
        self.keys: dict[str, KeyState] = {}
        self.timers = KeyTimers()
        self._shared = shared  # limits shared through a store (the listener's `want`)
        self.pauses = Pauses()  # what a pause holds back (`set_paused`)
        # Jobs run one at a time in one task (`DeterministicExecutor`): a task
        # its key let through cannot start before the started one that rejoins
        # its key has ended, so it gives its room back to it (`rejoin`).
        self.inline = inline

    # ------------------------------------------------------------ in and out

    def append(self, job: Job) -> None:
        if not self._ranked:
            if job.key is None and job.priority == 0:
                self._jobs.append(job)
                self.startable += 1
                return
            self._rank_all()
        self._add(job)

    def pop(self) -> Job | None:
        """The next task to start (None if none may start now), tombstones
        skipped. A task of a key now counts as holding it."""
        if not self._ranked:
            jobs = self._jobs
            while jobs:
                job = jobs.popleft()
                if job.status is TaskStatus.PENDING:
                    self.startable -= 1
                    return job
            return None
        ready = self._ready
        while ready:
            entry = heapq.heappop(ready)
            job = entry[2]
            if not _queued(job):
                self._tombstones -= 1
                continue
            key = job.key
            state = None if key is None else self.keys[key]
            if state is not None and state.limit is not None:
                if state.earmarked.get(job) is not entry:
                    self._tombstones -= 1
                    continue  # sent back to its key's line by a better task
                del state.earmarked[job]
            self.startable -= 1
            if state is not None:
                state.pending -= 1
                state.holders.add(job)
                if state.limit is not None and state.limit.rate is not None:
                    state.use_token(self.clock())
                    if state.shared:
                        self.listener.want(state)  # (the store hears of it; the next token)
            return job
        return None

    def pop_oldest(self) -> Job | None:
        """Take the oldest queued task out (``DROP_OLDEST``), whether it may start
        or waits for its key; None if the queue is empty."""
        if not self._ranked:
            return self.pop()
        order = self._order
        while order and not _queued(order[0]):
            order.popleft()
        for job in order:  # (a paused task is not dropped: it keeps its place)
            if not job.paused and _queued(job):
                self._forget(job)
                return job
        return None

    def discard(self, job: Job) -> None:
        """``job``, still in the queue, has ended (cancelled): it stays as a
        tombstone. Call after its status has left PENDING."""
        if job.paused:
            self.pauses.unpark(job)
            if job.key is not None:
                state = self.keys[job.key]
                state.pending -= 1
                state.parked -= 1
                self._maybe_forget_key(state)
            return
        if not self._ranked:
            self.startable -= 1
            jobs = self._jobs
            tombstones = len(jobs) - self.startable
            if tombstones > _COMPACT_AFTER and tombstones * 2 > len(jobs):
                self._jobs = deque(j for j in jobs if j.status is TaskStatus.PENDING)
            return
        self._forget(job)

    def take_all(self) -> list[Job]:
        """Empty the queue: every queued task, oldest first."""
        if not self._ranked:
            jobs = [j for j in self._jobs if j.status is TaskStatus.PENDING]
            self._jobs.clear()
            self.startable = 0
            return jobs
        jobs = [j for j in self._order if _queued(j) and not j.paused]
        parked = self.pauses.parked
        jobs.extend(entry[2] for entry in sorted(parked.values()))
        self._ready.clear()
        self._order.clear()
        parked.clear()
        self.startable = self.held = self._tombstones = 0
        for job in jobs:
            job.paused = False
            if job.key is not None:
                self.keys[job.key].pending -= 1
        for state in list(self.keys.values()):
            state.parked = 0
            state.queue.clear()
            if state.earmarked:
                state.earmarked.clear()
                if state.resumers or state.retriers:
                    self._grant(state)  # the room they were let through into is free
            if state.shared:
                self.listener.want(state)  # (the store's part of it may go back)
            self._maybe_forget_key(state)
        return jobs

    # ------------------------------------------------------------ ranked

    def _rank_all(self) -> None:
        """From now on ranked: what the deque holds moves over, in its order."""
        self._ranked = True
        jobs, self._jobs = self._jobs, deque()
        self.startable = 0
        now, wall = self.clock(), self._wall
        for job in jobs:
            if job.status is TaskStatus.PENDING:
                # Queued before anything was ranked: its age from its submission time.
                waited = 0.0 if wall is None else max(0.0, wall() - job.submitted_at)
                self._add(job, now - waited)

    def _add(self, job: Job, t: float | None = None) -> None:
        # Its key's state first: what may raise does so before anything changed.
        state = None if job.key is None else self.state(job.key)
        seq = self._seq = self._seq + 1
        if t is None:
            t = self.clock()
        if t < self._last:
            t = self._last
        else:
            self._last = t
        aging = self._aging
        rank = -float(job.priority) if aging is None else t - job.priority * aging
        entry = (rank, seq, job)
        order = self._order
        order.append(job)
        if len(order) > 2 * (self.startable + self.held + len(self.pauses.parked)) + _COMPACT_AFTER:
            # It keeps started tasks until the oldest queued one goes: drop them
            # when they dominate (amortized O(1) a task).
            self._order = deque(j for j in order if _queued(j))
        if state is not None:
            state.pending += 1
        if self.pauses.now is not None and self.pauses.holds(job):
            self._park(entry)
            return
        self._place(entry)

    def _place(self, entry: _Entry) -> None:
        """Queue ``entry``'s task (counted in its key's ``pending`` already):
        ready to start, or in its key's line."""
        job = entry[2]
        key = job.key
        if key is None:
            heapq.heappush(self._ready, entry)
            self.startable += 1
            return
        state = self.state(key)
        if state.limit is None:
            heapq.heappush(self._ready, entry)
            self.startable += 1
            return
        if not state.queue and not state.resumers and not state.retriers:  # (the common case)
            if state.limit.rate is not None:
                state.refill(self.clock())
            if state.room():
                self._let_through(state, entry)
                return
        heapq.heappush(state.queue, entry)
        self.held += 1
        self._grant(state)
        if job not in state.earmarked:
            state.limited_count += 1
            if state.earmarked and not state.resumers and not state.retriers:
                self._displace(state, entry)

    def _displace(self, state: KeyState, entry: _Entry) -> None:
        """A held-back task that outranks one its key let through takes its place
        (which goes back to the key's line): the key's best always start first."""
        worst = max(state.earmarked.values())
        if entry < worst:
            self._send_back(state, worst)
            self._grant(state)
            self.listener.waiting(worst[2])

    def _forget(self, job: Job) -> None:
        """``job`` leaves the queue without starting (cancelled, dropped, or taken
        by `take_all`); its entry stays behind as a tombstone."""
        key = job.key
        state = None if key is None else self.keys[key]
        if state is not None:
            state.pending -= 1
        if state is None or state.limit is None or job in state.earmarked:
            self.startable -= 1
            if state is not None and state.limit is not None:
                del state.earmarked[job]
                self._grant(state)  # its room is free again
        else:
            self.held -= 1
        if state is not None:
            if state.shared:
                self.listener.want(state)
            self._maybe_forget_key(state)
        self._tombstones += 1
        entries = len(self._ready) + self.held
        if self._tombstones > _COMPACT_AFTER and self._tombstones * 2 > entries:
            self._compact(job)

    def _compact(self, leaving: Job | None) -> None:
        """Drop the tombstones (``leaving``'s entries too: it may still be PENDING,
        dropped a moment from now)."""

        def keep(entry: _Entry) -> bool:
            return entry[2] is not leaving and _queued(entry[2]) and not entry[2].paused

        self._ready = [e for e in self._ready if keep(e) and self._current(e)]
        heapq.heapify(self._ready)
        for state in self.keys.values():
            if state.queue:
                state.queue = [e for e in state.queue if keep(e)]
                heapq.heapify(state.queue)
        self._order = deque(j for j in self._order if j is not leaving and _queued(j))
        self._tombstones = 0

    def _current(self, entry: _Entry) -> bool:
        """``entry`` in ``ready`` is not stale (its task was not sent back)."""
        key = entry[2].key
        if key is None:
            return True
        state = self.keys.get(key)
        return state is None or state.limit is None or state.earmarked.get(entry[2]) is entry

    def _let_through(self, state: KeyState, entry: _Entry) -> None:
        # (An entry sent back by `_displace` was copied: its stale twin in
        # ``ready`` is told apart by identity.)
        state.earmarked[entry[2]] = entry
        heapq.heappush(self._ready, entry)
        self.startable += 1

    # ------------------------------------------------------------ keys

    def state(self, key: str) -> KeyState:
        state = self.keys.get(key)
        if state is None:
            limits = self._limits
            limit = limits.get(key) or limits.get(DEFAULT_KEY)
            state = self.keys[key] = KeyState(key, limit, self.clock(), self._shared)
        return state

    def statistics(self, key: str) -> KeyStatistics:
        state = self.keys.get(key)
        return KeyStatistics(key=key) if state is None else state.statistics()

    def _state_of(self, job: Job) -> KeyState:
        assert job.key is not None
        return self.keys[job.key]

    def release(self, job: Job, *, deferred: bool = False) -> None:
        """``job`` (of a key) stops holding its key for a while: it gave its slot
        back (``deferred``), or waits for its next attempt (also after an attempt
        that ended while deferred)."""
        state = self._state_of(job)
        if job in state.holders:
            state.holders.remove(job)
            (state.deferred if deferred else state.retrying).add(job)
            if state.limit is not None and (state.queue or state.resumers or state.retriers):
                self._grant(state)
            elif state.shared:
                self.listener.want(state)
        elif not deferred and job in state.deferred:
            state.deferred.remove(job)
            state.retrying.add(job)

    def ended(self, job: Job) -> None:
        """``job`` (of a key, started) has ended: whatever it held of its key is free."""
        state = self._state_of(job)
        if job in state.holders or job in state.reserved:
            state.holders.discard(job)
            state.reserved.discard(job)
            if state.limit is not None and (state.queue or state.resumers or state.retriers):
                self._grant(state)
            elif state.shared:
                self.listener.want(state)
        else:
            state.deferred.discard(job)
            state.retrying.discard(job)
        self._maybe_forget_key(state)

    def rejoin(self, job: Job, make_wake: Callable[[], W]) -> Waiter[W] | None:
        """Take ``job``'s key back: after a deferral (it holds it on return), or
        for a retry's attempt (it is let through; `attempt_starts` takes the token
        once it holds a slot). First come, first served among the key's started
        tasks (resumes first: a rate holds back starts only), ahead of its pending
        ones. None: it has it now; else it waits in the key's line until the
        waiter's ``wake`` (made by ``make_wake``) is set, or until its wait is
        cancelled (`leave_line`)."""
        state = self._state_of(job)
        start = job in state.retrying
        if state.limit is not None:
            if self.inline and state.earmarked:
                for entry in list(state.earmarked.values()):
                    self._send_back(state, entry)
                    self.listener.waiting(entry[2])
            state.refill(self.clock())
            ahead = state.resumers or (start and state.retriers)
            if ahead or not state.room(start):
                waiter = Waiter(job, make_wake(), start)
                (state.retriers if start else state.resumers).append(waiter)
                state.limited_count += 1
                self._grant(state)  # (sets the timer for the token it may wait for)
                if not waiter.granted:
                    self.listener.waiting(job)
                return waiter
        state.take(job, start)
        return None

    def leave_line(self, waiter: Waiter[W]) -> None:
        """``waiter``'s wait was cancelled: its task takes nothing (what it was
        granted meanwhile goes back)."""
        job, start = waiter.job, waiter.start
        state = self._state_of(job)
        if waiter.granted:
            self.release(job, deferred=not start)
            if start:
                state.reserved.discard(job)
                state.retrying.add(job)
                self._grant(state)
        else:
            (state.retriers if start else state.resumers).remove(waiter)
            self._grant(state)  # the next in line may fit now

    def attempt_starts(self, job: Job) -> None:
        """A retry let through by its key holds its slot now: it holds the key,
        and takes its token."""
        state = self._state_of(job)
        state.reserved.discard(job)
        state.holders.add(job)
        limit = state.limit
        if limit is not None and limit.rate is not None:
            state.use_token(self.clock())
            if state.shared:
                self.listener.want(state)

    def waiting_on(self, job: Job) -> str | None:
        """Why a queued or rejoining task of a limited key waits, if it waits for
        its key, or ``"paused"`` (None otherwise)."""
        if job.paused:
            return "paused"
        key = job.key
        state = None if key is None else self.keys.get(key)
        if state is None or state.limit is None or job in state.earmarked:
            return None
        if job in state.reserved:
            return "slot"
        if _queued(job) or any(w.job is job for w in (*state.resumers, *state.retriers)):
            state.refill(self.clock())
            return state.reason()
        return None

    def regrant(self, state: KeyState) -> None:
        """``state``'s room changed from outside (the store granted or took back
        part of a shared key): let its waiting tasks through as it allows (or,
        idle with its tokens given back, forget it)."""
        if state.queue or state.resumers or state.retriers:
            self._grant(state)
        else:
            self._maybe_forget_key(state)

    def _grant(self, state: KeyState) -> None:
        """The key's room may have grown: hand it to its resumers, then its
        retries, then let pending tasks through, each in order; past that, set a
        timer for the next token."""
        limit = state.limit
        assert limit is not None
        if limit.rate is not None:
            state.refill(self.clock())
        for line, start in ((state.resumers, False), (state.retriers, True)):
            while line and state.room(start):
                waiter = line.popleft()
                state.take(waiter.job, start)
                waiter.granted = True
                waiter.wake.set()
                self.listener.waiting(waiter.job)
            if line:
                break
        if not state.resumers and not state.retriers:
            queue = state.queue
            while queue:
                if not _queued(queue[0][2]):
                    heapq.heappop(queue)
                    self._tombstones -= 1
                    continue
                if not state.room():
                    break
                self.held -= 1
                entry = heapq.heappop(queue)
                self._let_through(state, entry)
                self.listener.ready()
                self.listener.waiting(entry[2])
        if state.shared:
            self.listener.want(state)  # (the store's bucket: no timer here)
            return
        waiting = state.retriers or state.queue
        if waiting and not state.resumers and limit.rate is not None and state.by_rate():
            self._set_timer(state, state.ready_at())

    def _maybe_forget_key(self, state: KeyState) -> None:
        """Memory follows the keys in use: past ``_KEEP_IDLE`` keys, an idle key
        whose bucket is full is as good as absent and goes as it goes idle (its
        counts restart); one whose bucket still fills goes once it is full (a
        timer: `_token_due`), a shared one once its tokens went back to the
        store (`regrant`). O(1) a call."""
        if not state.idle or len(self.keys) <= _KEEP_IDLE:
            return
        if state.spent(self.clock()):
            if self.keys.get(state.key) is state:  # (not a new state of the key)
                del self.keys[state.key]
        elif not state.shared:
            self._set_timer(state, state.full_at())

    def _set_timer(self, state: KeyState, at: float) -> None:
        if self.timers.set(state, at):
            self.listener.timer(at)

    def tick(self) -> None:
        """The keys due now have their next token (or a full bucket): their
        waiting tasks go through as it allows; idle ones are forgotten."""
        for state in self.timers.due(self.clock()):
            if state.limit is not None and (state.resumers or state.retriers or state.queue):
                self._grant(state)
            self._maybe_forget_key(state)

    # ------------------------------------------------------------ paused

    def set_paused(self, names: frozenset[str], keys: frozenset[str]) -> None:
        """Pause exactly the tasks of these ``names`` and ``keys``: queued tasks
        that match leave the queue for `Pauses.parked` (new ones go there at
        once), and those that match no more go back to their place in it.
        Running tasks go on. Rare (an operator's command): O(queue) each time."""
        pauses = self.pauses
        if (names or keys) and not self._ranked:
            self._rank_all()  # (one queue shape for parking and unparking)
        back = pauses.set(names, keys)
        if back is None:
            return
        for entry in back:
            job = entry[2]
            if job.key is not None:
                self.keys[job.key].parked -= 1
            self._place(entry)
            self.listener.waiting(job)
        if pauses.now is not None:
            found: dict[Job, _Entry] = {}
            for entry in self._ready:
                if _queued(entry[2]) and self._current(entry) and pauses.holds(entry[2]):
                    found[entry[2]] = entry
            for state in self.keys.values():
                for entry in state.queue:
                    if _queued(entry[2]) and pauses.holds(entry[2]):
                        found[entry[2]] = entry
            # Out of the queue first, all of them (their entries too), then the
            # room they leave in their keys goes to who waits there.
            touched: dict[str, KeyState] = {}
            for entry in sorted(found.values()):
                job = entry[2]
                of = None if job.key is None else self.keys[job.key]
                if of is None or of.limit is None:
                    self.startable -= 1
                elif job in of.earmarked:
                    del of.earmarked[job]
                    self.startable -= 1
                else:
                    self.held -= 1
                if of is not None:
                    touched[of.key] = of
                self._park(entry)
            if found:
                self._compact(None)
                for state in touched.values():
                    if state.limit is not None:
                        self._grant(state)
        for _ in back:
            self.listener.ready()
        pauses.wake_lifted()

    def hold_retry(self, job: Job, wake: Wake) -> bool:
        """Hold a retry's next attempt while its name or key is paused, until
        ``wake`` is set (its ``waiting_on`` says ``"paused"``): True if it is
        held. Its shell forgets it (`Pauses.retries`) once woken or cancelled."""
        if not self.pauses.hold_retry(job, wake):
            return False
        self.listener.waiting(job)
        self.listener.parked(job)
        return True

    def _park(self, entry: _Entry) -> None:
        """Hold ``entry``'s task out of the queue (it is in no heap now): a pause
        matches it. It keeps its place (``entry``) for when the pause is lifted."""
        job = entry[2]
        self.pauses.park(entry)
        if job.key is not None:
            self.keys[job.key].parked += 1
        self.listener.waiting(job)
        self.listener.parked(job)

    def _send_back(self, state: KeyState, entry: _Entry) -> None:
        """A task its key let through (``entry``, not started) goes back to the key's
        line, at its place in it."""
        job = entry[2]
        del state.earmarked[job]  # (its entry in ``ready`` is now stale)
        self.startable -= 1
        heapq.heappush(state.queue, (entry[0], entry[1], job))
        self.held += 1
        self._tombstones += 1  # (its old entry in ``ready``)

    def __repr__(self) -> str:
        tombstones = self._tombstones if self._ranked else len(self._jobs) - self.startable
        return (
            f"<Pending {self.startable} startable, {tombstones} tombstones,"
            f" {self.held} held by their keys>"
        )
