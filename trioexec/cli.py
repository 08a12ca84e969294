"""The ``trioexec`` command: a demo, and views of a trioexec database.

The only module that imports the CLI libraries (click, rich). Every failure a person
can cause (bad arguments, a missing or corrupt database) ends in one line on stderr
and a non-zero exit, never a traceback. The views (``status``, ``watch``, ``runs``,
``schedules``, ``tasks``, ``promises`` without an action, ``check``) open the database
read-only: they never create, migrate or lock it. Everything that comes from the database is
printed as plain text, never parsed as rich markup.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

# click is also a dependency of sqlite-utils, so it is there wherever trioexec imports;
# rich comes only with the `cli` extra: without it, `run` says so in one line.
import click
import trio

import trioexec
from trioexec import PostgresStore, SQLiteStore, StoreError, SubStatus, TaskStatus
from trioexec._demo import demo_workload, run_workload, simulate
from trioexec._store._open import is_postgres_url

try:
    from rich.console import Console, Group
    from rich.live import Live
    from rich.panel import Panel
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text
except ModuleNotFoundError as exc:  # pragma: no cover - tested in a fresh venv
    MISSING_EXTRA: str | None = exc.name or "rich"
else:
    MISSING_EXTRA = None

if TYPE_CHECKING:
    from trioexec.durable import DurableStore

EXIT_USAGE = 2
EXIT_PROBLEM = 1
#: The demo writes a few hundred rows: a database another process keeps locked for
#: seconds is not one to demo on, and saying so soon beats a long silence.
DEMO_BUSY_TIMEOUT = 2.0

if MISSING_EXTRA is None:
    console = Console()
    err = Console(stderr=True)


def fail(message: str, code: int = EXIT_PROBLEM) -> NoReturn:
    # Text, not markup: messages carry paths and ids (a task named "batch[/]").
    err.print(
        Text.assemble(("trioexec:", "bold red"), " ", message), highlight=False, soft_wrap=True
    )
    raise SystemExit(code)


def cell(value: object) -> Text:
    """A table cell showing ``value`` as it is (no markup, no emoji codes)."""
    return Text("" if value is None else str(value))


@contextmanager
def open_store(path: str) -> Iterator[SQLiteStore | PostgresStore]:
    """An existing database (a SQLite file or a PostgreSQL URL) opened read-only,
    or one clear line and exit 1."""
    try:
        store = trioexec.open_store(path, read_only=True)
    except (StoreError, ValueError, ModuleNotFoundError) as exc:
        fail(str(exc))
    try:
        yield store
    except StoreError as exc:
        fail(str(exc))
    finally:
        store.close()


def parse_age(text: str) -> float:
    """'90', '90s', '10m', '2h', '1d' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    raw = text.strip().lower()
    try:
        value = float(raw[:-1]) * units[raw[-1]] if raw and raw[-1] in units else float(raw)
    except ValueError:
        value = math.nan
    if not (0 <= value < math.inf):
        raise click.BadParameter(
            f"{text!r} is not a duration like 90s, 10m, 2h", param_hint="'--older-than'"
        )
    return value


def ago(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def stamp(t: float | None) -> str:
    if t is None:
        return ""
    return datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S")


def emit_json(rows: Sequence[Any]) -> None:
    def plain(value: Any) -> Any:
        if hasattr(value, "__attrs_attrs__"):
            import attrs

            return {k: plain(v) for k, v in attrs.asdict(value, recurse=False).items()}
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return getattr(value, "value", value)

    click.echo(json.dumps([plain(r) for r in rows], indent=2, default=str))


# --------------------------------------------------------------------------- the CLI


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(trioexec.__version__, prog_name="trioexec")
def main() -> None:
    """trioexec: tasks that give their slot back while they wait.

    Start with `trioexec demo`; the other commands look at the SQLite database an
    executor (or the demo) writes, from any other process.
    """


# --------------------------------------------------------------------------- demo


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


@main.command()
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


# --------------------------------------------------------------------------- status / watch


def execution_table(rows: list[trioexec.ExecutionRecord], now: float) -> Table:
    """The executions' table; a ``key`` column only if one of them has a key."""
    keyed = any(r.key is not None for r in rows)
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
            cell((r.error or "")[:40]),
        )
    return table


@main.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--status", "status_", type=click.Choice([s.value for s in TaskStatus]))
@click.option("--sub-status", type=click.Choice([s.value for s in SubStatus]))
@click.option("--older-than", help="only tasks deferred longer than this (90s, 10m, 2h)")
@click.option("--key", help="only tasks submitted with this admission key")
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")
def status(
    db: str,
    status_: str | None,
    sub_status: str | None,
    older_than: str | None,
    key: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Executions in DB, with their status and sub-status (oldest first, at most
    --limit of them; --json too). A key column shows when any of them has a key."""
    age = parse_age(older_than) if older_than is not None else None
    with open_store(db) as store:
        # Cut and counted in SQL: a view of a million rows reads --limit of them.
        rows = store.executions(
            status=status_, sub_status=sub_status, deferred_longer_than=age, key=key, limit=limit
        )
        if as_json:
            emit_json(rows)
            return
        counts = store.counts()
        if status_ is None and sub_status is None and age is None and key is None:
            matching = sum(counts.values())
        else:
            found = store.counts(sub_status=sub_status, deferred_longer_than=age, key=key)
            matching = found[TaskStatus(status_)] if status_ else sum(found.values())
    summary = ", ".join(f"{n} {s.value}" for s, n in counts.items() if n)
    console.print(Text.assemble((db, "bold"), f": {summary or 'no executions'}"))
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
        Panel(head, title=Text(f"trioexec watch {db} — {stamp(now)}")),
        Text("deferred, longest first:", style="bold"),
        execution_table(longest, now),
    )


@main.command()
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


# --------------------------------------------------------------------------- runs


@main.command()
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


def zoned(t: float | None, tz: str) -> str:
    """``t`` to the minute in the time zone ``tz`` (UTC if this machine lacks it)."""
    if t is None:
        return ""
    try:
        zone: datetime.tzinfo = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        zone = datetime.UTC
    return datetime.datetime.fromtimestamp(t, zone).strftime("%Y-%m-%d %H:%M")


@main.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")
def schedules(db: str, as_json: bool) -> None:
    """Schedules in DB (Executor.schedule) with their last and next run."""
    with open_store(db) as store:
        records = store.schedules()
    if as_json:
        emit_json(records)
        return
    table = Table(box=None, padding=(0, 1), pad_edge=False)  # (fits 80 columns)
    for column in ("schedule", "cron", "tz", "task", "last run", "next run"):
        table.add_column(column, overflow="fold", no_wrap=column.endswith("run"))
    for r in records:
        when = zoned(r.last_run, r.tz), zoned(r.next_run, r.tz)
        table.add_row(*map(cell, (r.schedule_id, r.cron, r.tz, r.name, *when)))
    console.print(table)


# --------------------------------------------------------------------------- durable


PROMISE_STATES = ["pending", "resolved", "rejected", "rejected_canceled", "rejected_timedout"]
TASK_STATES = ["pending", "acquired", "suspended", "halted", "fulfilled"]


class _DefaultList(click.Group):
    """`trioexec promises DB` means `trioexec promises list DB`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@contextmanager
def open_durable(db: str, *, read_only: bool = True) -> Iterator[DurableStore]:
    """The durable tables of an existing database (read-only unless asked), or one
    clear line and exit 1."""
    from trioexec.durable import DurableStore

    if read_only:
        with open_store(db) as store, DurableStore(store) as ds:
            yield ds
        return
    if not is_postgres_url(db) and not os.path.exists(db):  # a writer would create it
        fail(f"{db}: no such database file")
    try:
        writable = DurableStore(db)
    except StoreError as exc:
        fail(str(exc))
    with writable:
        yield writable


@main.group(cls=_DefaultList)
def promises() -> None:
    """Durable promises: list them, or resolve/reject one (e.g. approve from a shell)."""


@promises.command("list")
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--state", type=click.Choice(PROMISE_STATES))
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def promises_list(db: str, state: str | None, limit: int, as_json: bool) -> None:
    """Promises in DB, by id."""
    with open_durable(db) as ds:
        rows, _ = trio.run(lambda: ds.promises.search(state=state, limit=limit))
    if as_json:
        emit_json(rows)
        return
    table = Table(box=None, padding=(0, 2))
    for column in ("id", "state", "data", "times out", "tags"):
        table.add_column(column, overflow="fold")
    for p in rows:
        table.add_row(
            cell(p.id),
            cell(p.state.value),
            cell((p.data or "")[:40]),
            cell(stamp(p.timeout_at)),
            cell(json.dumps(p.tags, ensure_ascii=False)),
        )
    console.print(table)


def _settle(db: str, id: str, data: str | None, how: str) -> None:
    from trioexec.durable import Conflict, NotFound

    try:
        value = None if data is None else json.loads(data)
    except json.JSONDecodeError as exc:
        fail(f"--data is not JSON: {exc}", EXIT_USAGE)
    with open_durable(db, read_only=False) as ds:
        settle = getattr(ds.promises, how)
        try:
            record = trio.run(lambda: settle(id, data=value))
        except (Conflict, NotFound) as exc:
            fail(f"{db}: {exc}")
    console.print(Text(f"promise {record.id}: {record.state.value}"))


@promises.command("resolve")
@click.argument("db", type=click.Path(dir_okay=False))
@click.argument("id")
@click.option("--data", help="the value, as JSON")
def promises_resolve(db: str, id: str, data: str | None) -> None:
    """Resolve promise ID (tasks waiting on it resume)."""
    _settle(db, id, data, "resolve")


@promises.command("reject")
@click.argument("db", type=click.Path(dir_okay=False))
@click.argument("id")
@click.option("--data", help="the reason, as JSON")
def promises_reject(db: str, id: str, data: str | None) -> None:
    """Reject promise ID."""
    _settle(db, id, data, "reject")


@main.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option(
    "--state", type=click.Choice(["pending", "acquired", "suspended", "halted", "fulfilled"])
)
@click.option("--target")
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def tasks(db: str, state: str | None, target: str | None, limit: int, as_json: bool) -> None:
    """Durable tasks in DB, by id."""
    with open_durable(db) as ds:
        rows, _ = trio.run(lambda: ds.tasks.search(state=state, target=target, limit=limit))
    if as_json:
        emit_json(rows)
        return
    table = Table(box=None, padding=(0, 2))
    for column in ("id", "state", "version", "target", "holder", "lease until", "awaiting"):
        table.add_column(column, overflow="fold")
    for t in rows:
        table.add_row(
            cell(t.id),
            cell(t.state.value),
            cell(t.version),
            cell(t.target),
            cell(t.pid),
            cell(stamp(t.lease_expires_at)),
            cell(", ".join(t.awaiting)),
        )
    console.print(table)


@main.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def check(db: str, as_json: bool) -> None:
    """Check DB's invariants; exit 1 if any is violated."""
    from trioexec.durable import DurableStore

    problems: list[str] = []
    with open_store(db) as store, DurableStore(store) as ds:
        for r in store.executions():
            running = r.status is TaskStatus.RUNNING
            if (r.sub_status is not None) != running:
                problems.append(
                    f"sub_status_truth: {r.task_id} is {r.status.value}"
                    f" with sub-status {r.sub_status}"
                )
            if r.status not in (TaskStatus.PENDING, TaskStatus.RUNNING) and r.finished_at is None:
                problems.append(f"finished_without_time: {r.task_id}")
        problems += [f"durable: {name}" for name in trio.run(ds.check_invariants)]

        async def read_all() -> None:  # every row must be one this trioexec can read
            for search in (ds.tasks.search, ds.promises.search):
                cursor = None
                while True:
                    _, cursor = await search(limit=500, cursor=cursor)
                    if cursor is None:
                        break

        try:
            trio.run(read_all)
        except (ValueError, KeyError) as exc:
            problems.append(f"durable: unreadable row: {exc}")
    if as_json:
        click.echo(json.dumps({"ok": not problems, "violations": problems}))
    elif problems:
        for p in problems:
            err.print(Text.assemble(("violated", "red"), " ", p), highlight=False)
    else:
        console.print(Text(f"{db}: all invariants hold"))
    if problems:
        raise SystemExit(EXIT_PROBLEM)


def _interrupted(exc: BaseException) -> bool:
    if isinstance(exc, KeyboardInterrupt):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.subgroup(KeyboardInterrupt) is not None


def _store_error(exc: BaseException) -> StoreError | None:
    """The StoreError ``exc`` is, or the first of a group made only of StoreErrors
    (the demo's nurseries wrap the executor's)."""
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, BaseExceptionGroup) and exc.split(StoreError)[1] is None:
        return _store_error(exc.exceptions[0])
    return None


def run(args: Sequence[str] | None = None) -> None:
    """Console-script entry point. Every failure is one line on stderr: usage errors
    (and a missing `cli` extra) exit 2, problems with the database (unreadable rows,
    a locked file) exit 1, Ctrl-C 130."""
    if MISSING_EXTRA is not None:
        sys.stderr.write(
            f"trioexec: the command line needs the 'cli' extra (no module named"
            f" {MISSING_EXTRA!r}): pip install 'trioexec[cli]'\n"
        )
        raise SystemExit(EXIT_USAGE)
    try:
        code = main.main(args=args, prog_name="trioexec", standalone_mode=False)
    except click.UsageError as exc:
        hint = (
            f" (see 'trioexec {exc.ctx.command_path.split(' ', 1)[-1]} --help')" if exc.ctx else ""
        )
        fail(f"{exc.format_message()}{hint}", EXIT_USAGE)
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except click.Abort:
        fail("aborted", EXIT_PROBLEM)
    except (StoreError, ValueError, KeyError) as exc:
        # A row this trioexec cannot read, a locked or broken table, ...
        fail(f"cannot read the database: {type(exc).__name__}: {exc}")
    except BaseException as exc:
        if _interrupted(exc):
            fail("interrupted", 130)
        store_error = _store_error(exc)
        if store_error is not None:
            fail(str(store_error))
        raise
    if isinstance(code, int) and code:
        raise SystemExit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
