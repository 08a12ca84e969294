"""Tutorial, part 4: a workflow of steps that pass a context along.

A `trioexec.Workflow` is a DAG of ``@trioexec.task`` steps. Each step receives a
`trioexec.Context`: the merge of its dependencies' contexts (for a key two
dependencies both write, the one listed later in ``dependencies`` wins), and what
it writes flows to its dependents. Steps whose dependencies are complete run
concurrently through the executor's slots; a step that waits can defer like any
task. ``ex.run_workflow(...)`` returns a `trioexec.WorkflowResult`; a failed run
is returned, not raised, and the failed step's dependents are ``SKIPPED``.

    fetch --> count ----\\
         \\--> price ----> report

Run it with ``python examples/tutorial_4_workflow.py`` (about 0.4 s). It asserts
what it shows, so a regression makes it fail.
"""

from __future__ import annotations

import trio

import trioexec
from trioexec import Context, RunStatus, TaskHandle, TaskStatus, Workflow, task


@task(id="fetch")
async def fetch(ctx: Context) -> None:
    await trio.sleep(0.05)
    ctx["orders"] = [{"id": 1, "amount": 30}, {"id": 2, "amount": 70}]
    ctx["source"] = "fetch"


@task(id="count", dependencies=["fetch"])
async def count(ctx: Context) -> None:
    await trio.sleep(0.15)
    ctx["count"] = len(ctx["orders"])
    ctx["source"] = "count"


@task(id="price", dependencies=["fetch"])
async def price(ctx: Context, handle: TaskHandle) -> None:
    # Waits for an exchange rate, holding no slot meanwhile (see part 2).
    ready_at = trio.current_time() + 0.15
    await handle.defer_until(lambda: trio.current_time() >= ready_at, poll_interval=0.02)
    if ctx.get("fail_pricing"):
        raise RuntimeError("no exchange rate today")
    ctx["total_eur"] = sum(o["amount"] for o in ctx["orders"]) * 0.9
    ctx["source"] = "price"


@task(id="report", dependencies=["count", "price"])
async def report(ctx: Context) -> None:
    # Sees both branches' writes; for "source", price (listed last) wins.
    ctx["report"] = f"{ctx['count']} orders, {ctx['total_eur']:.2f} EUR (from {ctx['source']})"


pipeline = Workflow("orders", [fetch, count, price, report])


async def main() -> None:
    print(pipeline)  # <Workflow 'orders': fetch -> count -> price -> report>
    async with trioexec.open_executor(max_concurrent_tasks=2) as ex:
        start = trio.current_time()
        result = await ex.run_workflow(pipeline, {"job": "nightly"})
        elapsed = trio.current_time() - start
        print(result.status, result.context["report"], f"in {elapsed:.2f}s")
        assert result.ok
        assert result.status is RunStatus.COMPLETED
        assert result.context["report"] == "2 orders, 90.00 EUR (from price)"
        assert result.context["job"] == "nightly"  # the initial context flows through
        assert all(c.status is TaskStatus.COMPLETED for c in result.steps.values())
        assert result.steps["price"].deferred_seconds >= 0.15
        # count and price ran side by side (about 0.05 + 0.15 s in all, not
        # 0.05 + 0.15 + 0.15): price started before count had finished.
        assert result.steps["price"].started_at < result.steps["count"].finished_at

        # A step that fails (after its retries) fails the run; its dependents
        # are skipped, independent branches still finish.
        run = await ex.start_workflow(pipeline, {"fail_pricing": True})
        failed = await run.wait()
        status = run.status()
        print(failed.status, repr(failed.error), status.execution_status, status.skipped_steps)
        assert failed.status is RunStatus.FAILED
        assert not failed.ok
        assert isinstance(failed.error, RuntimeError)
        assert failed.steps["count"].status is TaskStatus.COMPLETED
        assert failed.steps["price"].status is TaskStatus.FAILED
        assert "report" not in failed.steps  # never ran
        assert (status.completed_steps, status.failed_steps, status.skipped_steps) == (2, 1, 1)


if __name__ == "__main__":
    trio.run(main)
