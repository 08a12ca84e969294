"""``trioexec result DB TASK_ID [--wait]`` (API §13): a task's kept value as JSON on
stdout and exit 0, or one line on stderr saying why not and exit 1. The real console
script on a SQLite file an executor with ``keep_results=True`` wrote.

``--wait`` runs in a child process that says, through a pipe, when it has found the
execution live and waits for it; only then does this process's executor let the
task complete (no sleeping: each side waits for the other's word)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from test_cli import cli, cli_env, interruptible, ok, one_line_error

import trioexec
from trioexec import TaskStatus
from trioexec._changes import Start, submitted

KEPT = "report[/] it's \N{PARTY POPPER}"  # (an id that is markup, quoted and emoji)
VALUE = {
    "rows": [1, 2.5, None, True],
    "note": "it's [bold]fine[/] \N{PARTY POPPER}",
    "pair": (1, "a"),
}
#: VALUE as JSON gives it back: the tuple is a list.
DECODED = {**VALUE, "pair": [1, "a"]}
#: What the command prints for it: ``json.dumps`` of the value, as the store keeps it.
PRINTED = (
    '{"rows": [1, 2.5, null, true], "note": "it\'s [bold]fine[/] \\ud83c\\udf89",'
    ' "pair": [1, "a"]}\n'
)


async def report() -> dict[str, Any]:
    return VALUE


async def nothing() -> None:
    return None


async def charge_card() -> None:
    raise ValueError("card declined [/]")


async def hang() -> None:
    await trio.sleep_forever()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """app.db: tasks that completed with and without a kept value, failed, timed
    out and were cancelled (a real executor with keep_results=True), and two live
    executions of another executor (written as it would leave them): one running,
    held by its live owner, one pending that nobody holds."""
    path = tmp_path_factory.mktemp("result") / "app.db"

    async def main() -> None:
        with trioexec.open_store(path) as store:
            async with trioexec.open_executor(store=store, keep_results=True) as ex:
                refs = [
                    await ex.submit(report, task_id=KEPT),
                    await ex.submit(nothing, task_id="none"),
                    await ex.submit(report, task_id="not-kept", keep_result=False),
                    await ex.submit(charge_card, task_id="charge-card"),
                    await ex.submit(hang, task_id="timed", timeout=0.01),
                ]
                cancelled = await ex.submit(hang, task_id="cancelled")
                await trio.testing.wait_all_tasks_blocked()
                cancelled.cancel()
                for ref in [*refs, cancelled]:
                    await ref.wait()
            now = time.time()
            store.heartbeat("w2", now + 3600)
            store.write(
                [
                    submitted("crunch-1", 1, "crunch", None, None, None, "w2", now),
                    Start(("crunch-1", 1, 1, now)),
                    submitted("queued-1", 1, "queued", None, None, None, None, now),
                ]
            )

    trio.run(main)
    return path


@pytest.mark.parametrize(
    ("task_id", "printed"), [(KEPT, PRINTED), ("none", "null\n")], ids=["value", "none"]
)
def test_the_kept_value_is_printed_as_json(db: Path, task_id: str, printed: str) -> None:
    out = ok(cli("result", "app.db", task_id, cwd=db.parent))
    assert out == printed
    assert json.loads(out) == (DECODED if task_id == KEPT else None)


@pytest.mark.parametrize(
    ("task_id", "line"),
    [
        ("it's \N{PARTY POPPER}[/]", 'no execution "it\'s \N{PARTY POPPER}[/]"'),
        ("charge-card", "task 'charge-card' ended failed: ValueError('card declined [/]')"),
        (
            "timed",
            "task 'timed' ended timed_out:"
            " TaskTimeout(\"task 'hang' (timed) timed out after 0.01s\")",
        ),
        ("cancelled", "task 'cancelled' ended cancelled"),
        (
            "not-kept",
            "execution 'not-kept' completed without a kept result"
            " (open_executor(keep_results=True), or keep_result=True on @task or submit)",
        ),
        (
            "crunch-1",
            "execution 'crunch-1' has not ended yet (it is running); --wait waits for it",
        ),
        (
            "queued-1",
            "execution 'queued-1' has not ended yet (it is pending; no owner; orphaned:"
            " it cannot be re-created, recovery will fail it); --wait waits for it",
        ),
    ],
    ids=["unknown", "failed", "timed-out", "cancelled", "not-kept", "running", "pending"],
)
def test_why_there_is_no_value_is_one_line(db: Path, task_id: str, line: str) -> None:
    assert one_line_error(cli("result", "app.db", task_id, cwd=db.parent), 1) == (
        f"trioexec: app.db: {line}"
    )


def test_wait_on_an_ended_or_unknown_task_answers_at_once(db: Path) -> None:
    out = ok(cli("result", "app.db", KEPT, "--wait", cwd=db.parent))
    assert out == PRINTED
    line = one_line_error(cli("result", "app.db", "nope", "--wait", cwd=db.parent), 1)
    assert line == "trioexec: app.db: no execution 'nope'"


@pytest.mark.parametrize(
    ("args", "code", "line"),
    [
        (["result", "missing.db", "x"], 1, "trioexec: missing.db: no such database file"),
        (
            ["result", "app.db", ""],
            2,
            "trioexec: task id must not be empty (see 'trioexec result --help')",
        ),
    ],
    ids=["missing-db", "empty-id"],
)
def test_bad_arguments_are_one_line(db: Path, args: list[str], code: int, line: str) -> None:
    assert one_line_error(cli(*args, cwd=db.parent), code) == line
    assert not (db.parent / "missing.db").exists()


# ---------------------------------------------------------------------- --wait

#: The command, run as the console script runs it, in a child that writes
#: "waiting" to the file descriptor argv[1] once it has read the execution live
#: twice (its own look, then `wait_result`'s first): it waits from then on.
WAITING = """
import os, sys
from trioexec._store._base import LIVE
from trioexec._store._sql_store import SQLStore
from trioexec.cli import run

ready = int(sys.argv[1])
read = SQLStore.execution
live = 0

def execution(self, task_id):
    global live
    record = read(self, task_id)
    if record is not None and record.status in LIVE:
        live += 1
        if live == 2:
            os.write(ready, b"waiting")
            os.close(ready)
    return record

SQLStore.execution = execution
run(sys.argv[2:])
"""


def start_waiting(db: str, task_id: str, cwd: Path) -> tuple[subprocess.Popen[str], int]:
    """``trioexec result DB TASK_ID --wait`` in a child, and the pipe it says
    "waiting" on."""
    ready, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITING, str(write_end), "result", db, task_id, "--wait"],
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        pass_fds=(write_end,),
        preexec_fn=interruptible,
    )
    os.close(write_end)
    return proc, ready


def until_waiting(proc: subprocess.Popen[str], ready: int) -> None:
    """Block until the child says it waits (at most 30 s: it may have failed)."""
    try:
        said = os.read(ready, 16) if select.select([ready], [], [], 30)[0] else b""
    finally:
        os.close(ready)
    if said != b"waiting":
        proc.kill()
        _, errors = proc.communicate()
        pytest.fail(f"the command never waited: {errors}")


def test_wait_prints_the_value_once_the_task_completes(db_target: str, tmp_path: Path) -> None:
    """On a SQLite file (it polls) and on a PostgreSQL URL (a notification wakes
    it), while this process's executor runs the task."""

    async def main() -> subprocess.Popen[str]:
        with trioexec.open_store(db_target) as store:
            async with trioexec.open_executor(store=store, keep_results=True) as ex:
                go = trio.Event()

                async def slow() -> dict[str, Any]:
                    await go.wait()
                    return VALUE

                ref = await ex.submit(slow, task_id=KEPT)
                await ex.flush()  # (its row is in the store: the command finds it live)
                proc, ready = start_waiting(db_target, KEPT, tmp_path)
                await trio.to_thread.run_sync(until_waiting, proc, ready)
                go.set()
                assert (await ref.wait()).ok
        return proc

    proc = trio.run(main)
    out, errors = proc.communicate(timeout=30)
    assert (proc.returncode, errors) == (0, "")
    assert out == PRINTED


def test_ctrl_c_while_waiting_is_one_line(db: Path) -> None:
    proc, ready = start_waiting("app.db", "crunch-1", db.parent)
    until_waiting(proc, ready)
    proc.send_signal(signal.SIGINT)
    out, errors = proc.communicate(timeout=30)
    assert (proc.returncode, out, errors) == (130, "", "trioexec: interrupted\n")
    with trioexec.open_store(db, read_only=True) as store:
        record = store.execution("crunch-1")
    assert record is not None
    assert record.status is TaskStatus.RUNNING  # (waiting on it never touches it)
