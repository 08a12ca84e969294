"""Ctrl-C records why (issue 34): the tasks an interrupted executor cancels end
``cancelled`` with the reason in their row, not an empty error. A real process on a
SQLite file gets a real SIGINT; in process, a block that raises says which error."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio
import trio.testing

import trioexec
from trioexec import SQLiteStore, TaskStatus

APP = textwrap.dedent(
    """
    import sys, trio, trioexec

    async def main():
        with trioexec.SQLiteStore(sys.argv[1]) as store:
            async with trioexec.open_executor(store=store, max_concurrent_tasks=1) as ex:
                await ex.submit(trio.sleep_forever, task_id="running-1")
                await ex.submit(trio.sleep_forever, task_id="queued-1")
                await ex.flush()
                print("READY", flush=True)
                await trio.sleep_forever()

    trio.run(main)
    """
)


def test_ctrl_c_records_interrupted_in_every_cancelled_row(tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    script = tmp_path / "app.py"
    script.write_text(APP)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "READY\n"
        deadline = time.monotonic() + 30
        while True:  # (the first task takes its slot right after the flush)
            with SQLiteStore(db, read_only=True) as store:
                row = store.execution("running-1")
            if row is not None and row.status is TaskStatus.RUNNING:
                break
            if time.monotonic() > deadline:
                pytest.fail("running-1 never started")
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert "KeyboardInterrupt" in err
    with SQLiteStore(db, read_only=True) as store:
        rows = {r.task_id: (r.status, r.error) for r in store.executions()}
    why = "TaskCancelled('interrupted (KeyboardInterrupt: Ctrl-C)')"
    assert rows == {
        "running-1": (TaskStatus.CANCELLED, why),
        "queued-1": (TaskStatus.CANCELLED, why),
    }


async def test_a_block_that_raises_says_which_error(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "app.db", inline=True) as store:
        with pytest.raises(KeyError):
            async with trioexec.open_executor(store=store) as ex:
                ref = await ex.submit(trio.sleep_forever, task_id="t1")
                await trio.testing.wait_all_tasks_blocked()
                raise KeyError("the body's own")
        assert ref.status is TaskStatus.CANCELLED
        assert store.execution("t1").error == (  # type: ignore[union-attr]
            'TaskCancelled("interrupted: the executor\'s block raised KeyError")'
        )


async def test_a_normal_cancel_policy_leaves_no_reason(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "app.db", inline=True) as store:
        async with trioexec.open_executor(
            store=store, shutdown_policy=trioexec.ShutdownPolicy.CANCEL
        ) as ex:
            await ex.submit(trio.sleep_forever, task_id="t1")
            await trio.testing.wait_all_tasks_blocked()
        assert store.execution("t1").error is None  # type: ignore[union-attr]
