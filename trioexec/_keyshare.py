"""`KeyBroker`: an executor's part of key limits shared through its store (how
they hold across executors: docs/howto/key_limits.rst, "Across processes").

The queue lets a key's tasks through only as far as the part of its concurrency
held here (``KeyState.cap``) and the tokens taken from the store's bucket
(`trioexec._store._key_ledger`), and tells the broker whenever a key's tasks
come, go or wait; the broker settles every key that changed in one store call
(a round).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, final

import trio

from ._machine._keys import EPSILON, RESERVED
from ._store._key_ledger import KeyGrant, KeyRequest

if TYPE_CHECKING:
    from ._journal import Journal
    from ._machine._keys import KeyState
    from ._machine._pending import Pending

#: How soon a key that others hold is asked for again, first and at most.
POLL_MIN = 0.05
POLL_MAX = 1.0
#: Keys settled in one store call at most (the rest wait for the next round).
ROUND_KEYS = 512


@final
class KeyBroker:
    """Settles this executor's shared keys with the store."""

    def __init__(
        self, pending: Pending, journal: Journal, owner: str, free_slots: Callable[[], int]
    ) -> None:
        self._pending = pending
        self._journal = journal
        self._owner = owner
        self._held: dict[str, int] = {}  # key -> slots of it held in the store
        # Keys to settle next round, in order; True: even if nothing changed here
        # (a poll: the store may have more, or others may want it).
        self._dirty: dict[str, bool] = {}
        self._later: list[tuple[float, str]] = []  # (when, key): ask again then
        self._due: dict[str, float] = {}  # key -> its entry in ``later`` (others: stale)
        self._poll: dict[str, float] = {}  # key -> its poll interval while others hold it
        self._lot = trio.lowlevel.ParkingLot()
        self._settling = False
        self.rounds = 0  # store calls made (tests and statistics)
        # Slots free for tasks not let through yet: a shared rate's tokens are
        # asked for only for tasks that can start (and one more), else tokens that
        # wait for slots would let starts bunch up. Keys held to fewer are `_starved`.
        self.free_slots = free_slots
        self._starved: set[str] = set()
        self._budget = 0  # (free slots left in the round being made)

    def want(self, state: KeyState) -> None:
        """``state``'s key changed: settle it in the next round (`Listener.want`)."""
        if not self._settling:
            self._dirty.setdefault(state.key, False)
            if self._lot:
                self._lot.unpark()

    def slot_freed(self) -> None:
        """A worker found no work and gave its slot back: keys that asked for
        no tokens for want of one ask again."""
        if self._starved:
            for key in self._starved:
                self._dirty.setdefault(key, False)
            self._starved.clear()
            if self._lot:
                self._lot.unpark()

    async def run(self) -> None:
        """Settle changed keys, round after round, forever."""
        while True:
            await self._wait()
            keys = list(self._dirty.items())[:ROUND_KEYS]
            for key, _ in keys:
                del self._dirty[key]
            requests = self._requests(keys)
            if requests:
                self.rounds += 1
                journal = self._journal
                asked = trio.current_time()  # (the tokens' age counts from here: never less)
                grants = await journal.call(journal.store.key_round, self._owner, requests)
                self._apply(requests, grants, asked)

    async def _wait(self) -> None:
        later = self._later
        while not self._dirty:
            at = later[0][0] if later else math.inf
            if at <= trio.current_time():
                at, key = heapq.heappop(later)
                if self._due.get(key) == at:
                    del self._due[key]
                    self._dirty[key] = True
                continue
            with trio.move_on_at(at):
                await self._lot.park()

    def _requests(self, keys: list[tuple[str, bool]]) -> list[KeyRequest]:
        """What each key's tasks here hold and want now. Until the round is
        settled, a key lets tasks through only as far as the store is sure to
        leave it (what they use now)."""
        self._budget = max(0, self.free_slots())
        return [r for key, poll in keys if (r := self._request(key, poll)) is not None]

    def _request(self, key: str, poll: bool) -> KeyRequest | None:
        state = self._pending.keys.states.get(key)
        held = self._held.get(key, 0)
        if state is None or state.limit is None:
            self._poll.pop(key, None)  # (forgotten: nothing of it is kept here)
            if not held:
                return None
            # Its tasks are gone: give it all back.
            return KeyRequest(
                key=key, concurrency=held, rate=None, per=1.0, in_use=0, wanted=0, tokens=0
            )
        limit = state.limit
        in_use = state.in_use()
        queued = state.pending - len(state.earmarked) - state.parked  # (paused: no)
        wanted = in_use + queued + len(state.resumers) + len(state.retriers)
        if limit.concurrency is not None:
            wanted = min(wanted, limit.concurrency)
        tokens, returned = 0, 0.0
        if limit.rate is not None:
            starters = queued + len(state.retriers)
            spare = state.tokens - len(state.earmarked) - state.count[RESERVED]
            if limit.concurrency is not None:  # (no more than may start at once)
                starters = min(starters, limit.concurrency - in_use - len(state.resumers))
            if starters > 0:
                want = min(starters, math.ceil(limit.rate))
                if self._budget < want:
                    self._starved.add(key)  # (asked for more when a slot is free)
                    # One at least, slot or not: its task waits in line with the
                    # rest (by rank), so the key never starves behind other work;
                    # the token pays for its wait when it is used (`use_token`).
                    want = max(self._budget, 0 if state.tokens > 1.0 - EPSILON else 1)
                tokens = max(0, want - math.floor(spare + EPSILON))
                if tokens and state.granted:
                    # (tokens held here pay for their wait first: `owe_for_waiting`)
                    state.owe_for_waiting(trio.current_time())
                self._budget -= tokens
            elif spare > 0 and not queued and not state.retriers:
                returned = spare  # nobody here will use them: back to the bucket
                state.give_back(spare)
        late, state.late = state.late, 0.0
        unchanged = limit.concurrency is None or (wanted == held and state.cap == held)
        if unchanged and not (poll or tokens or returned or late):
            waiting = queued or state.resumers or state.retriers
            if limit.concurrency is not None and waiting and key not in self._due:
                self._poll_later(key, trio.current_time())  # (others may come to want it)
            return None  # nothing the store needs to hear
        if state.cap is not None:
            state.cap = min(state.cap, in_use)
        return KeyRequest(
            key=key,
            concurrency=limit.concurrency,
            rate=limit.rate,
            per=limit.per,
            in_use=in_use,
            wanted=wanted,
            tokens=tokens,
            returned=returned,
            late=late,
        )

    def _apply(self, requests: list[KeyRequest], grants: list[KeyGrant], asked: float) -> None:
        """Hand each key what the store granted (asked at ``asked``); plan the next asks."""
        now = trio.current_time()
        pending = self._pending
        self._settling = True
        try:
            for request, grant in zip(requests, grants, strict=True):
                key = request.key
                if grant.held:
                    self._held[key] = grant.held
                else:
                    self._held.pop(key, None)
                state = pending.keys.states.get(key)
                if state is None or not state.shared:
                    if grant.held:
                        self._dirty[key] = False  # its tasks are gone: give it back
                    continue
                if state.cap is not None:
                    state.cap = grant.usable
                if grant.tokens:
                    state.add_tokens(grant.tokens, grant.full_in, asked)
                pending.keys.regrant(state)
                self._plan(state, request, grant, now)
        finally:
            self._settling = False

    def _plan(self, state: KeyState, request: KeyRequest, grant: KeyGrant, now: float) -> None:
        """Ask for ``state``'s key again when the store may have more for it."""
        key = state.key
        at = math.inf
        short = grant.tokens < request.tokens  # (the bucket had fewer than asked for)
        if (
            (state.queue or state.retriers)
            and state.by_rate()
            and (short or key not in self._starved)
        ):
            at = now + grant.next_token_in  # (its tasks wait for tokens: ask when there are)
        waiting = state.queue or state.resumers or state.retriers
        if request.concurrency is not None and (grant.usable < request.wanted or waiting):
            # Others may hold it, or come to want it: ask again (backing off).
            self._poll_later(key, now)
        else:
            self._poll.pop(key, None)
        self._ask_at(key, at)

    def _poll_later(self, key: str, now: float) -> None:
        poll = self._poll[key] = min(self._poll.get(key, POLL_MIN / 2) * 2, POLL_MAX)
        self._ask_at(key, now + poll)

    def _ask_at(self, key: str, at: float) -> None:
        if at < self._due.get(key, math.inf):
            self._due[key] = at
            heapq.heappush(self._later, (at, key))

    def held(self) -> dict[str, int]:
        """Slots held in the store, by key."""
        return dict(self._held)
