"""Backpressure: a producer faster than the executor, under each overflow policy.

An executor with 2 slots and room for 4 more submissions in its queue
(``max_concurrent_tasks=2, queue_capacity=4``: at most 6 outstanding) meets a
producer that submits 30 short jobs (10 ms of work each) as fast as it can. The
executor cannot keep up, and its ``overflow`` policy decides what gives:

- ``BLOCK``: ``await ex.submit(...)`` waits for space. Nothing is lost; the
  producer is slowed to the executor's pace.
- ``REJECT``: ``submit`` raises `trioexec.TaskRejected`; the producer keeps its pace.
- ``FAIL_FAST``: ``submit`` raises `trioexec.CapacityExceeded` (a ``TaskRejected``)
  and the health event says ``capacity_exceeded``.
- ``DROP_NEWEST``: the new submission is accepted by ``submit`` but completes at
  once as ``DROPPED``; the queue keeps the oldest work.
- ``DROP_OLDEST``: the oldest *pending* submission is dropped to make room for
  the new one; the queue keeps the newest work.

For each policy it prints one row of ``ex.statistics()`` and the producer's
elapsed time, which jobs actually ran, and the health events left in
``ex.events`` after the run. Nobody reads the stream while the producer runs, so
the rejects (or drops) of a run coalesce into one unread event whose
``occurrence_count`` says how many it stands for. (A reader that keeps up, with
``async for event in ex.events``, would see them one by one.)

Run it with ``python examples/backpressure.py`` (well under a second of real
time). It asserts what it showed, so a regression makes it fail.
"""

from __future__ import annotations

from collections import Counter

import attrs
import trio

import trioexec
from trioexec import Overflow, TaskStatus

SLOTS = 2
QUEUE = 4
CAPACITY = SLOTS + QUEUE
JOBS = 30
WORK = 0.01  # seconds of work per job, holding a slot


@attrs.frozen
class Outcome:
    policy: Overflow
    stats: trioexec.ExecutorMetrics
    producer_seconds: float
    total_seconds: float
    statuses: dict[int, TaskStatus]  # job number -> final status (refused jobs absent)
    raised: Counter[str]  # exception type name -> how many submissions raised it
    events: list[trioexec.HealthEvent]


async def job(n: int) -> int:
    await trio.sleep(WORK)
    return n


async def produce(policy: Overflow) -> Outcome:
    refs: dict[int, trioexec.TaskRef] = {}
    raised: Counter[str] = Counter()
    async with trioexec.open_executor(
        max_concurrent_tasks=SLOTS, queue_capacity=QUEUE, overflow=policy
    ) as ex:
        t0 = trio.current_time()
        for n in range(1, JOBS + 1):
            try:
                refs[n] = await ex.submit(job, n, name=f"job-{n}")
            except trioexec.TaskRejected as exc:  # CapacityExceeded is a TaskRejected
                raised[type(exc).__name__] += 1
        producer_seconds = trio.current_time() - t0
        completions = [await ref.wait() for ref in refs.values()]
        total_seconds = trio.current_time() - t0
    # The executor is closed; what it published is still in the buffer.
    events = []
    while (event := ex.events.get_nowait()) is not None:
        events.append(event)
    for n, c in zip(refs, completions, strict=True):
        if c.status is TaskStatus.COMPLETED:
            assert c.result == n
    return Outcome(
        policy=policy,
        stats=ex.statistics(),
        producer_seconds=producer_seconds,
        total_seconds=total_seconds,
        statuses={n: c.status for n, c in zip(refs, completions, strict=True)},
        raised=raised,
        events=events,
    )


def ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7, 8] -> '1-3,7-8'."""
    parts = []
    i = 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        parts.append(f"{numbers[i]}" if i == j else f"{numbers[i]}-{numbers[j]}")
        i = j + 1
    return ",".join(parts) or "none"


def describe_events(events: list[trioexec.HealthEvent]) -> str:
    if not events:
        return "none"
    lines = []
    for e in events:
        a = e.attributes
        lines.append(
            f"{e.kind.value} reason={e.reason} occurrence_count={e.occurrence_count} "
            f"(latest: pending {a['pending_depth']}, active {a['active_count']}, "
            f"capacity {a['capacity']})"
        )
    return ("\n" + " " * 23).join(lines)


async def main() -> None:
    print(
        f"{JOBS} jobs of {WORK * 1000:.0f} ms, submitted as fast as possible to an executor "
        f"with {SLOTS} slots and queue_capacity={QUEUE} (capacity {CAPACITY}).\n"
    )
    outcomes = [await produce(policy) for policy in Overflow]

    header = (
        f"{'overflow':<12} {'submitted':>9} {'queued':>6} {'completed':>9} {'rejected':>8} "
        f"{'dropped':>7} {'max_outst':>9} {'producer':>9} {'all done':>9}  jobs that ran"
    )
    print(header)
    print("-" * len(header))
    for o in outcomes:
        s = o.stats
        ran = sorted(n for n, st in o.statuses.items() if st is TaskStatus.COMPLETED)
        print(
            f"{o.policy.value:<12} {s.submitted_count:>9} {s.queued_count:>6} "
            f"{s.completed_count:>9} {s.rejected_count:>8} {s.dropped_count:>7} "
            f"{s.max_outstanding_count:>9} {o.producer_seconds * 1000:>7.1f}ms "
            f"{o.total_seconds * 1000:>7.1f}ms  {ranges(ran)}"
        )

    print("\nWhat the producer saw, and the health events left unread in ex.events:")
    for o in outcomes:
        dropped = sorted(n for n, st in o.statuses.items() if st is TaskStatus.DROPPED)
        seen = ", ".join(f"{count} x {name}" for name, count in o.raised.items())
        if dropped:
            seen = ", ".join(filter(None, [seen, f"jobs {ranges(dropped)} ended DROPPED"]))
        if o.policy is Overflow.BLOCK:
            seen = "all accepted; once full, each submit waited for space"
        print(f"{o.policy.value:<12} producer: {seen}")
        print(f"{'':<12} events:   {describe_events(o.events)}")

    # ---- what this example demonstrates; a regression fails the `examples` session
    by_policy = {o.policy: o for o in outcomes}
    for o in outcomes:
        s = o.stats
        assert s.submitted_count == JOBS, (o.policy, s)
        assert s.max_outstanding_count <= CAPACITY, (o.policy, s)
        assert s.max_outstanding_count == CAPACITY, (o.policy, s)  # the producer did fill it
        assert s.failed_count == s.cancelled_count == s.timed_out_count == 0, (o.policy, s)
        assert s.active_count == s.deferred_count == s.queue_depth == 0, (o.policy, s)
        assert s.events_dropped_count == 0, (o.policy, s)
        # Every refusal or drop is in the stream, coalesced while unread.
        refusals = sum(e.occurrence_count for e in o.events)
        assert refusals == s.rejected_count + s.dropped_count, (o.policy, o.events, s)
        assert all(e.policy is o.policy for e in o.events), o.events

    block = by_policy[Overflow.BLOCK]
    assert block.stats.queued_count == block.stats.completed_count == JOBS, block.stats
    assert block.stats.rejected_count == block.stats.dropped_count == 0, block.stats
    assert not block.raised, block.raised
    assert not block.events, block.events
    # Slowed to the executor's pace: 30 jobs, 2 at a time, 10 ms each.
    assert block.producer_seconds >= (JOBS - CAPACITY) / SLOTS * WORK * 0.9, block

    for policy, error, reason in [
        (Overflow.REJECT, "TaskRejected", "queue_full"),
        (Overflow.FAIL_FAST, "CapacityExceeded", "capacity_exceeded"),
    ]:
        o = by_policy[policy]
        s = o.stats
        assert s.rejected_count > 0, (policy, s)
        assert s.dropped_count == 0, (policy, s)
        assert s.completed_count == s.queued_count == JOBS - s.rejected_count, (policy, s)
        assert o.raised == Counter({error: s.rejected_count}), (policy, o.raised)
        assert [(e.kind, e.reason) for e in o.events] == [
            (trioexec.HealthEventKind.TASK_REJECT, reason)
        ], (policy, o.events)
        assert o.producer_seconds < block.producer_seconds, (policy, o, block)

    newest = by_policy[Overflow.DROP_NEWEST]
    s = newest.stats
    assert s.dropped_count > 0, s
    assert s.rejected_count == 0, s
    assert s.completed_count == s.queued_count == JOBS - s.dropped_count, s
    # The queue kept the oldest work: the first jobs ran, the later ones were dropped.
    ran = [n for n, st in newest.statuses.items() if st is TaskStatus.COMPLETED]
    assert ran == list(range(1, s.completed_count + 1)), newest.statuses

    oldest = by_policy[Overflow.DROP_OLDEST]
    s = oldest.stats
    assert s.dropped_count > 0, s
    assert s.rejected_count == 0, s
    assert s.queued_count == JOBS, s  # each new one was queued ...
    assert s.completed_count == JOBS - s.dropped_count, s  # ... at an older one's expense
    # The queue kept the newest work: the last QUEUE jobs ran (plus those already running).
    last = range(JOBS - QUEUE + 1, JOBS + 1)
    assert all(oldest.statuses[n] is TaskStatus.COMPLETED for n in last), oldest.statuses
    for o in (newest, oldest):
        assert not o.raised, o.raised
        assert [e.kind for e in o.events] == [trioexec.HealthEventKind.TASK_DROP], o.events

    print("\nall assertions hold")


if __name__ == "__main__":
    trio.run(main)
