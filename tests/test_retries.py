"""Retries of TaskSpec submissions, per-attempt timeouts, and cooperative budgets."""

import pytest
import trio
import trio.testing

from trioexec import (
    Backoff,
    HealthEventKind,
    PermanentError,
    TaskHandle,
    TaskStatus,
    TaskTimeout,
    open_executor,
    task,
)


def drain(ex):
    out = []
    while (ev := ex.events.get_nowait()) is not None:
        out.append(ev)
    return out


async def test_retry_then_succeed_with_exact_backoff_and_no_slot_held(autojump_clock):
    starts = []

    @task(retries=3, backoff=Backoff(initial=1, factor=2, max=10))
    async def flaky():
        starts.append(trio.current_time())
        if len(starts) < 3:
            raise ConnectionError(f"try {len(starts)}")
        return "ok"

    async with open_executor(max_concurrent_tasks=1) as ex:
        t0 = trio.current_time()
        ref = await ex.submit(flaky)
        # During the first backoff delay the slot is free for other work.
        await trio.testing.wait_all_tasks_blocked()
        assert ref.status is TaskStatus.PENDING
        assert ex.slots.in_use == 0
        assert await ex.run(trio.sleep, 0.5) is None
        c = await ref.wait()
        events = drain(ex)
    assert c.ok
    assert c.attempts == 3
    assert [s - t0 for s in starts] == [0, 1, 3]  # delays 1, then 2
    retry_events = [e for e in events if e.kind is HealthEventKind.TASK_RETRY_SCHEDULED]
    assert [e.attributes["attempt"] for e in retry_events] == [1, 2]
    assert [e.attributes["delay"] for e in retry_events] == [1, 2]
    assert not [e for e in events if e.kind is HealthEventKind.TASK_FAILED]


async def test_retries_exhausted_fail_once(autojump_clock):
    @task(retries=2, backoff=Backoff(initial=1))
    async def always():
        raise OSError("down")

    async with open_executor() as ex:
        c = await (await ex.submit(always)).wait()
        events = drain(ex)
    assert c.status is TaskStatus.FAILED
    assert c.attempts == 3
    kinds = [e.kind for e in events]
    assert kinds.count(HealthEventKind.TASK_RETRY_SCHEDULED) == 2
    assert kinds.count(HealthEventKind.TASK_FAILED) == 1
    assert ex.statistics().failed_count == 1


async def test_permanent_error_and_unlisted_errors_never_retry(autojump_clock):
    @task(retries=5)
    async def permanent():
        raise PermanentError("bad request")

    @task(retries=5, retry_on=(OSError,))
    async def other():
        raise KeyError("not retryable")

    async with open_executor() as ex:
        a = await (await ex.submit(permanent)).wait()
        b = await (await ex.submit(other)).wait()
    assert (a.status, a.attempts) == (TaskStatus.FAILED, 1)
    assert (b.status, b.attempts) == (TaskStatus.FAILED, 1)


async def test_plain_functions_are_not_retried(autojump_clock):
    calls = []

    async def f():
        calls.append(1)
        raise OSError

    async with open_executor() as ex:
        c = await (await ex.submit(f)).wait()
    assert c.attempts == 1
    assert calls == [1]


async def test_timeout_per_attempt_is_retried_and_final_status_timed_out(autojump_clock):
    starts = []

    @task(retries=1, timeout=5, backoff=Backoff(initial=2))
    async def hangs():
        starts.append(trio.current_time())
        await trio.sleep_forever()

    async with open_executor() as ex:
        t0 = trio.current_time()
        c = await (await ex.submit(hangs)).wait()
    assert [s - t0 for s in starts] == [0, 7]  # 5 s timeout, 2 s backoff, again
    assert c.status is TaskStatus.TIMED_OUT
    assert isinstance(c.error, TaskTimeout)
    assert c.attempts == 2
    assert ex.statistics().timed_out_count == 1


async def test_timeout_then_success(autojump_clock):
    n = 0

    @task(retries=1, timeout=5, backoff=Backoff(initial=1))
    async def second_time_lucky():
        nonlocal n
        n += 1
        await trio.sleep(10 if n == 1 else 1)
        return n

    async with open_executor() as ex:
        c = await (await ex.submit(second_time_lucky)).wait()
    assert (c.status, c.result, c.attempts) == (TaskStatus.COMPLETED, 2, 2)


async def test_cancel_during_backoff(autojump_clock):
    @task(retries=3, backoff=Backoff(initial=100, max=100))
    async def failing():
        raise OSError

    async with open_executor() as ex:
        ref = await ex.submit(failing)
        await trio.testing.wait_all_tasks_blocked()
        assert ref.status is TaskStatus.PENDING
        ref.cancel()
        c = await ref.wait()
    assert c.status is TaskStatus.CANCELLED
    assert c.attempts == 1
    assert trio.current_time() < 100


async def test_budget_counts_active_time_only(autojump_clock):
    ev = trio.Event()

    async def mostly_waiting(handle: TaskHandle):
        await trio.sleep(1)
        await handle.defer_until(ev)  # 100 s deferred: not counted
        await trio.sleep(1)

    async def busy():
        await trio.sleep(3)

    async with open_executor(task_budget=2.5) as ex:
        waiting = await ex.submit(mostly_waiting)
        over = await ex.submit(busy)
        under = await ex.submit(busy, budget=5)
        await trio.sleep(100)
        ev.set()
    assert not (await waiting.wait()).budget_exceeded
    assert (await over.wait()).budget_exceeded
    assert not (await under.wait()).budget_exceeded
    assert (await over.wait()).status is TaskStatus.COMPLETED  # cooperative: not interrupted
    assert ex.statistics().timeout_budget_exceeded_count == 1


async def test_spec_budget_and_timeout_defaults(autojump_clock):
    @task(budget=1, timeout=10)
    async def slow():
        await trio.sleep(2)

    async with open_executor() as ex:
        c = await (await ex.submit(slow)).wait()
        d = await (await ex.submit(slow, timeout=1)).wait()
    assert c.budget_exceeded
    assert c.status is TaskStatus.COMPLETED
    assert d.status is TaskStatus.TIMED_OUT


@pytest.mark.parametrize("bad", [0, -1, float("nan")])
async def test_bad_submit_timeout(bad):
    async with open_executor() as ex:
        with pytest.raises(ValueError, match="timeout"):
            await ex.submit(trio.sleep, 0, timeout=bad)
