"""Subprocess side of ``test_dashboard_browser.py`` and the dashboard's screenshots
(not a test module: never collected). An executor writing a SQLite file that a
``trioexec dashboard`` in another process shows.

Usage::

    python dashboard_executor.py DB INBOX

Opens an executor on ``open_store(DB)`` (two slots, ``recover=True``, the specs
below registered) and puts in it:

- a few quick ``resize-image`` tasks that complete, and ``charge-card``
  (task id ``charge-card-1``), which fails its first attempt (no retries): a
  dead letter that ``trioexec retry`` or the dashboard's Retry runs again (it
  succeeds then, printing ``OK charge-card-1``);
- a workflow run ``refund-1`` (fetch-order -> approval -> pay -> notify) whose
  approval step defers on the durable promise ``approval-refund-1`` (polled
  every 0.1 s); the line ``RUN refund-1 completed <JSON>`` follows its end, with
  the promise's state and data as the approval step read them.

Once all that is in the store it prints ``READY <run id> <promise id> <failed
task id> <approval step's task id>``, then follows lines on stdin:

- ``defer``: submits ``import-report`` (task id ``import-report-1``), which
  defers on a condition, the file ``INBOX/report.csv`` existing, and prints
  ``DEFERRED import-report-1`` once the store has it deferred; ``IMPORTED
  import-report-1`` when it ran to its end (the file appeared).
- ``quit`` (or end of input): leaves the executor, cancelling what has not
  ended, and prints ``BYE``.

Nothing here sleeps to wait for a state except where it polls the store for
what the executor's writer task has recorded, with a deadline.
"""

from __future__ import annotations

import json
import os
import sys

import trio

import trioexec
from trioexec import Context, TaskHandle, Workflow
from trioexec.durable import DurableStore

RUN_ID = "refund-1"
PROMISE_ID = f"approval-{RUN_ID}"
FAILED_ID = "charge-card-1"
DEFERRED_ID = "import-report-1"
POLL = 0.1  # how often the approval step and the importer look at their condition
DEADLINE = 30.0  # for the store to show what this executor did (a hang, not a wait)

INBOX = sys.argv[2] if len(sys.argv) > 2 else "."


def say(*words: object) -> None:
    print(*words, flush=True)


class FileAppears:
    """A polled condition: ``path`` exists. Says so in ``waiting_on``."""

    def __init__(self, path: str, shown: str) -> None:
        self.path = path
        self.__trioexec_waiting_on__ = f"condition {shown} exists"

    def __call__(self) -> bool:
        return os.path.exists(self.path)


@trioexec.task(id="resize-image")
async def resize_image(n: int) -> dict[str, int]:
    await trio.sleep(0.01)
    return {"image": n, "width": 640}


@trioexec.task(id="charge-card")
async def charge_card(amount: float) -> str:
    marker = trio.Path(INBOX) / "charge-card.failed-once"
    if not await marker.exists():
        await marker.touch()
        raise ConnectionError("payments API: 503 Service Unavailable")
    say("OK", FAILED_ID)
    return f"charged {amount:.2f}"


@trioexec.task(id="import-report")
async def import_report(handle: TaskHandle) -> int:
    report = os.path.join(INBOX, "report.csv")
    await handle.defer_until(FileAppears(report, "inbox/report.csv"), poll_interval=POLL)
    say("IMPORTED", DEFERRED_ID)
    return 1


def refund_workflow(ds: DurableStore) -> Workflow:
    @trioexec.task(id="fetch-order")
    async def fetch_order(ctx: Context) -> None:
        ctx["order"] = {"id": "A-1042", "amount": 120.0}

    @trioexec.task(id="approval", dependencies=["fetch-order"])
    async def approval(ctx: Context, handle: TaskHandle) -> None:
        await handle.defer_until(ds.promises.settled(ctx["promise"], poll=POLL))
        record = await ds.promises.get(ctx["promise"])
        assert record is not None
        ctx["approval"] = {"state": record.state.value, "data": json.loads(record.data)}

    @trioexec.task(id="pay", dependencies=["approval"])
    async def pay(ctx: Context) -> None:
        ctx["refunded"] = ctx["order"]["amount"]

    @trioexec.task(id="notify", dependencies=["pay"])
    async def notify(ctx: Context) -> None:
        ctx["notified"] = True

    return Workflow("refund", [fetch_order, approval, pay, notify])


async def recorded(
    ex: trioexec.Executor, store: trioexec.Store, **where: str
) -> trioexec.ExecutionRecord:
    """The first execution matching ``where`` once the store has it (flushing)."""
    with trio.fail_after(DEADLINE):
        while True:
            await ex.flush()
            found = store.executions(**where)
            if found:
                return found[0]
            await trio.sleep(0.02)


def deferred(record: trioexec.ExecutionRecord | None) -> bool:
    return record is not None and record.sub_status is trioexec.SubStatus.DEFERRED


async def finish(run: trioexec.WorkflowRun) -> None:
    result = await run.wait()
    if result.ok:
        say("RUN", RUN_ID, "completed", json.dumps(result.context["approval"]))
    else:
        say("RUN", RUN_ID, "failed", repr(result.error))


async def main(db: str) -> None:
    with trioexec.open_store(db) as store, DurableStore(store) as ds:
        await ds.promises.create(
            PROMISE_ID, 3600, data={"order": "A-1042", "amount": 120.0}, tags={"kind": "refund"}
        )
        async with (
            trioexec.open_executor(
                store=store,
                max_concurrent_tasks=2,
                recover=True,
                tasks=[resize_image, charge_card, import_report],
                shutdown_policy=trioexec.ShutdownPolicy.CANCEL,
            ) as ex,
            trio.open_nursery() as nursery,
        ):
            for n in range(6):
                await ex.submit(resize_image, n)
            failed = await ex.submit(charge_card, 120.0, task_id=FAILED_ID)
            assert not (await failed.wait()).ok
            run = await ex.start_workflow(
                refund_workflow(ds), {"promise": PROMISE_ID}, run_id=RUN_ID
            )
            nursery.start_soon(finish, run)
            approval = await recorded(ex, store, run_id=RUN_ID, sub_status="deferred")
            await recorded(ex, store, status="failed")
            say("READY", RUN_ID, PROMISE_ID, FAILED_ID, approval.task_id)
            while True:
                line = await trio.to_thread.run_sync(sys.stdin.readline)
                words = line.split()
                if not words or words[0] == "quit":
                    break
                if words[0] == "defer":
                    await ex.submit(import_report, task_id=DEFERRED_ID)
                    with trio.fail_after(DEADLINE):
                        while not deferred(store.execution(DEFERRED_ID)):
                            await ex.flush()
                            await trio.sleep(0.02)
                    say("DEFERRED", DEFERRED_ID)
                else:
                    say("UNKNOWN", *words)
            nursery.cancel_scope.cancel()
    say("BYE")


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
