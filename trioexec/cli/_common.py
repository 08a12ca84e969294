"""What every command shares: the consoles, one-line failures, the read-only store,
and how times and ages are shown.

rich comes only with the `cli` extra: without it, `MISSING_EXTRA` names the missing
module and `trioexec.cli.run` says so in one line (no command is loaded then).
"""

from __future__ import annotations

import datetime
import enum
import json
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

import attrs
import click  # (a dependency of sqlite-utils too: there wherever trioexec imports)

import trioexec
from trioexec import PostgresStore, SQLiteStore, StoreError
from trioexec._records import age, check_id
from trioexec._store._open import is_postgres_url
from trioexec._store._pg_conn import mask, redact

try:
    from rich.console import Console
    from rich.text import Text
except ModuleNotFoundError as exc:  # pragma: no cover - tested in a fresh venv
    MISSING_EXTRA: str | None = exc.name or "rich"
else:
    MISSING_EXTRA = None

EXIT_USAGE = 2
EXIT_PROBLEM = 1

if MISSING_EXTRA is None:
    console = Console()
    err = Console(stderr=True)


def fail(message: str, code: int = EXIT_PROBLEM) -> NoReturn:
    # Text, not markup: messages carry paths and ids (a task named "batch[/]").
    # (Whatever the message quotes, no password is printed.)
    err.print(
        Text.assemble(("trioexec:", "bold red"), " ", mask(message)),
        highlight=False,
        soft_wrap=True,
    )
    raise SystemExit(code)


def check_ids(values: Sequence[str], what: str = "task id") -> None:
    """Usage error for a value no store can hold, before the database is opened
    (one bad value: nothing done)."""
    for value in values:
        try:
            check_id(what, value)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None


#: DB as output shows it: a URL without its password.
shown = redact


@contextmanager
def open_store(path: str, *, read_only: bool = True) -> Iterator[SQLiteStore | PostgresStore]:
    """An existing database (a SQLite file or a PostgreSQL URL) opened read-only, or
    to write (brought to this trioexec's schema if older), or one clear line and
    exit 1."""
    if not read_only and not is_postgres_url(path) and not os.path.exists(path):
        fail(f"{path}: no such database file")  # (a writer would create it)
    try:
        store = trioexec.open_store(path, read_only=read_only)
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
    """An age for a table: 40.0s, 3.5m, 36.0h (hours at most); empty for None."""
    return "" if seconds is None else age(seconds, tenths=True, days=False)


def stamp(t: float | None) -> str:
    return "" if t is None else datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S")


def emit_json(rows: Sequence[Any]) -> None:
    def plain(value: Any) -> Any:  # what json cannot write itself
        if attrs.has(type(value)):
            return attrs.asdict(value, recurse=False)
        return value.value if isinstance(value, enum.Enum) else str(value)

    click.echo(json.dumps(list(rows), indent=2, default=plain))
