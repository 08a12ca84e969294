"""The store's schema, defined once for SQLite and PostgreSQL, each spelling it its
way (`migration`). The executions table: each column's name, type, constraint and
the schema versions that added it; both schemas create and add these columns from
it, a "row" change lists its values in this order (`ROW_COLUMNS`), PostgreSQL's
batch insert casts by its types, and a new execution's row starts from its
`Column.initial` values. And the migrations both schemas share (`SHARED_STEPS`)."""

from __future__ import annotations

from typing import Literal

import attrs

from ._errors import StoreError
from ._records import TaskStatus

Kind = Literal["text", "integer", "bigint", "real"]
#: Where each schema's version sits in `Column.since`, and its spelling in `_SPELLED`.
SQLITE_SCHEMA, POSTGRES_SCHEMA = 0, 1
#: What the two schemas spell apart: (SQLite's, PostgreSQL's). The types (a `Kind`'s,
#: and the rest); ``seq``, the submission order PostgreSQL's indexes name where
#: SQLite's hold the rowid on their own; ``include``, the columns an index holds beside
#: its keys (SQLite has no ``INCLUDE``: it holds them as keys).
_SPELLED = {
    "text": ("TEXT", "text"),
    "integer": ("INTEGER", "integer"),
    "bigint": ("INTEGER", "bigint"),
    "real": ("REAL", "double precision"),
    "boolean": ("INTEGER", "boolean"),
    "true": ("1", "true"),
    "serial": ("INTEGER PRIMARY KEY AUTOINCREMENT", "bigserial PRIMARY KEY"),
    "seq": ("", ", seq"),
    "include": (", ", ", seq) INCLUDE ("),
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
    #: A plain task's row leaves it as the table would (its DEFAULT, or NULL): a
    #: batch's rows that all do go in without naming it (SQLite's insert)
    rare: bool = False

    @property
    def postgres_type(self) -> str:
        return _SPELLED[self.kind][POSTGRES_SCHEMA]

    def spelled(self, store: int) -> str:
        """As ``store``'s schema spells it in ``CREATE TABLE`` and ``ADD COLUMN``."""
        key = " PRIMARY KEY" if self.name == "task_id" else ""
        null = " NOT NULL" if self.not_null else ""
        default = "" if self.default is None else f" DEFAULT {self.default}"
        return f"{self.name} {_SPELLED[self.kind][store]}{key}{null}{default}"


EXECUTIONS = (
    Column("task_id", "text"),
    Column("name", "text", not_null=True),
    Column("run_id", "text", rare=True),
    Column("status", "text", not_null=True, initial=TaskStatus.PENDING),
    Column("sub_status", "text"),
    Column("attempt", "integer", not_null=True, default=0, initial=0),
    Column("recovery_attempts", "integer", not_null=True, default=0, initial=0, rare=True),
    Column("owner", "text"),
    Column("version", "bigint", not_null=True, default=1, rare=True),
    Column("submitted_at", "real"),
    Column("started_at", "real"),
    Column("finished_at", "real"),
    Column("deferred_since", "real"),
    Column("error", "text"),
    Column("spec_id", "text", rare=True),
    Column("args", "text", rare=True),
    Column("key", "text", since=(6, 3), rare=True),
    # (a priority may be up to 2**62 either way)
    Column("priority", "bigint", since=(6, 3), not_null=True, default=0, initial=0, rare=True),
    Column("waiting_on", "text", since=(9, 6), initial="slot"),
    Column("traceback", "text", since=(10, 7), rare=True),
    # (a kept result, JSON; NULL: none kept)
    Column("result", "text", since=(14, 11), sparse=True),
    # (`submit(dedupe_key=...)`: one live or recently completed execution per key)
    Column("dedupe_key", "text", since=(15, 12), sparse=True),
    # (the task tree: the task of its executor that submitted it)
    Column("parent_id", "text", since=(16, 13), sparse=True),
)
#: A "row" change's fields after its kind, in order.
ROW_COLUMNS = tuple(c.name for c in EXECUTIONS)
#: Where the `Column.sparse` ones sit in a "row" change.
SPARSE = tuple(i for i, c in enumerate(EXECUTIONS) if c.sparse)


def migration(store: int, version: int, sql: str) -> str:
    """Migration ``version`` of ``store``'s schema: the statements that add the executions
    columns of the version (1: none, the table is made with them: ``{columns}`` in
    ``sql``), then ``sql``, each ``{name}`` of `_SPELLED` as the schema spells it."""
    columns = [c.spelled(store) for c in EXECUTIONS if c.since[store] == version]
    adds = [f"ALTER TABLE executions ADD COLUMN {c};\n" for c in columns if version > 1]
    spelled = {name: both[store] for name, both in _SPELLED.items()}
    return "".join(adds) + sql.format(columns=", ".join(columns), **spelled)


# ---------------------------------------------------------------- the shared migrations

#: The migrations both schemas share, by SQLite's names: SQLite's sixth on are
#: PostgreSQL's third on (its first made SQLite's first five); `migration` spells them.
SHARED_STEPS = {
    # Admission by key: each execution's key and priority as submitted. Rows from
    # before have none (NULL key, priority 0; a constant default rewrites no row).
    # The index holds keyed rows only, so a keyless insert writes no entry to it;
    # `executions(key=...)` reads it in submission order (its own order after the key).
    "0006_execution_keys": "CREATE INDEX executions_key ON executions (key{seq})"
    " WHERE key IS NOT NULL",
    # Key limits shared by the executors on this file or schema: the slots of a key
    # each owner holds (valid while its lease is), and each key's token bucket.
    # (key_holds_owner: for release_owner)
    "0007_key_ledger": """
        CREATE TABLE key_holds (key {text} NOT NULL, owner {text} NOT NULL,
            held {integer} NOT NULL, wanted {integer} NOT NULL, since {real},
            PRIMARY KEY (key, owner));
        CREATE INDEX key_holds_owner ON key_holds (owner);
        CREATE TABLE key_buckets (key {text} PRIMARY KEY, tokens {real} NOT NULL,
            stamp {real} NOT NULL);
        """,
    # Schedules (`Executor.schedule`): each one's definition as last saved, and one
    # row per occurrence claimed: the primary key lets one executor of many win it.
    "0008_schedules": """
        CREATE TABLE schedules (schedule_id {text} PRIMARY KEY, cron {text} NOT NULL,
            tz {text} NOT NULL, name {text} NOT NULL, next_run {real}, last_run {real});
        CREATE TABLE schedule_runs (schedule_id {text} NOT NULL, at {real} NOT NULL,
            owner {text} NOT NULL, PRIMARY KEY (schedule_id, at));
        """,
    # Why a live execution is not running (`ExecutionRecord.waiting_on`); rows
    # written before it was recorded have it NULL.
    "0009_waiting_on": "",
    # Operator commands: the traceback of the exception that ended an execution
    # (dead letters show it), the append-only log of every command (executors poll
    # it by seq: SQLite's AUTOINCREMENT never hands out a seq again; PostgreSQL's
    # commands take turns under an advisory lock, so seq order is commit order),
    # and what is paused now.
    "0010_control": """
        CREATE TABLE commands (seq {serial}, kind {text} NOT NULL,
            name {text}, key {text}, task_id {text}, who {text} NOT NULL, at {real} NOT NULL,
            changed {boolean} NOT NULL, detail {text} NOT NULL);
        CREATE TABLE pauses (kind {text} NOT NULL, value {text} NOT NULL, who {text} NOT NULL,
            at {real} NOT NULL, PRIMARY KEY (kind, value));
        """,
    # The dashboard's reads (`trioexec._store._browse`): pages under a status or
    # name filter in submission order; the failed ones of a name, for the dead
    # letters' page (few rows, written only as an execution fails); the live
    # executions, a few among millions, with every column their filters and order
    # read (a page from the index alone; finished rows, most inserted finished,
    # write nothing to it); the executions finished since a time, counted from the
    # index alone; a task's commands. Each run records its steps' graph (JSON; NULL
    # before); the runs page reads them newest first, by keyset.
    "0011_dashboard": """
        CREATE INDEX executions_by_status ON executions (status{seq});
        CREATE INDEX executions_name ON executions (name{seq});
        CREATE INDEX executions_failed_name ON executions (name{seq}) WHERE status = 'failed';
        CREATE INDEX executions_live_rows ON executions (status, sub_status, submitted_at,
            deferred_since{include}waiting_on, name, key, run_id)
            WHERE status IN ('pending', 'running');
        CREATE INDEX executions_finished ON executions (finished_at, status)
            WHERE finished_at IS NOT NULL;
        CREATE INDEX commands_task ON commands (task_id{seq}) WHERE task_id IS NOT NULL;
        ALTER TABLE workflow_runs ADD COLUMN graph {text};
        CREATE INDEX workflow_runs_created ON workflow_runs (created_at, run_id);
        """,
    # Commands apply in the order they were issued (`_control.pause_turn`): a
    # target keeps its row once resumed (paused false), with the issue time of the
    # latest pause or resume applied to it; old commands and resumed targets are
    # deleted as new commands are recorded (a range of the primary key).
    "0012_command_order": """
        ALTER TABLE pauses ADD COLUMN paused {boolean} NOT NULL DEFAULT {true};
        ALTER TABLE pauses ADD COLUMN latest {real} NOT NULL DEFAULT 0;
        UPDATE pauses SET latest = at;
        """,
    # When each key's bucket is full again (a full bucket is the same as no
    # row): rounds delete the rows past it, earliest first, from this index.
    # Rows from before keep NULL (their key's rate is not known here) until
    # their key is settled again.
    "0013_key_bucket_full": """
        ALTER TABLE key_buckets ADD COLUMN full_at {real};
        CREATE INDEX key_buckets_full ON key_buckets (full_at, key) WHERE full_at IS NOT NULL;
        """,
    # A task's value kept as JSON with its completion (`keep_results`); NULL
    # when none was kept, as in every row before.
    "0014_results": "",
    # `submit(dedupe_key=...)`: one live execution per key (the store refuses a
    # second), and a key's executions by when they finished (is one recent?).
    "0015_dedupe": """
        CREATE UNIQUE INDEX executions_dedupe_live ON executions (dedupe_key)
            WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running');
        CREATE INDEX executions_dedupe ON executions (dedupe_key, finished_at)
            WHERE dedupe_key IS NOT NULL;
        """,
    # The task tree: the task that submitted an execution, and its children by it
    # (in submission order: a page of them is a range).
    "0016_task_tree": "CREATE INDEX executions_children ON executions (parent_id{seq})"
    " WHERE parent_id IS NOT NULL",
}


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
