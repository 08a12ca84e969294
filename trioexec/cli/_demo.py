"""``trioexec demo``: tasks waiting on the outside world, a workflow waiting on a
durable promise and a retry, with a live view; then the comparison with and
without deferral, and the commands to look at what it wrote."""

from __future__ import annotations

import os
import shlex
import tempfile
from collections import Counter
from typing import Any

import click
import trio
from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Column, Table
from rich.text import Text

import trioexec
from trioexec import PostgresStore, SQLiteStore, StoreError, TaskStatus
from trioexec._demo import (
    DEFAULT_SECONDS,
    FILE_WAITERS,
    KINDS,
    QUICK_SECONDS,
    REPORT,
    Plan,
    demo_plan,
    run_workload,
    simulate,
)
from trioexec._store._open import is_postgres_url
from trioexec.durable import DurableStore

from ._common import console, fail
from ._common import shown as redact

#: The demo writes a few hundred rows: a database another process keeps locked for
#: seconds is not one to demo on, and saying so soon beats a long silence.
DEMO_BUSY_TIMEOUT = 2.0
KIND_NAMES = {"webhook": "a webhook", "upload": "an upload", "api": "an API"}
WAIT_STYLES = {"promise": "magenta", "condition": "cyan", "event": "yellow", "retry": "red"}


def waiting_rows(state: dict[str, Any], now: float) -> list[tuple[str, str, float]]:
    """(task, what it waits on, for how long) of every watched task that waits
    for something other than a slot, longest first."""
    since: dict[str, tuple[str, float]] = state["since"]
    rows = []
    for task_id, (name, ref) in list(state["watch"].items()):
        reason = ref.waiting_on
        if reason is None or reason == "slot":
            since.pop(task_id, None)
            continue
        if since.get(task_id, ("", 0.0))[0] != reason:
            since[task_id] = (reason, now)
        rows.append((name, reason, now - since[task_id][1]))
    return sorted(rows, key=lambda r: -r[2])


def demo_view(ex: trioexec.Executor, state: dict[str, Any], plan: Plan) -> Group:
    m = ex.statistics()
    now = trio.current_time()
    slots = ex.slots
    total = state["total"]
    free = slots.total - slots.in_use
    bar = Text.assemble(("█ " * slots.in_use, "green"), ("· " * free, "dim"))
    elapsed = now - state["t0"]
    head = Table.grid(padding=(0, 2))
    head.add_row("slots in use", bar, f"{slots.in_use}/{slots.total}")
    head.add_row("queued", str(m.queue_depth), "")
    head.add_row("deferred", str(m.deferred_count), "(holding no slot)")
    head.add_row(
        "done", f"{state['done']}/{total}", f"{state['done'] / max(elapsed, 1e-9):.1f} tasks/s"
    )
    run = state["run"]
    if run is not None:
        status = run.status()
        head.add_row(
            "workflow",
            Text(f"{run.run_id}: {status.completed_steps}/{status.total_steps} steps"),
            Text(status.execution_status.value.replace("_", " ")),
        )
    progress = ProgressBar(total=total, completed=state["done"], width=40)

    def titled(title: str, *columns: str | Column) -> Table:
        return Table(*columns, title=title, title_justify="left", box=None, padding=(0, 2))

    waiting = titled("waiting, and on what", "task", "waiting on", Column("for", justify="right"))
    rows = waiting_rows(state, now)
    for name, reason, seconds in rows[:12]:
        style = WAIT_STYLES.get(reason.split(" ", 1)[0], "")
        waiting.add_row(Text(name), Text(reason, style=style), f"{seconds:.1f}s")
    if not rows:
        waiting.add_row(Text("nothing waits now", style="dim"), "", "")
    happened = titled("what happened", Column("at", justify="right"), "")
    for at, line in state["log"][-5:]:
        happened.add_row(f"{at:.1f}s", Text(line))
    title = f"trioexec demo — {elapsed:4.1f}s of ~{plan.seconds:.0f}s"
    return Group(Panel(Group(head, progress), title=title), waiting, happened)


def status_line(ex: trioexec.Executor, state: dict[str, Any]) -> str:
    """One line of the view, for a pipe."""
    m = ex.statistics()
    elapsed = trio.current_time() - state["t0"]
    rows = waiting_rows(state, trio.current_time())
    kinds = Counter(reason.split(" ", 1)[0] for _, reason, _ in rows)
    waits = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "nothing"
    return (
        f"{elapsed:5.1f}s  slots {ex.slots.in_use}/{ex.slots.total}  deferred"
        f" {m.deferred_count:3d}  queued {m.queue_depth:3d}  done {state['done']}/{state['total']}"
        f"  waiting on: {waits}"
    )


@click.command()
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    help="SQLite file or postgresql:// URL to write (default: a temp SQLite file).",
)
@click.option("--slots", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--tasks", type=click.IntRange(4, 10_000), default=48, show_default=True)
@click.option(
    "--quick",
    is_flag=True,
    help=f"The same story in about {QUICK_SECONDS:.0f} s instead of {DEFAULT_SECONDS:.0f} s.",
)
def demo(db: str | None, slots: int, tasks: int, quick: bool) -> None:
    """Tasks waiting on the outside world give their slot back (about 30 s).

    Twice as many tasks as slots wait on events (a webhook, an upload, an API),
    two on a polled condition (a file the demo writes midway), and a workflow's
    approval step on a durable promise (the demo resolves it midway); one task
    fails once and is retried; the rest only compute. A live view shows the
    slots, and every waiting task with what it waits on. The summary compares
    the makespan with the same workload holding its slots while waiting
    (simulated on Trio's mock clock); then the commands to inspect the database.
    """
    plan = demo_plan(tasks, slots, QUICK_SECONDS if quick else DEFAULT_SECONDS)
    path = db or os.path.join(tempfile.mkdtemp(prefix="trioexec-demo-"), "demo.db")
    try:
        store: SQLiteStore | PostgresStore = (
            trioexec.open_store(path)
            if is_postgres_url(path)
            else SQLiteStore(path, busy_timeout=DEMO_BUSY_TIMEOUT)
        )
    except (StoreError, ValueError, ModuleNotFoundError) as exc:
        fail(str(exc))
    n_events = len(plan.waits)
    # (a URL's password is never printed: the commands show *** in its place)
    shown = shlex.quote(redact(path))
    console.print(
        Text.assemble(
            ("trioexec demo", "bold"),
            f": {plan.total} tasks on {slots} slots, about {plan.seconds:.0f} s. Recording to ",
            (redact(path), "cyan"),
            "; watch it from another shell with:",
        )
    )
    console.print(Text(f"  trioexec watch {shown}", style="cyan"), soft_wrap=True)
    kinds = ", ".join(KIND_NAMES[k] for k in KINDS[:n_events])
    story = [
        f"{n_events} tasks wait on events ({kinds}) set between "
        f"{min(plan.waits):.0f} and {max(plan.waits):.0f} s",
        f"{FILE_WAITERS} tasks wait on a polled condition: {REPORT} exists"
        f" (the demo writes it at {plan.file_at:.1f} s)",
        "the workflow refund (fetch-order → approval → pay → notify): approval waits"
        f" on a durable promise (the demo resolves it at {plan.promise_at:.1f} s)",
        "charge-card fails its first attempt and is retried",
        f"{len(plan.works) - n_events} tasks only compute",
    ]
    for line in story:
        console.print(Text(f"  • {line}"), highlight=False)
    live_box: dict[str, Any] = {}

    async def real(ds: DurableStore) -> float:
        def started(ex: trioexec.Executor, state: dict[str, Any]) -> None:
            live_box["ex"], live_box["state"] = ex, state

        def echo_log(state: dict[str, Any]) -> None:
            for at, line in state["log"][live_box.get("logged", 0) :]:
                click.echo(f"{at:5.1f}s  {line}")
            live_box["logged"] = len(state["log"])

        async def refresh(live: Live | None) -> None:
            last_line = 0.0
            while True:
                await trio.sleep(0.1)
                if "ex" not in live_box:
                    continue
                ex, state = live_box["ex"], live_box["state"]
                if live is not None:
                    live.update(demo_view(ex, state, plan))
                    continue
                echo_log(state)
                if trio.current_time() - last_line >= 1.0:
                    last_line = trio.current_time()
                    click.echo(status_line(ex, state))

        live = Live(console=console, refresh_per_second=10) if console.is_terminal else None
        async with trio.open_nursery() as n:
            if live is not None:
                live.start()
            n.start_soon(refresh, live)
            try:
                makespan = await run_workload(
                    plan, defer=True, store=store, ds=ds, on_start=started
                )
            finally:
                if live is not None:  # (stopped even if the workload never started)
                    if "ex" in live_box:
                        live.update(demo_view(live_box["ex"], live_box["state"], plan))
                    live.stop()
            n.cancel_scope.cancel()
        if live is None:
            echo_log(live_box["state"])
        return makespan

    try:
        with DurableStore(store, retry_timeout=DEMO_BUSY_TIMEOUT) as ds:
            makespan = trio.run(real, ds)
        counts = store.counts()
    finally:
        store.close()
    held = simulate(plan, defer=False)
    ideal = simulate(plan, defer=True)
    table = Table("run", Column("makespan", justify="right"), title="summary", title_justify="left")
    table.add_row("with defer_until (this run, real time)", f"{makespan:.1f}s")
    table.add_row("with defer_until (simulated)", f"{ideal:.1f}s")
    table.add_row("holding slots while waiting (simulated)", f"{held:.1f}s")
    console.print(table)
    waiters = n_events + FILE_WAITERS + 1
    console.print(
        Text(
            f"Deferral finished the same {plan.total} tasks in {ideal:.1f}s instead of"
            f" {held:.1f}s ({held / ideal:.1f}x faster): while {waiters} tasks waited, their"
            f" slots ran the others. Store: {counts[TaskStatus.COMPLETED]} completed,"
            f" {sum(v for k, v in counts.items() if k is not TaskStatus.COMPLETED)} other"
            f" — {redact(path)}"
        )
    )
    console.print(Text("Look at what it wrote:", style="bold"))
    for command, what in [
        ("status", "every task, and how it ended"),
        ("runs", "the refund run, step by step"),
        ("promises", "the approval promise, resolved"),
    ]:
        # A command on a line of its own, never wrapped: it is there to be pasted.
        console.print(Text(f"  # {what}", style="dim"), highlight=False)
        console.print(Text(f"  trioexec {command} {shown}", style="cyan"), soft_wrap=True)
