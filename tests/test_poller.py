"""The executor's shared poller for deferred tasks' sync predicates."""

import pytest
import trio
import trio.testing

from trioexec import Backoff, TaskHandle, TaskStatus, open_executor


async def test_one_poller_serves_every_deferred_predicate_with_exact_times(autojump_clock):
    checks: dict[int, list[float]] = {}

    async def job(i: int, handle: TaskHandle) -> float:
        t0 = trio.current_time()
        checks[i] = []

        def ready() -> bool:
            checks[i].append(trio.current_time() - t0)
            return len(checks[i]) == 4

        await handle.defer_until(ready, poll_interval=2.0 + i)
        return trio.current_time() - t0

    async with open_executor(max_concurrent_tasks=2) as ex:
        refs = [await ex.submit(job, i) for i in range(3)]
        await trio.testing.wait_all_tasks_blocked()
        poller = ex._core.workers.shared_poller
        assert poller is not None
        assert len(poller._heap) == 3  # all three wait in one heap, no task each
    for i, ref in enumerate(refs):
        c = await ref.wait()
        interval = 2.0 + i
        assert checks[i] == [0, interval, 2 * interval, 3 * interval]
        assert c.result == 3 * interval


async def test_backoff_through_the_poller(autojump_clock):
    seen = []

    async def job(handle: TaskHandle) -> None:
        t0 = trio.current_time()

        def ready() -> bool:
            seen.append(trio.current_time() - t0)
            return len(seen) == 5

        await handle.defer_until(ready, poll_interval=Backoff(initial=1, factor=2, max=3))

    async with open_executor() as ex:
        await ex.run(job)
    assert seen == [0, 1, 3, 6, 9]


async def test_a_raising_predicate_fails_the_task_through_the_poller(autojump_clock):
    n = 0

    def flaky() -> bool:
        nonlocal n
        n += 1
        if n == 3:
            raise OSError("sensor gone")
        return False

    async def job(handle: TaskHandle) -> None:
        await handle.defer_until(flaky, poll_interval=1)

    async with open_executor() as ex:
        c = await (await ex.submit(job)).wait()
        assert ex.slots.in_use == 0
    assert c.status is TaskStatus.FAILED
    assert isinstance(c.error, OSError)


async def test_cancelled_waits_leave_and_shutdown_does_not_wait_for_their_deadline(
    autojump_clock,
):
    async def patient(handle: TaskHandle) -> str:
        with trio.move_on_after(5):
            await handle.defer_until(lambda: False, poll_interval=3600)
        return "gave up"

    async with open_executor() as ex:
        c = await (await ex.submit(patient)).wait()
    assert c.result == "gave up"
    assert trio.current_time() < 100  # not an hour, waiting for a dead entry's deadline


async def test_async_predicates_keep_polling_in_their_own_task(autojump_clock):
    n = 0

    async def ready() -> bool:
        nonlocal n
        n += 1
        await trio.lowlevel.checkpoint()
        return n == 3

    async def job(handle: TaskHandle) -> None:
        await handle.defer_until(ready, poll_interval=1)

    async with open_executor() as ex:
        await ex.run(job)
        assert ex._core.workers.shared_poller is None  # only sync predicates go to the poller
    assert n == 3


@pytest.mark.parametrize("policy", ["cancel", "drain"])
async def test_shutdown_with_deferred_predicates(policy, autojump_clock):
    flag = False

    async def job(handle: TaskHandle) -> None:
        await handle.defer_until(lambda: flag, poll_interval=1)

    async with trio.open_nursery() as n:

        async def raise_flag():
            nonlocal flag
            await trio.sleep(10)
            flag = True

        n.start_soon(raise_flag)
        async with open_executor(shutdown_policy=policy) as ex:
            ref = await ex.submit(job)
    expected = TaskStatus.CANCELLED if policy == "cancel" else TaskStatus.COMPLETED
    assert ref.status is expected
