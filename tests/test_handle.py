"""TaskHandle.defer_until on its own: every condition kind, timing, cancellation."""

import math
import threading

import pytest
import trio
import trio.lowlevel
import trio.testing
from trio_util import AsyncBool, AsyncValue

from trioexec import Backoff, SlotPool, SubStatus, TaskDefinitionError, TaskHandle


class Observer:
    """The executor side of a handle (`trioexec._handle._Observer`), recording."""

    def __init__(self):
        self.log = []

    def deferred(self, handle, job):
        self.log.append(("deferred", handle.slot.is_held))

    def resumed(self, handle, job):
        self.log.append(("resumed", handle.slot.is_held))

    def reclaim_deadline(self, job):
        return math.inf

    async def reclaim(self, job, slot):
        await slot.reclaim()

    def poller(self):
        return None

    async def thread_resumed(self, handle):
        pass

    def thread_lend_ended(self, handle):
        pass


async def make_handle(pool=None, observer=None):
    pool = pool or SlotPool(1)
    return TaskHandle(await pool.acquire(), "t1", _observer=observer), pool


async def test_event_releases_slot_while_waiting_and_reclaims(autojump_clock):
    obs = Observer()
    handle, pool = await make_handle(observer=obs)
    event = trio.Event()
    seen = []

    async def setter():
        await trio.sleep(3)
        seen.append((pool.in_use, handle.sub_status))
        event.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(setter)
        t0 = trio.current_time()
        await handle.defer_until(event)
        assert trio.current_time() - t0 == 3
    assert seen == [(0, SubStatus.DEFERRED)]
    assert handle.slot.is_held
    assert pool.in_use == 1
    assert handle.sub_status is SubStatus.ACTIVE
    # The observer is told after release is decided, with the slot still held on
    # the way down and held again on the way up.
    assert obs.log == [("deferred", True), ("resumed", True)]
    assert handle.deferred_seconds == 3


class Waitable:
    """Any object with an async wait() and no is_set()."""

    def __init__(self):
        self.event = trio.Event()
        self.waits = 0

    async def wait(self):
        self.waits += 1
        await self.event.wait()


async def test_object_with_async_wait(autojump_clock):
    handle, pool = await make_handle()
    w = Waitable()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handle.defer_until, w)
        await trio.testing.wait_all_tasks_blocked()
        assert pool.in_use == 0
        assert w.waits == 1
        w.event.set()
    assert pool.in_use == 1


@pytest.mark.parametrize("make", [lambda: AsyncBool(False), lambda: AsyncValue(0)])
async def test_trio_util_values_wake_on_truthy(make, autojump_clock):
    handle, pool = await make_handle()
    value = make()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handle.defer_until, value)
        await trio.testing.wait_all_tasks_blocked()
        assert handle.sub_status is SubStatus.DEFERRED
        value.value = type(value.value)(0)  # still falsy: stays deferred
        await trio.testing.wait_all_tasks_blocked()
        assert handle.sub_status is SubStatus.DEFERRED
        value.value = True if isinstance(value, AsyncBool) else 7
    assert handle.sub_status is SubStatus.ACTIVE
    assert pool.in_use == 1


@pytest.mark.parametrize(
    "make_ready",
    [
        lambda: _set_event(),
        lambda: AsyncBool(True),
        lambda: AsyncValue("yes"),
        lambda: lambda: True,
        lambda: _async_true,
        lambda: lambda: [1],  # truthiness, not `is True`
    ],
)
async def test_fast_path_never_releases(make_ready, autojump_clock):
    obs = Observer()
    handle, pool = await make_handle(observer=obs)
    t0 = trio.current_time()
    await handle.defer_until(make_ready())
    assert trio.current_time() == t0
    assert obs.log == []
    assert pool.in_use == 1
    assert handle.deferred_seconds == 0


def _set_event():
    e = trio.Event()
    e.set()
    return e


async def _async_true():
    return True


async def test_fast_path_is_a_checkpoint():
    handle, _ = await make_handle()
    with trio.CancelScope() as scope:
        scope.cancel()
        await handle.defer_until(lambda: True)
    assert scope.cancelled_caught
    assert handle.slot.is_held


async def test_sync_predicate_exact_poll_counts_and_times(autojump_clock):
    handle, pool = await make_handle()
    calls = []

    def ready():
        calls.append(trio.current_time())
        return len(calls) == 4

    t0 = trio.current_time()
    await handle.defer_until(ready, poll_interval=2.5)
    # checked at once, then every 2.5 s: true on the 4th check.
    assert [c - t0 for c in calls] == [0, 2.5, 5.0, 7.5]
    assert trio.current_time() - t0 == 7.5
    assert handle.deferred_seconds == 7.5
    assert pool.in_use == 1


async def test_async_predicate_polled(autojump_clock):
    handle, _ = await make_handle()
    calls = []

    async def ready():
        await trio.lowlevel.checkpoint()
        calls.append(trio.current_time())
        return len(calls) == 3

    t0 = trio.current_time()
    await handle.defer_until(ready, poll_interval=1)
    assert [c - t0 for c in calls] == [0, 1, 2]


async def test_backoff_poll_interval(autojump_clock):
    handle, _ = await make_handle()
    calls = []

    def ready():
        calls.append(trio.current_time())
        return len(calls) == 6

    t0 = trio.current_time()
    await handle.defer_until(ready, poll_interval=Backoff(initial=1, factor=2, max=5))
    # waits 1, 2, 4, 5, 5
    assert [c - t0 for c in calls] == [0, 1, 3, 7, 12, 17]


async def test_threading_event_is_polled_via_is_set(autojump_clock):
    handle, _ = await make_handle()
    ev = threading.Event()

    async def setter():
        await trio.sleep(2.2)
        ev.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(setter)
        t0 = trio.current_time()
        await handle.defer_until(ev, poll_interval=1)
    assert trio.current_time() - t0 == 3


async def test_cancel_while_deferred_reclaims_before_propagating(autojump_clock):
    pool = SlotPool(1)
    handle, _ = await make_handle(pool)
    after = []
    with trio.move_on_after(5) as scope:
        await handle.defer_until(trio.Event())
    after.append((handle.slot.is_held, pool.in_use, handle.sub_status))
    assert scope.cancelled_caught
    assert after == [(True, 1, SubStatus.ACTIVE)]
    handle.slot.release()
    assert pool.in_use == 0


async def test_cancelled_reclaim_waits_for_a_slot_shielded(autojump_clock):
    """A cancelled deferral still queues (shielded) for a slot held by someone else."""
    pool = SlotPool(1)
    handle, _ = await make_handle(pool)
    other = pool.token()
    done = []

    async def deferrer():
        with trio.move_on_after(1):
            await handle.defer_until(trio.Event())
        done.append((trio.current_time(), handle.slot.is_held, pool.in_use))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(deferrer)
        await trio.testing.wait_all_tasks_blocked()
        await other.reclaim()  # take the slot the deferrer gave back
        await trio.sleep(10)  # the deferrer's wait is cancelled at t=1 but must queue
        assert done == []
        other.release()
    assert done[0][1:] == (True, 1)
    assert done[0][0] >= 10


async def test_raising_condition_fails_and_reclaims(autojump_clock):
    obs = Observer()
    handle, pool = await make_handle(observer=obs)
    n = 0

    def flaky():
        nonlocal n
        n += 1
        if n == 3:
            raise OSError("disk gone")
        return False

    with pytest.raises(OSError, match="disk gone"):
        await handle.defer_until(flaky, poll_interval=1)
    assert handle.slot.is_held
    assert pool.in_use == 1
    assert handle.sub_status is SubStatus.ACTIVE
    assert obs.log == [("deferred", True), ("resumed", True)]


async def test_raising_on_first_check_never_releases():
    obs = Observer()
    handle, pool = await make_handle(observer=obs)

    def boom():
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        await handle.defer_until(boom)
    assert obs.log == []
    assert pool.in_use == 1


@pytest.mark.parametrize(
    ("poll", "exc"),
    [(0, ValueError), (-1, ValueError), (float("inf"), ValueError), ("1", TypeError)],
)
async def test_bad_poll_interval_raises_before_release(poll, exc):
    obs = Observer()
    handle, pool = await make_handle(observer=obs)
    with pytest.raises(exc, match="poll_interval"):
        await handle.defer_until(trio.Event(), poll_interval=poll)
    assert pool.in_use == 1
    assert obs.log == []


@pytest.mark.parametrize("cond", [True, "ready", None, object()])
async def test_unsupported_condition_is_type_error(cond):
    handle, pool = await make_handle()
    with pytest.raises(TypeError, match="defer_until needs"):
        await handle.defer_until(cond)
    assert pool.in_use == 1


async def test_a_deadline_wakes_exactly_then_without_its_slot(autojump_clock):
    obs = Observer()
    handle, pool = await make_handle(observer=obs)
    deadline = trio.current_time() + 30
    seen = []

    async def meanwhile():
        await trio.testing.wait_all_tasks_blocked()
        seen.append((pool.in_use, handle.sub_status, handle.waiting_on))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(meanwhile)
        await handle.defer_until(deadline)
    assert trio.current_time() == deadline  # exact: no polling interval late
    assert seen == [(0, SubStatus.DEFERRED, "deadline")]
    assert obs.log == [("deferred", True), ("resumed", True)]


async def test_a_deadline_passed_returns_at_once_holding_the_slot(autojump_clock):
    obs = Observer()
    handle, pool = await make_handle(observer=obs)
    start = trio.current_time()
    await handle.defer_until(start - 1)
    await handle.defer_until(int(start))  # (an int is a deadline too)
    assert trio.current_time() == start
    assert obs.log == []
    assert pool.in_use == 1


async def test_a_nan_deadline_is_value_error():
    handle, pool = await make_handle()
    with pytest.raises(ValueError, match="deadline must be a number, got nan"):
        await handle.defer_until(math.nan)
    assert pool.in_use == 1


async def test_a_coroutine_object_is_refused_naming_the_mistake():
    handle, pool = await make_handle()

    async def ready():
        return True

    coroutine = ready()
    with pytest.raises(TypeError, match=r"coroutine object.*defer_until\(ready\), not"):
        await handle.defer_until(coroutine)
    assert coroutine.cr_frame is None  # closed: no "never awaited" warning later
    assert pool.in_use == 1


def test_bad_backoff_is_definition_error():
    with pytest.raises(TaskDefinitionError):
        Backoff(initial=0)


async def test_defer_without_slot_is_runtime_error():
    handle, _ = await make_handle()
    handle.slot.release()
    with pytest.raises(RuntimeError, match="without its slot"):
        await handle.defer_until(trio.Event())


async def test_cancelled_and_cancel_requested():
    handle, _ = await make_handle()
    assert not handle.cancel_requested
    fired = []

    async def watcher():
        await handle.cancelled()
        fired.append(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watcher)
        await trio.testing.wait_all_tasks_blocked()
        assert fired == []
        handle._request_cancel()
    assert fired == [True]
    assert handle.cancel_requested
    await handle.cancelled()  # returns at once after the fact


async def test_locals_survive_deferral(autojump_clock):
    handle, _ = await make_handle()
    big = {"rows": list(range(1000)), "cursor": object()}
    snapshot = dict(big)
    ev = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handle.defer_until, ev)
        await trio.testing.wait_all_tasks_blocked()
        ev.set()
    assert big == snapshot
    assert big["cursor"] is snapshot["cursor"]


async def test_defer_until_sync_from_a_worker_thread():
    """Real threads (autojump and threads do not mix): ordering comes from events."""
    pool = SlotPool(1)
    released = trio.Event()

    class SignalOnDefer(Observer):
        def deferred(self, handle, job):
            super().deferred(handle, job)
            released.set()

    handle = TaskHandle(await pool.acquire(), "sync", _observer=SignalOnDefer())
    ev = trio.Event()
    seen = []

    def body():
        seen.append(("before", handle.slot.is_held))
        handle.defer_until_sync(ev)
        seen.append(("after", handle.slot.is_held))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, body)
        await released.wait()
        await trio.testing.wait_all_tasks_blocked()  # release() follows the hook
        assert pool.in_use == 0
        assert handle.sub_status is SubStatus.DEFERRED
        other = await pool.acquire()  # the freed slot is usable by others
        other.release()
        ev.set()
    assert seen == [("before", True), ("after", True)]
    assert pool.in_use == 1


async def test_a_deadline_past_a_floats_range_is_never_or_passed(autojump_clock):
    handle, pool = await make_handle()
    start = trio.current_time()
    await handle.defer_until(-(10**400))  # passed: at once, holding the slot
    assert (trio.current_time(), pool.in_use) == (start, 1)
    with trio.move_on_after(1000):
        await handle.defer_until(10**400)  # never (as math.inf): only the scope ends it
    assert trio.current_time() == start + 1000
    assert pool.in_use == 1
