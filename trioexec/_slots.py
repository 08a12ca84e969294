"""Concurrency slots: a `SlotPool` over `trio.CapacityLimiter`, and the `SlotToken` a task holds.

A token is the borrower the limiter records, so a task can give its slot back
(`SlotToken.release`) and queue for one again (`SlotToken.reclaim`) as many
times as it likes. Waiting is FIFO across everyone who asks: tasks starting
for the first time and tasks resuming after a deferral stand in the same line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import trio

from ._records import TYPED, check_number


@final
class SlotPool:
    """A fixed number of concurrency slots, handed out first come, first served.

    Args:
      total: how many slots; at least 1.

    Raises:
      ValueError: if ``total`` is below 1.

    Example::

        pool = SlotPool(4)
        with await pool.acquire() as token:
            ...  # runs holding one of the four slots
    """

    __slots__ = ("_limiter", "_listeners", "reclaiming")

    def __init__(self, total: int) -> None:
        _check_total(total)
        self._limiter = trio.CapacityLimiter(total)
        #: Tokens queued in `SlotToken.reclaim` now (read it, never assign): a
        #: holder that could keep its slot for more work gives it up while anyone
        #: is queued (FIFO). A plain attribute, cheaper than `waiting`: the
        #: executor's workers read it between every two jobs.
        self.reclaiming = 0
        # Told (synchronously) after every resize; the executor starts workers.
        self._listeners: list[Callable[[], None]] = []

    @property
    def limiter(self) -> trio.CapacityLimiter:
        """The underlying `trio.CapacityLimiter`; tokens are its borrowers."""
        return self._limiter

    @property
    def total(self) -> int:
        """The number of slots.

        Assign to resize at run time. Growing wakes waiters at once; shrinking lets
        current holders finish and admits nobody new until fewer than the new
        total are in use. Below 1 raises `ValueError`.
        """
        return int(self._limiter.total_tokens)

    @total.setter
    def total(self, new_total: int) -> None:
        _check_total(new_total)
        self._limiter.total_tokens = new_total
        for listener in self._listeners:
            listener()

    @property
    def in_use(self) -> int:
        """Slots currently held."""
        return self._limiter.borrowed_tokens

    @property
    def available(self) -> int:
        """Slots free right now (0 while the pool is over-committed after a shrink)."""
        return max(0, self.total - self.in_use)

    def on_resize(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (synchronously) after every resize through `total`."""
        self._listeners.append(callback)

    @property
    def waiting(self) -> int:
        """Tasks queued for a slot."""
        return self._limiter.statistics().tasks_waiting

    def token(self) -> SlotToken:
        """A new token that does not hold a slot yet; `SlotToken.reclaim` takes one."""
        return SlotToken(self)

    async def acquire(self) -> SlotToken:
        """Wait (FIFO) for a slot and return the token that holds it.

        A checkpoint. If cancelled while waiting, no slot is taken.
        """
        token = SlotToken(self)
        await token.reclaim()
        return token

    def __repr__(self) -> str:
        return f"<SlotPool {self.in_use}/{self.total} in use, {self.waiting} waiting>"


def _check_total(total: int) -> None:
    check_number("slot total", total, float, ">= 1", typed="an int", ge=1, errors=TYPED)
    if not isinstance(total, int):  # (a number, so a ValueError)
        raise ValueError(f"slot total must be >= 1, got {total!r}")


@final
class SlotToken:
    """The right to run non-deferred code, held or not.

    `release` gives the slot back at once and never blocks; `reclaim` waits for
    one in the pool's FIFO line. Using the token as a context manager releases
    it on leaving the block, however the block ends.
    """

    __slots__ = ("_held", "_pool")

    def __init__(self, pool: SlotPool) -> None:
        self._pool = pool
        self._held = False

    @property
    def pool(self) -> SlotPool:
        """The pool this token draws from."""
        return self._pool

    @property
    def is_held(self) -> bool:
        """True while this token holds a slot."""
        return self._held

    def release(self) -> bool:
        """Give the slot back. Returns True if a slot was freed, False if none was held.

        Never blocks and is not a checkpoint; the first task waiting for a slot is
        woken at once.
        """
        if not self._held:
            return False
        self._held = False
        self._pool._limiter.release_on_behalf_of(self)
        return True

    async def reclaim(self) -> None:
        """Wait (FIFO) for a slot and hold it.

        Always a checkpoint. If cancelled while waiting, no slot is taken and
        `trio.Cancelled` propagates.

        Raises:
          RuntimeError: if this token already holds a slot.
        """
        if self._held:
            raise RuntimeError("this SlotToken already holds a slot")
        pool = self._pool
        pool.reclaiming += 1
        try:
            await pool._limiter.acquire_on_behalf_of(self)
        finally:
            pool.reclaiming -= 1
        self._held = True

    def try_reclaim(self) -> bool:
        """Take a free slot without waiting; False if none is free or someone is
        already queued (FIFO is kept). Never blocks and is not a checkpoint.

        Raises:
          RuntimeError: if this token already holds a slot.
        """
        if self._held:
            raise RuntimeError("this SlotToken already holds a slot")
        return self.hold_nowait()

    def hold_nowait(self) -> bool:
        """`try_reclaim` for a caller that may hold a slot already (the executor's
        workers, between jobs: one call instead of two): True if this token holds
        one now; False if none is free or someone is queued (FIFO). Never blocks
        and is not a checkpoint."""
        if self._held:
            return True
        try:
            self._pool._limiter.acquire_on_behalf_of_nowait(self)
        except trio.WouldBlock:
            return False
        self._held = True
        return True

    def __enter__(self) -> SlotToken:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<SlotToken {'held' if self._held else 'released'} of {self._pool!r}>"
