"""Operators' commands from another process (issue 18, deliver 2 and 3):
``trioexec pause|resume|cancel|retry`` reach a real worker process through its
store (SQLite file or PostgreSQL) within a second, and every command is
recorded with who sent it.

The worker is ``control_worker.py`` next to this file; it announces what it does
on stdout, and nothing here sleeps to wait for a state.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from lineproc import LineProcess

import trioexec

HERE = Path(__file__).resolve().parent
WORKER = HERE / "control_worker.py"
CLI = [sys.executable, "-m", "trioexec"]
NAME = "alpha"
# The commands' effect is promised within a second (a poll every 0.5 s); a
# loaded two-core machine adds its scheduling delay on top.
WITHIN = 1.0 + 0.5


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def worker(tmp_path, db_target):
    proc = LineProcess(
        WORKER,
        [db_target, str(tmp_path / "flaky-marker")],
        tmp_path / "worker.stderr",
        stdin=subprocess.PIPE,
    )
    proc.expect("READY")
    yield proc
    proc.cleanup()


def send(worker: LineProcess, line: str) -> None:
    assert worker.proc.stdin is not None
    worker.proc.stdin.write(f"{line}\n".encode())
    worker.proc.stdin.flush()


def said(worker: LineProcess, *words: str) -> list[str]:
    """The worker's first line starting with ``words`` (read already, or coming)."""
    n = len(words)
    for line in worker.lines:
        if line.split()[:n] == list(words):
            return line.split()
    while True:
        fields = worker.expect(words[0])
        if fields[:n] == list(words):
            return fields


def last_command_at(db: str) -> float:
    """When the store recorded its latest command (the store's clock: this host's)."""
    return json.loads(cli("commands", db, "--json").stdout)[-1]["at"]


def submit(worker: LineProcess, spec: str, task_id: str) -> str:
    """Submit and return its waiting_on as the worker saw it once queued."""
    send(worker, f"submit {spec} {task_id}")
    words = worker.expect("QUEUED")
    assert words[1] == task_id
    return words[2]


def test_pause_and_resume_reach_the_worker_within_a_second(worker, db_target):
    done = cli("pause", db_target, "--name", NAME)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"name {NAME}: paused"
    words = worker.expect("PAUSED")
    sent = last_command_at(db_target)
    assert words[2:] == [NAME, "-"]
    assert float(words[1]) - sent <= WITHIN
    assert submit(worker, "alpha", "a1") == "paused"
    assert submit(worker, "beta", "b1") in ("slot", "None")
    said(worker, "START", "beta", "b1")
    status = cli("status", db_target, "--waiting-on", "paused", "--json")
    assert [r["task_id"] for r in json.loads(status.stdout)] == ["a1"]
    assert f"paused: name {NAME}\n" in cli("status", db_target).stdout
    # Twice is once: recorded, nothing changes.
    again = cli("pause", db_target, "--name", NAME)
    assert again.stdout.strip() == f"name {NAME}: already paused"

    done = cli("resume", db_target, "--name", NAME)
    assert done.stdout.strip() == f"name {NAME}: resumed"
    words = worker.expect("PAUSED")
    sent = last_command_at(db_target)
    assert words[2:] == ["-", "-"]
    assert float(words[1]) - sent <= WITHIN
    said(worker, "START", "alpha", "a1")
    assert said(worker, "END", "a1")[2] == "completed"

    log = json.loads(cli("commands", db_target, "--json").stdout)
    assert [(c["kind"], c["name"], c["changed"]) for c in log] == [
        ("pause", NAME, True),
        ("pause", NAME, False),
        ("resume", NAME, True),
    ]
    assert all("@" in c["who"] and " pid " in c["who"] for c in log)


def test_cancel_stops_a_running_task_in_the_worker(worker, db_target):
    submit(worker, "slow", "s1")
    said(worker, "START", "slow", "s1")
    done = cli("cancel", db_target, "s1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("s1: sent to its owner")
    ended = said(worker, "END", "s1")
    assert ended[2] == "cancelled"
    assert float(ended[3]) - last_command_at(db_target) <= WITHIN
    [row] = json.loads(cli("status", db_target, "--json").stdout)
    assert row["status"] == "cancelled"
    assert "cancelled by " in row["error"]  # who, as the command log says
    assert " pid " in row["error"]
    again = cli("cancel", db_target, "s1", "nope")
    assert again.returncode == 1
    assert again.stdout.splitlines() == ["s1: already finished (cancelled)", "nope: no such task"]


def test_a_failed_task_is_kept_and_retry_runs_it_again(worker, db_target):
    submit(worker, "flaky", "f1")
    assert said(worker, "END", "f1")[2] == "failed"
    failed = json.loads(cli("status", db_target, "--status", "failed", "--json").stdout)
    [record] = failed
    assert record["task_id"] == "f1"
    assert "ValueError: flaky f1 fails its first run" in record["traceback"]
    assert json.loads(record["args"]) == ["f1"]
    attempt = record["attempt"]

    done = cli("retry", db_target, "f1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"f1: requeued (attempt {attempt + 1} next)")
    # The worker has recover=True: the retry command starts its recovery at once.
    said(worker, "OK", "f1")
    send(worker, "quit")
    worker.expect("BYE")
    status = json.loads(cli("status", db_target, "--json").stdout)
    assert {r["task_id"]: r["status"] for r in status} == {"f1": "completed"}
    refused = cli("retry", db_target, "f1")
    assert refused.returncode == 1
    assert "f1: not requeued: completed" in refused.stderr
    log = json.loads(cli("commands", db_target, "--json").stdout)
    assert [c["kind"] for c in log] == ["retry", "retry"]


def test_retry_failed_filters_and_usage_errors(tmp_path):
    db = str(tmp_path / "none.db")
    assert cli("retry", db, "--failed").returncode == 1  # no such file: one line
    usage = cli("retry", db, "x", "--failed")
    assert usage.returncode == 2
    assert "task ids or --failed" in usage.stderr
    assert "--name and --since go with --failed" in cli("retry", db, "x", "--name", "n").stderr
    assert "at least one --name or --key" in cli("pause", db).stderr
    assert "neither a duration" in cli("retry", db, "--failed", "--since", "soon").stderr


def test_retry_failed_by_name_and_since(tmp_path):
    db = str(tmp_path / "runs.db")

    @trioexec.task(id="nightly-export")
    async def export(day: str) -> None:
        raise ValueError(f"no data for {day}")

    async def fail_one() -> None:
        with trioexec.SQLiteStore(db) as store:
            async with trioexec.open_executor(store=store, tasks=[export]) as ex:
                await (await ex.submit(export, "2026-11-26", task_id="e1")).wait()

    trio.run(fail_one)
    other = cli("retry", db, "--failed", "--name", "something-else")
    assert (other.returncode, other.stdout.strip()) == (0, "nothing to requeue")
    later = cli("retry", db, "--failed", "--since", "2999-01-01T00:00")
    assert later.stdout.strip() == "nothing to requeue"
    done = cli("retry", db, "--failed", "--name", "nightly-export", "--since", "2000-01-01T00:00")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("e1: requeued (attempt 2 next)")
