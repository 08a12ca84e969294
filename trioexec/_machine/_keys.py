"""Admission by key: `KeyLimit` (the policy), `KeyStatistics` (a snapshot) and
`KeyState` (one key's counts, token bucket and lines).

The bucket's arithmetic is pure (`KeyState.room`, `refill`, `ready_at`): it takes
``now`` on the executor's clock and returns numbers; `KeyTimers` only orders when
keys are due (the shell's timer task sleeps until then).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, final

import attrs

from .._records import TYPED, check_id, check_number

if TYPE_CHECKING:
    from .._taskref import Job

#: the `KeyLimit` of every key a mapping does not list
DEFAULT_KEY = "*"

# Token counts are floats refilled at arbitrary times: a count a rounding error
# short of a whole token counts as one.
EPSILON = 1e-9


#: ``concurrency`` at most: what the stores' integer columns of held slots hold.
MAX_CONCURRENCY = 2**31 - 1
#: ``rate`` and ``per`` between these: every sum and product of the bucket's
#: arithmetic (tokens, seconds per token, tokens per second) stays a finite float.
MIN_RATE, MAX_RATE = 1e-9, 1e12


def _concurrency(_: Any, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        what, most = f"KeyLimit {attribute.name}", "at most 2**31 - 1 (what a store holds)"
        check_number(what, value, int, ">= 1", typed="an int or None", ge=1, errors=TYPED)
        check_number(what, value, int, most, le=MAX_CONCURRENCY)


def _rate(limit: KeyLimit, attribute: attrs.Attribute[Any], value: object) -> None:
    """``rate`` and ``per``: a finite number in [MIN_RATE, MAX_RATE]. (attrs runs
    validators once every field is set: ``rate``'s also refuses a limit of nothing.)"""
    if value is None and attribute.name == "rate":
        if limit.concurrency is None:
            raise ValueError(
                "KeyLimit needs a concurrency or a rate (or both): KeyLimit() limits nothing"
            )
        return
    what, must = f"KeyLimit {attribute.name}", "a finite number > 0"
    typed, span = "a number", f" (from {MIN_RATE:g} to {MAX_RATE:g})"
    check_number(
        what, value, float, must, typed=typed, ge=MIN_RATE, le=MAX_RATE, hint=span, errors=TYPED
    )


@attrs.frozen(kw_only=True)
class KeyLimit:
    """The limit of one key (`open_executor`'s ``key_limits``): either or both of

    - ``concurrency``: at most that many tasks of the key hold a slot at once (a
      deferred task holds none);
    - ``rate`` starts (attempts, retries included) per ``per`` seconds: a token
      bucket that holds at most ``rate`` tokens (one, for a rate below 1) and
      gains ``rate`` every ``per`` seconds. Over any span of ``s`` seconds at
      most ``rate + rate * s / per`` tasks of the key start (a full bucket, then
      the refill; ``rate=0.5`` is one start every 2 seconds).

    Example::

        KeyLimit(concurrency=2, rate=10, per=1.0)   # 2 at once, 10 starts a second

    Raises:
      TypeError, ValueError: a value that is not an int from 1 to 2**31 - 1
        (``concurrency``) or a finite number from 1e-9 to 1e12 (``rate``,
        ``per``), naming it; neither ``concurrency`` nor ``rate`` (a limit of
        nothing).
    """

    concurrency: int | None = attrs.field(default=None, validator=_concurrency)
    rate: float | None = attrs.field(default=None, validator=_rate)
    per: float = attrs.field(default=1.0, validator=_rate)

    @property
    def burst(self) -> float:
        """The most tokens the bucket holds: ``rate``, and at least one."""
        return 0.0 if self.rate is None else max(float(self.rate), 1.0)


@attrs.frozen(kw_only=True)
class KeyStatistics:
    """One key's tasks now (`Executor.key_statistics`): ``active`` hold a slot,
    ``pending`` have not started (held back by the key or waiting for a slot),
    ``deferred`` gave their slot back; ``limited_count`` counts the times one of
    its tasks had to wait for the key's limit (to start, or to resume). An
    idle key (nothing pending, running or deferred, its rate bucket full) may
    be forgotten once there are more than 1,024 keys: its counts then start
    from zero again."""

    key: str
    active: int = 0
    pending: int = 0
    deferred: int = 0
    limited_count: int = 0


def key_limits_for(value: object) -> dict[str, KeyLimit]:
    """``key_limits=`` as a mapping from key to `KeyLimit` (``"*"``: every key not
    listed): one `KeyLimit` applies to every key, None limits none. Each is
    checked again (one made with attrs' validators off, say). Raises TypeError
    or ValueError naming what it refuses."""
    if value is None:
        return {}
    if isinstance(value, KeyLimit):
        attrs.validate(value)
        return {DEFAULT_KEY: value}
    if isinstance(value, Mapping):
        limits: dict[str, KeyLimit] = {}
        for key, limit in value.items():
            if not isinstance(key, str) or not key:
                raise TypeError(f"key_limits keys must be non-empty str, got {key!r}")
            if not isinstance(limit, KeyLimit):
                raise TypeError(f"key_limits[{key!r}] must be a KeyLimit, got {limit!r}")
            try:
                attrs.validate(limit)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"key_limits[{key!r}]: {exc}") from None
            limits[key] = limit
        return limits
    raise TypeError(f"key_limits must be a KeyLimit or a mapping of them, got {value!r}")


class _NotText(TypeError, ValueError):
    """A key that is not a str: a TypeError, and the ValueError a submission
    has always raised for it (`check_key`)."""


def check_key(value: object) -> str:
    """An admission key (``submit(key=...)``, a spec's, `Executor.key_statistics`'s):
    a str `check_id` accepts. Raises, naming it, TypeError for a non-str (also a
    ValueError, as for the other ids) and ValueError for a str no store can hold."""
    if not isinstance(value, str):
        raise _NotText(f"key must be a str, got {type(value).__name__} {value!r}")
    return check_id("key", value)


class Wake(Protocol):
    """What the shell waits on and the machine sets (a `trio.Event`)."""

    def set(self) -> None: ...


W = TypeVar("W", bound=Wake)


@final
@attrs.define(eq=False)
class Waiter(Generic[W]):
    """A started task of a limited key waiting in one of its key's lines (to
    resume from a deferral, or, with ``start``, for a retry's attempt); ``wake``
    is set once it is ``granted`` the key."""

    job: Job
    wake: W
    start: bool
    granted: bool = False


#: What a started task is to its key, one role at a time (`KeyState.roles`):
#: it holds a slot; it gave its slot back (deferred); it waits for its next
#: attempt; it is a retry let through, waiting for a slot (its token is taken
#: when it gets one). Holders and reserved ones count against the key's room.
HOLDS, DEFERRED, RETRYING, RESERVED = range(4)
_ROLES = ("holds", "deferred", "retrying", "reserved")


@final
class KeyState:
    """One key's counts and lines, kept while the key has tasks or a bucket that
    is not full. ``roles``: its started tasks, each with its one role (`HOLDS`,
    `DEFERRED`, `RETRYING`, `RESERVED`), and ``count``: how many have each;
    ``earmarked``: tasks of a limited key the queue has let through to start (they count
    against the key's room until they start or are cancelled); ``queue``: its held-back
    pending tasks, best first (a heap of ``(rank, seq, job)``); ``resumers`` and
    ``retriers``: its started tasks waiting to hold the key again after a deferral
    (concurrency only) or for a retry's attempt (and a token), first come first served,
    resumers first, both ahead of every pending task."""

    __slots__ = (
        "cap",
        "count",
        "earmarked",
        "granted",
        "key",
        "late",
        "limit",
        "limited_count",
        "parked",
        "pending",
        "queue",
        "resumers",
        "retriers",
        "roles",
        "shared",
        "stamp",
        "timer_at",
        "tokens",
    )

    def __init__(self, key: str, limit: KeyLimit | None, now: float, shared: bool = False) -> None:
        self.key = key
        self.limit = limit
        # Shared through a store (`trioexec._keyshare`): ``cap`` is the part of the
        # key's concurrency this executor holds, and tokens come from the store's
        # bucket, not from a refill here (``stamp`` never passes).
        self.shared = shared = shared and limit is not None
        concurrency = None if limit is None else limit.concurrency
        self.cap = 0 if shared and concurrency is not None else concurrency
        self.roles: dict[Job, int] = {}
        self.count = [0, 0, 0, 0]  # (by role)
        self.pending = 0  # its tasks in the queue (paused ones too)
        self.parked = 0  # ... of which a pause holds out of it (`Pauses.parked`)
        self.limited_count = 0
        self.earmarked: dict[Job, tuple[float, int, Job]] = {}  # (with their entries)
        self.queue: list[tuple[float, int, Job]] = []
        self.resumers: deque[Waiter[Any]] = deque()
        self.retriers: deque[Waiter[Any]] = deque()
        self.tokens = limit.burst if limit is not None and not shared else 0.0
        self.stamp = math.inf if shared else now  # when `tokens` was last brought up to date
        # Shared: when each token of the store's held here came, and how long
        # after that the store's bucket would have been full without it (oldest
        # first); and what the ones started late owe the bucket (`use_token`).
        self.granted: deque[list[float]] = deque()
        self.late = 0.0
        self.timer_at = math.inf  # a refill check is due then

    def move(self, job: Job, role: int | None) -> int | None:
        """``job`` takes ``role`` (None: it leaves the key). Returns the role it had."""
        count = self.count
        old = self.roles.pop(job, None)
        if old is not None:
            count[old] -= 1
        if role is not None:
            self.roles[job] = role
            count[role] += 1
        return old

    def take(self, job: Job, start: bool) -> None:
        """A started task takes its key back: after a deferral it holds it again;
        a retry is let through (`RESERVED`) until it holds a slot."""
        self.move(job, RESERVED if start else HOLDS)

    def use_token(self, now: float) -> None:
        """A task of the key starts: it takes a token. A shared key's token
        that waited here past the time the store's bucket would have filled up
        owes what the bucket gained since (at most itself): the next round pays
        it (``KeyRequest.late``), so starts keep to the rate, not grants."""
        if self.shared:
            if self.granted:
                self.late += self._owed(self.granted.popleft(), now)
        else:
            self.refill(now)
        self.tokens -= 1.0

    def owe_for_waiting(self, now: float) -> None:
        """Shared: the tokens held here and not used yet owe for their wait so
        far (asked before more tokens are: else a token that waited for a slot
        and a new one could start together)."""
        for entry in self.granted:
            self.late += self._owed(entry, now)

    def _owed(self, entry: list[float], now: float) -> float:
        """What ``entry`` (a token: when it came, when the bucket would have
        been full without it, what it paid) owes at ``now`` beyond what it paid."""
        limit = self.limit
        assert limit is not None
        assert limit.rate is not None
        at, full_in, paid = entry
        owed = min(1.0, max(0.0, (now - at - full_in) * limit.rate / limit.per))
        entry[2] = max(owed, paid)
        return max(0.0, owed - paid)

    def add_tokens(self, tokens: int, full_in: float, now: float) -> None:
        """The store granted ``tokens`` (shared), taken from a bucket that would
        have been full ``full_in`` seconds later without them."""
        limit = self.limit
        assert limit is not None
        assert limit.rate is not None
        step = limit.per / limit.rate  # (each token taken puts it one further off)
        self.granted.extend([now, full_in + i * step, 0.0] for i in range(tokens))
        self.tokens += tokens

    def give_back(self, tokens: float) -> None:
        """``tokens`` held here go back to the store's bucket (the newest)."""
        self.tokens -= tokens
        for _ in range(min(len(self.granted), math.ceil(tokens - EPSILON))):
            self.granted.pop()

    def refill(self, now: float) -> None:
        """Bring the bucket up to ``now``."""
        limit = self.limit
        if limit is None or limit.rate is None or now <= self.stamp:
            return
        self.tokens = min(limit.burst, self.tokens + (now - self.stamp) * limit.rate / limit.per)
        self.stamp = now

    def room(self, start: bool = True) -> bool:
        """One more task of the key may hold a slot now (and, with ``start``,
        take a token), counting the ones already let through. (Call `refill` first.)"""
        limit = self.limit
        if limit is None:
            return True
        taken = len(self.earmarked) + self.count[RESERVED]
        if self.cap is not None and self.count[HOLDS] + taken >= self.cap:
            return False
        return not start or limit.rate is None or self.tokens - taken > 1.0 - EPSILON

    def by_rate(self) -> bool:
        """The key is held back by its rate (not by its concurrency)."""
        limit = self.limit
        if limit is None or limit.rate is None:
            return False
        return self.cap is None or self.in_use() < self.cap

    def ready_at(self) -> float:
        """When the bucket holds a token more than those already let through."""
        limit = self.limit
        assert limit is not None
        assert limit.rate is not None
        missing = len(self.earmarked) + self.count[RESERVED] + 1.0 - self.tokens
        at = self.stamp + max(missing, 0.0) * limit.per / limit.rate
        return max(at, math.nextafter(self.stamp, math.inf))  # (later, however little)

    def spent(self, now: float) -> bool:
        """Its bucket is as good as new (a forgotten key starts again from it):
        full, or (shared) no tokens of the store's left here, nor a debt to it."""
        if self.shared:
            return self.tokens <= 0.0 and self.late <= 0.0
        self.refill(now)
        limit = self.limit
        return limit is None or limit.rate is None or self.tokens >= limit.burst - EPSILON

    def full_at(self) -> float:
        """When the bucket is full again (``stamp``: it is, has no rate, or is the store's)."""
        limit = self.limit
        if limit is None or limit.rate is None or self.shared:
            return self.stamp
        return self.stamp + (limit.burst - self.tokens) * limit.per / limit.rate

    def in_use(self) -> int:
        """Its tasks that hold the key or were let through to it."""
        return self.count[HOLDS] + len(self.earmarked) + self.count[RESERVED]

    @property
    def idle(self) -> bool:
        """Nothing of the key pending, running, deferred or waiting."""
        return not (self.pending or self.roles or self.resumers)

    def reason(self) -> str:
        """What holds a task of this key back: its concurrency or its rate."""
        return f"rate limit {self.key}" if self.by_rate() else f"key concurrency {self.key}"

    def statistics(self) -> KeyStatistics:
        return KeyStatistics(
            key=self.key,
            active=self.count[HOLDS],
            pending=self.pending + self.count[RETRYING] + self.count[RESERVED],
            deferred=self.count[DEFERRED],
            limited_count=self.limited_count,
        )

    def __repr__(self) -> str:
        roles = ", ".join(f"{n} {name}" for n, name in zip(self.count, _ROLES, strict=True))
        return f"<KeyState {self.key!r} {self.pending} queued, {roles}>"


@final
@attrs.define(eq=False)
class KeyTimers:
    """When limited keys' buckets have their next token: a heap of the keys due,
    earliest first (the shell sleeps until `next`, then ticks the `due` ones)."""

    _heap: list[tuple[float, int, KeyState]] = attrs.Factory(list)
    _seq: int = 0

    def set(self, state: KeyState, at: float) -> bool:
        """Wake ``state``'s key at ``at`` (unless it is to be woken sooner).
        True if that is now the earliest (the shell's sleep ends sooner)."""
        if at >= state.timer_at:
            return False
        state.timer_at = at
        self._seq += 1
        heap = self._heap
        heapq.heappush(heap, (at, self._seq, state))
        return heap[0][2] is state

    def due(self, now: float) -> list[KeyState]:
        """The keys due at ``now`` (taken off the heap)."""
        heap = self._heap
        states = []
        while heap and heap[0][0] <= now:
            at, _, state = heapq.heappop(heap)
            if at == state.timer_at:  # (else superseded by an earlier one)
                state.timer_at = math.inf
                states.append(state)
        return states

    def next(self) -> float:
        """When the next key is due (inf: none is)."""
        return self._heap[0][0] if self._heap else math.inf
