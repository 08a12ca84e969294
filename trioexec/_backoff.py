"""`Backoff`: growing delays, for retries and for polled conditions.

A policy value with no dependencies beyond the errors, so the spec, the handle and
the poller all use it without importing each other.
"""

from __future__ import annotations

import math
import random

import attrs

from ._errors import TaskDefinitionError


@attrs.frozen(kw_only=True)
class Backoff:
    """Growing delays: the n-th delay (n >= 1) is ``min(initial * factor**(n-1), max)``,
    then multiplied by a uniform random factor in ``[1 - jitter, 1 + jitter]``.

    Used for retry delays and as a growing ``poll_interval`` for `TaskHandle.defer_until`.

    Example::

        Backoff(initial=1.0, factor=2.0, max=60.0, jitter=0.1)  # ~1, 2, 4, ... 60 s
    """

    initial: float = 1.0
    factor: float = 2.0
    max: float = 60.0
    jitter: float = 0.0

    def __attrs_post_init__(self) -> None:
        for name in ("initial", "factor", "max", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TaskDefinitionError(f"Backoff.{name} must be a number, got {value!r}")
        if not (0 < self.initial < math.inf):
            raise TaskDefinitionError(f"Backoff.initial must be > 0, got {self.initial!r}")
        if not (self.factor >= 1 and self.factor < math.inf):
            raise TaskDefinitionError(f"Backoff.factor must be >= 1, got {self.factor!r}")
        if not (self.max >= self.initial):
            raise TaskDefinitionError(
                f"Backoff.max must be >= initial ({self.initial!r}), got {self.max!r}"
            )
        if not (0 <= self.jitter < 1):
            raise TaskDefinitionError(f"Backoff.jitter must be in [0, 1), got {self.jitter!r}")

    def base_delay(self, n: int) -> float:
        """The n-th delay (n >= 1) before jitter."""
        if n < 1:
            raise ValueError(f"delay number must be >= 1, got {n!r}")
        # Stop multiplying once past max: factor**n overflows for large n.
        delay = self.initial
        for _ in range(n - 1):
            delay *= self.factor
            if delay >= self.max:
                return self.max
        return min(delay, self.max)

    def delay(self, n: int, rng: random.Random | None = None) -> float:
        """The n-th delay (n >= 1) with jitter applied."""
        base = self.base_delay(n)
        if not self.jitter:
            return base
        u = (rng or random).uniform(1 - self.jitter, 1 + self.jitter)
        return base * u
