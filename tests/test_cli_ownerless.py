"""After a crash, the rows of the dead executor do not look alive (issue 34): a real
executor process on a SQLite file, killed with SIGTERM (no handler: it dies at once)
while one task is deferred, one holds a slot and one is queued. Once its lease has
run out, ``trioexec status`` and ``trioexec check`` say that nobody runs them and
what becomes of them; an executor with ``recover=True`` then runs them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio
from test_cli import cli, ok

import trioexec

LIVE = (trioexec.TaskStatus.PENDING, trioexec.TaskStatus.RUNNING)

WORKER = textwrap.dedent(
    """
    import sys, trio, trioexec

    @trioexec.task(id="ownerless.wait")
    async def wait(handle):
        await handle.defer_until(trio.Event())

    @trioexec.task(id="ownerless.hold")
    async def hold():
        await trio.sleep_forever()

    async def main():
        with trioexec.SQLiteStore(sys.argv[1]) as store:
            async with trioexec.open_executor(
                store=store, max_concurrent_tasks=2, lease=0.5, tasks=[wait, hold]
            ) as ex:
                await ex.submit(wait, task_id="deferred-1")
                await ex.submit(hold, task_id="holding-1")
                await ex.submit(hold, task_id="queued-1")
                await trio.sleep_forever()

    trio.run(main)
    """
)


def until(what: str, check: object, timeout: float = 30.0) -> None:
    """Wait (bounded) until ``check()`` is true: the other process gets there."""
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def live(db: Path) -> dict[str, trioexec.ExecutionRecord]:
    with trioexec.SQLiteStore(db, read_only=True) as store:
        return {r.task_id: r for r in store.executions() if r.status in LIVE}


def test_a_killed_executors_rows_say_their_owner_is_gone(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    proc = subprocess.Popen([sys.executable, str(script), str(db)])
    try:

        def written() -> bool:
            try:
                rows = live(db)
            except trioexec.StoreError:  # (not there yet, or its schema not yet made)
                return False
            return (
                len(rows) == 3
                and rows["deferred-1"].sub_status is trioexec.SubStatus.DEFERRED
                and rows["holding-1"].status is trioexec.TaskStatus.RUNNING
            )

        until("the worker's three rows are written", written)
        # While it lives, its rows are its own.
        assert "owner gone" not in ok(cli("status", "app.db", cwd=tmp_path))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGTERM

    def noted() -> bool:
        return "owner gone" in ok(cli("status", "app.db", cwd=tmp_path))

    until("the lease runs out", noted)
    rows = ok(cli("status", "app.db", cwd=tmp_path)).splitlines()[2:]
    for task_id in ("deferred-1", "holding-1", "queued-1"):
        (row,) = [line for line in rows if line.startswith(task_id + " ")]
        assert "; an executor with recover=True will run it again" in row
        assert "owner gone " in row
    report = json.loads(ok(cli("check", "app.db", "--json", cwd=tmp_path)))
    assert report["ok"] is True
    assert sorted(line.split(" ")[0] for line in report["ownerless"]) == [
        "deferred-1",
        "holding-1",
        "queued-1",
    ]
    out = ok(cli("check", "app.db", cwd=tmp_path))
    assert "3 live execution(s) nobody runs now" in out

    # What the note says holds: an executor with recover=True runs them again.
    @trioexec.task(id="ownerless.wait")
    async def wait() -> str:
        return "woken"

    @trioexec.task(id="ownerless.hold")
    async def hold() -> str:
        return "held"

    async def recover() -> None:
        with trioexec.SQLiteStore(db) as store:
            async with trioexec.open_executor(
                store=store, recover=True, tasks=[wait, hold], lease=0.5
            ) as ex:
                await ex.wait_for_idle()

    trio.run(recover)
    with trioexec.SQLiteStore(db, read_only=True) as store:
        assert {r.task_id: r.status for r in store.executions()} == dict.fromkeys(
            ["deferred-1", "holding-1", "queued-1"], trioexec.TaskStatus.COMPLETED
        )
    assert "owner gone" not in ok(cli("status", "app.db", cwd=tmp_path))
