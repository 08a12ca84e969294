"""A failing task nobody waits on is not silent (issue 34): the executor says so once,
on stderr, as it closes: how many, and the first one's error with its task id and
traceback. Reading a completion in any way counts; ``report_unread_failures=False``
keeps it quiet; a workflow's failed steps are read by their run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import trio

import trioexec
from trioexec import TaskStatus, Workflow, task


async def boom(n: int) -> None:
    raise RuntimeError(f"payments API said 503 ({n})")


async def test_an_unread_failure_is_reported_once_at_close(capsys: pytest.CaptureFixture[str]):
    async with trioexec.open_executor() as ex:
        ref = await ex.submit(boom, 1, name="charge-card", task_id="charge-1")
        await ex.wait_for_idle()
        assert capsys.readouterr().err == ""  # (at close, not before)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == (
        "trioexec: 1 failed task whose completion nobody read (await ref.wait(), or"
        " open_executor(report_unread_failures=False) for quiet)"
    )
    assert lines[1] == (
        "the first: 'charge-card' (task charge-1) failed: RuntimeError('payments API said 503 (1)')"
    )
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: payments API said 503 (1)"
    assert ref.status is TaskStatus.FAILED


async def test_many_unread_failures_are_counted_and_the_first_named(
    capsys: pytest.CaptureFixture[str],
):
    async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
        refs = [await ex.submit(boom, n, task_id=f"t{n}") for n in range(100)]
        await refs[0].wait()  # the first is read: the next one is named
        assert refs[1].completion is not None  # reading .completion counts too
    err = capsys.readouterr().err
    assert err.startswith("trioexec: 98 failed tasks whose completion nobody read")
    assert "the first: 'boom' (task t2) failed: RuntimeError('payments API said 503 (2)')" in err
    assert err.count("trioexec:") == 1  # once


async def test_a_timed_out_task_counts(capsys: pytest.CaptureFixture[str], autojump_clock):
    async with trioexec.open_executor() as ex:
        await ex.submit(trio.sleep_forever, timeout=5, task_id="slow")
    err = capsys.readouterr().err
    assert err.startswith("trioexec: 1 failed task")
    assert "(task slow) timed_out: TaskTimeout(" in err


async def test_read_failures_are_not_reported(capsys: pytest.CaptureFixture[str]):
    async with trioexec.open_executor() as ex:
        ref = await ex.submit(boom, 1)
        assert not (await ref.wait()).ok
        with pytest.raises(RuntimeError):
            await ex.run(boom, 2)
        await ex.submit(trio.sleep, 0)  # (a completed task is never reported)
    assert capsys.readouterr().err == ""


async def test_report_unread_failures_false_keeps_quiet(capsys: pytest.CaptureFixture[str]):
    async with trioexec.open_executor(report_unread_failures=False) as ex:
        await ex.submit(boom, 1)
    assert capsys.readouterr().err == ""


async def test_a_workflows_failed_step_is_read_by_its_run(capsys: pytest.CaptureFixture[str]):
    @task(id="explode")
    async def explode(context: trioexec.Context) -> None:
        raise ValueError("disk full")

    async with trioexec.open_executor() as ex:
        result = await ex.run_workflow(Workflow("etl", [explode]))
    assert not result.ok
    assert capsys.readouterr().err == ""


async def test_a_body_that_raises_still_reports(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(KeyError):
        async with trioexec.open_executor() as ex:
            await ex.submit(boom, 1, task_id="before")
            await ex.wait_for_idle()
            raise KeyError("the body's own error")
    assert "the first: 'boom' (task before) failed" in capsys.readouterr().err


def test_a_program_that_never_waits_says_so_on_stderr_and_exits_0(tmp_path):
    script = tmp_path / "app.py"
    script.write_text(
        textwrap.dedent(
            """
            import trio, trioexec

            async def charge(order):
                raise RuntimeError(f"card declined for order {order}")

            async def main():
                async with trioexec.open_executor() as ex:
                    for order in range(3):
                        await ex.submit(charge, order, task_id=f"charge-{order}")

            trio.run(main)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0
    assert done.stdout == ""
    assert done.stderr.startswith("trioexec: 3 failed tasks whose completion nobody read")
    assert "the first: 'charge' (task charge-0) failed" in done.stderr
    assert done.stderr.rstrip().endswith("RuntimeError: card declined for order 0")
