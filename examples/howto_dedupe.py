"""How-to: exactly one charge per order, however often checkout submits it.

A customer double-clicks "Pay": two web workers, two processes on one SQLite
file, submit the charge of order 1001 at the same moment, each with the dedupe
key ``charge-1001``. The store lets one of them make the execution; the other
gets a `TaskRef` of that same execution (``ref.deduplicated``), waits for it
through the store, and gets its kept result: one charge, the same for both.

Then order 1003's card is declined. A failed charge does not hold its key: the
customer's next try, with another card, charges, and a third click gets that
charge.

Run it with ``python examples/howto_dedupe.py``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import trio

import trioexec
from trioexec import TaskStatus


class CardDeclined(Exception):
    pass


@trioexec.task(keep_result=True)  # kept: a duplicate in another process gets it
async def charge(order: str, card: str, web: str) -> dict[str, object]:
    await trio.sleep(0.5)  # the payment provider's API
    if card == "expired":
        raise CardDeclined(f"order {order}: card declined")
    return {"order": order, "charge": f"ch_{order}_{card}", "by": web}


async def checkout(db: str, web: str, order: str, card: str) -> dict[str, object]:
    """Web worker ``web``'s "Pay": charge the order, unless it is charged (or being charged)."""
    with trioexec.open_store(db) as store:
        async with trioexec.open_executor(store=store) as ex:
            ref = await ex.submit(charge, order, card, web, dedupe_key=f"charge-{order}")
            completion = await ref.wait()
    assert completion.status is TaskStatus.COMPLETED
    return {
        "web": web,
        "task_id": ref.task_id,
        "deduplicated": ref.deduplicated,
        "charge": completion.result,
    }


async def double_click(db: str) -> None:
    """Two web workers, two processes, submit order 1001's charge at once."""
    answers = []

    async def web_worker(web: str) -> None:
        command = [sys.executable, __file__, "checkout", db, web, "1001", "visa"]
        done = await trio.run_process(command, capture_stdout=True)
        answers.append(json.loads(done.stdout))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(web_worker, "web-1")
        nursery.start_soon(web_worker, "web-2")
    made, found = sorted(answers, key=lambda answer: answer["deduplicated"])
    print(f"order 1001, {made['web']}: charged {made['charge']}")
    print(f"order 1001, {found['web']}: deduplicated, got {found['charge']}")
    assert (made["deduplicated"], found["deduplicated"]) == (False, True)
    assert found["task_id"] == made["task_id"]
    made_by_one = {"order": "1001", "charge": "ch_1001_visa", "by": made["web"]}
    assert found["charge"] == made["charge"] == made_by_one
    with trioexec.open_store(db, read_only=True) as store:
        charges = [r for r in store.executions() if r.dedupe_key == "charge-1001"]
    assert len(charges) == 1  # charged once


async def declined_then_paid(db: str) -> None:
    """Order 1003: the declined charge frees its key; the next try charges."""
    with trioexec.open_store(db) as store:
        async with trioexec.open_executor(store=store) as ex:
            key = "charge-1003"
            declined = await ex.submit(charge, "1003", "expired", "web-1", dedupe_key=key)
            error = (await declined.wait()).error  # failed: the key is free
            print(f"order 1003, expired card: {error!r}")
            paid = await ex.submit(charge, "1003", "amex", "web-1", dedupe_key=key)
            again = await ex.submit(charge, "1003", "visa", "web-1", dedupe_key=key)
            print(f"order 1003, another card: charged {(await paid.wait()).result}")
            print(f"order 1003, one more click: deduplicated, got {(await again.wait()).result}")
    assert isinstance(error, CardDeclined)
    assert (paid.deduplicated, again.deduplicated) == (False, True)
    assert again.task_id == paid.task_id != declined.task_id


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp, "shop.db"))
        trioexec.SQLiteStore(db).close()  # (created once, before the web workers race)
        trio.run(double_click, db)
        trio.run(declined_then_paid, db)


if __name__ == "__main__":
    if sys.argv[1:2] == ["checkout"]:
        db, web, order, card = sys.argv[2:6]
        print(json.dumps(trio.run(checkout, db, web, order, card)))
    else:
        main()
