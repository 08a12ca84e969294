"""`KeyGate`: the keys' side of the queue (`Pending`), which owns its heaps and
counts: the gate pushes what a key lets through onto the ready heap and keeps
``held``, how many tasks wait in its keys' lines.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, final

import attrs

from .._records import PENDING
from ._keys import (
    DEFAULT_KEY,
    DEFERRED,
    HOLDS,
    RESERVED,
    RETRYING,
    KeyLimit,
    KeyState,
    KeyStatistics,
    KeyTimers,
    W,
    Waiter,
)

if TYPE_CHECKING:
    from .._taskref import Job

# Keep this many keys' states (their counts) before dropping idle ones.
_KEEP_IDLE = 1024

#: A queued task's place: (rank, sequence, job), smallest first. The rank is a
#: float, or in fair order a (priority group, round) pair (`Pending`).
Entry = tuple[Any, int, "Job"]

_IN_ROOM = (HOLDS, RESERVED)  # (roles that count against a key's room)


def queued(job: Job) -> bool:
    """``job`` is still waiting in the queue (not started, not ended)."""
    return job.status is PENDING and job.scope is None


class Listener(Protocol):
    """What the queue decides and other parts carry out (the core hands each on)."""

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
        """A key is due at ``at``, sooner than any before: call `KeyGate.tick` then."""


class Ready(Protocol):
    """What the gate asks of the queue (`Pending`)."""

    ready: list[Entry]  # the heap of the tasks that may start now, best first
    startable: int  # ... how many (tombstones aside)
    tombstones: int  # stale entries in its heap and the keys' lines


@final
@attrs.define(eq=False)
class KeyGate:
    """The keys of one queue: their states (``states``), how many tasks wait in
    their lines (``held``), and when each is due (``timers``)."""

    _queue: Ready
    clock: Callable[[], float]
    _limits: Mapping[str, KeyLimit]
    _shared: bool  # limits shared through a store (the listener's `want`)
    # Jobs run one at a time in one task (`DeterministicExecutor`): a task
    # its key let through cannot start before the started one that rejoins
    # its key has ended, so it gives its room back to it (`rejoin`).
    inline: bool
    listener: Listener
    states: dict[str, KeyState] = attrs.field(factory=dict, init=False)
    timers: KeyTimers = attrs.field(factory=KeyTimers, init=False)
    held: int = attrs.field(default=0, init=False)

    # ------------------------------------------------------------ the queue's tasks

    def place(self, state: KeyState, entry: Entry) -> None:
        """Queue ``entry``'s task of a limited key (counted in its key's
        ``pending`` already): let through at once, or into its key's line."""
        job = entry[2]
        limit = state.limit
        assert limit is not None
        if not state.queue and not state.resumers and not state.retriers:  # (the common case)
            if limit.rate is not None:
                state.refill(self.clock())
            if state.room():
                self._let_through(state, entry)
                return
        heapq.heappush(state.queue, entry)
        self.held += 1
        self.grant(state)
        if job not in state.earmarked:
            state.limited_count += 1
            if state.earmarked and not state.resumers and not state.retriers:
                self._displace(state, entry)

    def take(self, job: Job, entry: Entry) -> bool:
        """``job`` (of a key), off the ready heap at ``entry``, leaves the queue
        to start: it holds its key now (and a token). False if ``entry`` is stale:
        its key sent it back to its line since, for a better task."""
        assert job.key is not None
        state = self.states[job.key]
        if state.limit is not None:
            if state.earmarked.get(job) is not entry:
                return False
            del state.earmarked[job]
        self._queue.startable -= 1
        state.pending -= 1
        state.roles[job] = HOLDS  # (`KeyState.move` inlined here and in `ended`: every task)
        state.count[HOLDS] += 1
        if state.limit is not None and state.limit.rate is not None:
            state.use_token(self.clock())
            if state.shared:
                self.listener.want(state)  # (the store hears of it; the next token)
        return True

    def forget(self, job: Job) -> None:
        """``job`` (of a key) leaves the queue without starting: what it took of
        its key's room, or its place in the key's line, is free."""
        state = self._state_of(job)
        let_through = job in state.earmarked
        self.unqueue(job)
        state.pending -= 1
        if let_through:
            self.grant(state)  # its room is free again
        if state.shared:
            self.listener.want(state)
        self._maybe_forget_key(state)

    def unqueue(self, job: Job) -> KeyState:
        """``job`` (of a key, queued) leaves the queue for a pause's parking:
        its key's room or line place is free (the caller grants it after)."""
        state = self._state_of(job)
        if state.limit is not None and job not in state.earmarked:
            self.held -= 1  # (in its key's line)
        else:
            state.earmarked.pop(job, None)
            self._queue.startable -= 1
        return state

    def parked_gone(self, job: Job) -> None:
        """``job``, parked by a pause, has ended without starting."""
        state = self._state_of(job)
        state.pending -= 1
        state.parked -= 1
        self._maybe_forget_key(state)

    def lined(self) -> Iterator[Entry]:
        """Every entry in the keys' lines (tombstones too)."""
        for state in self.states.values():
            yield from state.queue

    def current(self, entry: Entry) -> bool:
        """``entry`` in the ready heap is not stale (its task was not sent back)."""
        key = entry[2].key
        if key is None:
            return True
        state = self.states.get(key)
        return state is None or state.limit is None or state.earmarked.get(entry[2]) is entry

    def compact(self, keep: Callable[[Entry], bool]) -> None:
        """Drop the entries of the keys' lines ``keep`` refuses."""
        for state in self.states.values():
            if state.queue:
                state.queue = [e for e in state.queue if keep(e)]
                heapq.heapify(state.queue)

    def clear(self, jobs: list[Job]) -> None:
        """The queue is emptied (`Pending.take_all`) of ``jobs``."""
        self.held = 0
        for job in jobs:
            if job.key is not None:
                self.states[job.key].pending -= 1
        for state in list(self.states.values()):
            state.parked = 0
            state.queue.clear()
            if state.earmarked:
                state.earmarked.clear()
                if state.resumers or state.retriers:
                    self.grant(state)  # the room they were let through into is free
            if state.shared:
                self.listener.want(state)  # (the store's part of it may go back)
            self._maybe_forget_key(state)

    # ------------------------------------------------------------ keys

    def state(self, key: str) -> KeyState:
        state = self.states.get(key)
        if state is None:
            limits = self._limits
            limit = limits.get(key) or limits.get(DEFAULT_KEY)
            state = self.states[key] = KeyState(key, limit, self.clock(), self._shared)
        return state

    def statistics(self, key: str) -> KeyStatistics:
        state = self.states.get(key)
        return KeyStatistics(key=key) if state is None else state.statistics()

    def _state_of(self, job: Job) -> KeyState:
        assert job.key is not None
        return self.states[job.key]

    def release(self, job: Job, *, deferred: bool = False) -> None:
        """``job`` (of a key) stops holding its key for a while: it gave its slot
        back (``deferred``), or waits for its next attempt (also after an attempt
        that ended while deferred)."""
        state = self._state_of(job)
        role = state.roles.get(job)
        if role == HOLDS:
            state.move(job, DEFERRED if deferred else RETRYING)
            if state.limit is not None and (state.queue or state.resumers or state.retriers):
                self.grant(state)
            elif state.shared:
                self.listener.want(state)
        elif not deferred and role == DEFERRED:
            state.move(job, RETRYING)

    def ended(self, job: Job) -> None:
        """``job`` (of a key, started) has ended: whatever it held of its key is free."""
        state = self._state_of(job)
        role = state.roles.pop(job, None)
        if role is not None:
            state.count[role] -= 1
        if role in _IN_ROOM:
            if state.limit is not None and (state.queue or state.resumers or state.retriers):
                self.grant(state)
            elif state.shared:
                self.listener.want(state)
        self._maybe_forget_key(state)

    def rejoin(self, job: Job, make_wake: Callable[[], W]) -> Waiter[W] | None:
        """Take ``job``'s key back: after a deferral (it holds it on return), or for a
        retry's attempt (let through; `attempt_starts` takes the token once it holds a
        slot), first come first served among the key's started tasks (resumes first: a
        rate holds back starts only), ahead of its pending ones. None: it has it now;
        else it waits in the key's line until the waiter's ``wake`` (made by
        ``make_wake``) is set, or its wait is cancelled (`leave_line`)."""
        state = self._state_of(job)
        start = state.roles.get(job) == RETRYING
        if state.limit is not None:
            if self.inline and state.earmarked:
                for entry in list(state.earmarked.values()):
                    self.send_back(state, entry)
                    self.listener.waiting(entry[2])
            state.refill(self.clock())
            ahead = state.resumers or (start and state.retriers)
            if ahead or not state.room(start):
                waiter = Waiter(job, make_wake(), start)
                (state.retriers if start else state.resumers).append(waiter)
                state.limited_count += 1
                self.grant(state)  # (sets the timer for the token it may wait for)
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
                state.move(job, RETRYING)
                self.grant(state)
        else:
            (state.retriers if start else state.resumers).remove(waiter)
            self.grant(state)  # the next in line may fit now

    def attempt_starts(self, job: Job) -> None:
        """A retry let through by its key holds its slot now: it holds the key, and
        takes (spends) its token."""
        state = self._state_of(job)
        state.move(job, HOLDS)
        limit = state.limit
        if limit is not None and limit.rate is not None:
            state.use_token(self.clock())
            if state.shared:
                self.listener.want(state)

    def waiting_on(self, job: Job) -> str | None:
        """Why a queued or rejoining task of a limited key waits for its key, else None."""
        key = job.key
        state = None if key is None else self.states.get(key)
        if state is None or state.limit is None or job in state.earmarked:
            return None
        if state.roles.get(job) == RESERVED:
            return "slot"
        if queued(job) or any(w.job is job for w in (*state.resumers, *state.retriers)):
            state.refill(self.clock())
            return state.reason()
        return None

    def regrant(self, state: KeyState) -> None:
        """``state``'s room changed from outside (the store granted or took back
        part of a shared key): let its waiting tasks through as it allows (or,
        idle with its tokens given back, forget it)."""
        if state.queue or state.resumers or state.retriers:
            self.grant(state)
        else:
            self._maybe_forget_key(state)

    def grant(self, state: KeyState) -> None:
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
                if not queued(queue[0][2]):
                    heapq.heappop(queue)
                    self._queue.tombstones -= 1
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

    def _displace(self, state: KeyState, entry: Entry) -> None:
        """A held-back task that outranks one its key let through takes its place
        (which goes back to the key's line): the key's best always start first."""
        worst = max(state.earmarked.values())
        if entry < worst:
            self.send_back(state, worst)
            self.grant(state)
            self.listener.waiting(worst[2])

    def send_back(self, state: KeyState, entry: Entry) -> None:
        """A task its key let through (``entry``, not started) goes back to its key's
        line, at its old place (rank) in it."""
        job = entry[2]
        del state.earmarked[job]  # (its entry in ``ready`` is now stale)
        self._queue.startable -= 1
        heapq.heappush(state.queue, (entry[0], entry[1], job))
        self.held += 1
        self._queue.tombstones += 1  # (its old entry in ``ready``)

    def _let_through(self, state: KeyState, entry: Entry) -> None:
        # (An entry sent back by `_displace` was copied: its stale twin in
        # ``ready`` is told apart by identity.)
        state.earmarked[entry[2]] = entry
        queue = self._queue
        heapq.heappush(queue.ready, entry)
        queue.startable += 1

    def _maybe_forget_key(self, state: KeyState) -> None:
        """Memory follows the keys in use: past ``_KEEP_IDLE`` keys, an idle key whose
        bucket is full (as good as absent) is forgotten (its counts restart), one whose
        bucket still fills once it is full (a timer: `tick`), a shared one once its
        tokens went back to the store (`regrant`). O(1) a call."""
        if not state.idle or len(self.states) <= _KEEP_IDLE:
            return
        if state.spent(self.clock()):
            if self.states.get(state.key) is state:  # (not a new state of the key)
                del self.states[state.key]
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
                self.grant(state)
            self._maybe_forget_key(state)
