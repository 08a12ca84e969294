"""``trioexec pause|resume|cancel|retry|commands``: an operator's commands, sent
through the store to every executor on it (within a second), each recorded
with who sent it and when (``trioexec commands`` lists them)."""

from __future__ import annotations

import datetime
import time

import click
from rich.text import Text

from trioexec._control import who_am_i
from trioexec._store._control import SUPERSEDED_COMMAND

from ._common import (
    EXIT_USAGE,
    ago,
    check_ids,
    console,
    emit_json,
    err,
    fail,
    open_store,
    parse_age,
)
from ._table import Column, one_line, print_table


def _pause_or_resume(kind: str, db: str, names: tuple[str, ...], keys: tuple[str, ...]) -> None:
    if not names and not keys:
        raise click.UsageError("give at least one --name or --key")
    check_ids(names, "name")
    check_ids(keys, "key")
    who = who_am_i()
    superseded = []
    with open_store(db, read_only=False) as store:
        for what, value in [("name", n) for n in names] + [("key", k) for k in keys]:
            name, key = (value, None) if what == "name" else (None, value)
            try:
                command = store.command(kind, who=who, name=name, key=key)
            except ValueError as exc:
                fail(str(exc), EXIT_USAGE)
            console.print(Text(f"{what} {value}: {command.detail}"), highlight=False)
            if command.detail.startswith(SUPERSEDED_COMMAND):
                superseded.append(f"{what} {value}")
    if superseded:
        fail(
            f"not {kind}d: {', '.join(superseded)} (a command issued later, by the clock of"
            f" the host that issued it, decides; see trioexec commands)"
        )


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--name", "names", multiple=True, help="the tasks of this name (repeatable)")
@click.option("--key", "keys", multiple=True, help="the tasks of this admission key (repeatable)")
def pause(db: str, names: tuple[str, ...], keys: tuple[str, ...]) -> None:
    """Pause tasks by name or key on every executor using DB (within a second).

    Pending tasks that match do not start (they wait on "paused"); running ones
    go on. Pausing what is paused changes nothing. See `trioexec resume`."""
    _pause_or_resume("pause", db, names, keys)


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--name", "names", multiple=True, help="the tasks of this name (repeatable)")
@click.option("--key", "keys", multiple=True, help="the tasks of this admission key (repeatable)")
def resume(db: str, names: tuple[str, ...], keys: tuple[str, ...]) -> None:
    """Resume what `trioexec pause` (or Executor.pause) paused in DB."""
    _pause_or_resume("resume", db, names, keys)


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.argument("task_ids", nargs=-1, required=True)
def cancel(db: str, task_ids: tuple[str, ...]) -> None:
    """Cancel tasks by id: their executor stops them within a second (a task
    whose executor is gone is cancelled in DB at once). Exits 1 if an id is
    unknown; a task that already ended is left as it is."""
    who = who_am_i()
    unknown = 0
    check_ids(task_ids)
    with open_store(db, read_only=False) as store:
        for task_id in task_ids:
            try:
                command = store.command("cancel", task_id=task_id, who=who)
            except ValueError as exc:
                fail(str(exc), EXIT_USAGE)
            unknown += command.detail == "no such task"
            console.print(Text(f"{one_line(task_id)}: {command.detail}"), highlight=False)
    if unknown:
        raise SystemExit(1)


def parse_since(text: str) -> float:
    """``--since``: a duration back from now (90s, 10m, 2h, 1d) or an ISO 8601
    time (local time unless it names its zone), as Unix seconds."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        try:
            return time.time() - parse_age(text)
        except click.BadParameter:
            raise click.BadParameter(
                f"{text!r} is neither a duration (2h, 1d) nor an ISO time (2026-11-26T08:00)",
                param_hint="'--since'",
            ) from None
    return moment.timestamp()


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.argument("task_ids", nargs=-1)
@click.option("--failed", is_flag=True, help="every failed task (or only --name, --since)")
@click.option("--name", help="with --failed: only tasks of this name")
@click.option("--since", help="with --failed: only those that failed since (2h, 2026-11-26T08:00)")
def retry(
    db: str, task_ids: tuple[str, ...], failed: bool, name: str | None, since: str | None
) -> None:
    """Requeue failed tasks (dead letters) by id, or --failed ones, in DB.

    Each keeps its task id and runs as its next attempt on an executor using DB
    with recover=True whose tasks= registers its spec (at once if one is
    running). Exits 1 if an id given could not be requeued (it is live,
    completed, unknown, or cannot be re-created)."""
    if bool(task_ids) == failed:
        raise click.UsageError("give task ids or --failed (not both)")
    if (name is not None or since is not None) and not failed:
        raise click.UsageError("--name and --since go with --failed")
    after = None if since is None else parse_since(since)
    check_ids(task_ids)
    if name is not None:
        check_ids((name,), "name")
    with open_store(db, read_only=False) as store:
        try:
            result = store.requeue(list(task_ids) or None, name=name, since=after, who=who_am_i())
        except ValueError as exc:
            fail(str(exc), EXIT_USAGE)
    for record in result.requeued:
        console.print(
            Text(f"{one_line(record.task_id)}: requeued (attempt {record.attempt + 1} next)"),
            highlight=False,
        )
    for task_id, why in result.refused:
        err.print(Text(f"{one_line(task_id)}: not requeued: {why}"), highlight=False)
    if not result.requeued and not result.refused:
        console.print("nothing to requeue")
    elif result.requeued:
        console.print(
            Text(
                f"{len(result.requeued)} requeued: an executor on this database with"
                " recover=True that registers their tasks runs them",
                style="dim",
            )
        )
    if task_ids and result.refused:
        raise SystemExit(1)


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")
def commands(db: str, limit: int, as_json: bool) -> None:
    """The commands sent to DB (pause, resume, cancel, retry), newest last, with
    who sent them, when and what they did; and what is paused now."""
    with open_store(db) as store:
        log = store.commands(0)[-limit:]
        paused = store.pauses()
    if as_json:
        emit_json(log)
        return
    now = time.time()
    columns = [
        Column("#", justify="right"),
        Column("when"),
        Column("command"),
        Column("target"),
        Column("who", fold=True),
        Column("result", fold=True),
    ]
    table = []
    for c in log:
        target = c.task_id or (f"name {c.name}" if c.name else f"key {c.key}" if c.key else "")
        table.append([c.seq, f"{ago(now - c.at)} ago", c.kind, target, c.who, c.detail])
    print_table(console, columns, table)
    for p in paused:
        since = ago(now - p.at)
        line = f"paused: {p.kind} {one_line(p.value)} (by {one_line(p.who)}, {since} ago)"
        console.print(Text(line), highlight=False)
