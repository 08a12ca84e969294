"""Coming from Celery: tasks, retries, a rate limit, revoke, beat and a chord.

What a Celery app of this shape does with a broker, a result backend, a worker and
a beat process, trioexec does in one ``async with`` block over a store:

- ``push_invoice`` retries a flaky upstream with exponential backoff
  (Celery's ``autoretry_for`` / ``retry_backoff`` / ``max_retries``) and is
  limited to 10 starts a minute (``rate_limit="10/m"``), through an admission key;
- one submission is cancelled while it waits for the rate limit (``revoke``);
- ``report`` runs every 15 minutes (a beat schedule);
- ``pricing`` prices two regions side by side, then adds them up (a chord).

The delays are minutes, so the script runs on Trio's ``MockClock`` with autojump
(virtual time, milliseconds of real time) and the store's wall clock follows it.
In production: ``trio.run(main)`` and ``trioexec.SQLiteStore("runs.db")`` (or a
``PostgresStore``), which other processes and the ``trioexec`` command can read.

Run it with ``python examples/coming_from_celery.py``.
"""

from __future__ import annotations

import trio
import trio.testing

import trioexec
from trioexec import Backoff, Context, KeyLimit, TaskStatus, Workflow, task
from trioexec.testing import FakeWallClock


class UpstreamError(Exception):
    """A 502 from the billing API: worth retrying."""


attempts: dict[int, int] = {}


@task(
    id="push_invoice",
    retries=3,
    backoff=Backoff(initial=2.0, factor=2.0, max=60.0, jitter=0.1),
    retry_on=UpstreamError,
    key="billing-api",
)
async def push_invoice(invoice: int) -> str:
    attempts[invoice] = attempts.get(invoice, 0) + 1
    if invoice == 3 and attempts[invoice] == 1:
        raise UpstreamError("502 Bad Gateway")  # the first try of invoice 3 fails
    return f"invoice {invoice} pushed"


reports: list[str] = []


@task(id="report")
async def report(handle: trioexec.TaskHandle) -> None:
    reports.append(handle.task_id)  # "report@<time of the occurrence>"


@task(id="price_eu")
async def price_eu(ctx: Context) -> None:
    ctx["eu"] = 90.0


@task(id="price_us")
async def price_us(ctx: Context) -> None:
    ctx["us"] = 110.0


@task(id="total", dependencies=["price_eu", "price_us"])
async def total(ctx: Context) -> None:
    ctx["total"] = ctx["eu"] + ctx["us"]  # runs once both prices are in


pricing = Workflow("pricing", [price_eu, price_us, total])


async def main() -> None:
    store = trioexec.MemoryStore(clock=FakeWallClock(start=1_799_999_700.0))  # 07:55 UTC
    async with trioexec.open_executor(
        max_concurrent_tasks=4,
        store=store,
        key_limits={"billing-api": KeyLimit(rate=10, per=60.0)},
    ) as ex:
        t0 = trio.current_time()
        invoices = [await ex.submit(push_invoice, n) for n in range(12)]  # .delay(n)
        revoked = await ex.submit(push_invoice, 99, task_id="invoice-99")
        await trio.testing.wait_all_tasks_blocked()
        print("invoice-99 waits on:", revoked.waiting_on)
        assert revoked.waiting_on == "rate limit billing-api"
        revoked.cancel()  # revoke: it never runs

        ex.schedule(report, cron="*/15 * * * *", schedule_id="report")  # beat

        priced = await ex.run_workflow(pricing)  # chord(group(...), total)
        assert priced.context["total"] == 200.0

        done = [await ref.wait() for ref in invoices]
        took = trio.current_time() - t0
        await trio.sleep(3600 - took)  # an hour of the schedule
        ex.unschedule("report")

    print(f"12 invoices in {took:.0f}s (10 a minute); invoice 3 took {done[3].attempts} attempts")
    assert [c.result for c in done] == [f"invoice {n} pushed" for n in range(12)]
    assert done[3].attempts == 2
    assert 12 <= took <= 25  # 10 start at once, then one every 6 s (3 more, one a retry)
    assert (await revoked.wait()).status is TaskStatus.CANCELLED
    assert 99 not in attempts
    print("reports:", reports)
    assert reports == [f"report@2027-01-15T{t}:00Z" for t in ("08:00", "08:15", "08:30", "08:45")]
    print("store:", {str(s): n for s, n in store.counts().items() if n})  # `trioexec status`


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
