"""``trioexec schedules``: the schedules in a database, with their next run (read-only)."""

from __future__ import annotations

import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click
from rich.table import Table

from ._common import cell, console, emit_json, open_store


def zoned(t: float | None, tz: str) -> str:
    """``t`` to the minute in the time zone ``tz`` (UTC if this machine lacks it)."""
    if t is None:
        return ""
    try:
        zone: datetime.tzinfo = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        zone = datetime.UTC
    return datetime.datetime.fromtimestamp(t, zone).strftime("%Y-%m-%d %H:%M")


@click.command()
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
