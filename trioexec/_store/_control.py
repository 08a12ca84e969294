"""Operator commands (pause, resume, cancel) and requeues of dead letters: the rules
(`check_command`, `pause_turn`, `cancel_plan`, `requeue_refusal`, `append_command`'s pruning)
and the SQL of `Store.command` and `Store.requeue`, written once with the
placeholder (``?`` or ``%s``) as a parameter.

**Order.** Commands apply in the order they were issued, not recorded: an
executor records its pauses and resumes from a task of its own, after the call
returned. Each carries its issue time (``at``); a pause or resume issued before
the last one applied to its target changes nothing. So the pauses table keeps a
row per target once resumed too (``paused`` false), with the issue time of the
latest pause or resume applied to it (``latest``).

**Clocks.** Hosts' clocks order their commands, as they decide leases. A clock
ahead must not pin a target: an issue time more than `MAX_SKEW` after the
recording store's clock is refused (seconds mistaken for milliseconds, say), and
a target's latest issue time that far after it does not order a new command (a
host's clock that far ahead, or a row older than this rule). So a host's clock
ahead by up to `MAX_SKEW` can hold another's later command off for as long, never
more.

**Retention.** The log keeps the newest `KEEP_COMMANDS` commands and every one of
the last `KEEP_SECONDS`; older ones, and targets resumed that long ago, are
deleted as new commands are recorded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from .._changes import Requeue
from .._records import ExecutionRecord, check_id, check_number
from ._base import (
    COMMAND_FIELDS,
    LIVE,
    RECORD_COLUMNS,
    SELECT_RECORDS,
    TRANSITIONS,
    Command,
    Requeued,
    apply_change,
    record_by_id,
    records_of,
    update_sql,
    upsert_sql,
)
from ._dialect import Dialect

NOT_RECREATABLE = (
    "not re-creatable: submitted without a registered TaskSpec or with arguments that are not JSON"
)
#: How the detail of a pause or resume that changed nothing, being issued
#: before the latest one applied to its target, begins.
SUPERSEDED_COMMAND = "superseded"
#: The commands log keeps at least the newest this many commands...
KEEP_COMMANDS = 1_000
#: ...and every command issued in the last this many seconds (store's clock).
KEEP_SECONDS = 3_600.0
#: Old commands are deleted when a seq that is a multiple of this is recorded.
PRUNE_EVERY = 100
#: How far (seconds) a command's issue time may be after the clock of the store
#: that records it, and hosts' clocks apart for their commands to be ordered by
#: them (see **Clocks** above).
MAX_SKEW = 60.0


@attrs.frozen
class Asked:
    """A `Store.command` checked (`check_command`), for a store to carry out:
    ``pause`` is the (kind, value) a pause or resume turns, None for a cancel;
    ``issued`` when it was issued (None: now)."""

    kind: str
    pause: tuple[str, str] | None
    task_id: str | None
    who: str
    issued: float | None


def check_command(
    kind: str,
    name: str | None,
    key: str | None,
    task_id: str | None,
    who: str,
    at: float | None = None,
) -> Asked:
    """Refuse a `Store.command` that cannot be carried out (ValueError naming the
    bad value: its arguments may come from anywhere, whatever their types say)."""
    check_id("who", who)
    pause: tuple[str, str] | None = None
    if kind == "pause" or kind == "resume":
        if task_id is not None:
            raise ValueError(f"a {kind} takes a name or a key, not a task_id ({task_id!r})")
        if (name is None) == (key is None):
            raise ValueError(
                f"a {kind} takes exactly one of name and key, got name={name!r}, key={key!r}"
            )
        pause = ("name", check_id("name", name)) if key is None else ("key", check_id("key", key))
    elif kind == "cancel":
        if name is not None or key is not None:
            raise ValueError(f"a cancel takes a task_id only, got name={name!r}, key={key!r}")
        if task_id is None:
            raise ValueError("a cancel needs a task_id")
        check_id("task_id", task_id)
    else:
        hint = " (a retry is Store.requeue)" if kind == "retry" else ""
        raise ValueError(f"kind must be 'pause', 'resume' or 'cancel', got {kind!r}{hint}")
    if at is not None:
        must = "a time in seconds >= 0 (the store's clock: Unix seconds)"
        typed = "a number of seconds"
        at = check_number("at", at, float, must, typed=typed, ge=0, lt=math.inf, stored=True)
    return Asked(kind, pause, task_id, who, at)


@attrs.frozen(kw_only=True)
class PauseRow:
    """A row of the pauses table: a target paused now, or resumed (kept to order
    the commands that arrive late, until `append_command` prunes it)."""

    paused: bool
    who: str  #: who paused it (the first pause of this pause), or resumed it
    at: float  #: when that was issued
    latest: float  #: the issue time of the latest pause or resume applied to it


def pause_turn(
    row: PauseRow | None, kind: str, who: str, at: float, now: float
) -> tuple[PauseRow | None, bool, str]:
    """A pause or resume (``kind``) issued by ``who`` at ``at``, recorded at
    ``now``, against its target's row (None: none yet): (the row to write, None
    to leave it as it is; changed; the command's detail). One issued before the
    latest one applied changes nothing, unless that one's time is more than
    `MAX_SKEW` after ``now`` (a clock that far ahead orders nothing); at the
    same instant, the one recorded later wins."""
    if row is not None and at < row.latest <= now + MAX_SKEW:
        return None, False, f"{SUPERSEDED_COMMAND} by a later {'pause' if row.paused else 'resume'}"
    if kind == "pause":
        if row is not None and row.paused:
            return attrs.evolve(row, latest=at), False, "already paused"
        return PauseRow(paused=True, who=who, at=at, latest=at), True, "paused"
    if row is not None and row.paused:
        return PauseRow(paused=False, who=who, at=at, latest=at), True, "resumed"
    if row is None:  # never paused: a row all the same, to order a pause issued before it
        return PauseRow(paused=False, who=who, at=at, latest=at), False, "not paused"
    return attrs.evolve(row, latest=at), False, "not paused"


#: `Store.requeue`'s arguments, checked: the ids asked (None: every failed
#: one), the name filter and ``since``.
Requeuing = tuple[list[str] | None, str | None, float | None]


def check_requeue(task_ids: object, name: object, since: object, who: object) -> Requeuing:
    """`Store.requeue`'s arguments, checked (ValueError naming the bad value)."""
    check_id("who", who)
    if name is not None:
        check_id("name", name)
    if since is not None:
        must = "seconds (a float) or None"  # (any but NaN: within no bound)
        since = check_number("since", since, float, must, le=math.inf, stored=True)
    if task_ids is None:
        return None, name, since  # type: ignore[return-value]
    if isinstance(task_ids, str | bytes) or not isinstance(task_ids, Sequence):
        raise ValueError(f"task_ids must be a sequence of task ids or None, got {task_ids!r}")
    if name is not None or since is not None:
        raise ValueError(
            "name and since choose among the failed executions: give them without task_ids"
            f" (got name={name!r}, since={since!r})"
        )
    return [check_id("task_id", t) for t in task_ids], None, None


def cancel_plan(record: ExecutionRecord | None, now: float) -> tuple[bool, bool, str]:
    """What a cancel of ``record`` (None: unknown) does at ``now``: (changed,
    cancel it in the store, detail). A live owner's execution is left to its
    owner, which sees the command; one nobody runs is the store's to cancel."""
    if record is None:
        return False, False, "no such task"
    if record.status not in LIVE:
        return False, False, f"already finished ({record.status.value})"
    lease = record.lease_expires_at
    if record.owner is not None and lease is not None and lease >= now:
        return True, False, f"sent to its owner {record.owner}"
    return True, True, "cancelled in the store (no live owner)"


def descendants_sql(d: Dialect, task_id: str | None) -> tuple[str, tuple[object, ...]]:
    """The query of the unfinished descendants of ``task_id`` (their records, in
    submission order), through ended ones: a recursive walk down ``parent_id``."""
    m = d.mark
    sql = (
        "WITH RECURSIVE tree (task_id) AS ("
        f"SELECT task_id FROM executions WHERE parent_id = {m}"
        " UNION SELECT e.task_id FROM executions e JOIN tree t ON e.parent_id = t.task_id)"
        # (from the tree: its rows by their key, never a scan of the live ones)
        f" SELECT {RECORD_COLUMNS} FROM tree t JOIN executions e ON e.task_id = t.task_id"
        " LEFT JOIN owners o ON o.owner = e.owner"
        f" WHERE e.status IN ('pending', 'running') ORDER BY e.{d.seq}"
    )
    return sql, (task_id,)


def requeue_refusal(record: ExecutionRecord | None) -> str | None:
    """Why ``record`` (None: unknown) cannot be requeued, or None if it can."""
    if record is None:
        return "no such task"
    if record.status in LIVE:
        return f"still {record.status.value}"
    if record.status not in TRANSITIONS["requeue"][0]:
        return record.status.value  # "completed", "dropped", "rejected"
    if record.run_id is not None:
        return "a workflow step: resume its run"
    if not record.recreatable:
        return NOT_RECREATABLE
    return None


# ---------------------------------------------------------------------- SQL

COMMAND_COLUMNS = ", ".join(COMMAND_FIELDS)


def command_of(row: Sequence[Any]) -> Command:
    """A row of the commands table (`COMMAND_FIELDS`) as a record."""
    values = dict(zip(COMMAND_FIELDS, row, strict=True))
    values["changed"] = bool(values["changed"])  # (SQLite: 0 or 1)
    return Command(**values)


def append_command(conn: Any, mark: str, now: float, who: str, **fields: Any) -> Command:
    """Append one command (``fields``: kind, name, key, task_id, changed, detail,
    and ``at``, when it was issued: ``now`` if not given). Every `PRUNE_EVERY`
    seqs, delete the commands past the newest `KEEP_COMMANDS` and issued over
    `KEEP_SECONDS` ago, and the targets resumed (their latest command issued)
    that long ago."""
    values = {"name": None, "key": None, "task_id": None, "at": now, **fields, "who": who}
    columns = [c for c in COMMAND_FIELDS if c != "seq"]
    row = conn.execute(
        f"INSERT INTO commands ({', '.join(columns)})"
        f" VALUES ({', '.join([mark] * len(columns))}) RETURNING seq",
        [values[c] for c in columns],
    ).fetchone()
    seq = int(row[0])
    if seq % PRUNE_EVERY == 0:  # (a range of the primary key, then a small table)
        bounds = (seq - KEEP_COMMANDS, now - KEEP_SECONDS)
        conn.execute(f"DELETE FROM commands WHERE seq <= {mark} AND at < {mark}", bounds)
        conn.execute(f"DELETE FROM pauses WHERE NOT paused AND latest < {mark}", bounds[1:])
    return Command(seq=seq, **values)


def sql_command(conn: Any, d: Dialect, where: str, now: float, asked: Asked) -> Command:
    """`Store.command` (``asked``) in a SQL store's transaction (``conn``), at
    ``now``; ``where`` names the store in errors."""
    m = d.mark
    at = now if asked.issued is None else asked.issued
    if at > now + MAX_SKEW:  # (milliseconds, or a clock that far ahead, would order all after it)
        raise ValueError(
            f"at={at!r} is {at - now:.6g} s after the store's clock ({now!r}):"
            f" an issue time is seconds on the store's clock, at most {MAX_SKEW:g} s ahead"
        )
    if asked.pause is not None:
        sql = f"SELECT paused, who, at, latest FROM pauses WHERE kind = {m} AND value = {m}"
        found = conn.execute(sql, asked.pause).fetchone()
        row: PauseRow | None = None
        if found is not None:  # (SQLite's paused: 0 or 1)
            row = PauseRow(paused=bool(found[0]), who=found[1], at=found[2], latest=found[3])
        new, changed, detail = pause_turn(row, asked.kind, asked.who, at, now)
        if new is not None:
            sql = upsert_sql(m, "pauses", "kind, value, who, at, paused, latest", "kind, value")
            conn.execute(sql, (*asked.pause, new.who, new.at, new.paused, new.latest))
        target: dict[str, str | None] = dict([asked.pause])  # (its name or its key)
    else:
        record = record_by_id(conn, m, where, asked.task_id, d.lock_row)
        changed, in_store, detail = cancel_plan(record, now)
        error = f"cancelled by {asked.who}"  # (the error of an execution the store cancels)
        if record is not None and in_store:
            conn.execute(update_sql("cancel", m), (now, error, record.task_id, record.version))
        # Its unfinished descendants too: those nobody runs here, the others by
        # their owners, which see the command (`trioexec._control`).
        below = records_of(conn, where, *descendants_sql(d, asked.task_id))
        gone = f"{error}: its ancestor {asked.task_id!r} was cancelled"
        for child in below:
            if cancel_plan(child, now)[1]:
                conn.execute(update_sql("cancel", m), (now, gone, child.task_id, child.version))
        if below:
            changed = True
            detail += f"; {len(below)} unfinished descendant(s) too"
        target = {"task_id": asked.task_id}
    return append_command(
        conn, m, now, asked.who, at=at, kind=asked.kind, changed=changed, detail=detail, **target
    )


def sql_requeue(
    conn: Any, d: Dialect, where: str, now: float, checked: Requeuing, who: str
) -> Requeued:
    """`Store.requeue` (``checked``: `check_requeue`) in a SQL store's transaction
    (``conn``), at ``now``; ``where`` names the store in errors."""
    m = d.mark
    asked, name, since = checked
    done: list[ExecutionRecord] = []
    refused: list[tuple[str, str]] = []

    def judge(task_id: str, record: ExecutionRecord | None) -> None:
        why = requeue_refusal(record)
        if why is None and record is not None and record.dedupe_key is not None:
            # (one execution per dedupe key: a second must not run it again)
            holder = conn.execute(
                f"SELECT task_id, status FROM executions WHERE dedupe_key = {m}"
                f" AND status IN ('pending', 'running', 'completed') LIMIT 1",
                (record.dedupe_key,),
            ).fetchone()
            if holder is not None:
                why = f"its dedupe key is held by {holder[0]!r} ({holder[1]})"
        if why is not None:
            refused.append((task_id, why))
            return
        assert record is not None
        conn.execute(update_sql("requeue", m), (record.task_id, record.version))
        # (as the requeue left it, by `TRANSITIONS`: its attempt, error and
        # traceback kept; with no owner's lease)
        values = attrs.asdict(record, recurse=False)
        apply_change(values, Requeue((record.task_id, record.version)))
        done.append(ExecutionRecord(**{**values, "lease_expires_at": None}))

    if asked is None:
        sql = f"{SELECT_RECORDS} WHERE e.status = 'failed'"
        params: list[object] = []
        if name is not None:
            sql += f" AND e.name = {m}"
            params.append(name)
        if since is not None:
            sql += f" AND e.finished_at >= {m}"
            params.append(since)
        for record in records_of(conn, where, f"{sql} ORDER BY e.{d.seq}{d.lock_row}", params):
            judge(record.task_id, record)
    else:
        for task_id in asked:  # (read one by one: an id asked twice is pending the second time)
            judge(task_id, record_by_id(conn, m, where, task_id, d.lock_row))
    one = asked[0] if asked is not None and len(asked) == 1 else None
    detail = f"requeued {len(done)}, refused {len(refused)}"
    command = append_command(
        conn, m, now, who, kind="retry", name=name, task_id=one, changed=bool(done), detail=detail
    )
    return Requeued(requeued=done, refused=refused, command=command)
