"""`Pending`: accepted tasks that have not started, in the order they start.

Until a task with a key or a priority arrives, a plain deque in submission
order (the fast path: most executors never use either). From then on, ranked:
a heap of the tasks that may start now (``ready``), best first; each limited
key keeps a line of its own (`KeyGate`), so a key at its limit never delays
another key's.

Rank: higher priority first, then submission order. With ``priority_aging``, a
waiting task's priority rises by 1 for every ``priority_aging`` seconds it has
waited, so tasks compare by ``queued_at - priority * priority_aging``: a static
order, kept in a heap (``queued_at`` on the executor's clock, made monotonic so
equal priorities keep submission order).

With ``fairness="keys"``, tasks of equal priority start round-robin over their
keys (keyless tasks are one group): each task is given a round, one past its
key's last (and never before the round that started last), and the tasks of a
round rank as if queued when its first was (so they tie, and with aging age
from then), then by round, then in submission order. Submitting A1 A2 A3 B1 B2
gives rounds 1 2 3 1 2: they start A1 B1 A2 B2 A3.

A task cancelled while pending leaves a tombstone the workers skip (a cancel
costs O(1)), compacted away once tombstones outnumber the queued entries.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, final

from .._records import PENDING
from ._keygate import Entry, KeyGate, Listener
from ._keygate import queued as _queued
from ._keys import KeyLimit, KeyState, Wake
from ._pauses import Pauses

if TYPE_CHECKING:
    from .._taskref import Job

# Compact only past this many tombstones (and when they are the majority).
_COMPACT_AFTER = 64
# (fair order) Keep this many keys' last rounds before forgetting those of keys
# with nothing queued (`Pending._forget_rounds`).
_KEEP_ROUNDS = 1024


@final
class _Deaf:
    """The listener of a queue on its own (tests): nobody to tell."""

    def _nothing(self, *_: object) -> None:
        pass

    ready = waiting = want = parked = timer = _nothing


_DEAF = _Deaf()


@final
class Pending:
    """The pending queue. ``startable`` is how many tasks may start now, tombstones
    aside (a plain attribute: the workers read it on every turn); ``keys.held``,
    how many more wait in their keys' lines."""

    __slots__ = (
        "_aging",
        "_began",
        "_fair",
        "_jobs",
        "_keep_rounds",
        "_last",
        "_order",
        "_ranked",
        "_round",
        "_rounds",
        "_seq",
        "_wall",
        "clock",
        "keys",
        "listener",
        "pauses",
        "ready",
        "startable",
        "tombstones",
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
        fairness: str | None = None,
    ) -> None:
        self.clock = clock  # the executor's (Trio's, in the shell)
        self.listener = _DEAF if listener is None else listener
        self._jobs: deque[Job] = deque()
        self.startable = 0
        self._ranked = False
        self.ready: list[Entry] = []
        self._order: deque[Job] = deque()  # ranked: every queued task, oldest first
        self._seq = 0
        self._last = -math.inf  # the latest submission time ranked (monotonic)
        self._aging = priority_aging
        self._fair = fairness is not None
        self._round = 0  # (fair order) the round of the task that started last
        self._rounds: dict[str | None, int] = {}  # (fair order) each key's last round
        self._began: dict[int, float] = {}  # (fair order) when each round's first was queued
        self._keep_rounds = _KEEP_ROUNDS
        self._wall = wall  # the clock of ``Job.submitted_at``
        self.tombstones = 0  # stale entries in the ready heap and the keys' lines
        self.keys = KeyGate(self, clock, dict(key_limits or {}), shared, inline, self.listener)
        self.pauses = Pauses()

    # ------------------------------------------------------------ in and out

    def append(self, job: Job) -> None:
        if not self._ranked:
            if job.key is None and job.priority == 0:  # (fair order: keyless are one group)
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
                if job.status is PENDING:
                    self.startable -= 1
                    return job
            return None
        ready = self.ready
        while ready:
            entry = heapq.heappop(ready)
            job = entry[2]
            if not _queued(job):
                self.tombstones -= 1
                continue
            if job.key is None:
                self.startable -= 1
            elif not self.keys.take(job, entry):
                self.tombstones -= 1
                continue  # sent back to its key's line by a better task
            if self._fair and entry[0][1] > self._round:
                for passed in range(self._round, entry[0][1]):
                    self._began.pop(passed, None)  # (no task is given it again)
                self._round = entry[0][1]
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
                self.keys.parked_gone(job)
            return
        if not self._ranked:
            self.startable -= 1
            jobs = self._jobs
            tombstones = len(jobs) - self.startable
            if tombstones > _COMPACT_AFTER and tombstones * 2 > len(jobs):
                self._jobs = deque(j for j in jobs if j.status is PENDING)
            return
        self._forget(job)

    def take_all(self) -> list[Job]:
        """Empty the queue: every queued task, oldest first."""
        if not self._ranked:
            jobs = [j for j in self._jobs if j.status is PENDING]
            self._jobs.clear()
            self.startable = 0
            return jobs
        jobs = [j for j in self._order if _queued(j) and not j.paused]
        parked = self.pauses.parked
        jobs.extend(entry[2] for entry in sorted(parked.values()))
        self.ready.clear()
        self._order.clear()
        parked.clear()
        self.startable = self.tombstones = 0
        for job in jobs:
            job.paused = False
        self.keys.clear(jobs)
        return jobs

    # ------------------------------------------------------------ ranked

    def _rank_all(self) -> None:
        """From now on ranked: what the deque holds moves over, in its order."""
        self._ranked = True
        jobs, self._jobs = self._jobs, deque()
        self.startable = 0
        now, wall = self.clock(), self._wall
        for job in jobs:
            if job.status is PENDING:
                # Queued before anything was ranked: its age from its submission time.
                waited = 0.0 if wall is None else max(0.0, wall() - job.submitted_at)
                self._add(job, now - waited)

    def _add(self, job: Job, t: float | None = None) -> None:
        # Its key's state first: what may raise does so before anything changed.
        state = None if job.key is None else self.keys.state(job.key)
        seq = self._seq = self._seq + 1
        t = self._last = max(self.clock() if t is None else t, self._last)
        aging = self._aging
        if self._fair:
            rounds = self._rounds
            turn = rounds[job.key] = max(self._round, rounds.get(job.key, 0) + 1)
            if len(rounds) > self._keep_rounds:  # (many keys used once: forget them)
                self._forget_rounds()
            # A round's tasks rank as queued when its first was (they tie; then
            # by round, then submission): aging counts from there.
            began = self._began.setdefault(turn, t)
            rank: object = (-job.priority if aging is None else began - job.priority * aging, turn)
        else:
            rank = -float(job.priority) if aging is None else t - job.priority * aging
        entry = (rank, seq, job)
        order = self._order
        order.append(job)
        queued = self.startable + self.keys.held + len(self.pauses.parked)
        if len(order) > 2 * queued + _COMPACT_AFTER:
            # It keeps started tasks until the oldest queued one goes: drop them
            # when they dominate (amortized O(1) a task).
            self._order = deque(j for j in order if _queued(j))
        if state is not None:
            state.pending += 1
        if self.pauses.now is not None and self.pauses.holds(job):
            self._park(entry)
            return
        self._place(entry)

    def _forget_rounds(self) -> None:
        """(fair order) Forget the last round of each key with nothing queued: it
        joins the current round again when it comes back (amortized O(1) a task)."""
        states, current = self.keys.states, self._round
        self._rounds = {
            k: r
            for k, r in self._rounds.items()
            if r > current or k is None or (k in states and states[k].pending > 0)
        }
        self._keep_rounds = max(_KEEP_ROUNDS, 2 * len(self._rounds))

    def _place(self, entry: Entry) -> None:
        """Queue ``entry``'s task (counted in its key's ``pending`` already):
        ready to start, or in its key's line."""
        key = entry[2].key
        state = None if key is None else self.keys.state(key)
        if state is None or state.limit is None:
            heapq.heappush(self.ready, entry)
            self.startable += 1
        else:
            self.keys.place(state, entry)

    def _forget(self, job: Job) -> None:
        """``job`` leaves the queue without starting (cancelled, dropped, or taken
        by `take_all`); its entry stays behind as a tombstone."""
        if job.key is None:
            self.startable -= 1
        else:
            self.keys.forget(job)
        self.tombstones += 1
        entries = len(self.ready) + self.keys.held
        if self.tombstones > _COMPACT_AFTER and self.tombstones * 2 > entries:
            self._compact(job)

    def _compact(self, leaving: Job | None) -> None:
        """Drop the tombstones (``leaving``'s entries too: it may still be PENDING,
        dropped a moment from now)."""

        def keep(entry: Entry) -> bool:
            return entry[2] is not leaving and _queued(entry[2]) and not entry[2].paused

        self.ready = [e for e in self.ready if keep(e) and self._current(e)]
        heapq.heapify(self.ready)
        self.keys.compact(keep)
        self._order = deque(j for j in self._order if j is not leaving and _queued(j))
        self.tombstones = 0

    def _current(self, entry: Entry) -> bool:
        """``entry`` in ``ready`` is not stale (its task was not sent back)."""
        return entry[2].key is None or self.keys.current(entry)

    # ------------------------------------------------------------ keys

    def waiting_on(self, job: Job) -> str | None:
        """Why a queued or rejoining task waits, if for a pause (``"paused"``) or its
        key; else None."""
        return "paused" if job.paused else self.keys.waiting_on(job)

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
                self.keys.states[job.key].parked -= 1
            self._place(entry)
            self.listener.waiting(job)
        if pauses.now is not None:
            queue = [*filter(self._current, self.ready), *self.keys.lined()]
            found = {e[2]: e for e in queue if _queued(e[2]) and pauses.holds(e[2])}
            # Out of the queue first, all of them (their entries too), then the
            # room they leave in their keys goes to who waits there.
            touched: dict[str, KeyState] = {}
            for entry in sorted(found.values()):
                job = entry[2]
                if job.key is None:
                    self.startable -= 1
                else:
                    state = self.keys.unqueue(job)
                    touched[state.key] = state
                self._park(entry)
            if found:
                self._compact(None)
                for state in touched.values():
                    if state.limit is not None:
                        self.keys.grant(state)
        for _ in back:
            self.listener.ready()
        pauses.wake_lifted()

    def hold_retry(self, job: Job, wake: Wake) -> bool:
        """`Pauses.hold_retry`, told to the listener (what it waits on, the shutdown)."""
        if not self.pauses.hold_retry(job, wake):
            return False
        self.listener.waiting(job)
        self.listener.parked(job)
        return True

    def _park(self, entry: Entry) -> None:
        """Hold ``entry``'s task out of the queue (it is in no heap now): a pause
        matches it. It keeps its place (``entry``) for when the pause is lifted."""
        job = entry[2]
        self.pauses.park(entry)
        if job.key is not None:
            self.keys.states[job.key].parked += 1
        self.listener.waiting(job)
        self.listener.parked(job)

    def __repr__(self) -> str:
        tombstones = self.tombstones if self._ranked else len(self._jobs) - self.startable
        return (
            f"<Pending {self.startable} startable, {tombstones} tombstones,"
            f" {self.keys.held} held by their keys>"
        )
