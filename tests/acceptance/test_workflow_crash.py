"""SIGKILL a process in the middle of workflow runs; a new executor resumes every
run without redoing finished steps (real subprocess; a SQLite file, or a PostgreSQL database)."""

from __future__ import annotations

import collections
import importlib.util
import selectors
import subprocess
import sys
import time
from pathlib import Path

import trio

from trioexec import HealthEventKind, TaskStatus, open_executor, open_store

WORKER = Path(__file__).with_name("wf_worker.py")
N_RUNS = 8


def _load_worker():
    spec = importlib.util.spec_from_file_location("wf_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    """One line of the child's stdout, waiting on the pipe (not the clock) up to a bound."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            raise AssertionError(f"no output from the worker in {timeout}s")
        return proc.stdout.readline().strip()
    finally:
        sel.close()


def test_sigkill_mid_workflow_then_resume(tmp_path, db_target):
    db, marker, log = db_target, tmp_path / "landed", tmp_path / "steps.log"
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(db), str(marker), str(log), str(N_RUNS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = _read_line(proc, 30)
        assert line == "READY", (line, proc.stderr.read() if proc.poll() is not None else "")
        with open_store(db) as peek:
            assert len(peek.runs(status="running")) == N_RUNS
            deferred = peek.executions(sub_status="deferred")
            assert sorted(e.name for e in deferred) == ["wait"] * N_RUNS
        proc.kill()
        assert proc.wait(10) == -9
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()

    worker = _load_worker()
    wf = worker.make_workflow(str(marker), str(log))

    async def resume() -> None:
        with open_store(db) as store:
            async with open_executor(
                store=store, recover=True, tasks=[wf], lease=worker.LEASE
            ) as ex:
                with trio.fail_after(30):
                    # Each resumed run announces itself (the old lease must lapse first).
                    resumed = set()
                    async for event in ex.events:
                        if event.kind is HealthEventKind.WORKFLOW_PROGRESS:
                            resumed.add(event.attributes["run_id"])
                            if len(resumed) == N_RUNS:
                                break
                    marker.write_text("x")
                    for run in list(ex.workflow_runs.values()):
                        result = await run.wait()
                        assert result.ok, result
                        assert result.context["total"] == sum(range(result.context["n"]))
                        assert result.context["loaded"] is True

    started = time.monotonic()
    trio.run(resume)
    assert time.monotonic() - started < 30

    with open_store(db) as store:
        runs = store.runs()
        assert len(runs) == N_RUNS
        assert {r.status for r in runs} == {"completed"}
        for run in runs:
            assert {sid: state for sid, (state, _) in run.steps.items()} == dict.fromkeys(
                ["extract", "wait", "transform", "load"], "completed"
            )
            steps = store.executions(run_id=run.run_id)
            by_name = collections.Counter((e.name, e.status) for e in steps)
            assert by_name == {
                ("extract", TaskStatus.COMPLETED): 1,  # never re-run
                ("wait", TaskStatus.CANCELLED): 1,  # interrupted: superseded ...
                ("wait", TaskStatus.COMPLETED): 1,  # ... and run again
                ("transform", TaskStatus.COMPLETED): 1,
                ("load", TaskStatus.COMPLETED): 1,
            }

    lines = collections.Counter(line.rsplit(" ", 1)[0] for line in log.read_text().splitlines())
    for n in range(N_RUNS):
        assert lines[f"extract {n}"] == 1
        assert lines[f"wait {n}"] == 2  # re-entered defer_until after the crash
        assert lines[f"transform {n}"] == 1
        assert lines[f"load {n}"] == 1
