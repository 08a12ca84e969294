"""The executions table, defined once: each column's name, type, constraint and the
schema versions that added it. The SQLite and PostgreSQL schemas create and add
these columns from it (`added`), a "row" change lists
its values in this order (`ROW_COLUMNS`), PostgreSQL's batch insert casts by its
types, and a new execution's row starts from its `Column.initial` values."""

from __future__ import annotations

from typing import Literal

import attrs

from ._errors import StoreError
from ._records import TaskStatus

Kind = Literal["text", "integer", "bigint", "real"]
#: Where each schema's version sits in `Column.since`, and its SQL type in `_TYPES`.
SQLITE_SCHEMA, POSTGRES_SCHEMA = 0, 1
#: Each kind's SQL type: (SQLite's, PostgreSQL's).
_TYPES = {
    "text": ("TEXT", "text"),
    "integer": ("INTEGER", "integer"),
    "bigint": ("INTEGER", "bigint"),
    "real": ("REAL", "double precision"),
}


@attrs.frozen
class Column:
    name: str
    kind: Kind
    #: The schema versions that added it: (SQLite's, PostgreSQL's).
    since: tuple[int, int] = (1, 1)
    #: NOT NULL, with this DEFAULT (for the rows before it) if not None
    not_null: bool = False
    default: int | None = None
    #: What a new execution's row holds if its submission does not say.
    initial: object = None
    #: NULL in nearly every row (what a few tasks use): a batch's insert names
    #: it only if one of its rows has a value for it
    sparse: bool = False

    @property
    def postgres_type(self) -> str:
        return _TYPES[self.kind][POSTGRES_SCHEMA]

    def spelled(self, store: int) -> str:
        """As ``store``'s schema spells it in ``CREATE TABLE`` and ``ADD COLUMN``."""
        key = " PRIMARY KEY" if self.name == "task_id" else ""
        null = " NOT NULL" if self.not_null else ""
        default = "" if self.default is None else f" DEFAULT {self.default}"
        return f"{self.name} {_TYPES[self.kind][store]}{key}{null}{default}"


EXECUTIONS = (
    Column("task_id", "text"),
    Column("name", "text", not_null=True),
    Column("run_id", "text"),
    Column("status", "text", not_null=True, initial=TaskStatus.PENDING),
    Column("sub_status", "text"),
    Column("attempt", "integer", not_null=True, default=0, initial=0),
    Column("recovery_attempts", "integer", not_null=True, default=0, initial=0),
    Column("owner", "text"),
    Column("version", "bigint", not_null=True, default=1),
    Column("submitted_at", "real"),
    Column("started_at", "real"),
    Column("finished_at", "real"),
    Column("deferred_since", "real"),
    Column("error", "text"),
    Column("spec_id", "text"),
    Column("args", "text"),
    Column("key", "text", since=(6, 3)),
    # (a priority may be up to 2**62 either way)
    Column("priority", "bigint", since=(6, 3), not_null=True, default=0, initial=0),
    Column("waiting_on", "text", since=(9, 6), initial="slot"),
    Column("traceback", "text", since=(10, 7)),
    # (a kept result, JSON; NULL: none kept)
    Column("result", "text", since=(14, 11), sparse=True),
    # (`submit(dedupe_key=...)`: one live or recently completed execution per key)
    Column("dedupe_key", "text", since=(15, 12), sparse=True),
    # (the task tree: the task of its executor that submitted it)
    Column("parent_id", "text", since=(16, 13), sparse=True),
)
#: The dedupe keys' two indexes (both schemas): one live execution per key, and a
#: key's executions by when they finished.
DEDUPE_LIVE = "(dedupe_key) WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running')"
DEDUPE_BY_KEY = "(dedupe_key, finished_at) WHERE dedupe_key IS NOT NULL"
#: A "row" change's fields after its kind, in order.
ROW_COLUMNS = tuple(c.name for c in EXECUTIONS)
#: Where the `Column.sparse` ones sit in a "row" change.
SPARSE = tuple(i for i, c in enumerate(EXECUTIONS) if c.sparse)


def added(store: int, version: int) -> list[Column]:
    """The executions columns ``store``'s schema ``version`` added (1: the table)."""
    return [c for c in EXECUTIONS if c.since[store] == version]


def add_columns(store: int, version: int) -> str:
    """The statements that add them, each migration's first (1: none, the table has them)."""
    columns = added(store, version) if version > 1 else []
    return "".join(f"ALTER TABLE executions ADD COLUMN {c.spelled(store)};\n" for c in columns)


# ---------------------------------------------------------------- the version


def version_of(where: str, value: object, current: int) -> int:
    """The schema version stored as ``value`` in ``trioexec_meta`` (0: no row);
    refuses one that does not read as a number, or is newer than ``current``."""
    try:
        found = int(str(value))
    except ValueError:
        raise StoreError(f"{where}: unreadable schema version {value!r} in trioexec_meta") from None
    if found > current:
        raise StoreError(
            f"{where}: written by a newer trioexec (schema version {found}; "
            f"this trioexec knows up to {current})"
        )
    return found


def refuse_unmigrated(where: str, found: int, current: int, none: str) -> None:
    """A read-only store needs the schema as this trioexec writes it: refuses
    none at all (``none`` says so) or an older one."""
    if found == 0:
        raise StoreError(f"{where}: {none}")
    if found < current:
        raise StoreError(
            f"{where}: written by an older trioexec (schema version {found}; this "
            f"trioexec reads {current}): open it once read-write to migrate it"
        )
