"""Key limits shared through a store: the arithmetic of one key in one
`Store.key_round`, the same for every store.

Every executor sharing a store holds some of a limited key's concurrency (a row
``(key, owner, held, wanted, since)``, valid while the owner's lease is live: a
dead owner's rows are reclaimed like its executions) and takes start tokens from one
bucket per key (``(key, tokens, stamp)`` on the store's clock). An executor asks
for what its waiting tasks need and gives back what they no longer hold, in
batches (`trioexec._keyshare`); the store never grants more than the key's limit
in all, counting every live owner. While other owners wait for a key, each may
use only its share (``ceil(concurrency / owners wanting)``, or the floor while a
waiting owner holds less than the floor), so one busy executor cannot keep a key
from the rest. Owners take turns: a free slot goes to the owner that has waited
longest (``since``), and with no slot free, an owner that holds two more than a
waiter (or any, while a waiter holds none) starts no more until it has handed
one over.
"""

from __future__ import annotations

import math

import attrs

# A token count a rounding error short of a whole token counts as one.
_EPSILON = 1e-9
#: Full buckets a round deletes at most, beyond one for each key it settles: a
#: bucket is kept with the time it is full again (``full_at``), and a full one
#: is the same as none, so rounds prune those of keys nobody settles again
#: (used once) as they go, with bounded work each.
PRUNE_MORE = 16


@attrs.frozen(kw_only=True)
class KeyRequest:
    """One owner's request for one key in a `Store.key_round`."""

    key: str
    concurrency: int | None  #: the key's limit as this owner knows it
    rate: float | None
    per: float
    in_use: int  #: slots of the key its tasks hold or were let through to (kept)
    wanted: int  #: slots it would hold now (``in_use`` and its waiting tasks)
    tokens: int  #: start tokens it asks for now
    returned: float = 0.0  #: tokens it took earlier and will not use, given back
    #: tokens owed for tokens started late: while a token waited to be used, the
    #: bucket kept filling as if it had been taken, past where it would have
    #: stopped, full, had it been taken at the start (see `KeyGrant.full_in`)
    late: float = 0.0


@attrs.frozen(kw_only=True)
class KeyGrant:
    """What a `Store.key_round` gave one owner for one key."""

    key: str
    held: int  #: slots of the key the owner holds now (never below ``in_use``)
    usable: int  #: of those, how many it may use (its share while others wait)
    tokens: int  #: start tokens it took
    next_token_in: float  #: seconds until the bucket has a whole token again (0: now)
    #: seconds until the bucket, as it was before these tokens were taken, would
    #: have been full: a token started later than that owes what the bucket
    #: gained meanwhile (at most the token; ``KeyRequest.late``)
    full_in: float = 0.0


@attrs.frozen
class Hold:
    """A live owner's row of a key: ``held`` slots, ``wanted`` asked for, and
    since when it has wanted more than it holds (None: it does not)."""

    owner: str
    held: int = attrs.field(kw_only=True)
    wanted: int = attrs.field(kw_only=True)
    since: float | None = attrs.field(default=None, kw_only=True)


def _share(concurrency: int, waiters: list[int]) -> int:
    """What one owner may use while the owners holding ``waiters`` slots wait."""
    if not waiters:
        return concurrency
    owners = len(waiters) + 1
    # The ceiling, unless a waiter holds less than the floor: ceilings can add up
    # to more than the limit, and the first owners in would keep the last out
    # for good (4 slots, 3 owners: 2 + 2 + 0).
    if min(waiters) < concurrency // owners:
        return concurrency // owners
    return -(-concurrency // owners)


def settle(
    request: KeyRequest,
    others: list[Hold],
    bucket: tuple[float, float] | None,
    now: float,
    mine: Hold | None = None,
) -> tuple[KeyGrant, Hold | None, tuple[float, float] | None]:
    """One key of a round. ``others``: the rows of the key's other live owners;
    ``bucket``: its ``(tokens, stamp)`` (None: full); ``mine``: the owner's row
    until now. Returns the grant, the owner's new row (None: delete it) and the
    new bucket (None: full, delete)."""
    held = usable = request.in_use
    row = None
    concurrency = request.concurrency
    if concurrency is not None:
        before = 0 if mine is None else mine.held
        since = now if mine is None or mine.since is None else mine.since
        taken = sum(h.held for h in others)
        waiters = [h for h in others if h.wanted > h.held]
        share = _share(concurrency, [h.held for h in waiters])
        held = max(request.in_use, min(request.wanted, concurrency - taken, share))
        usable = min(held, share)
        ahead = any(h.held <= before and h.since is not None and h.since < since for h in waiters)
        if held > before and ahead:
            # Owners that waited longer with no more come first: wait your turn.
            usable = held = max(request.in_use, before)
        fewer = min((h.held for h in waiters), default=concurrency)
        if taken + held >= concurrency and before and (fewer == 0 < held or fewer < held - 1):
            # Someone waits with none, or two fewer, and no slot is free: one that
            # held the key so far starts no more, so that its slot goes to them
            # when it ends (1 slot: owners take turns).
            usable = min(usable, held - 1)
            held = max(request.in_use, held - 1)
        if held or request.wanted:
            row = Hold(
                "", held=held, wanted=request.wanted, since=since if request.wanted > held else None
            )

    tokens, next_in, full_in, left = 0, 0.0, 0.0, None
    rate = request.rate
    if rate is not None:
        burst = _burst(rate)
        if bucket is None:
            level, stamp = burst, now
        else:
            level, stamp = bucket
            if now > stamp:
                level = min(burst, level + (now - stamp) * rate / request.per)
                stamp = now
        level = min(burst, level + max(0.0, request.returned)) - max(0.0, request.late)
        full_in = max(0.0, burst - level) * request.per / rate
        tokens = max(0, min(request.tokens, math.floor(level + _EPSILON)))
        level -= tokens
        if level < 1.0 - _EPSILON:
            next_in = (1.0 - level) * request.per / rate
        if level < burst - _EPSILON:
            left = (level, stamp)
    grant = KeyGrant(
        key=request.key,
        held=held,
        usable=usable,
        tokens=tokens,
        next_token_in=next_in,
        full_in=full_in,
    )
    return grant, row, left


def full_at(request: KeyRequest, bucket: tuple[float, float]) -> float:
    """When ``bucket`` (``(tokens, stamp)``, as `settle` left it) is full again
    at ``request``'s rate: from then on it is the same as no bucket."""
    rate = request.rate
    assert rate is not None
    tokens, stamp = bucket
    return stamp + max(0.0, _burst(rate) - tokens) * request.per / rate


def _burst(rate: float) -> float:
    """The most tokens a bucket holds: ``rate`` (a rate below 1 still lets one
    through at a time)."""
    return max(float(rate), 1.0)
