"""What the two SQL stores' SQL does not share: one `Dialect` each, the only place
SQLite's and PostgreSQL's spellings differ. Every query is written once with these
(`trioexec._store._sql_store`, the dashboard's reads in `_browse`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import Any

import attrs


@attrs.frozen
class Dialect:
    mark: str  #: the placeholder
    seq: str  #: a table's submission order column (a unique integer per row)
    is_not: str  #: ``a IS NOT b`` that treats NULL as a value
    greatest: str  #: the larger of two non-NULL values
    #: ``{col}`` is one of a list passed as one parameter (`list_param`)
    any_of: str
    list_param: Callable[[Collection[object]], object]
    #: Locks the rows a statement of alias ``{alias}`` reads, skipping those another
    #: transaction holds (SQLite: a write transaction holds the whole file).
    skip_locked: str
    #: Locks the rows a statement reads (SQLite: the write transaction holds the file).
    for_update: str
    #: Locks the row of the task a command reads.
    lock_row: str
    #: An order of ``e.deferred_since`` with NULLs (not deferred) last.
    deferred_last: str
    find: str  #: ``{col}`` holds the parameter as a literal substring
    bucket: str  #: the bucket number of ``e.finished_at``: ``(finished_at - p1) / p2``, floored
    #: Keeps a planner off a column's index (SQLite: unary ``+``; it has no
    #: statistics, and would walk every execution of a name to find the few live)
    aside: str
    #: Submission order among the live executions only, sorted after they are
    #: found (PostgreSQL: ``seq + 0``; it guesses that a third of the rows hold
    #: any ``strpos``, and walks the whole ``seq`` index back to find 51 of them)
    live_seq: str

    def in_list(self, column: str) -> str:
        """``column`` is one of the list passed as the next parameter (`list_param`)."""
        return self.any_of.format(col=column)


#: Each spelling side by side: (SQLite's, PostgreSQL's).
_SPELLINGS: dict[str, tuple[Any, Any]] = {
    "mark": ("?", "%s"),
    "seq": ("rowid", "seq"),
    "is_not": ("IS NOT", "IS DISTINCT FROM"),
    "greatest": ("max", "greatest"),
    # (SQLite: a list as one JSON parameter, any length: no limit on ``?`` to mind)
    "any_of": ("{col} IN (SELECT value FROM json_each(?))", "{col} = ANY(%s)"),
    "list_param": (lambda values: json.dumps(list(values)), list),
    "skip_locked": ("", " FOR UPDATE OF {alias} SKIP LOCKED"),
    "for_update": ("", " FOR UPDATE"),
    "lock_row": ("", " FOR UPDATE OF e"),
    "deferred_last": (
        "e.deferred_since IS NULL, e.deferred_since",
        "e.deferred_since ASC NULLS LAST",
    ),
    "find": ("instr({col}, ?) > 0", "strpos({col}, %s) > 0"),
    # (SQLite's CAST truncates toward zero: the same as floor for the rows counted)
    "bucket": (
        "CAST((e.finished_at - ?) / ? AS INTEGER)",
        "CAST(floor((e.finished_at - %s) / %s) AS bigint)",
    ),
    "aside": ("+", ""),
    "live_seq": ("e.rowid", "(e.seq + 0)"),
}
SQLITE = Dialect(**{field: both[0] for field, both in _SPELLINGS.items()})
POSTGRES = Dialect(**{field: both[1] for field, both in _SPELLINGS.items()})
