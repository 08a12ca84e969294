"""How-to: exactly one charge per order, its result read by id.

The shop's worker charges each order as the task ``charge-<order>`` and keeps
what the payment provider answered (``@task(keep_result=True)``). The order
page is another process: knowing only the order's number, it reads that
charge's result from the store with ``trioexec.wait_result``, waiting while the
charge is still running. The card of order 1003 is declined; order 1004 was
never charged.

Run it with ``python examples/howto_results.py``; given the path of a new file,
it keeps its database there (``python examples/howto_results.py charges.db``)
for ``trioexec result`` to read.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import trio

import trioexec
from trioexec import TaskStatus

ORDERS = {"1001": 2500, "1002": 4200, "1003": 990}  # order: amount in cents


class CardDeclined(Exception):
    pass


@trioexec.task(keep_result=True)
async def charge(order: str, cents: int) -> dict[str, object]:
    await trio.sleep(1.0)  # the payment provider's API
    if order == "1003":
        raise CardDeclined(f"order {order}: card declined")
    return {"order": order, "cents": cents, "charge": f"ch_{order}"}


async def worker(db: str) -> None:
    """The shop's worker: one charge per order, and the order page beside it."""
    with trioexec.open_store(db) as store:
        async with trioexec.open_executor(store=store) as ex:
            refs = [
                await ex.submit(charge, order, cents, task_id=f"charge-{order}")
                for order, cents in ORDERS.items()
            ]
            await ex.flush()  # recorded: from now on another process finds them by id
            ids = [f"charge-{order}" for order in [*ORDERS, "1004"]]
            await trio.run_process([sys.executable, __file__, "page", db, *ids], check=True)
            done = [(await ref.wait()).status for ref in refs]
    assert done == [TaskStatus.COMPLETED, TaskStatus.COMPLETED, TaskStatus.FAILED]


async def order_page(db: str, task_ids: list[str]) -> None:
    """Another process: what became of each charge, by its id."""
    seen = []
    with trioexec.open_store(db, read_only=True) as store:
        for task_id in task_ids:
            try:
                with trio.fail_after(10):
                    value = await trioexec.wait_result(store, task_id)
            except trioexec.TaskFailed as exc:
                print(f"{task_id}: {exc.status.value}: {exc.error}")
                seen.append("failed")
            except LookupError:
                print(f"{task_id}: no such charge")
                seen.append("unknown")
            else:
                print(f"{task_id}: {value}")
                seen.append(value["charge"])
    assert seen == ["ch_1001", "ch_1002", "failed", "unknown"]


def main(path: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = path or str(Path(tmp, "charges.db"))
        trio.run(worker, db)
    if path:
        print(f"\n{path} kept; read a charge's result with:\n  trioexec result {path} charge-1001")


if __name__ == "__main__":
    if sys.argv[1:2] == ["page"]:
        trio.run(order_page, sys.argv[2], sys.argv[3:])
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else None)
