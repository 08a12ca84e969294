"""``trioexec demo --quick`` (issue 19 item 5), as a person sees it under a terminal
(pexpect, waiting for output with timeouts: no sleeps here) and as it leaves its
database; and the workload's plan and simulation, in process.

What a person must see: the live panel with the slots, the tasks waiting and on
what (an event, a polled condition, the workflow's durable promise), the retry,
then the summary with and without deferral and the three commands to inspect
what it wrote, all of which work on that database.
"""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pexpect
import pytest
import trio
from test_cli import ANSI, TRIOEXEC, cli, cli_env, ok, squash

from trioexec import SQLiteStore, TaskStatus
from trioexec._demo import (
    DEFAULT_SECONDS,
    QUICK_SECONDS,
    demo_plan,
    simulate,
)
from trioexec.durable import DurableStore, PromiseState

TOTAL = 48 + 2 + 1 + 4  # the base tasks, two file importers, charge-card, four steps


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str, float]:
    """One ``trioexec demo --quick --db demo.db`` under a 140x50 pseudo-terminal:
    (its directory, the raw transcript, what was read up to its end, seconds)."""
    cwd = tmp_path_factory.mktemp("demo")
    transcript = io.StringIO()
    started = time.monotonic()
    child = pexpect.spawn(
        TRIOEXEC[0],
        [*TRIOEXEC[1:], "demo", "--quick", "--db", "demo.db"],
        cwd=str(cwd),
        env=cli_env(columns=None),
        dimensions=(50, 140),
        encoding="utf-8",
        timeout=30,
    )
    child.logfile_read = transcript
    try:
        # In order, as they come: the live panel, the waits and their reasons...
        child.expect(r"Recording to")
        child.expect(r"trioexec demo — +\d+\.\ds of ~5s")
        child.expect(r"slots in use")
        child.expect(r"waiting, and on what")
        child.expect(r"condition inbox/report\.csv exists")
        child.expect(r"charge-card: attempt 1 failed")
        child.expect(r"refund: approval\s+(\x1b\[[0-9;]*m)?promise approval-refund-")
        child.expect(r"the demo resolved promise approval-refund-")
        child.expect(r"workflow refund-[0-9a-f]+ completed")
        # ...then the comparison and the commands.
        child.expect(r"summary")
        child.expect(r"faster")
        child.expect(r"trioexec promises demo\.db")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    elapsed = time.monotonic() - started
    assert (child.exitstatus, child.signalstatus) == (0, None)
    return cwd, transcript.getvalue(), squash(transcript.getvalue()), elapsed


def test_quick_finishes_well_under_15_seconds(quick_run: tuple[Path, str, str, float]) -> None:
    *_, elapsed = quick_run
    assert elapsed < 12, elapsed


def test_the_live_view_shows_slots_waits_and_why(quick_run: tuple[Path, str, str, float]) -> None:
    _, raw, seen, _ = quick_run
    assert "Traceback" not in seen
    assert "\x1b[?25h" in raw  # the live view gave the cursor back
    assert seen.startswith(
        "trioexec demo: 55 tasks on 4 slots, about 5 s. Recording to demo.db; watch it from "
        "another shell with: trioexec watch demo.db "
    )
    assert re.search(r"slots in use (█ ){4}4/4", seen)  # the slots were all busy...
    assert re.search(r"deferred [1-9]\d* \(holding no slot\)", seen)  # ...waiters held none
    for row in (
        r"import-[01] condition inbox/report\.csv exists \d+\.\ds",  # a polled condition
        r"(webhook|upload|api)-\d event \d+\.\ds",  # an event
        r"refund: approval promise approval-refund-[0-9a-f]{6} \d+\.\ds",  # a durable promise
    ):
        assert re.search(row, seen), row
    assert re.search(r"workflow refund-[0-9a-f]{6}: 1/4 steps", seen)
    assert re.search(r"workflow refund-[0-9a-f]{6}: 4/4 steps complete", seen)
    assert re.search(r"done 55/55", seen)
    # What happened, in order: the retry, the file, the promise, the run.
    happened = [
        r"charge-card: attempt 1 failed \(503 from the payments API\); retry in 0\.5s",
        r"charge-card: attempt 2 succeeded",
        r"the demo wrote inbox/report\.csv: its importers wake up",
        r"the demo resolved promise approval-refund-[0-9a-f]{6}: the refund goes on",
        r"workflow refund-[0-9a-f]{6} completed: refunded 120\.00",
    ]
    assert re.search(r" .*".join(happened), seen), seen[-1500:]


def test_the_summary_compares_and_names_three_commands(
    quick_run: tuple[Path, str, str, float],
) -> None:
    _, raw, seen, _ = quick_run
    summary = seen[seen.rindex("summary") :]
    for row in (
        "with defer_until (this run, real time)",
        "with defer_until (simulated)",
        "holding slots while waiting (simulated)",
    ):
        assert re.search(rf"{re.escape(row)} │ +\d+\.\ds │", summary), row
    sentence = re.search(
        r"Deferral finished the same 55 tasks in (\d+\.\d)s instead of (\d+\.\d)s "
        r"\((\d+\.\d)x faster\): while 11 tasks waited, their slots ran the others\. "
        r"Store: 55 completed, 0 other — demo\.db",
        summary,
    )
    assert sentence, summary
    ideal, held, _ = map(float, sentence.groups())
    assert ideal < held
    assert summary.endswith(
        "Look at what it wrote: "
        "# every task, and how it ended trioexec status demo.db "
        "# the refund run, step by step trioexec runs demo.db "
        "# the approval promise, resolved trioexec promises demo.db"
    )
    # Each command stands whole on a line of its own, to be pasted.
    lines = [ANSI.sub("", line).strip() for line in raw.splitlines()]
    for command in ("status", "runs", "promises"):
        assert f"trioexec {command} demo.db" in lines


def test_the_database_has_the_run_completed_and_the_promise_resolved(
    quick_run: tuple[Path, str, str, float],
) -> None:
    cwd, *_ = quick_run
    with SQLiteStore(cwd / "demo.db") as store:
        (run,) = store.runs()
        assert (run.workflow, run.status) == ("refund", "completed")
        assert {step: state for step, (state, _) in run.steps.items()} == {
            "fetch-order": "completed",
            "approval": "completed",
            "pay": "completed",
            "notify": "completed",
        }
        records = store.executions()
    assert len(records) == TOTAL
    assert {r.status for r in records} == {TaskStatus.COMPLETED}
    (charge,) = [r for r in records if r.name == "charge-card"]
    assert charge.attempt == 2  # failed once, retried

    async def promise() -> object:
        with DurableStore(cwd / "demo.db") as ds:
            return await ds.promises.get(f"approval-{run.run_id}")

    record = trio.run(promise)
    assert record is not None
    assert record.state is PromiseState.RESOLVED  # type: ignore[attr-defined]
    assert json.loads(record.data) == {"approved": True, "by": "the demo"}  # type: ignore[attr-defined]


def test_the_three_commands_show_what_it_wrote(quick_run: tuple[Path, str, str, float]) -> None:
    cwd, *_ = quick_run
    status = ok(cli("status", "demo.db", cwd=cwd))
    assert status.startswith(f"demo.db: {TOTAL} completed\n")
    assert re.search(r"charge-card +completed +2$", status, re.M)
    runs = squash(ok(cli("runs", "demo.db", cwd=cwd)))
    assert re.search(r"refund-[0-9a-f]{6} refund completed 4/4 0", runs), runs
    promises = squash(ok(cli("promises", "demo.db", cwd=cwd)))
    assert re.search(
        r'approval-refund-[0-9a-f]{6} resolved \{"approved": true, "by": "the demo"\}', promises
    ), promises


def test_in_a_pipe_it_prints_lines_not_a_live_view(tmp_path: Path) -> None:
    out = ok(cli("demo", "--quick", "--tasks", "8", "--slots", "2", "--db", "d.db", cwd=tmp_path))
    assert "\x1b" not in out  # no colours, no cursor movements
    assert re.search(r"^ +\d+\.\ds +slots [0-2]/2 +deferred +\d+ .* waiting on: ", out, re.M)
    assert re.search(r"waiting on: .*\d promise", out)
    assert "charge-card: attempt 1 failed" in out
    assert "Store: 15 completed, 0 other — d.db" in " ".join(out.split())
    assert out.rstrip().endswith("# the approval promise, resolved\n  trioexec promises d.db")


# ---------------------------------------------------------------- the plan, in process


def test_the_plan_scales_with_the_timeline() -> None:
    full, quick = demo_plan(48, 4, DEFAULT_SECONDS), demo_plan(48, 4, QUICK_SECONDS)
    assert (len(full.waits), len(full.works), full.total) == (8, 48, 55)
    assert max(full.waits) == 0.95 * DEFAULT_SECONDS  # the last event near the end
    assert (quick.file_at, quick.promise_at, quick.retry_delay) == (1.75, 2.5, 0.5)
    assert demo_plan(4, 4).waits.__len__() == 4  # never more waiters than tasks


@pytest.mark.parametrize(("tasks", "slots"), [(48, 4), (8, 2), (4, 1)])
def test_deferral_beats_holding_and_the_run_lasts_its_timeline(tasks: int, slots: int) -> None:
    plan = demo_plan(tasks, slots, QUICK_SECONDS)
    deferring, holding = simulate(plan, defer=True), simulate(plan, defer=False)
    assert deferring < holding
    assert 0.9 * QUICK_SECONDS < deferring < 1.1 * QUICK_SECONDS
    assert simulate(plan, defer=True) == deferring  # exact: virtual time
