"""``trioexec schedules``: the schedules in a database, with their next run (read-only)."""

from __future__ import annotations

import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click

from ._common import console, emit_json, open_store
from ._table import Column, print_table


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
    columns = [
        Column("schedule"),
        Column("cron"),
        Column("tz"),
        Column("task", fold=True),
        Column("last run"),
        Column("next run"),
    ]
    table = [
        [r.schedule_id, r.cron, r.tz, r.name, zoned(r.last_run, r.tz), zoned(r.next_run, r.tz)]
        for r in records
    ]
    print_table(console, columns, table)
