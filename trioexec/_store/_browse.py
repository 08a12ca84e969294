"""The dashboard's reads of a SQL store: pages of executions under filters, by
keyset (never ``OFFSET``: page 1,000 costs what page 1 does), the executions
finished per time bucket, the task names stored, a task's commands, and a task's
children (the task tree: the first of them, and how many in all).

Plain synchronous functions (the web app runs them in a worker thread), each in
one read snapshot (`SQLStore.snapshot`), their SQL written once over the store's
`Dialect`. Every text the caller gives is a bound parameter; a ``waiting_on``
filter is a literal substring (``instr`` / ``strpos``, never ``LIKE``), so ``%``,
``_``, ``[`` and quotes in it are only themselves.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any, Literal, TypeVar

import attrs

from .._records import ExecutionRecord, SubStatus, TaskStatus, check_number
from .._records import storable as storable  # (the dashboard's, from here)
from ._base import (
    LIVE,
    RECORD_COLUMNS,
    RECORD_FIELDS,
    RUN_COLUMNS,
    SELECT_RECORDS,
    Command,
    RunRecord,
    record_of,
    records_of,
    run_of,
)
from ._control import COMMAND_COLUMNS, command_of
from ._dialect import Dialect
from ._sql_store import SQLStore

#: How `browse` orders executions: ``"newest"`` submission first (the default),
#: ``"oldest"`` first, or ``"longest_waiting"``: only live executions (pending or
#: running), those waiting longest first (a deferred one since its
#: ``deferred_since``, a pending one since its ``submitted_at``), then the active
#: ones (holding a slot) in submission order.
Order = Literal["oldest", "newest", "longest_waiting"]
ORDERS: tuple[Order, ...] = ("oldest", "newest", "longest_waiting")
#: `Page.total` counts at most this many matches (None beyond: not cheap).
COUNT_LIMIT = 10_000
#: The most rows a page, or a `task_names` answer, may ask for.
MAX_LIMIT = 10_000
#: The most buckets one `activity` call may ask for.
MAX_BUCKETS = 10_000
#: The statuses of an execution that ended: every one but the live ones (`LIVE`).
ENDED = tuple(s for s in TaskStatus if s not in LIVE)
_LIVE_SQL = "e.status IN ('pending', 'running')"
#: A status filter's condition: one of these constants, never the caller's text
#: (an unknown status is refused first). A planner sees which status it is, and
#: can use an index of that status's rows only (the failed ones' by name).
_STATUS_SQL = {s: f"e.status = '{s.value}'" for s in TaskStatus}
_MAX_CURSOR = 500  # characters: a cursor this module made is far shorter
E = TypeVar("E", TaskStatus, SubStatus)


@attrs.frozen
class Page:
    """One page of `browse`."""

    rows: list[ExecutionRecord]
    next_cursor: str | None  #: opaque text; pass back as ``cursor=`` for the next page
    total: int | None  #: how many match, all pages (None: over `COUNT_LIMIT`)


@attrs.frozen
class Bucket:
    """The executions that ended in ``[start, start + bucket)``, by status."""

    start: float
    ended: dict[TaskStatus, int]  #: every status of `ENDED` (zero or more)

    @property
    def finished(self) -> int:
        """How many ended, whatever their status."""
        return sum(self.ended.values())


# longest_waiting's sort key: (0 waiting / 1 active, since when, submission order).
_RANK = "CASE WHEN e.status = 'pending' OR e.sub_status = 'deferred' THEN 0 ELSE 1 END"
_SINCE = (
    "CASE WHEN e.status = 'pending' THEN coalesce(e.submitted_at, 0)"
    " WHEN e.sub_status = 'deferred' THEN coalesce(e.deferred_since, 0) ELSE 0 END"
)


def _sql_store(store: object) -> tuple[SQLStore, Dialect]:
    if not isinstance(store, SQLStore):
        raise TypeError(
            f"the dashboard reads a trioexec store, got {type(store).__name__} {store!r}"
        )
    return store, store.dialect


def _text(what: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a str or None, got {type(value).__name__} {value!r}")
    return value


def _member(what: str, kind: type[E], value: E | str | None) -> E | None:
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        must = ", ".join(m.value for m in kind)
        raise ValueError(f"{what} must be one of {must}, got {value!r}") from None


def _limit(value: object) -> int:
    return check_number("limit", value, int, f"an int from 1 to {MAX_LIMIT}", ge=1, le=MAX_LIMIT)


def _where(
    d: Dialect,
    order: object,
    status: TaskStatus | str | None,
    sub_status: SubStatus | str | None,
    **given: str | None,
) -> tuple[list[str], list[object], bool] | None:
    """The conditions (on ``e``) and their parameters (``given``: the text
    filters, by column); None if nothing can match (a text no store can hold: a
    NUL, a lone surrogate); and whether only live executions can match.

    A query of live executions only (``longest_waiting``, a live status, a
    sub-status, ``waiting_on``) says so (``status IN ('pending', 'running')``,
    true of every row it can match anyway): the index of the live rows, which
    holds every column these filters and that order read, then answers it
    without reading the table; a name or key index is kept out of its way."""
    where: list[str] = []
    params: list[object] = []
    status = _member("status", TaskStatus, status)
    sub_status = _member("sub_status", SubStatus, sub_status)
    texts = {column: _text(column, value) for column, value in given.items()}
    live = (
        order == "longest_waiting"
        or status in (TaskStatus.PENDING, TaskStatus.RUNNING)
        or sub_status is not None
        or texts["waiting_on"] is not None
    )
    if live:
        where.append(_LIVE_SQL)
    if status is not None:
        where.append(_STATUS_SQL[status])
    if sub_status is not None:
        where.append(f"e.sub_status = {d.mark}")
        params.append(sub_status.value)
    for column, value in texts.items():
        if value is None:
            continue
        if not storable(value):
            return None
        if column == "waiting_on":
            where.append(d.find.format(col="e.waiting_on"))
        elif live and column != "run_id":  # (a run's executions are few: its index)
            where.append(f"{d.aside}e.{column} = {d.mark}")
        else:
            where.append(f"e.{column} = {d.mark}")
        params.append(value)
    return where, params, live


def _order(d: Dialect, order: object, live: bool) -> tuple[list[str], bool]:
    """The sort key's expressions (of live executions only: ``live``), and
    whether descending."""
    seq = d.live_seq if live else f"e.{d.seq}"
    if order == "oldest":
        return [seq], False
    if order == "newest":
        return [seq], True
    if order == "longest_waiting":
        return [_RANK, _SINCE, seq], False
    raise ValueError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")


def _encode(order: str, key: list[Any]) -> str:
    text = json.dumps([order, *key], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode("ascii")


def _unpack(cursor: object, bad: ValueError) -> list[Any]:
    """The JSON list a cursor of ours holds (`_encode`); ``bad`` for anything else."""
    if not isinstance(cursor, str) or not cursor or len(cursor) > _MAX_CURSOR:
        raise bad
    try:
        raw = base64.b64decode(cursor.encode("ascii"), altchars=b"-_", validate=True)
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeError, binascii.Error, ValueError):
        raise bad from None
    if not isinstance(value, list):
        raise bad
    return value


def _decode(cursor: object, order: str) -> list[Any]:
    """The sort key a cursor of `_encode` holds; ValueError naming a cursor that is
    not one, or is one of another order."""
    bad = ValueError(f"malformed cursor {cursor!r}: pass back a Page's next_cursor as it is")
    value = _unpack(cursor, bad)
    if not value or not isinstance(value[0], str):
        raise bad
    if value[0] != order:
        raise ValueError(f"cursor {cursor!r} is a page of order {value[0]!r}, not {order!r}")
    key = value[1:]

    def integer(v: object) -> bool:  # (one a database's 64-bit integer can hold)
        return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63

    if order == "longest_waiting":
        ok = (
            len(key) == 3
            and key[0] in (0, 1)
            and integer(key[0])
            and (integer(key[1]) or isinstance(key[1], float))
            and math.isfinite(key[1])
            and integer(key[2])
        )
        if ok:
            key[1] = float(key[1])
    else:
        ok = len(key) == 1 and integer(key[0])
    if not ok:
        raise bad
    return key


def browse(
    store: object,
    *,
    status: TaskStatus | str | None = None,
    sub_status: SubStatus | str | None = None,
    name: str | None = None,
    key: str | None = None,
    waiting_on: str | None = None,
    run_id: str | None = None,
    order: Order = "newest",
    limit: int = 50,
    cursor: str | None = None,
) -> Page:
    """A page of the executions matching every given filter, in ``order`` (see
    `Order`), at most ``limit`` rows, after ``cursor`` (a `Page.next_cursor` of
    the same order; None: the first page). Walking the cursors visits every
    matching execution once, while none is added; rows that change meanwhile
    may move between pages (a live one that ends leaves ``longest_waiting``).

    ``name``, ``key``, ``run_id``: equal to (case-sensitive); ``waiting_on``: a
    literal, case-sensitive substring of the execution's `waiting_on`, so only
    live executions match it.

    Raises:
      ValueError: an unknown status, sub-status or order, a limit out of range, a
        filter that is not text, or a malformed cursor (naming it).
      TypeError: not a trioexec store.
      StoreError: naming the store, if it cannot be read.
    """
    sql_store, d = _sql_store(store)
    limit = _limit(limit)
    _order(d, order, False)  # (an unknown order: before anything else)
    texts = {"name": name, "key": key, "run_id": run_id, "waiting_on": waiting_on}
    found = _where(d, order, status, sub_status, **texts)
    start = None if cursor is None else _decode(cursor, str(order))
    if found is None:
        return Page(rows=[], next_cursor=None, total=0)
    where, params, live = found
    keys, descending = _order(d, order, live)
    count_where, count_params = list(where), list(params)  # (every page's: no cursor)
    if start is not None:
        marks = ", ".join([d.mark] * len(keys))
        where.append(f"({', '.join(keys)}) {'<' if descending else '>'} ({marks})")
        params.extend(start)
    params.append(limit + 1)
    way = " DESC" if descending else ""
    names = [f"k{i}" for i in range(len(keys))]
    # The page's sort keys first, from the indexes alone where they hold what
    # the filters read; then those few rows, by their submission number.
    inner = (
        f"SELECT {', '.join(f'{k} AS {n}' for k, n in zip(keys, names, strict=True))}"
        f" FROM executions e{_and(where)} ORDER BY {', '.join(k + way for k in keys)}"
        f" LIMIT {d.mark}"
    )
    sql = (
        f"SELECT {RECORD_COLUMNS}, {', '.join(f'k.{n}' for n in names)} FROM ({inner}) AS k"
        f" JOIN executions e ON e.{d.seq} = k.{names[-1]}"
        " LEFT JOIN owners o ON o.owner = e.owner"
        f" ORDER BY {', '.join(f'k.{n}{way}' for n in names)}"
    )
    width = len(RECORD_FIELDS)
    with sql_store.snapshot("browse executions") as conn:
        rows = conn.execute(sql, params).fetchall()
        total = _count(conn, d, count_where, count_params)
    more = len(rows) > limit
    rows = rows[:limit]
    records = [record_of(row[:width], sql_store.path) for row in rows]
    next_cursor = None
    if more:
        last = list(rows[-1][width:])
        if order == "longest_waiting":
            last = [int(last[0]), float(last[1]), int(last[2])]
        next_cursor = _encode(str(order), last)
    return Page(rows=records, next_cursor=next_cursor, total=total)


def _and(where: list[str]) -> str:
    return " WHERE " + " AND ".join(where) if where else ""


def _count(conn: Any, d: Dialect, where: list[str], params: list[object]) -> int | None:
    """How many executions (``e``) hold ``where``: None if over `COUNT_LIMIT` (it
    counts no further)."""
    sql = f"SELECT count(*) FROM (SELECT 1 FROM executions e{_and(where)} LIMIT {d.mark}) AS m"
    counted = int(conn.execute(sql, [*params, COUNT_LIMIT + 1]).fetchone()[0])
    return None if counted > COUNT_LIMIT else counted


def _seconds(what: str, value: object) -> float:
    must = "a finite number of seconds"
    return check_number(what, value, float, must, gt=-math.inf, lt=math.inf)


def activity(
    store: object, *, since: float, bucket: float = 60.0, now: float | None = None
) -> list[Bucket]:
    """The executions that ended from ``since`` to ``now`` (default: the
    store's clock), counted by status (every status of `ENDED`) per ``bucket``
    seconds: ``ceil((now - since) / bucket)`` buckets, oldest first,
    starting at ``since``, empty ones zero-filled (none if ``now <= since``).
    One range of the index on (finished_at, status): no row is read.

    Raises:
      ValueError: a time that is not a finite number, a bucket <= 0, or more
        than `MAX_BUCKETS` buckets (naming the values).
      TypeError: not a trioexec store.
    """
    sql_store, d = _sql_store(store)
    since = _seconds("since", since)
    bucket = _seconds("bucket", bucket)
    if bucket <= 0:
        raise ValueError(f"bucket must be > 0 seconds, got {bucket!r}")
    end = _seconds("now", sql_store.clock() if now is None else now)
    if end <= since:
        return []
    n = math.ceil((end - since) / bucket)
    if n > MAX_BUCKETS:
        raise ValueError(
            f"{n} buckets of {bucket:g} s from {since!r} to {end!r}: at most {MAX_BUCKETS}"
        )
    counts = [dict.fromkeys(ENDED, 0) for _ in range(n)]
    # (No condition on the status: one on it could lead a planner to the status
    # index, and through every completed row.)
    sql = (
        f"SELECT {d.bucket} AS b, e.status, count(*) FROM executions e"
        f" WHERE e.finished_at >= {d.mark} AND e.finished_at <= {d.mark} GROUP BY 1, 2"
    )
    with sql_store.snapshot("count finished executions") as conn:
        rows = conn.execute(sql, (since, bucket, since, end)).fetchall()
    for number, status, count in rows:
        i = min(max(int(number), 0), n - 1)  # (now itself: in the last bucket)
        ended = counts[i]
        if status in ended:  # (a live row with a finished_at: never, but not counted)
            ended[TaskStatus(status)] += int(count)
    return [Bucket(start=since + i * bucket, ended=c) for i, c in enumerate(counts)]


def task_names(store: object, limit: int = 200) -> list[str]:
    """The distinct task names stored, sorted (as Python sorts text), at most
    ``limit`` of them (the first in the database's order). One index seek per
    name (a loose index scan), however many executions each has."""
    sql_store, d = _sql_store(store)
    limit = _limit(limit)
    sql = (
        "WITH RECURSIVE names (name, n) AS ("
        " SELECT min(e.name), 1 FROM executions e"
        " UNION ALL SELECT (SELECT min(e.name) FROM executions e WHERE e.name > names.name),"
        f" names.n + 1 FROM names WHERE names.name IS NOT NULL AND names.n < {d.mark})"
        " SELECT name FROM names WHERE name IS NOT NULL"
    )
    with sql_store.snapshot("query task names") as conn:
        rows = conn.execute(sql, (limit,)).fetchall()
    return sorted(str(row[0]) for row in rows)


def _task_id(task_id: object) -> str | None:
    """``task_id``, checked: None if no store can hold it (no row names it)."""
    checked = _text("task_id", task_id)
    if checked is None:
        raise ValueError("task_id must be a str, got None")
    return checked if storable(checked) else None


def task_commands(store: object, task_id: str) -> list[Command]:
    """The commands naming ``task_id`` (a cancel; a retry of it alone), oldest
    first. A retry of several ids at once, or of every failed one, names no task:
    it is not among them."""
    sql_store, d = _sql_store(store)
    checked = _task_id(task_id)
    if checked is None:
        return []
    sql = f"SELECT {COMMAND_COLUMNS} FROM commands WHERE task_id = {d.mark} ORDER BY seq"
    with sql_store.snapshot("query a task's commands") as conn:
        rows = conn.execute(sql, (checked,)).fetchall()
    return [command_of(row) for row in rows]


@attrs.frozen
class Children:
    """A task's children (`task_children`)."""

    rows: list[ExecutionRecord]  #: the first submitted, in submission order
    total: int | None  #: how many it has (None: over `COUNT_LIMIT`)

    @property
    def more(self) -> int:
        """How many are not among `rows` (at least this many if `total` is None)."""
        return (COUNT_LIMIT + 1 if self.total is None else self.total) - len(self.rows)


def task_children(store: object, task_id: str, limit: int = 50) -> Children:
    """The executions ``task_id`` submitted (those whose ``parent_id`` it is: the
    task tree, API.md §13), the first ``limit`` in submission order, and how many
    in all. One range of the children's index (``executions_children``); they are
    counted only if there are more than ``limit``.

    Raises:
      ValueError: a task id that is not text, a limit out of range.
      TypeError: not a trioexec store.
      StoreError: naming the store, if it cannot be read.
    """
    sql_store, d = _sql_store(store)
    limit = _limit(limit)
    checked = _task_id(task_id)
    if checked is None:
        return Children(rows=[], total=0)
    where = [f"e.parent_id = {d.mark}"]  # (a range of the children's index)
    sql = f"{SELECT_RECORDS}{_and(where)} ORDER BY e.{d.seq} LIMIT {d.mark}"
    with sql_store.snapshot("query a task's children") as conn:
        rows = records_of(conn, sql_store.path, sql, (checked, limit + 1))
        total = len(rows) if len(rows) <= limit else _count(conn, d, where, [checked])
    return Children(rows=rows[:limit], total=total)


@attrs.frozen
class RunPage:
    """One page of `runs_page`."""

    rows: list[RunRecord]
    next_cursor: str | None  #: opaque text; pass back as ``cursor=`` for the next page
    #: the live executions (pending or running) of each running run of the page,
    #: by run id, in submission order: its steps under way, which the run
    #: records only once they end
    live: dict[str, list[ExecutionRecord]] = attrs.field(factory=dict)


_RUN_STATUS = RUN_COLUMNS.index("status")
_RUN_ORDER = "runs"


def _run_key(cursor: object) -> list[Any]:
    """A runs cursor's key: ``[created_at, run_id]``, or ``[None, run_id]`` in
    the runs without a creation time (they come last)."""
    bad = ValueError(f"malformed cursor {cursor!r}: pass back a RunPage's next_cursor as it is")
    value = _unpack(cursor, bad)
    if len(value) != 3 or value[0] != _RUN_ORDER:
        raise bad
    at, run_id = value[1], value[2]
    if not isinstance(run_id, str) or not storable(run_id):
        raise bad
    if at is not None and (
        isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at)
    ):
        raise bad
    return [None if at is None else float(at), run_id]


def runs_page(
    store: object,
    *,
    status: str | None = None,
    workflow: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> RunPage:
    """A page of workflow runs, newest first (by ``created_at``, then ``run_id``;
    runs without a creation time last), with ``status`` and ``workflow`` if
    given (equal to), at most ``limit``, after ``cursor`` (a `RunPage.next_cursor`;
    None: the first page). Keyset pagination on the index of ``(created_at,
    run_id)``: any page costs what the first does. Each run comes with its steps,
    and each running one with its live executions (`RunPage.live`).

    Raises:
      ValueError: a limit out of range, a filter that is not text, or a
        malformed cursor (naming it).
      TypeError: not a trioexec store.
      StoreError: naming the store, if it cannot be read.
    """
    sql_store, d = _sql_store(store)
    limit = _limit(limit)
    filters = {"status": _text("status", status), "workflow": _text("workflow", workflow)}
    start = None if cursor is None else _run_key(cursor)
    given = {column: value for column, value in filters.items() if value is not None}
    if not all(map(storable, given.values())):
        return RunPage(rows=[], next_cursor=None)
    where = [f"r.{column} = {d.mark}" for column in given]
    params: list[object] = list(given.values())
    columns = ", ".join(f"r.{c}" for c in RUN_COLUMNS)
    timed = [*where, "r.created_at IS NOT NULL"]
    untimed = [*where, "r.created_at IS NULL"]
    timed_params, untimed_params = list(params), list(params)
    if start is not None and start[0] is not None:
        timed.append(f"(r.created_at, r.run_id) < ({d.mark}, {d.mark})")
        timed_params += start
    elif start is not None:
        timed = []  # (past every timed run)
        untimed.append(f"r.run_id < {d.mark}")
        untimed_params.append(start[1])
    rows: list[Any] = []
    with sql_store.snapshot("query workflow runs") as conn:
        if timed:
            rows = conn.execute(
                f"SELECT {columns} FROM workflow_runs r{_and(timed)}"
                f" ORDER BY r.created_at DESC, r.run_id DESC LIMIT {d.mark}",
                [*timed_params, limit + 1],
            ).fetchall()
        if len(rows) <= limit:
            rows += conn.execute(
                f"SELECT {columns} FROM workflow_runs r{_and(untimed)}"
                f" ORDER BY r.run_id DESC LIMIT {d.mark}",
                [*untimed_params, limit + 1 - len(rows)],
            ).fetchall()
        more = len(rows) > limit
        rows = rows[:limit]
        steps: dict[str, dict[str, tuple[str, str | None]]] = {r[0]: {} for r in rows}
        if rows:
            marks = ", ".join([d.mark] * len(rows))
            for run_id, step_id, state, output in conn.execute(
                f"SELECT s.run_id, s.step_id, s.state, s.output FROM workflow_steps s"
                f" WHERE s.run_id IN ({marks}) ORDER BY s.{d.seq}",
                [r[0] for r in rows],
            ).fetchall():
                steps[run_id][step_id] = (state, output)
        running = [r[0] for r in rows if r[_RUN_STATUS] == "running"]
        live: dict[str, list[ExecutionRecord]] = {run_id: [] for run_id in running}
        if running:
            marks = ", ".join([d.mark] * len(running))
            sql = f"{SELECT_RECORDS} WHERE e.run_id IN ({marks}) AND {_LIVE_SQL} ORDER BY e.{d.seq}"
            for record in records_of(conn, sql_store.path, sql, running):
                live[str(record.run_id)].append(record)
    records = [run_of(row, steps[row[0]]) for row in rows]
    last = records[-1] if more else None
    next_cursor = None if last is None else _encode(_RUN_ORDER, [last.created_at, last.run_id])
    return RunPage(rows=records, next_cursor=next_cursor, live=live)
