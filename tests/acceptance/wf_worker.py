"""Subprocess side of ``test_workflow_crash.py`` (not collected).

    python wf_worker.py DB MARKER LOG N_RUNS

Starts N_RUNS runs of the ``etl`` workflow below, waits until every run's
``extract`` step is complete and every ``wait`` step is deferred (all flushed),
prints ``READY``, and waits for its SIGKILL.
"""

from __future__ import annotations

import os
import sys

import trio

from trioexec import HealthEventKind, TaskHandle, Workflow, open_executor, open_store, task

LEASE = 0.5


def log(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def make_workflow(marker: str, log_path: str) -> Workflow:
    @task(id="extract")
    async def extract(ctx):
        log(log_path, f"extract {ctx['n']}")
        ctx["rows"] = list(range(ctx["n"]))

    @task(id="wait", dependencies=["extract"])
    async def wait(ctx, handle: TaskHandle):
        log(log_path, f"wait {ctx['n']}")
        await handle.defer_until(lambda: os.path.exists(marker), poll_interval=0.02)

    @task(id="transform", dependencies=["wait"])
    async def transform(ctx):
        log(log_path, f"transform {ctx['n']}")
        ctx["total"] = sum(ctx["rows"])

    @task(id="load", dependencies=["transform"])
    async def load(ctx):
        log(log_path, f"load {ctx['n']}")
        ctx["loaded"] = True

    return Workflow("etl", [extract, wait, transform, load])


async def main(db: str, marker: str, log_path: str, n_runs: int) -> None:
    wf = make_workflow(marker, log_path)
    with open_store(db) as store:
        async with open_executor(store=store, lease=LEASE, max_concurrent_tasks=3) as ex:
            for n in range(n_runs):
                await ex.start_workflow(wf, {"n": n})
            deferred = 0
            async for event in ex.events:  # only the `wait` steps defer
                if event.kind is HealthEventKind.TASK_DEFERRED:
                    deferred += 1
                    if deferred == n_runs:
                        break
            await ex.flush()
            print("READY", flush=True)
            await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
