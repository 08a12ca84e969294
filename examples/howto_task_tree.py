"""How-to: cancel an order, and every step it started stops too.

Fulfilling an order is one task, ``fulfil_order``, with a deadline (30
minutes). It fans out its steps as tasks of the same executor, which makes them
its children: reserve the stock, charge the card (deferred until the bank
confirms 3-D Secure), e-mail "order received" (the mail provider is down for a
while: e-mails are paused, so that one waits, pending). It also starts the
order's audit trail with ``detached=True``: a root of its own, which outlives
the order however it ends.

- Order 1003 is paid after a minute, and completes: its e-mail, still pending,
  is sent once the mail provider is back. A parent that ends leaves its
  children be.
- Order 1001: the customer cancels it after five minutes. Its unfinished steps
  end ``CANCELLED`` with it, the pending e-mail without running; the audit trail
  goes on, and records how the order ended.
- Order 1002: the bank never answers, and the order's deadline passes. Its
  deferred charge ends ``TIMED_OUT`` with it: it inherited the deadline.

Then the support desk cancels order 2001 through the store, as ``trioexec
cancel orders.db order-2001`` does from any process: the executor running it
follows the command, and the order's steps end with it. The store records
each step's ``parent_id``.

Customers take minutes, so this runs on Trio's ``MockClock`` with autojump
(virtual time: the run takes a fraction of a second). In production:
``trio.run(main)``.

Run it with ``python examples/howto_task_tree.py``. ``python
examples/howto_task_tree.py serve orders.db`` runs order 3001 in a worker on
that SQLite file, on the real clock, until ``trioexec cancel orders.db
order-3001`` (or its deadline) ends it.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
import trio.testing
import trio_util

import trioexec
from trioexec import TaskHandle, TaskStatus
from trioexec.testing import FakeWallClock

MINUTE = 60.0
ORDER_DEADLINE = 30 * MINUTE
STEPS = ("stock", "charge", "email", "audit")


class Shop:
    """What the steps wait on (the bank's answers, how each order ended), and
    the refs of each order's steps, by task id."""

    def __init__(self) -> None:
        self.bank: dict[str, trio.Event] = {}
        self.outcome: dict[str, trio_util.AsyncValue[str | None]] = {}
        self.steps: dict[str, trioexec.TaskRef[Any]] = {}
        self.ran: list[str] = []  # the steps that ran

    def new_order(self, order: str) -> None:
        self.bank[order] = trio.Event()
        self.outcome[order] = trio_util.AsyncValue(None)


async def reserve_stock(order: str, shop: Shop) -> str:
    shop.ran.append(f"{order}/stock")
    await trio.sleep(0.5)  # the warehouse's API
    return f"{order}: 1 item reserved"


async def charge_card(order: str, shop: Shop, handle: TaskHandle) -> str:
    shop.ran.append(f"{order}/charge")
    await handle.defer_until(shop.bank[order])  # no slot held while the bank asks the customer
    return f"ch_{order}"


async def email_order_received(order: str, shop: Shop) -> None:
    shop.ran.append(f"{order}/email")


async def audit_trail(order: str, shop: Shop, handle: TaskHandle) -> str:
    shop.ran.append(f"{order}/audit")
    outcome = shop.outcome[order]
    await handle.defer_until(outcome)  # until the storefront records how the order ended
    return f"{order}: {outcome.value}"


async def fulfil_order(ex: trioexec.Executor, order: str, shop: Shop, handle: TaskHandle) -> str:
    # Submitted from this task, each step is its child: its deadline is never
    # later than the order's, and cancelling the order cancels it.
    stock = await ex.submit(reserve_stock, order, shop, task_id=f"{order}/stock", timeout=10)
    paid = await ex.submit(charge_card, order, shop, task_id=f"{order}/charge")
    email = await ex.submit(email_order_received, order, shop, task_id=f"{order}/email")
    # The audit trail must outlive the order, however it ends: a root.
    audit = await ex.submit(audit_trail, order, shop, task_id=f"{order}/audit", detached=True)
    shop.steps.update({ref.task_id: ref for ref in (stock, paid, email, audit)})
    for step in (stock, paid):  # (not the e-mail: the order does not wait for it)
        await handle.defer_until(step)  # a TaskRef: until it has ended, with no slot held
    (await stock.wait()).unwrap()  # (at once now) a step that failed fails the order
    charge = (await paid.wait()).unwrap()
    return f"{order}: paid with {charge}"


def ended_by(error: object) -> str:
    """The ancestor whose cancel or deadline ended a task, as its error names it."""
    found = re.search(r"ancestor '([^']+)'", str(error))
    return "" if found is None else found.group(1)


def show(shop: Shop, order: trioexec.TaskRef[Any]) -> dict[str, tuple[str, str]]:
    """Print the order and its steps; return each one's (status, ancestor that ended it)."""
    seen = {}
    for ref in [order, *(shop.steps[f"{order.task_id}/{step}"] for step in STEPS)]:
        done = ref.completion
        ancestor = "" if done is None or done.error is None else ended_by(done.error)
        seen[ref.task_id] = (ref.status.value, ancestor)
        if ref.parent_id is not None:
            notes = [f"parent {ref.parent_id}"]
        else:
            notes = ["a root" if ref is order else "detached: a root"]
        if ancestor:
            notes.append(f"ended by {ancestor}")
        if done is not None and ref.task_id not in shop.ran and ref is not order:
            notes.append("never ran")
        print(f"  {ref.task_id:18} {ref.status.value:10} {', '.join(notes)}")
    return seen


async def storefront() -> None:
    """Three orders in one executor, no store."""
    shop = Shop()
    orders: dict[str, trioexec.TaskRef[Any]] = {}
    async with trioexec.open_executor(max_concurrent_tasks=4) as ex:
        ex.pause(name="email_order_received")  # the mail provider is down
        start = trio.current_time()
        for order in ("order-1001", "order-1002", "order-1003"):
            shop.new_order(order)
            orders[order] = await ex.submit(
                fulfil_order, ex, order, shop, task_id=order, timeout=ORDER_DEADLINE
            )

        await trio.sleep(1 * MINUTE)
        shop.bank["order-1003"].set()  # the customer of order 1003 confirms the payment
        assert (await orders["order-1003"].wait()).result == "order-1003: paid with ch_order-1003"
        assert shop.steps["order-1003/email"].status is TaskStatus.PENDING  # left be
        shop.outcome["order-1003"].value = "paid"

        await trio.sleep(4 * MINUTE)
        orders["order-1001"].cancel()  # the customer cancels order 1001
        await trio.testing.wait_all_tasks_blocked()
        print("order-1001: the customer cancels it at 5 min")
        seen = show(shop, orders["order-1001"])
        assert seen == {
            "order-1001": ("cancelled", ""),
            "order-1001/stock": ("completed", ""),  # it had ended: nothing to cancel
            "order-1001/charge": ("cancelled", "order-1001"),
            "order-1001/email": ("cancelled", "order-1001"),
            "order-1001/audit": ("running", ""),  # detached: it goes on
        }, seen
        assert "order-1001/email" not in shop.ran  # pending: it ended without running
        charge = await shop.steps["order-1001/charge"].wait()
        assert str(charge.error) == (
            "task 'charge_card' (order-1001/charge) was cancelled:"
            " its ancestor 'order-1001' was cancelled"
        ), charge.error
        shop.outcome["order-1001"].value = "cancelled by the customer"

        await trio.sleep(5 * MINUTE)
        ex.resume(name="email_order_received")  # the mail provider is back, at 10 min
        await trio.testing.wait_all_tasks_blocked()
        print("order-1003: paid at 1 min; its e-mail is sent at 10 min")
        seen = show(shop, orders["order-1003"])
        assert seen == {
            "order-1003": ("completed", ""),
            "order-1003/stock": ("completed", ""),
            "order-1003/charge": ("completed", ""),
            "order-1003/email": ("completed", ""),  # its parent had completed: left be
            "order-1003/audit": ("completed", ""),
        }, seen

        completion = await orders["order-1002"].wait()  # the bank never answers
        assert trio.current_time() - start == ORDER_DEADLINE
        assert str(completion.error) == "task 'fulfil_order' (order-1002) timed out after 1800.0s"
        await trio.testing.wait_all_tasks_blocked()
        print("order-1002: its deadline passes at 30 min")
        seen = show(shop, orders["order-1002"])
        assert seen == {
            "order-1002": ("timed_out", ""),
            "order-1002/stock": ("completed", ""),
            "order-1002/charge": ("timed_out", "order-1002"),  # deferred: ended all the same
            "order-1002/email": ("completed", ""),  # sent at 10 min
            "order-1002/audit": ("running", ""),
        }, seen
        shop.outcome["order-1002"].value = "timed out"

    audits = [(await shop.steps[f"{order}/audit"].wait()).result for order in orders]
    print("audit trail:", audits)
    assert audits == [
        "order-1001: cancelled by the customer",
        "order-1002: timed out",
        "order-1003: paid",
    ]


async def support_desk(db: Path) -> None:
    """Order 2001 runs in an executor on a SQLite file; the support desk cancels
    it through the store, as ``trioexec cancel`` does from another process."""
    shop = Shop()
    shop.new_order("order-2001")
    with trioexec.SQLiteStore(db, inline=True, clock=FakeWallClock(start=time.time())) as store:
        async with trioexec.open_executor(store=store, max_concurrent_tasks=4) as ex:
            ex.pause(name="email_order_received")
            order = await ex.submit(
                fulfil_order, ex, "order-2001", shop, task_id="order-2001", timeout=ORDER_DEADLINE
            )
            await trio.sleep(MINUTE)
            await ex.flush()  # (what another process sees is what has been written)

            # What `trioexec cancel orders.db order-2001` does, from any process:
            sent = store.command("cancel", task_id="order-2001", who="support desk")
            sent_at = trio.current_time()
            print(f"order-2001: the support desk cancels it: {sent.detail}")
            record = store.execution("order-2001")
            assert record is not None
            too = "2 unfinished descendant(s) too"  # its charge and its e-mail
            assert sent.detail == f"sent to its owner {record.owner}; {too}", sent.detail
            assert (await order.wait()).status is TaskStatus.CANCELLED
            for step in ("charge", "email"):
                await shop.steps[f"order-2001/{step}"].wait()
            assert trio.current_time() - sent_at <= 1.0  # it follows the store within a second
            shop.outcome["order-2001"].value = "cancelled by the support desk"
            ex.resume(name="email_order_received")

        records = {record.task_id: record for record in store.executions()}
    for task_id, record in records.items():
        print(f"  {task_id:18} {record.status.value:10} parent_id={record.parent_id}")
    assert {task_id: (r.status.value, r.parent_id) for task_id, r in records.items()} == {
        "order-2001": ("cancelled", None),
        "order-2001/stock": ("completed", "order-2001"),
        "order-2001/charge": ("cancelled", "order-2001"),
        "order-2001/email": ("cancelled", "order-2001"),
        "order-2001/audit": ("completed", None),  # detached
    }
    assert records["order-2001"].error == "TaskCancelled('cancelled by support desk')"
    print("  its charge's error:", records["order-2001/charge"].error)
    assert records["order-2001/charge"].error == (
        "TaskCancelled(\"task 'charge_card' (order-2001/charge) was cancelled:"
        " its ancestor 'order-2001' was cancelled\")"
    )


async def main(db: Path) -> None:
    await storefront()
    await support_desk(db)


async def serve(db: str) -> None:
    """A worker on ``db``, on the real clock: order 3001 runs until it ends,
    cancelled from another process (``trioexec cancel``) or past its deadline."""
    shop = Shop()
    shop.new_order("order-3001")
    with trioexec.open_store(db) as store:
        async with trioexec.open_executor(store=store) as ex:
            ex.pause(name="email_order_received")  # (so that one step is pending)
            order = await ex.submit(
                fulfil_order, ex, "order-3001", shop, task_id="order-3001", timeout=ORDER_DEADLINE
            )
            await trio.testing.wait_all_tasks_blocked()  # (its steps are submitted)
            await shop.steps["order-3001/stock"].wait()
            await ex.flush()
            print(
                f"worker (pid {os.getpid()}) on {db}: order-3001 waits for the bank;"
                f" cancel it with: trioexec cancel {db} order-3001",
                flush=True,
            )
            completion = await order.wait()
            shop.outcome["order-3001"].value = completion.status.value
            ex.resume(name="email_order_received")
            await ex.wait_for_idle()
        for record in store.executions():
            print(f"  {record.task_id:18} {record.status.value:10} {record.error or ''}")
    assert completion.status is not TaskStatus.COMPLETED  # the bank never answers


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        trio.run(serve, sys.argv[2])
    else:
        clock = trio.testing.MockClock(autojump_threshold=0)
        with tempfile.TemporaryDirectory() as tmp:
            trio.run(main, Path(tmp) / "orders.db", clock=clock)
