"""Coming from DBOS: a workflow that survives a restart, and a durable wait for a message.

Part 1, a workflow of steps. ``checkout`` reserves stock, then charges the card
once the bank confirms (the step defers, holding no slot), then ships. Its steps
are ``@trioexec.task`` functions (DBOS's ``@DBOS.step``, with retries); the
``charge`` step has the admission key ``"payments"``, limited to 2 at a time and
10 starts a minute (a DBOS ``Queue`` with ``concurrency`` and ``limiter``). The
first executor stops while ``charge`` waits (a deploy); a second one opened on
the same store with ``recover=True`` resumes the run: ``reserve`` is not run
again, its output is restored into the context.

Part 2, a durable handler. A refund waits 10 minutes (DBOS's ``DBOS.sleep``),
then for an approval message (``DBOS.recv``) that someone else sends
(``DBOS.send``). In trioexec both are durable promises: the handler awaits a
promise nobody settles until it times out, then the approval promise, which the
approver resolves. While it waits, the task is suspended in the store: no slot,
no lease, and it survives a restart of the worker.

The waits are minutes, so the script runs on Trio's ``MockClock`` with autojump
(virtual time) and the stores' wall clock follows it. In production:
``trio.run(main)`` and ``trioexec.SQLiteStore("app.db")`` (or a ``PostgresStore``).

Run it with ``python examples/coming_from_dbos.py``.
"""

from __future__ import annotations

import trio
import trio.testing

import trioexec
from trioexec import Backoff, Context, KeyLimit, RunStatus, TaskHandle, Workflow, task
from trioexec.durable import (
    DurableHandle,
    DurableStore,
    PromiseRejected,
    PromiseState,
    open_worker,
)
from trioexec.testing import FakeWallClock

# ------------------------------------------------------------------ part 1

ran: list[str] = []  # the steps that ran, in order
bank_confirmed = trio.Event()


@task(id="reserve", retries=3, backoff=Backoff(initial=1.0, factor=2.0))
async def reserve(ctx: Context) -> None:
    ran.append("reserve")
    ctx["reservation"] = f"R-{ctx['order']}"


@task(id="charge", dependencies=["reserve"], key="payments", retries=3)
async def charge(ctx: Context, handle: TaskHandle) -> None:
    ran.append("charge")
    await handle.defer_until(bank_confirmed)  # no slot held while the bank thinks
    ctx["charged"] = True


@task(id="ship", dependencies=["charge"])
async def ship(ctx: Context) -> None:
    ran.append("ship")
    ctx["shipped"] = f"{ctx['reservation']} shipped"


checkout = Workflow("checkout", [reserve, charge, ship])
queues = {"payments": KeyLimit(concurrency=2, rate=10, per=60.0)}


async def workflow_part() -> None:
    store = trioexec.MemoryStore(clock=FakeWallClock())  # SQLiteStore("app.db") in production
    with trio.move_on_after(5):  # the first process stops (a deploy) while charge waits
        async with trioexec.open_executor(store=store, key_limits=queues, lease=3) as ex:
            run = await ex.start_workflow(checkout, {"order": 7})
            await trio.sleep_forever()
    print("before the restart:", ran, store.run(run.run_id).status)
    assert ran == ["reserve", "charge"]

    bank_confirmed.set()
    async with trioexec.open_executor(
        store=store, key_limits=queues, lease=3, recover=True, tasks=[checkout]
    ) as ex:
        result = await ex.workflow_runs[run.run_id].wait()
    print("after it:", ran, result.status, result.context)
    assert ran == ["reserve", "charge", "charge", "ship"]  # reserve is not run again
    assert result.status is RunStatus.COMPLETED
    assert result.context["shipped"] == "R-7 shipped"


# ------------------------------------------------------------------ part 2


deliveries: list[float] = []  # when the handler ran (it re-runs from the top)


async def refund(param: dict[str, str], handle: DurableHandle) -> dict[str, object]:
    deliveries.append(trio.current_time())
    order = param["order"]
    try:
        await handle.await_promise(f"cooldown-{order}")  # DBOS.sleep(600)
    except PromiseRejected as exc:  # it timed out: the 10 minutes are over
        if exc.record.state is not PromiseState.REJECTED_TIMEDOUT:
            raise  # (someone rejected it instead)
    decision = await handle.await_promise(f"approval-{order}")  # DBOS.recv("approval")
    return {"order": order, "refunded": decision["approved"]}


async def durable_part() -> None:
    store = trioexec.MemoryStore(clock=FakeWallClock())  # SQLiteStore("app.db") in production
    ds = DurableStore(store)
    await ds.promises.create("cooldown-A-1", timeout=600)  # nobody settles it
    await ds.promises.create("approval-A-1", timeout=86400)
    await ds.promises.create("refund-A-1", timeout=86400, target="refunds", data={"order": "A-1"})
    async with open_worker(ds, "refunds", refund, poll_interval=30):
        await trio.sleep(900)  # 15 minutes later, someone approves:
        await ds.promises.resolve("approval-A-1", data={"approved": True})  # DBOS.send
        while (promise := await ds.promises.get("refund-A-1")).pending:  # noqa: ASYNC110
            await trio.sleep(1)
    print("refund promise:", promise.state.value, promise.data)
    print("handler ran at (s):", [round(t) for t in deliveries])
    assert promise.data == '{"order": "A-1", "refunded": true}'
    # At 0 (suspends on the cooldown), once the cooldown timed out (suspends on
    # the approval), and at 900 once approved.
    assert len(deliveries) == 3
    assert 600 <= deliveries[1] < 900 <= deliveries[2]


if __name__ == "__main__":
    for part in (workflow_part, durable_part):
        trio.run(part, clock=trio.testing.MockClock(autojump_threshold=0))
