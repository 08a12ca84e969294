"""The views of executions: ``status``, ``watch`` and ``runs`` (read-only)."""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable

import click
from rich.console import Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

import trioexec
from trioexec import PostgresStore, SQLiteStore, SubStatus, TaskStatus

from ._common import ago, console, emit_json, fail, open_store, parse_age, shown, stamp
from ._table import Column, layout, one_line, print_table, show

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


def execution_table(
    rows: list[trioexec.ExecutionRecord], now: float, width: int | None
) -> RenderableType:
    """The executions' table for a terminal ``width`` wide (None: plain lines), with
    only the columns some row fills: ``key``, the live ones' ``sub-status`` and
    ``waiting on`` (or, when their owner is gone, what becomes of them), ``deferred``."""
    keyed = any(r.key is not None for r in rows)
    live = any(r.status in _LIVE for r in rows)
    deferred = any(r.deferred_since is not None for r in rows)
    fields: list[tuple[bool, Column, Callable[[trioexec.ExecutionRecord], object]]] = [
        (True, Column("task"), lambda r: r.task_id),
        (True, Column("name", fold=True), lambda r: r.name),
        (keyed, Column("key", fold=True), lambda r: r.key),
        (True, Column("status"), lambda r: r.status.value),
        (live, Column("sub-status"), lambda r: r.sub_status.value if r.sub_status else ""),
        (True, Column("try", justify="right"), lambda r: r.attempt),
        (deferred, Column("deferred", justify="right"), lambda r: _deferred(r, now)),
        (live, Column("waiting on", fold=True), lambda r: r.owner_note(now) or r.waiting_on),
        (True, Column("error", fold=True), lambda r: _error_line(r.error)),
    ]
    picked = [(column, value) for on, column, value in fields if on]
    table = [[value(r) for _, value in picked] for r in rows]
    return layout([column for column, _ in picked], table, width)


def _deferred(r: trioexec.ExecutionRecord, now: float) -> str:
    return ago(now - r.deferred_since) if r.deferred_since else ""


def _error_line(error: str | None) -> str:
    """An error as a table shows it: its first line, at most 80 characters (the
    whole of it is in --json and the dashboard)."""
    first = (error or "").strip().split("\n", 1)[0]
    return first if len(first) <= 80 else first[:79] + "…"


def _width() -> int | None:
    return console.width if console.is_terminal else None


def print_executions(rows: list[trioexec.ExecutionRecord]) -> None:
    show(console, execution_table(rows, time.time(), _width()))


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
        if waiting_on is None:  # (else counted as matched above)
            found = (
                counts
                if sub_status is None and age is None and key is None
                else store.counts(sub_status=sub_status, deferred_longer_than=age, key=key)
            )
            matching = found[TaskStatus(status_)] if status_ else sum(found.values())
    summary = ", ".join(f"{n} {s.value}" for s, n in counts.items() if n)
    console.print(Text.assemble((shown(db), "bold"), f": {summary or 'no executions'}"))
    if paused:  # (what every executor on it holds back: trioexec resume lifts it)
        what = ", ".join(f"{p.kind} {one_line(p.value)}" for p in paused)
        console.print(Text(f"paused: {what}", style="yellow"), highlight=False)
    print_executions(rows)
    if matching > len(rows):
        console.print(f"... and {matching - len(rows)} more (--limit)")


def watch_view(store: SQLiteStore | PostgresStore, db: str) -> Group:
    now = time.time()
    counts = store.counts()
    active = store.counts(sub_status=SubStatus.ACTIVE)[TaskStatus.RUNNING]
    deferred = store.counts(sub_status=SubStatus.DEFERRED)[TaskStatus.RUNNING]
    longest = store.executions(
        status=TaskStatus.RUNNING, sub_status=SubStatus.DEFERRED, order="longest_deferred", limit=10
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
        execution_table(longest, now, _width()),
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
    columns = [
        Column("run"),
        Column("workflow", fold=True),
        Column("status"),
        Column("steps done", justify="right"),
        Column("recoveries", justify="right"),
    ]
    table = []
    for r in records:
        done = sum(1 for state, _ in r.steps.values() if state == "completed")
        names = {e.name for e in steps[r.run_id]} | set(r.steps)
        total = max(len(names), 1)
        table.append([r.run_id, r.workflow, r.status, f"{done}/{total}", r.recovery_attempts])
    print_table(console, columns, table)
    if run_id is not None:
        for r in records:
            print_executions(steps[r.run_id][:100])
