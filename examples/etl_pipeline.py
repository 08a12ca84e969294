"""A four-step ETL pipeline as a trioexec Workflow, with a file-wait step.

    extract --> wait_for_upload --> transform --> load
        \\--> upload  (another task writes the file the wait step waits for)

``wait_for_upload`` defers until a file appears: its slot is free meanwhile, so
``upload`` (and anything else) can run even with one slot. Context flows
downstream: each step reads what its dependencies wrote. Progress is printed from
the executor's ``workflow_progress`` events as it goes.

Run it with ``python examples/etl_pipeline.py`` (about a second).
"""

from __future__ import annotations

import json
import os
import tempfile

import trio

import trioexec
from trioexec import HealthEventKind, TaskHandle, Workflow, task


@task(id="extract")
async def extract(ctx: trioexec.Context) -> None:
    await trio.sleep(0.1)
    ctx["expected_file"] = ctx["workdir"] + "/orders.json"
    ctx["source"] = "orders-api"


@task(id="upload", dependencies=["extract"])
async def upload(ctx: trioexec.Context, handle: TaskHandle) -> None:
    # Another system, producing the file the next step waits for. It is slow to
    # start, and does not hold the one slot while it is.
    ready_at = trio.current_time() + 0.4
    await handle.defer_until(lambda: trio.current_time() >= ready_at, poll_interval=0.05)
    rows = [{"id": i, "amount": 10 * i} for i in range(1, 6)]
    tmp = trio.Path(ctx["expected_file"] + ".tmp")
    await tmp.write_text(json.dumps(rows))
    await tmp.rename(ctx["expected_file"])  # appears at once, complete


@task(id="wait_for_upload", dependencies=["extract"])
async def wait_for_upload(ctx: trioexec.Context, handle: TaskHandle) -> None:
    path = ctx["expected_file"]
    await handle.defer_until(lambda: os.path.exists(path), poll_interval=0.05)
    ctx["rows"] = json.loads(await trio.Path(path).read_text())


@task(id="transform", dependencies=["wait_for_upload"])
async def transform(ctx: trioexec.Context) -> None:
    ctx["total"] = sum(row["amount"] for row in ctx["rows"])
    ctx["count"] = len(ctx["rows"])


@task(id="load", dependencies=["transform"])
async def load(ctx: trioexec.Context) -> None:
    await trio.sleep(0.05)
    ctx["loaded"] = f"{ctx['count']} orders, total {ctx['total']}"


pipeline = Workflow("etl", [extract, upload, wait_for_upload, transform, load])


async def show_progress(ex: trioexec.Executor, t0: float) -> None:
    last = None
    async for event in ex.events:
        if event.kind is not HealthEventKind.WORKFLOW_PROGRESS:
            continue
        a = event.attributes
        line = (
            f"{a['execution_status']:22s} done {a['completed_steps']}/{a['total_steps']}"
            f" ({a['completion_percentage']:5.1f}%)  ready {a['ready_steps']}"
            f"  in progress {a['in_progress_steps']} (deferred {a['deferred_steps']})"
            f"  -> {a['recommended_action']}"
        )
        if line != last:
            print(f"{trio.current_time() - t0:5.2f}s  {line}")
            last = line


async def main() -> None:
    t0 = trio.current_time()
    # One slot: the file wait must give it back, or upload could never run.
    async with trio.open_nursery() as nursery, trioexec.open_executor(max_concurrent_tasks=1) as ex:
        nursery.start_soon(show_progress, ex, t0)
        with tempfile.TemporaryDirectory(prefix="etl-") as workdir:
            result = await ex.run_workflow(pipeline, {"job": "nightly", "workdir": workdir})
    print()
    print("status: ", result.status.value)
    print("loaded: ", result.context["loaded"])
    print("steps:  ", ", ".join(f"{sid}={c.status.value}" for sid, c in result.steps.items()))
    waited = result.steps["wait_for_upload"].deferred_seconds
    print(f"wait_for_upload was deferred {waited:.2f}s, holding no slot")
    assert result.ok
    assert result.context["total"] == 150
    assert waited > 0.2


if __name__ == "__main__":
    trio.run(main)
