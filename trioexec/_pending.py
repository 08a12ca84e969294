"""`Pending`: accepted tasks that have not started, in the order they start.

Submission order today (priority and per-key order later). A task cancelled
while pending leaves a tombstone the workers skip, so a cancel costs O(1); the
deque is compacted when tombstones outnumber live entries.
"""

from __future__ import annotations

from collections import deque
from typing import final

from ._records import TaskStatus
from ._taskref import Job

# Compact only past this many tombstones (and when they are the majority).
_COMPACT_AFTER = 64


@final
class Pending:
    """The pending queue. ``live`` is how many it holds, tombstones aside (a
    plain attribute: the workers read it on every turn)."""

    __slots__ = ("_jobs", "live")

    def __init__(self) -> None:
        self._jobs: deque[Job] = deque()
        self.live = 0

    def append(self, job: Job) -> None:
        self._jobs.append(job)
        self.live += 1

    def pop(self) -> Job | None:
        """The next job to start (None if there is none), tombstones skipped."""
        jobs = self._jobs
        while jobs:
            job = jobs.popleft()
            if job.status is TaskStatus.PENDING:
                self.live -= 1
                return job
        return None

    def discard(self, job: Job) -> None:
        """``job``, still in the queue, has ended (cancelled): it stays as a
        tombstone. Call after its status has left PENDING."""
        self.live -= 1
        jobs = self._jobs
        tombstones = len(jobs) - self.live
        if tombstones > _COMPACT_AFTER and tombstones * 2 > len(jobs):
            self._jobs = deque(j for j in jobs if j.status is TaskStatus.PENDING)

    def __repr__(self) -> str:
        return f"<Pending {self.live} live, {len(self._jobs) - self.live} tombstones>"
