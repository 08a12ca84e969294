"""A store wrapper that injects faults: failing calls and a stalled writer.

It wraps a real store (MemoryStore, or SQLiteStore in inline mode) and forwards
everything, except that the calls named in ``fail`` raise `StoreError` and
``write`` can be paused (it then blocks the Trio thread's writer task by making
the executor's inline write refuse: see `paused`).
"""

from __future__ import annotations

from typing import Any

from trioexec import StoreError


class FaultyStore:
    """Forwards to ``inner``; ``fail_on`` holds the method names that raise now."""

    def __init__(self, inner: Any, *, path: str = "faulty.db") -> None:
        self._inner = inner
        self.path = path
        self.fail_on: set[str] = set()
        self.calls: dict[str, int] = {}

    @property
    def inline(self) -> bool:
        return bool(self._inner.inline)

    @property
    def clock(self) -> Any:
        return self._inner.clock

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name in self.fail_on:
                raise StoreError(f"{self.path}: injected failure in {name}")
            return target(*args, **kwargs)

        return call
