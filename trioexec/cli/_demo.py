"""``trioexec demo``: the four-slot story with a live view."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import click
import trio
from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

import trioexec
from trioexec import PostgresStore, SQLiteStore, StoreError, TaskStatus
from trioexec._demo import demo_workload, run_workload, simulate
from trioexec._store._open import is_postgres_url

from ._common import cell, console, fail

#: The demo writes a few hundred rows: a database another process keeps locked for
#: seconds is not one to demo on, and saying so soon beats a long silence.
DEMO_BUSY_TIMEOUT = 2.0


def demo_view(ex: trioexec.Executor, state: dict[str, Any], total: int) -> Group:
    m = ex.statistics()
    now = trio.current_time()
    slots = ex.slots
    bar = Text()
    for i in range(slots.total):
        bar.append("█ " if i < slots.in_use else "· ", style="green" if i < slots.in_use else "dim")
    elapsed = now - state["t0"]
    head = Table.grid(padding=(0, 2))
    head.add_row("slots in use", bar, f"{slots.in_use}/{slots.total}")
    head.add_row("queued", str(m.queue_depth), "")
    head.add_row("deferred", str(m.deferred_count), "(holding no slot)")
    head.add_row(
        "done", f"{state['done']}/{total}", f"{state['done'] / max(elapsed, 1e-9):.1f} tasks/s"
    )
    progress = ProgressBar(total=total, completed=state["done"], width=40)
    waiting = Table(title="deferred tasks", title_justify="left", box=None, padding=(0, 2))
    waiting.add_column("task")
    waiting.add_column("waiting for")
    waiting.add_column("for", justify="right")
    for task_id, since in sorted(state["deferred"].items(), key=lambda e: e[1])[:8]:
        waiting.add_row(
            cell(task_id[-6:]), cell(state["kinds"].get(task_id, "?")), f"{now - since:.1f}s"
        )
    return Group(Panel(Group(head, progress), title=f"trioexec demo — {elapsed:4.1f}s"), waiting)


@click.command()
@click.option(
    "--db",
    type=click.Path(dir_okay=False),
    help="SQLite file or postgresql:// URL to write (default: a temp SQLite file).",
)
@click.option("--slots", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--tasks", type=click.IntRange(4, 10_000), default=48, show_default=True)
def demo(db: str | None, slots: int, tasks: int) -> None:
    """The four-slot story: tasks waiting on the outside world give their slot back.

    Twice as many tasks as slots wait on a webhook, a file, an approval or an API
    for 3-8 s; the rest only compute. With deferral the waiters hold no slot while they
    wait, so the compute tasks flow through. The summary compares the makespan with
    the same workload holding its slots while waiting (simulated on Trio's mock clock).
    """
    waits, works = demo_workload(tasks, slots)
    path = db or os.path.join(tempfile.mkdtemp(prefix="trioexec-demo-"), "demo.db")
    try:
        store: SQLiteStore | PostgresStore = (
            trioexec.open_store(path)
            if is_postgres_url(path)
            else SQLiteStore(path, busy_timeout=DEMO_BUSY_TIMEOUT)
        )
    except (StoreError, ValueError, ModuleNotFoundError) as exc:
        fail(str(exc))
    console.print(
        Text.assemble(
            ("trioexec demo", "bold"),
            f": {tasks} tasks, {slots} slots; {len(waits)} of them wait on the outside world"
            " (3-8 s). Recording to ",
            (path, "cyan"),
            f" — look with `trioexec status {path}` or `trioexec watch {path}` from another shell.",
        )
    )
    live_box: dict[str, Any] = {}

    async def real() -> float:
        def started(ex: trioexec.Executor, state: dict[str, Any]) -> None:
            live_box["ex"], live_box["state"] = ex, state

        async def refresh(live: Live | None) -> None:
            last_line = 0.0
            while True:
                await trio.sleep(0.1)
                if "ex" not in live_box:
                    continue
                if live is not None:
                    live.update(demo_view(live_box["ex"], live_box["state"], tasks))
                elif trio.current_time() - last_line >= 1.0:
                    last_line = trio.current_time()
                    m = live_box["ex"].statistics()
                    st = live_box["state"]
                    elapsed = trio.current_time() - st["t0"]
                    click.echo(
                        f"{elapsed:5.1f}s  slots {live_box['ex'].slots.in_use}"
                        f"/{slots}  deferred {m.deferred_count:3d}  queued {m.queue_depth:3d}"
                        f"  done {st['done']}/{tasks}"
                    )

        live = (
            Live(console=console, refresh_per_second=10, transient=False)
            if console.is_terminal
            else None
        )
        async with trio.open_nursery() as n:
            if live is not None:
                live.start()
            n.start_soon(refresh, live)
            try:
                makespan = await run_workload(
                    slots, waits, works, defer=True, store=store, on_start=started
                )
            finally:
                if live is not None and "ex" in live_box:
                    live.update(demo_view(live_box["ex"], live_box["state"], tasks))
                    live.stop()
            n.cancel_scope.cancel()
        return makespan

    try:
        makespan = trio.run(real)
        counts = store.counts()
    finally:
        store.close()
    held = simulate(slots, waits, works, defer=False)
    ideal = simulate(slots, waits, works, defer=True)
    table = Table(title="summary", title_justify="left")
    table.add_column("run")
    table.add_column("makespan", justify="right")
    table.add_row("with defer_until (this run, real time)", f"{makespan:.1f}s")
    table.add_row("with defer_until (simulated)", f"{ideal:.1f}s")
    table.add_row("holding slots while waiting (simulated)", f"{held:.1f}s")
    console.print(table)
    console.print(
        Text(
            f"Deferral finished the same {tasks} tasks in {ideal:.1f}s instead of {held:.1f}s "
            f"({held / ideal:.1f}x faster): while {len(waits)} tasks waited, their slots ran "
            f"the others. Store: {counts[TaskStatus.COMPLETED]} completed, "
            f"{sum(v for k, v in counts.items() if k is not TaskStatus.COMPLETED)} other — {path}"
        )
    )
