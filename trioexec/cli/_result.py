"""``trioexec result``: the value a task returned, kept in the database as JSON
(read-only; with ``--wait``, once the task has ended)."""

from __future__ import annotations

import json
import time

import click
import trio

import trioexec
from trioexec import TaskFailed
from trioexec._store._base import LIVE

from ._common import check_ids, fail, open_store
from ._table import one_line


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.argument("task_id")
@click.option("--wait", is_flag=True, help="wait until the task has ended (Ctrl-C stops waiting)")
def result(db: str, task_id: str, wait: bool) -> None:
    """The kept value of task TASK_ID in DB, as JSON.

    A task's value is kept when it ran with keep_results=True (or keep_result=True).
    Exits 1, saying why, if TASK_ID is unknown, did not complete, completed
    without a kept value, or has not ended (--wait waits for it)."""
    check_ids((task_id,))
    with open_store(db) as store:
        record = store.execution(task_id)
        if record is None:
            fail(f"{db}: no execution {task_id!r}")
        if record.status in LIVE and not wait:
            note = record.owner_note(time.time())
            fail(
                f"{db}: execution {task_id!r} has not ended yet (it is {record.status.value}"
                f"{'; ' + note if note else ''}); --wait waits for it"
            )
        try:
            value = trio.run(trioexec.wait_result, store, task_id)
        except (TaskFailed, LookupError) as exc:  # (a failure, or a value not kept)
            fail(f"{db}: {one_line(exc)}")
    # (as the store keeps it: json.dumps of the value the task returned)
    click.echo(json.dumps(value))
