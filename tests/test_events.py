import pytest
import trio
import trio.testing

from trioexec import CapacityExceeded, HealthEventKind, Overflow, TaskStatus, open_executor
from trioexec._events import EventStream

K = HealthEventKind


async def test_publish_never_blocks_and_drops_oldest_when_full():
    stream = EventStream(3)
    for i in range(5):
        stream.publish(K.TASK_DEFERRED, f"t{i}")
    assert stream.dropped == 2
    assert [stream.get_nowait().task_id for _ in range(3)] == ["t2", "t3", "t4"]
    assert stream.get_nowait() is None


async def test_only_reject_and_drop_coalesce_while_unread():
    stream = EventStream(10)
    for i in range(3):
        stream.publish(K.TASK_REJECT, f"r{i}", policy=Overflow.REJECT, reason="queue_full")
    stream.publish(K.TASK_REJECT, "other", policy=Overflow.REJECT, reason="nothing_to_drop")
    stream.publish(K.TASK_DEFERRED, "d1")
    stream.publish(K.TASK_DEFERRED, "d1")
    first = stream.get_nowait()
    assert (first.kind, first.occurrence_count, first.task_id) == (K.TASK_REJECT, 3, "r2")
    # Once read, the next one starts a new event.
    stream.publish(K.TASK_REJECT, "r3", policy=Overflow.REJECT, reason="queue_full")
    rest = [stream.get_nowait() for _ in range(4)]
    assert [(e.kind, e.occurrence_count) for e in rest] == [
        (K.TASK_REJECT, 1),
        (K.TASK_DEFERRED, 1),
        (K.TASK_DEFERRED, 1),
        (K.TASK_REJECT, 1),
    ]
    assert rest[0].reason == "nothing_to_drop"


async def test_reader_wakes_and_iteration_ends_on_close():
    stream = EventStream(4)
    got = []

    async def reader():
        async for ev in stream:
            got.append(ev.task_id)

    async with trio.open_nursery() as n:
        n.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        stream.publish(K.TASK_RESUMED, "a")
        await trio.testing.wait_all_tasks_blocked()
        assert got == ["a"]
        stream.publish(K.TASK_RESUMED, "b")
        stream.close()
    assert got == ["a", "b"]


async def test_executor_publishes_reject_with_counts(autojump_clock):
    async with open_executor(
        max_concurrent_tasks=1, queue_capacity=1, overflow=Overflow.FAIL_FAST
    ) as ex:
        await ex.submit(trio.sleep, 1)
        await ex.submit(trio.sleep, 1)
        for _ in range(2):
            with pytest.raises(CapacityExceeded):
                await ex.submit(trio.sleep, 1)
        ev = ex.events.get_nowait()
    assert ev.kind is K.TASK_REJECT
    assert ev.policy is Overflow.FAIL_FAST
    assert ev.reason == "capacity_exceeded"
    assert ev.occurrence_count == 2
    assert ev.attributes == {
        "pending_depth": 1,
        "active_count": 1,
        "deferred_count": 0,
        "capacity": 2,
    }
    assert ex.statistics().rejected_count == 2


async def test_executor_drop_oldest_event_names_the_dropped_task(autojump_clock):
    async with open_executor(
        max_concurrent_tasks=1, queue_capacity=1, overflow=Overflow.DROP_OLDEST
    ) as ex:
        await ex.submit(trio.sleep, 1)
        old = await ex.submit(trio.sleep, 1)
        await ex.submit(trio.sleep, 1)
        ev = ex.events.get_nowait()
    assert old.status is TaskStatus.DROPPED
    assert (ev.kind, ev.task_id, ev.reason) == (K.TASK_DROP, old.task_id, "queue_full")


async def test_executor_event_sequence_for_defer_and_failure(autojump_clock):
    kinds = []

    async def deferring(handle):
        await handle.defer_until(lambda: trio.current_time() >= 2, poll_interval=1)
        raise RuntimeError("after resume")

    async with trio.open_nursery() as n:
        async with open_executor() as ex:

            async def read():
                async for ev in ex.events:
                    kinds.append((ev.kind, ev.task_id))

            n.start_soon(read)
            ref = await ex.submit(deferring)
    tid = ref.task_id
    assert kinds == [(K.TASK_DEFERRED, tid), (K.TASK_RESUMED, tid), (K.TASK_FAILED, tid)]


async def test_events_dropped_count_in_metrics(autojump_clock):

    ev = trio.Event()

    async def waiter(handle):
        await handle.defer_until(ev)

    async with open_executor(event_capacity=2) as ex:
        for _ in range(3):
            await ex.submit(waiter)
        await trio.testing.wait_all_tasks_blocked()
        ev.set()
    # 3 deferred + 3 resumed events into a buffer of 2.
    assert ex.statistics().events_dropped_count == 4
