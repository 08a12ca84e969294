"""`Pauses`: what an operator's pause holds back (`Executor.pause`).

Queued tasks that match leave the queue for ``parked``, each keeping its entry
(its place) for when the pause is lifted; a retry that matches waits between
its attempts (``retries``). Running tasks go on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import attrs

if TYPE_CHECKING:
    from .._taskref import Job
    from ._keys import Wake


@final
@attrs.define(eq=False)
class Pauses:
    """The names and keys paused now (``now``: None while nothing is), the tasks
    they hold out of the queue (``parked``) and the retries they hold (``retries``)."""

    now: tuple[frozenset[str], frozenset[str]] | None = None  # (names, keys)
    parked: dict[Job, Any] = attrs.Factory(dict)
    retries: dict[Job, Wake] = attrs.Factory(dict)

    def holds(self, job: Job) -> bool:
        if self.now is None:
            return False
        names, keys = self.now
        return job.name in names or (job.key is not None and job.key in keys)

    def park(self, entry: Any) -> None:
        """Hold ``entry``'s task (queued, in no heap now) out of the queue."""
        job = entry[2]
        job.paused = True
        self.parked[job] = entry

    def unpark(self, job: Job) -> Any:
        """``job`` leaves ``parked`` (ended, taken, or let go): its entry."""
        job.paused = False
        return self.parked.pop(job)

    def set(self, names: frozenset[str], keys: frozenset[str]) -> list[Any] | None:
        """Pause exactly these ``names`` and ``keys``. Returns the parked entries
        they no longer hold (unparked, in the queue's order) for the queue to put
        back; None if nothing was or is paused."""
        if not names and not keys and self.now is None:
            return None
        self.now = (names, keys) if names or keys else None
        back = sorted(entry for job, entry in self.parked.items() if not self.holds(job))
        for entry in back:
            self.unpark(entry[2])
        return back

    def hold_retry(self, job: Job, wake: Wake) -> bool:
        """Hold a retry's next attempt while a pause matches it, until ``wake`` is
        set: True if it is held. It stays in ``retries`` (a shutdown cancels it;
        ``waiting_on`` says ``"paused"``) until its shell takes it out, woken or
        cancelled; woken, the shell asks again (a pause may hold it again)."""
        if not self.holds(job):
            return False
        self.retries[job] = wake
        return True

    def wake_lifted(self) -> None:
        for job, wake in self.retries.items():
            if not self.holds(job):
                wake.set()
