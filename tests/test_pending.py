"""`Pending`, the pending queue, against a plain list: FIFO order, cancel in O(1)
by tombstone, and compaction that never loses or reorders a live job."""

import time

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from trioexec import TaskStatus
from trioexec._machine._pending import Pending
from trioexec._spec import call_info
from trioexec._taskref import Job


async def noop():
    pass


def make_job(n: int) -> Job:
    return Job(
        None, noop, (), call_info(noop), f"t{n}", "noop", None, None, None, None, 0.0, False, True
    )  # type: ignore[arg-type]


class PendingMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.pending = Pending(time.monotonic)
        self.model: list[Job] = []  # live jobs, in order
        self.made = 0

    @rule(count=st.integers(1, 80))
    def append(self, count):
        for _ in range(count):
            job = make_job(self.made)
            self.made += 1
            self.pending.append(job)
            self.model.append(job)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def cancel(self, data):
        """What a cancel does: the job ends, then the queue is told (a tombstone)."""
        job = self.model.pop(data.draw(st.integers(0, len(self.model) - 1)))
        job.status = TaskStatus.CANCELLED
        self.pending.discard(job)

    @rule()
    def pop(self):
        job = self.pending.pop()
        if self.model:
            assert job is self.model.pop(0)
            job.status = TaskStatus.RUNNING
        else:
            assert job is None

    @invariant()
    def live_count_matches(self):
        assert self.pending.startable == len(self.model)


TestPending = PendingMachine.TestCase
# (`nox -s soak` runs it again and again under new seeds)
TestPending.settings = settings(max_examples=100, stateful_step_count=60, deadline=None)


def test_tombstones_are_compacted_once_they_are_the_majority():
    pending = Pending(time.monotonic)
    jobs = [make_job(n) for n in range(200)]
    for job in jobs:
        pending.append(job)
    for job in jobs[:150]:
        job.status = TaskStatus.CANCELLED
        pending.discard(job)
    assert pending.startable == 50
    assert "50 startable" in repr(pending)
    tombstones = int(repr(pending).split(", ")[1].split()[0])
    assert tombstones <= 64  # compacted along the way, not 150 kept
    assert [pending.pop() for _ in range(50)] == jobs[150:]
    assert pending.pop() is None
