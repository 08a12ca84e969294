"""Durable promises and tasks: ``promises`` (list, resolve, reject), ``tasks``, and
``check`` (the invariants of a database's tables)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

import click
import trio
from rich.text import Text

from trioexec import TaskStatus
from trioexec._store._durable_rows import PromiseState, TaskState

from ._common import (
    EXIT_PROBLEM,
    EXIT_USAGE,
    console,
    emit_json,
    err,
    fail,
    open_store,
    shown,
    stamp,
)
from ._table import Column, print_table

if TYPE_CHECKING:
    from trioexec.durable import DurableStore

T = TypeVar("T")


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

    with open_store(db, read_only=read_only) as store, DurableStore(store) as ds:
        yield ds


@click.group(cls=_DefaultList)
def promises() -> None:
    """Durable promises: list them, or resolve/reject one (e.g. approve from a shell)."""


def _listing(
    db: str,
    search: Callable[[DurableStore], Awaitable[tuple[list[T], str | None]]],
    as_json: bool,
    fields: list[tuple[Column, Callable[[T], object]]],
) -> None:
    """The first page ``search`` finds in DB, as JSON or as a table of ``fields``."""
    with open_durable(db) as ds:
        rows, _ = trio.run(search, ds)
    if as_json:
        emit_json(rows)
        return
    table = [[value(r) for _, value in fields] for r in rows]
    print_table(console, [column for column, _ in fields], table)


@promises.command("list")
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--state", type=click.Choice([s.value for s in PromiseState]))
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def promises_list(db: str, state: str | None, limit: int, as_json: bool) -> None:
    """Promises in DB, by id."""
    _listing(
        db,
        lambda ds: ds.promises.search(state=state, limit=limit),
        as_json,
        [
            (Column("id"), lambda p: p.id),
            (Column("state"), lambda p: p.state.value),
            (Column("data", fold=True), lambda p: (p.data or "")[:40]),
            (Column("times out"), lambda p: stamp(p.timeout_at)),
            (Column("tags", fold=True), lambda p: json.dumps(p.tags, ensure_ascii=False)),
        ],
    )


def _settle_command(how: str, summary: str, data: str) -> None:
    """``trioexec promises resolve|reject DB ID [--data JSON]``."""

    @promises.command(how, help=summary)
    @click.argument("db", type=click.Path(dir_okay=False))
    @click.argument("id")
    @click.option("--data", help=f"the {data}, as JSON")
    def settle(db: str, id: str, data: str | None) -> None:
        from trioexec.durable import Conflict, NotFound

        try:
            value = None if data is None else json.loads(data)
        except json.JSONDecodeError as exc:
            fail(f"--data is not JSON: {exc}", EXIT_USAGE)
        with open_durable(db, read_only=False) as ds:
            try:
                record = trio.run(lambda: getattr(ds.promises, how)(id, data=value))
            except (Conflict, NotFound) as exc:
                fail(f"{db}: {exc}")
        console.print(Text(f"promise {record.id}: {record.state.value}"))


_settle_command("resolve", "Resolve promise ID (tasks waiting on it resume).", "value")
_settle_command("reject", "Reject promise ID.", "reason")


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--state", type=click.Choice([s.value for s in TaskState]))
@click.option("--target")
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def tasks(db: str, state: str | None, target: str | None, limit: int, as_json: bool) -> None:
    """Durable tasks in DB (for executor tasks: trioexec status).

    Lists, by id, the tasks of durable promises (trioexec.durable): those that
    open_worker and trioexec worker claim, not those an executor runs."""
    _listing(
        db,
        lambda ds: ds.tasks.search(state=state, target=target, limit=limit),
        as_json,
        [
            (Column("id"), lambda t: t.id),
            (Column("state"), lambda t: t.state.value),
            (Column("version", justify="right"), lambda t: t.version),
            (Column("target"), lambda t: t.target),
            (Column("holder", fold=True), lambda t: t.pid),
            (Column("lease until"), lambda t: stamp(t.lease_expires_at)),
            (Column("awaiting", fold=True), lambda t: ", ".join(t.awaiting)),
        ],
    )


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
def check(db: str, as_json: bool) -> None:
    """Check DB's invariants; exit 1 if any is violated."""
    from trioexec.durable import DurableStore

    problems: list[str] = []
    notes: list[str] = []  # not violations: live rows nobody runs now
    now = time.time()
    with open_store(db) as store, DurableStore(store) as ds:
        for r in store.executions():
            note = r.owner_note(now)
            if note is not None:
                notes.append(f"{r.task_id} ({r.status.value}): {note}")
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
                _, cursor = await search(limit=500)
                while cursor is not None:
                    _, cursor = await search(limit=500, cursor=cursor)

        try:
            trio.run(read_all)
        except (ValueError, KeyError) as exc:
            problems.append(f"durable: unreadable row: {exc}")
    if as_json:
        click.echo(json.dumps({"ok": not problems, "violations": problems, "ownerless": notes}))
    else:
        for p in problems:
            err.print(Text.assemble(("violated", "red"), " ", p), highlight=False)
        if not problems:
            console.print(Text(f"{shown(db)}: all invariants hold"))
        if notes:
            console.print(
                Text(
                    f"{len(notes)} live execution(s) nobody runs now (their executor stopped"
                    " or was killed):",
                    style="yellow",
                )
            )
            for line in notes[:50]:
                console.print(Text(f"  {line}"), highlight=False, soft_wrap=True)
            if len(notes) > 50:
                console.print(f"  ... and {len(notes) - 50} more")
    if problems:
        raise SystemExit(EXIT_PROBLEM)
