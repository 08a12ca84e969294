"""The views of executions: ``status``, ``watch`` and ``runs`` (read-only)."""

from __future__ import annotations

import fnmatch
import time

import click
from rich.console import Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

import trioexec
from trioexec import PostgresStore, SQLiteStore, SubStatus, TaskStatus

from ._common import ago, cell, console, emit_json, fail, open_store, parse_age, shown, stamp

_LIVE = (TaskStatus.PENDING, TaskStatus.RUNNING)


def waiting_matches(
    store: SQLiteStore | PostgresStore,
    pattern: str,
    status: str | None,
    sub_status: str | None,
    age: float | None,
    key: str | None,
) -> list[trioexec.ExecutionRecord]:
    """The executions whose ``waiting_on`` matches the glob ``pattern`` (fnmatch,
    case-sensitive), oldest first. Matched here, after the query, never in SQL:
    reasons hold quotes, brackets, ``%`` and ``_``. Only live executions wait on
    anything, so only they are read."""
    statuses = _LIVE if status is None else [s for s in _LIVE if s.value == status]
    found = [
        r
        for s in statuses
        for r in store.executions(
            status=s, sub_status=sub_status, deferred_longer_than=age, key=key
        )
        if r.waiting_on is not None and fnmatch.fnmatchcase(r.waiting_on, pattern)
    ]
    found.sort(key=lambda r: r.submitted_at or 0.0)  # (stable: the store's order on ties)
    return found


def execution_table(rows: list[trioexec.ExecutionRecord], now: float) -> Table:
    """The executions' table; a ``key`` column only if one of them has a key, a
    ``waiting on`` column only if one of them is live."""
    keyed = any(r.key is not None for r in rows)
    live = any(r.status in _LIVE for r in rows)
    table = Table(box=None, padding=(0, 1))
    # Ids and states must stay whole (people copy them); the rest gives way.
    table.add_column("task", no_wrap=True)
    table.add_column("name", overflow="fold", ratio=1)
    if keyed:
        table.add_column("key", overflow="fold", ratio=1)
    table.add_column("status", no_wrap=True)
    table.add_column("sub-status", no_wrap=True)
    table.add_column("try", no_wrap=True)
    table.add_column("deferred", no_wrap=True)
    if live:
        table.add_column("waiting on", overflow="fold", ratio=1)
    table.add_column("error", overflow="ellipsis", no_wrap=True, ratio=1)
    for r in rows:
        deferred = now - r.deferred_since if r.deferred_since is not None else None
        table.add_row(
            cell(r.task_id),
            cell(r.name),
            *([cell(r.key)] if keyed else []),
            cell(r.status.value),
            cell(r.sub_status.value if r.sub_status else ""),
            cell(r.attempt),
            cell(ago(deferred)),
            *([cell(r.waiting_on)] if live else []),
            cell((r.error or "")[:40]),
        )
    return table


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--status", "status_", type=click.Choice([s.value for s in TaskStatus]))
@click.option("--sub-status", type=click.Choice([s.value for s in SubStatus]))
@click.option("--older-than", help="only tasks deferred longer than this (90s, 10m, 2h)")
@click.option("--key", help="only tasks submitted with this admission key")
@click.option(
    "--waiting-on",
    metavar="GLOB",
    help="only live tasks waiting on what matches this glob ('promise*', 'key concurrency *')",
)
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")
def status(
    db: str,
    status_: str | None,
    sub_status: str | None,
    older_than: str | None,
    key: str | None,
    waiting_on: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Executions in DB, with their status and sub-status (oldest first, at most
    --limit of them; --json too). A key column shows when any of them has a key,
    a waiting-on column when any of them is live."""
    age = parse_age(older_than) if older_than is not None else None
    with open_store(db) as store:
        if waiting_on is not None:
            hits = waiting_matches(store, waiting_on, status_, sub_status, age, key)
            rows, matching = hits[:limit], len(hits)
        else:
            # Cut and counted in SQL: a view of a million rows reads --limit of them.
            rows = store.executions(
                status=status_,
                sub_status=sub_status,
                deferred_longer_than=age,
                key=key,
                limit=limit,
            )
        if as_json:
            emit_json(rows)
            return
        counts = store.counts()
        paused = store.pauses()
        if waiting_on is not None:
            pass  # (counted as matched above)
        elif status_ is None and sub_status is None and age is None and key is None:
            matching = sum(counts.values())
        else:
            found = store.counts(sub_status=sub_status, deferred_longer_than=age, key=key)
            matching = found[TaskStatus(status_)] if status_ else sum(found.values())
    summary = ", ".join(f"{n} {s.value}" for s, n in counts.items() if n)
    console.print(Text.assemble((shown(db), "bold"), f": {summary or 'no executions'}"))
    if paused:  # (what every executor on it holds back: trioexec resume lifts it)
        what = ", ".join(f"{p.kind} {p.value}" for p in paused)
        console.print(Text(f"paused: {what}", style="yellow"), highlight=False)
    console.print(execution_table(rows, time.time()))
    if matching > len(rows):
        console.print(f"... and {matching - len(rows)} more (--limit)")


def watch_view(store: SQLiteStore | PostgresStore, db: str) -> Group:
    now = time.time()
    counts = store.counts()
    active = store.counts(sub_status=SubStatus.ACTIVE)[TaskStatus.RUNNING]
    deferred = store.counts(sub_status=SubStatus.DEFERRED)[TaskStatus.RUNNING]
    longest = store.executions(
        status=TaskStatus.RUNNING,
        sub_status=SubStatus.DEFERRED,
        order="longest_deferred",
        limit=10,
    )
    head = Table.grid(padding=(0, 2))
    head.add_row("active", str(active))
    head.add_row("deferred", str(deferred))
    head.add_row("pending", str(counts[TaskStatus.PENDING]))
    head.add_row("completed", str(counts[TaskStatus.COMPLETED]))
    head.add_row(
        "failed/cancelled/timed out",
        f"{counts[TaskStatus.FAILED]}/{counts[TaskStatus.CANCELLED]}/{counts[TaskStatus.TIMED_OUT]}",
    )
    return Group(
        Panel(head, title=Text(f"trioexec watch {shown(db)} — {stamp(now)}")),
        Text("deferred, longest first:", style="bold"),
        execution_table(longest, now),
    )


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--interval", type=click.FloatRange(0.05), default=0.5, show_default=True)
@click.option("--once", is_flag=True, help="print one view and exit")
def watch(db: str, interval: float, once: bool) -> None:
    """A live view of DB, refreshed from the database (another process writes it)."""
    with open_store(db) as store:
        if once or not console.is_terminal:
            console.print(watch_view(store, db))
            return
        try:
            with Live(watch_view(store, db), console=console, refresh_per_second=4) as live:
                while True:
                    time.sleep(interval)
                    live.update(watch_view(store, db))
        except KeyboardInterrupt:
            pass


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.argument("run_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")
def runs(db: str, run_id: str | None, as_json: bool) -> None:
    """Workflow runs in DB with their progress (or one run's steps)."""
    with open_store(db) as store:
        records = store.runs() if run_id is None else [r for r in [store.run(run_id)] if r]
        if run_id is not None and not records:
            fail(f"{db}: no workflow run {run_id!r}")
        steps = {r.run_id: store.executions(run_id=r.run_id) for r in records}
    if as_json:
        emit_json(records)
        return
    table = Table(box=None, padding=(0, 2))
    for column in ("run", "workflow", "status", "progress", "steps done", "recoveries"):
        table.add_column(column, overflow="fold")
    for r in records:
        done = sum(1 for state, _ in r.steps.values() if state == "completed")
        names = {e.name for e in steps[r.run_id]} | set(r.steps)
        total = max(len(names), 1)
        table.add_row(
            cell(r.run_id),
            cell(r.workflow),
            cell(r.status),
            ProgressBar(total=total, completed=done, width=20),
            f"{done}/{total}",
            str(r.recovery_attempts),
        )
    console.print(table)
    if run_id is not None:
        for r in records:
            console.print(execution_table(steps[r.run_id][:100], time.time()))
