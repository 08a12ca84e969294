"""How-to: back off from a rate-limited API without holding a slot.

Part 1, a backoff inside a task. ``sync_orders`` gets "429 Too Many Requests,
retry after 30 s" half-way through its work. It waits until a deadline,
``handle.defer_until(trio.current_time() + exc.retry_after)`` (woken exactly then,
no polling): the slot is free during the backoff, so three 10-second reports run in it, and the
task then carries on with its local state (the pages fetched so far). The same
workload with ``await trio.sleep(retry_after)`` instead holds the only slot for
the whole 30 s, and the reports wait.

Part 2, retries between attempts. ``@task(retries=3, backoff=Backoff(...),
retry_on=RateLimited)`` re-runs a task that raised ``RateLimited`` after 2 s, then
4 s, ... The slot is not held during those delays either. An error that retrying
cannot fix is raised as `trioexec.PermanentError`: no retry.

The delays are tens of seconds, so the script runs on Trio's ``MockClock`` with
autojump (virtual time, exact durations, milliseconds of real time). In
production: ``trio.run(main)``.

Run it with ``python examples/howto_rate_limits.py``.
"""

from __future__ import annotations

import trio
import trio.testing

import trioexec
from trioexec import Backoff, HealthEventKind, PermanentError, TaskHandle, TaskStatus, task


class RateLimited(Exception):
    def __init__(self, retry_after: float) -> None:
        super().__init__(f"429 Too Many Requests; retry after {retry_after}s")
        self.retry_after = retry_after


class OrdersAPI:
    """A fake API that answers 429 to the 3rd request, once."""

    def __init__(self) -> None:
        self.requests = 0

    async def page(self, n: int) -> list[int]:
        self.requests += 1
        await trio.sleep(1)  # the request
        if self.requests == 3:
            raise RateLimited(retry_after=30)
        return [n * 10 + i for i in range(10)]


# ----------------------------------------------------------------- part 1


async def sync_orders(api: OrdersAPI, handle: TaskHandle) -> int:
    fetched: list[int] = []  # local state, kept across the backoff
    n = 0
    while n < 4:
        try:
            fetched += await api.page(n)
        except RateLimited as exc:
            # A deadline on Trio's clock: the slot is free until then, and the
            # task wakes exactly at retry_at (no polling), then retries the page.
            await handle.defer_until(trio.current_time() + exc.retry_after)
            continue
        n += 1
    return len(fetched)


async def sync_orders_sleeping(api: OrdersAPI) -> int:
    """The same task holding its slot through the backoff."""
    fetched: list[int] = []
    n = 0
    while n < 4:
        try:
            fetched += await api.page(n)
        except RateLimited as exc:
            await trio.sleep(exc.retry_after)  # holds the slot
            continue
        n += 1
    return len(fetched)


async def report(t0: float) -> float:
    await trio.sleep(10)
    return trio.current_time() - t0  # when it finished


async def backoff_in_task(defer: bool) -> tuple[float, list[float]]:
    api = OrdersAPI()
    async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
        t0 = trio.current_time()
        if defer:
            sync = await ex.submit(sync_orders, api)
        else:
            sync = await ex.submit(sync_orders_sleeping, api)
        await trio.sleep(2.5)  # the reports arrive just before the 429
        reports = [await ex.submit(report, t0) for _ in range(3)]
        done = await sync.wait()
        finished = [(await r.wait()).result for r in reports]
    assert done.result == 40, done
    return trio.current_time() - t0, finished


# ----------------------------------------------------------------- part 2


@task(
    id="push_invoice",
    retries=3,
    backoff=Backoff(initial=2, factor=2, max=60),
    retry_on=RateLimited,
)
async def push_invoice(invoice: int, t0: float, attempt_times: list[float]) -> str:
    attempt_times.append(trio.current_time() - t0)
    if len(attempt_times) < 3:
        raise RateLimited(retry_after=0)  # the server does not say: use our Backoff
    return f"invoice {invoice} pushed"


@task(id="push_bad_invoice", retries=3, backoff=Backoff(initial=2), retry_on=Exception)
async def push_bad_invoice(invoice: int) -> str:
    raise PermanentError(f"invoice {invoice}: 401 invalid API key")  # retrying will not help


async def retries_between_attempts() -> None:
    attempt_times: list[float] = []
    async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
        t0 = trio.current_time()
        ref = await ex.submit(push_invoice, 17, t0, attempt_times)
        await trio.testing.wait_all_tasks_blocked()  # the first attempt failed
        assert ref.status is TaskStatus.PENDING  # waiting to retry ...
        assert ex.slots.in_use == 0  # ... holding no slot
        await ex.run(trio.sleep, 1)  # other work fits in the delay
        done = await ref.wait()
        bad = await (await ex.submit(push_bad_invoice, 18)).wait()
        events = []
        while (event := ex.events.get_nowait()) is not None:
            events.append(event)

    retries = [e for e in events if e.kind is HealthEventKind.TASK_RETRY_SCHEDULED]
    print(f"push_invoice: {done.result!r}, attempts at {attempt_times} s")
    print(f"  retry delays from task_retry_scheduled: {[e.attributes['delay'] for e in retries]}")
    print(f"push_bad_invoice: {bad.status} after {bad.attempts} attempt: {bad.error}")
    assert done.ok
    assert done.attempts == 3
    assert attempt_times == [0, 2, 6]  # delays 2, then 4
    assert [e.attributes["delay"] for e in retries] == [2, 4]
    assert bad.status is TaskStatus.FAILED
    assert bad.attempts == 1  # PermanentError is never retried
    assert isinstance(bad.error, PermanentError)


async def main() -> None:
    deferring, finished = await backoff_in_task(defer=True)
    sleeping, finished_sleeping = await backoff_in_task(defer=False)
    print(f"defer_until in the backoff: all done at {deferring:.0f}s, reports at {finished}")
    print(
        f"trio.sleep in the backoff:  all done at {sleeping:.0f}s, reports at {finished_sleeping}"
    )
    # The 429 comes at t=3 (the 3rd 1 s request). Deferring, the reports run in
    # the free slot at 3-13, 13-23, 23-33; sync_orders is due back at 33, takes the
    # slot the last report leaves, and fetches its last two pages by 35.
    assert finished == [13, 23, 33], finished
    assert deferring == 35, deferring
    # Sleeping, sync_orders holds the slot until 35 and the reports come after it.
    assert finished_sleeping == [45, 55, 65], finished_sleeping
    assert sleeping == 65, sleeping
    await retries_between_attempts()


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
