"""A human-approval flow on durable promises, approved from another process.

A refund request is a durable task for the "refunds" target. Its handler asks for
approval by awaiting a durable promise: the promise is pending, so the task
suspends, giving up its slot and its lease; nothing runs and nothing polls while
the human thinks. Another process (here, a child process standing in for an
approver's shell or web app) resolves the approval promise; that moves the task
back to pending at once, the worker claims it again, and the handler runs again
from the top (handlers are re-entrant) and finds the approval settled.

    python examples/durable_approval.py                    # the whole story (~1 s)
    python examples/durable_approval.py approve DB ID      # what the approver runs

Given the path of a database instead, it keeps it there and the approver is
you: it runs the worker until the refund waits for its approval, says how to
give it (``trioexec promises resolve DB approval-A-1042 ...``) and stops; run
it again once approved, and the refund goes through.

    python examples/durable_approval.py approvals.db
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from trioexec.durable import (
    DurableHandle,
    DurableStore,
    PromiseRecord,
    TaskState,
    open_worker,
)

T = TypeVar("T")


async def refund(param: dict[str, object], handle: DurableHandle) -> dict[str, object]:
    print(f"  handler: refund {param['order']} for {param['amount']} — asking for approval")
    decision = await handle.await_promise(f"approval-{param['order']}")
    print(f"  handler: approval for {param['order']} is in: {decision}")
    return {"order": param["order"], "refunded": bool(decision["approved"])}


async def approve(db: str, order: str) -> None:
    """The other process: a person approving from a shell."""
    with DurableStore(db) as ds:
        await ds.promises.resolve(
            f"approval-{order}", idempotency_key=f"approve-{order}", data={"approved": True}
        )
    print(f"  approver (pid {os.getpid()}): approved {order}")


async def watch(check: Callable[[], Awaitable[T]]) -> T:
    """Look at the store until ``check()`` gives something: what an operator's
    dashboard does (the store is shared with other processes; nothing here can
    be woken by them)."""
    with trio.fail_after(10):
        while not (found := await check()):  # noqa: ASYNC110 - watching other processes
            await trio.sleep(0.02)
    return found


async def request_refund(ds: DurableStore, order: str) -> None:
    """The refund, a durable task for the "refunds" target, and its approval."""
    await ds.promises.create(f"approval-{order}", timeout=3600)
    await ds.promises.create(
        f"refund-{order}",
        timeout=3600,
        target="refunds",
        data={"order": order, "amount": 120.0},
    )


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "approvals.db")
        with DurableStore(db) as ds:
            order = "A-1042"
            await request_refund(ds, order)
            async with open_worker(ds, "refunds", refund, lease=5, poll_interval=0.05):

                async def suspended() -> bool:
                    task = await ds.tasks.get(f"refund-{order}")
                    return task is not None and task.state is TaskState.SUSPENDED

                await watch(suspended)
                print(
                    "task suspended: no slot, no lease, no polling; state in the store:",
                    (await ds.tasks.get(f"refund-{order}")).state.value,
                )
                result = await trio.run_process(
                    [sys.executable, __file__, "approve", db, order], capture_stdout=True
                )
                print(result.stdout.decode().rstrip())

                async def settled() -> PromiseRecord | None:
                    promise = await ds.promises.get(f"refund-{order}")
                    return None if promise is None or promise.pending else promise

                promise = await watch(settled)
            print("refund promise:", promise.state.value, promise.data)
            assert '"refunded": true' in (promise.data or "")
            assert await ds.check_invariants() == []


async def serve(db: str) -> None:
    """The refund on a database that stays: run the worker until the refund is
    settled, or until it waits for an approval nobody gave yet."""
    order = "A-1042"
    with DurableStore(db) as ds:
        if await ds.promises.get(f"refund-{order}") is None:
            await request_refund(ds, order)
        async with open_worker(ds, "refunds", refund, lease=5, poll_interval=0.05):

            async def waiting_or_settled() -> str | None:
                promise = await ds.promises.get(f"refund-{order}")
                if promise is not None and not promise.pending:
                    return f"refund promise: {promise.state.value} {promise.data}"
                task = await ds.tasks.get(f"refund-{order}")
                if task is not None and task.state is TaskState.SUSPENDED:
                    data = """'{"approved": true}'"""
                    return (
                        f"refund-{order} waits for approval-{order}; approve it with\n"
                        f"  trioexec promises resolve {db} approval-{order} --data {data}\n"
                        "then run this again"
                    )
                return None

            print(await watch(waiting_or_settled))


if __name__ == "__main__":
    if sys.argv[1:2] == ["approve"]:
        trio.run(approve, sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1:
        trio.run(serve, sys.argv[1])
    else:
        trio.run(main)
