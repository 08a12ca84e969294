"""`Backoff`: growing delays, for retries and for polled conditions.

A policy value with no dependencies beyond the errors, so the spec, the handle and
the poller all use it without importing each other.
"""

from __future__ import annotations

import math
import random

import attrs

from ._errors import TaskDefinitionError
from ._records import check_number


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
        bad, number = (TaskDefinitionError, TaskDefinitionError), "a number"
        for name in ("initial", "factor", "max", "jitter"):
            check_number(f"Backoff.{name}", getattr(self, name), float, number, errors=bad)
        check_number("Backoff.initial", self.initial, float, "> 0", gt=0, lt=math.inf, errors=bad)
        check_number("Backoff.factor", self.factor, float, ">= 1", ge=1, lt=math.inf, errors=bad)
        must = f">= initial ({self.initial!r})"
        check_number("Backoff.max", self.max, float, must, ge=self.initial, errors=bad)
        check_number("Backoff.jitter", self.jitter, float, "in [0, 1)", ge=0, lt=1, errors=bad)

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
