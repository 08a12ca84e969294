"""The `Store` seam: the few synchronous operations the executor needs, and the
change records it hands over in batches (group commit)."""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Callable, Collection, Sequence
from typing import Any, Literal, Protocol

import attrs

from .._changes import Change, ExecutionRow, RunChange, Transition, widen
from .._columns import ROW_COLUMNS, SPARSE
from .._errors import StoreError
from .._records import (
    ExecutionRecord,
    SubStatus,
    TaskStatus,
    check_number,
    matchable,
)
from ._key_ledger import KeyGrant, KeyRequest

LIVE = (TaskStatus.PENDING, TaskStatus.RUNNING)

#: How `Store.executions` orders its answer: ``"oldest"`` submission first (the
#: default), ``"newest"`` first, or ``"longest_deferred"`` (earliest ``deferred_since``
#: first, executions that are not deferred last; submission order breaks ties).
Order = Literal["oldest", "newest", "longest_deferred"]
ORDERS: tuple[Order, ...] = ("oldest", "newest", "longest_deferred")


# ---------------------------------------------------------------------- transitions

#: Take the change's value of this column (its fields after kind, task id and
#: version are the columns marked `ARG` or `FIRST`, in the table's order).
ARG = "<arg>"
#: Take it only if the row has none yet (``coalesce(column, value)``).
FIRST = "<first>"
#: One more than it was (a version: the owner that had it is fenced out).
BUMP = "<bump>"
#: What ending an execution clears.
_ENDED = {"sub_status": None, "deferred_since": None, "waiting_on": None, "traceback": None}
#: What sending one back to pending sets.
_PENDING = {"status": TaskStatus.PENDING, "sub_status": None, "deferred_since": None}
#: What each kind of change does to a live execution's row: the statuses it
#: applies in (fenced otherwise, as is a version that is not the row's), and
#: each column it sets: to a constant, or to the change's value (`ARG`, `FIRST`).
#: The one statement of these rules: the rows a batch folds before inserting them
#: (`fold_row`), a record's values (`apply_change`) and the SQL stores' ``UPDATE``
#: statements (`update_sql`) all derive from it.
TRANSITIONS: dict[str, tuple[tuple[TaskStatus, ...], dict[str, object]]] = {
    "start": (
        LIVE,
        {
            "status": TaskStatus.RUNNING,
            "sub_status": SubStatus.ACTIVE,
            "attempt": ARG,
            "started_at": FIRST,
            "waiting_on": None,
        },
    ),
    # (a sub-status exists only while running)
    "sub": ((TaskStatus.RUNNING,), {"sub_status": ARG, "deferred_since": ARG, "waiting_on": ARG}),
    "wait": (LIVE, {"waiting_on": ARG}),
    "retry": (LIVE, {**_PENDING, "error": ARG, "waiting_on": "retry backoff"}),
    "finish": (
        LIVE,
        {
            "status": ARG,
            "sub_status": None,
            "deferred_since": None,
            "waiting_on": None,
            "finished_at": ARG,
            "error": ARG,
            "traceback": ARG,
            "args": FIRST,  # (a dead letter's arguments, if the row has none)
        },
    ),
    "kept": ((TaskStatus.COMPLETED,), {"result": ARG}),
    # What a store does on its own (never journaled by an executor): end a live
    # execution (a recovery verdict, a run's superseded steps), cancel one with no
    # live owner (a command), and claim one an expired owner left.
    "end": (LIVE, {"status": ARG, **_ENDED, "finished_at": ARG, "error": ARG}),
    "cancel": (
        LIVE,
        {
            "status": TaskStatus.CANCELLED,
            "version": BUMP,
            **_ENDED,
            "finished_at": ARG,
            "error": ARG,
        },
    ),
    # (an operator's requeue of a dead letter: its attempt, error and traceback kept)
    "requeue": (
        (TaskStatus.FAILED, TaskStatus.TIMED_OUT, TaskStatus.CANCELLED),
        {
            **_PENDING,
            "owner": None,
            "version": BUMP,
            "recovery_attempts": 0,
            "finished_at": None,
            "waiting_on": "slot",
        },
    ),
    # (a claim given back before it ran: ownerless, so any executor recovers it,
    # and its claim, as a requeued one's, counts no recovery more)
    "release": (LIVE, {"owner": None, "version": BUMP}),
    "claim": (
        LIVE,
        {"owner": ARG, "version": BUMP, **_PENDING, "waiting_on": "slot", "recovery_attempts": ARG},
    ),
}


def _folds(
    place: Callable[[str], object], widen: Callable[[Any], object] | None = None
) -> dict[str, Callable[[Any, Any], bool]]:
    """For each kind of `TRANSITIONS`, a function that folds a change of that kind
    into a row whose columns sit at ``place(column)`` (a "row" list's index, a
    dict's key); False (nothing changed) if fenced. Compiled from the table, as
    attrs compiles an ``__init__``: every stored task folds two changes on the hot
    path, and a loop over the table's entries cost twice the bytecodes."""
    folds: dict[str, Callable[[Any, Any], bool]] = {}
    for kind, (guard, sets) in TRANSITIONS.items():
        fields = [c for c, how in sets.items() if how is ARG or how is FIRST]
        field = {c: 2 + i for i, c in enumerate(fields)}  # (after the task id and version)
        names: dict[str, Any] = {"guard": guard, "widen": widen}
        body = [
            f"if row[{place('version')!r}] != change[1] or row[{place('status')!r}] not in guard:",
            "    return False",
        ]
        if widen is not None and any(ROW_COLUMNS.index(c) in SPARSE for c in sets):
            body.append("widen(row)")  # (a list row has its sparse columns once it needs one)
        for column, how in sets.items():
            at = place(column)
            if how is ARG:
                body.append(f"row[{at!r}] = change[{field[column]}]")
            elif how is FIRST:
                body += [f"if row[{at!r}] is None:", f"    row[{at!r}] = change[{field[column]}]"]
            elif how is BUMP:
                body.append(f"row[{at!r}] += 1")
            else:  # (a constant: None, a status or a text)
                names[f"v{len(names)}"] = how
                body.append(f"row[{at!r}] = v{len(names) - 1}")
        lines = "".join(f"    {line}\n" for line in [*body, "return True"])
        exec(compile(f"def fold(row, change):\n{lines}", f"<fold {kind}>", "exec"), names)
        folds[kind] = names["fold"]
    return folds


#: For each kind, its fold into an `ExecutionRow` (`fold_row`; the journal calls
#: them directly: one call less for each change a stored task makes)
ROW_FOLDS = _folds(ROW_COLUMNS.index, widen)
_BY_NAME = _folds(lambda column: column)  # (values by column name)


@functools.cache
def update_sql(kind: str, mark: str, by: str = "task_id = {m} AND version = {m}") -> str:
    """The SQL stores' ``UPDATE`` of an execution by a change of ``kind``
    (`TRANSITIONS`), with ``mark`` as the placeholder: its parameters are the
    change's fields after its version, then those of ``by`` (the rows it
    updates: the task id and version by default)."""
    guard, sets = TRANSITIONS[kind]
    assignments = []
    for column, how in sets.items():
        if how is ARG:
            assignments.append(f"{column} = {mark}")
        elif how is FIRST:
            assignments.append(f"{column} = coalesce({column}, {mark})")
        elif how is BUMP:
            assignments.append(f"{column} = {column} + 1")
        else:  # (constants: None or a status, never a caller's text)
            value = "NULL" if how is None else repr(getattr(how, "value", how))
            assignments.append(f"{column} = {value}")
    statuses = ", ".join(repr(s.value) for s in guard)
    return (
        f"UPDATE executions SET {', '.join(assignments)}"
        f" WHERE {by.format(m=mark)} AND status IN ({statuses})"
    )


@functools.cache  # (a keyed task's settle and every lease renewal ask for one)
def upsert_sql(mark: str, table: str, columns: str, keys: str) -> str:
    """The SQL stores' ``INSERT`` of a row of ``columns`` (``"a, b"``) into
    ``table`` that updates the others of the row of its ``keys`` if there is one
    (``mark``: the placeholder)."""
    names = columns.split(", ")
    sets = ", ".join(f"{c} = excluded.{c}" for c in names if c not in keys.split(", "))
    into = f"INSERT INTO {table} ({columns}) VALUES ({', '.join([mark] * len(names))})"
    return f"{into} ON CONFLICT ({keys}) DO UPDATE SET {sets}"


def fold_row(row: ExecutionRow, change: Transition) -> bool:
    """`apply_change` for an `ExecutionRow` not written yet: fold ``change`` into it.
    Returns False (and changes nothing) if the change is fenced out."""
    return ROW_FOLDS[change.kind](row, change)


def fold_batch(
    changes: Sequence[Change],
    update: Callable[[Transition | RunChange], bool],
) -> tuple[list[ExecutionRow], list[str]]:
    """How a SQL store writes a batch: an execution first submitted in it is folded
    in memory (by the same `TRANSITIONS`) and inserted once, final
    state and all; under load most batches hold submit, start and finish of the
    same short tasks. ``update(change)`` writes any other change (a run change, a
    transition of a stored execution), False if fenced.

    Returns the new rows to insert (in submission order; never the executor's
    own lists if they change; the store refuses those whose id it holds
    already) and the fenced task ids."""
    fenced: list[str] = []
    fresh: dict[object, ExecutionRow] = {}
    copied: set[object] = set()  # ids in fresh whose row is our own copy
    refused: set[object] = set()  # ids whose row was refused: the rest too
    for change in changes:
        task_id = change[0]
        if isinstance(change, list):
            if task_id in fresh:
                fenced.append(str(task_id))
                refused.add(task_id)
            else:
                fresh[task_id] = change
        elif isinstance(change, RunChange):
            if not update(change):
                fenced.append(str(task_id))
        elif task_id in refused:
            fenced.append(str(task_id))
        elif task_id in fresh:
            if task_id not in copied:  # (the executor's list is not ours to change)
                fresh[task_id] = list(fresh[task_id])
                copied.add(task_id)
            if not fold_row(fresh[task_id], change):
                fenced.append(str(task_id))
        elif not update(change):
            fenced.append(str(task_id))
    return list(fresh.values()), fenced


def apply_change(row: dict[str, object], change: Transition) -> bool:
    """Apply ``change`` to ``row`` (values by column name) in place. Returns False
    (and changes nothing) if it is fenced out."""
    return _BY_NAME[change.kind](row, change)


@attrs.frozen(kw_only=True)
class RunRecord:
    """A workflow run as a store has it: enough to resume it."""

    run_id: str
    workflow: str
    status: str
    context: str  #: the initial context, JSON
    owner: str | None
    created_at: float | None
    finished_at: float | None
    steps: dict[str, tuple[str, str | None]]  #: step id -> (state, output JSON or None)
    recovery_attempts: int = 0
    #: step id -> the step ids it depends on, in the workflow's run order, as
    #: written when the run was created (None: a run written before it was kept)
    graph: dict[str, list[str]] | None = None


#: `RunRecord`'s fields but its steps: the workflow_runs table's columns.
RUN_COLUMNS = tuple(f.name for f in attrs.fields(RunRecord) if f.name != "steps")


def run_of(row: Sequence[object], steps: dict[str, tuple[str, str | None]]) -> RunRecord:
    """A workflow_runs row (`RUN_COLUMNS`) and its steps as a record. A graph
    this trioexec cannot read (a hand-edited row) reads as None: it only draws
    the run (a run resumes by its workflow's own steps), so it never makes the
    run itself unreadable."""
    values: dict[str, Any] = dict(zip(RUN_COLUMNS, row, strict=True))
    try:
        found = json.loads(str(values["graph"]))
        values["graph"] = {str(k): [str(d) for d in v] for k, v in found.items()}
    except (ValueError, TypeError, AttributeError):
        values["graph"] = None
    return RunRecord(**values, steps=steps)


#: The SQL stores' query of executions with their owner's lease (``e``, ``o``).
RECORD_FIELDS = tuple(f.name for f in attrs.fields(ExecutionRecord) if f.name != "result_kept")
#: Their columns (``e``: executions, ``o``: owners), in `RECORD_FIELDS`' order.
RECORD_COLUMNS = ", ".join(f"o.{f}" if f == "lease_expires_at" else f"e.{f}" for f in RECORD_FIELDS)
SELECT_RECORDS = (
    f"SELECT {RECORD_COLUMNS} FROM executions e LEFT JOIN owners o ON o.owner = e.owner"
)


def record_of(row: Sequence[object], where: str) -> ExecutionRecord:
    """A row of `SELECT_RECORDS` as a record; `StoreError` naming ``where`` (the
    store) and the task for a row this trioexec cannot read."""
    values: dict[str, Any] = dict(zip(RECORD_FIELDS, row, strict=True))
    try:
        status = TaskStatus(values["status"])
        sub = None if values["sub_status"] is None else SubStatus(values["sub_status"])
    except ValueError:
        raise StoreError(
            f"{where}: execution {values['task_id']!r} has an unreadable row"
            f" (status {values['status']!r}, sub-status {values['sub_status']!r})"
        ) from None
    kept = values["result"]
    if kept is not None:
        try:
            values["result"] = json.loads(kept)
        except ValueError:
            raise StoreError(
                f"{where}: execution {values['task_id']!r} has an unreadable kept result"
            ) from None
    values.update(status=status, sub_status=sub, result_kept=kept is not None)
    return ExecutionRecord(**values)


def records_of(conn: Any, where: str, sql: str, params: Sequence[object]) -> list[ExecutionRecord]:
    """The records a query of `RECORD_COLUMNS` (`SELECT_RECORDS` ...) finds, in its
    order (`record_of`: ``where`` names the store)."""
    return [record_of(row, where) for row in conn.execute(sql, params).fetchall()]


def record_by_id(
    conn: Any, mark: str, where: str, task_id: str | None, lock: str = ""
) -> ExecutionRecord | None:
    """Execution ``task_id``'s record, or None (``lock``: `Dialect.lock_row`)."""
    found = records_of(conn, where, f"{SELECT_RECORDS} WHERE e.task_id = {mark}{lock}", (task_id,))
    return found[0] if found else None


SUPERSEDED = "superseded: its workflow run was resumed by another executor"
RUN_ORPHANED = "orphaned: its owner's lease expired and its workflow is not registered here"


@attrs.frozen(kw_only=True)
class ScheduleRecord:
    """A schedule as a store has it (`Executor.schedule`): what ``trioexec
    schedules`` lists. Times are the store's wall clock, in seconds."""

    schedule_id: str
    cron: str
    tz: str  #: the IANA time zone its cron expression is read in
    name: str  #: the task name its occurrences run under
    next_run: float | None = None  #: as the executor that ran it last computed it
    last_run: float | None = None  #: the latest occurrence claimed (None: none yet)


#: `ScheduleRecord`'s fields, in order: the SQL stores' schedules columns.
SCHEDULE_FIELDS = tuple(f.name for f in attrs.fields(ScheduleRecord))


def schedule_of(row: Sequence[Any]) -> ScheduleRecord:
    """A row of the SQL stores' schedules table (`SCHEDULE_FIELDS`) as a record."""
    return ScheduleRecord(**dict(zip(SCHEDULE_FIELDS, row, strict=True)))


@attrs.frozen
class RunRecovery:
    """What one `Store.claim_runs` pass did."""

    claimed: list[RunRecord]  #: now ours: resume them
    orphaned: list[RunRecord]  #: failed: their workflow is unknown to the claimer
    abandoned: list[RunRecord]  #: failed: resumed too often


@attrs.frozen
class Recovery:
    """What one recovery pass did."""

    claimed: list[ExecutionRecord]  #: now ours (pending, version bumped): run them again
    orphaned: list[ExecutionRecord]  #: failed 'orphaned': cannot be re-created
    abandoned: list[ExecutionRecord]  #: failed 'abandoned': recovered too often


@attrs.frozen(kw_only=True)
class Command:
    """One operator command as a store recorded it (`Store.command`,
    `Store.requeue`): every command is kept, whether or not it changed anything.

    ``seq`` increases from 1 per store (every process on it sees one order);
    ``at`` is when it was issued, on the store's clock (for `Executor.pause`, when
    it was called: it is recorded a moment later). ``detail`` says what it did,
    for people: ``"paused"``, ``"already paused"``, ``"resumed"``, ``"not
    paused"``, ``"superseded by a later resume"`` (or pause: issued before the
    last one applied to its target), ``"sent to its owner <owner>"``,
    ``"cancelled in the store (no live owner)"``, ``"no such task"``,
    ``"already finished (<status>)"``, ``"requeued 3, refused 1"``. The log keeps
    the newest 1,000 commands and those of the last hour (`_control.KEEP_COMMANDS`).
    """

    seq: int
    kind: str  #: "pause", "resume", "cancel" or "retry"
    name: str | None = None
    key: str | None = None
    task_id: str | None = None
    who: str
    at: float
    changed: bool  #: False: nothing to do (already in that state, unknown, finished...)
    detail: str


#: `Command`'s fields, in order: the SQL stores' commands columns.
COMMAND_FIELDS = tuple(f.name for f in attrs.fields(Command))


@attrs.frozen(kw_only=True)
class Pause:
    """What is paused now (`Store.pauses`): pending tasks of that name, or of
    that admission key, do not start."""

    kind: Literal["name", "key"]
    value: str
    who: str
    at: float


@attrs.frozen(kw_only=True)
class Requeued:
    """What one `Store.requeue` did."""

    requeued: list[ExecutionRecord]  #: as they are now: pending, no owner, version + 1
    refused: list[tuple[str, str]]  #: (task id, why), in the order asked
    command: Command  #: the "retry" command recorded for this call


class Store(Protocol):
    """What an executor needs from a store. All calls are synchronous and short.

    An executor makes one call at a time, except `heartbeat`: it renews the
    lease from a thread of its own, while another call may be running (a
    store serialises what must be, as the SQLite store's write lock does)."""

    clock: Callable[[], float]

    @property
    def inline(self) -> bool:
        """True: call from the Trio thread (no worker thread; autojump-friendly)."""
        ...

    def write(self, changes: Sequence[Change]) -> list[str]:
        """Apply ``changes`` in order, in one transaction. Returns the task ids whose
        change was fenced out (their version moved on: another owner has them; or
        their submission was refused, the id being stored already), in no set
        order, an id perhaps more than once."""
        ...

    def heartbeat(self, owner: str, lease_expires_at: float) -> None:
        """Create or renew ``owner``'s one lease."""
        ...

    def taken_over(self, owner: str, live: dict[str, int]) -> list[str]:
        """Of ``live`` (task id -> version this owner runs), those no longer ours."""
        ...

    def recover(
        self,
        owner: str,
        now: float,
        recreatable: Callable[[ExecutionRecord], bool],
        max_recovery_attempts: int,
        limit: int | None = None,
    ) -> Recovery:
        """Atomically claim the live executions of owners whose lease expired before
        ``now``, oldest first: the re-creatable ones become ``owner``'s (pending,
        version + 1, ``recovery_attempts`` + 1), at most ``limit`` of them; the rest
        fail ``orphaned``; past ``max_recovery_attempts`` they fail ``abandoned``.
        One with no owner (requeued by `requeue`, or a claim an executor gave
        back as it closed) is no expiry: it is claimed without counting an
        attempt, never abandoned, and left for an executor that can re-create it
        (`_verdict.recovery_verdict` decides for every store). Never touches
        finished rows."""
        ...

    def claim_runs(
        self,
        owner: str,
        now: float,
        workflows: Collection[str],
        max_recovery_attempts: int,
    ) -> RunRecovery:
        """Atomically deal with the unfinished runs whose owner's lease expired
        before ``now``: those of the named workflows are taken over (their live step
        executions cancelled as superseded; ``recovery_attempts`` + 1); past
        ``max_recovery_attempts``, or of a workflow not named, the run and its live
        steps fail ('abandoned...' / 'orphaned')."""
        ...

    def run(self, run_id: str) -> RunRecord | None:
        """One workflow run, or None (also for an id no store can hold: see
        `execution`)."""
        ...

    def runs_taken_over(self, owner: str, run_ids: Collection[str]) -> list[str]:
        """Of ``run_ids`` (runs ``owner`` coordinates), those another owner has now."""
        ...

    def runs(self, *, status: str | None = None) -> list[RunRecord]:
        """Workflow runs, oldest first."""
        ...

    def release_owner(self, owner: str) -> None:
        """Forget ``owner``'s lease and its slots of limited keys (a clean shutdown)."""
        ...

    def key_round(self, owner: str, requests: Sequence[KeyRequest]) -> list[KeyGrant]:
        """Settle ``owner``'s share of each requested key, in one transaction: the
        slots of dead owners (lease expired or gone) are reclaimed, then `settle`
        decides against the other live owners' rows and the key's token bucket on
        the store's clock, and the owner's row and the bucket are written back.
        Keys are settled in sorted order (hosts lock them in that order); the
        grants come back in the order of ``requests``."""
        ...

    def save_schedule(self, record: ScheduleRecord) -> ScheduleRecord | None:
        """Create or update ``record``'s schedule (its cron, tz, name and next run;
        the last run is kept), in one transaction. Returns the schedule as it was
        before (None: it is new)."""
        ...

    def schedules(self) -> list[ScheduleRecord]:
        """Every schedule, by id."""
        ...

    def claim_occurrence(
        self, schedule_id: str, at: float, owner: str, next_run: float | None
    ) -> bool:
        """Claim ``schedule_id``'s occurrence at ``at`` for ``owner``, atomically:
        True for one caller per (schedule id, time), however many ask, from however
        many processes. The winner's claim also records ``at`` as the schedule's
        last run (if later) and ``next_run`` as its next."""
        ...

    def release_occurrence(self, schedule_id: str, at: float, owner: str) -> bool:
        """Give back ``owner``'s claim of ``schedule_id``'s occurrence at ``at`` (it
        did not submit it after all), so that another caller may claim it; the
        schedule's last run goes back to its latest occurrence still claimed.
        False if ``owner`` held no such claim (another owner's is never touched)."""
        ...

    def command(
        self,
        kind: str,
        *,
        name: str | None = None,
        key: str | None = None,
        task_id: str | None = None,
        who: str,
        at: float | None = None,
    ) -> Command:
        """Carry out and record one operator command, in one transaction.

        ``at``: when it was issued, on the store's clock (None: now; at most 60
        seconds, ``MAX_SKEW``, ahead of it). Commands apply in the order they
        were issued: a pause or resume issued before the last one applied to its
        target changes nothing (its detail says it was superseded), so commands
        recorded late (an executor records its own from a task, after
        `Executor.pause` returned) keep their callers' order. A last one issued
        more than ``MAX_SKEW`` after the store's clock (by a host whose clock is
        that far ahead) orders nothing: the new command applies.

        ``"pause"`` / ``"resume"`` (exactly one of ``name``, ``key``): add or remove
        that pause (`pauses`); changed False if it already was (or was not).
        ``"cancel"`` (``task_id``): a live execution whose owner's lease is live
        is left to its owner, which sees the command and cancels it ("sent to its
        owner <owner>"); one with no owner or an expired lease is cancelled by the
        store at once (CANCELLED, version + 1, error ``"cancelled by <who>"``). An
        unknown or finished task changes nothing. Every call appends one command.

        Raises:
          ValueError: an unknown kind, a missing or extra target, an id that is
            not a storable id (`check_id`), or an ``at`` that is not a time >= 0
            or is more than ``MAX_SKEW`` after the store's clock, naming it.
        """
        ...

    def commands(self, after: int = 0, limit: int | None = None) -> list[Command]:
        """The commands with ``seq > after``, in order, at most ``limit`` (a range of
        the primary key: cheap to poll), of those the log keeps."""
        ...

    def last_command_seq(self) -> int:
        """The newest command's seq (0: none yet): where an executor that starts
        begins to follow the log."""
        ...

    def pauses(self) -> list[Pause]:
        """What is paused now, by (kind, value)."""
        ...

    def requeue(
        self,
        task_ids: Sequence[str] | None = None,
        *,
        name: str | None = None,
        since: float | None = None,
        who: str,
    ) -> Requeued:
        """Send dead letters back to pending, in one transaction, for recovery (any
        executor with ``recover=True`` and their spec) to claim and run again.

        ``task_ids``: each in order (FAILED, TIMED_OUT or CANCELLED ones); None:
        every FAILED execution, oldest first (only of ``name``; only finished at
        or after ``since``). Workflow steps, executions that cannot be re-created,
        unknown, live and other finished ones are refused, with the reason. A
        requeued execution is pending with no owner, version + 1, recovery
        attempts 0, waiting for a slot; its attempt, error and traceback are kept
        until its next attempt ends. Appends one "retry" command.
        """
        ...

    def executions(
        self,
        *,
        status: TaskStatus | str | None = None,
        sub_status: SubStatus | str | None = None,
        deferred_longer_than: float | datetime.timedelta | None = None,
        run_id: str | None = None,
        key: str | None = None,
        limit: int | None = None,
        order: Order = "oldest",
    ) -> list[ExecutionRecord]:
        """Executions matching every given filter (``key``: the admission key they
        were submitted with), in ``order`` (oldest submission first by default), at
        most ``limit`` of them (None: all). A ``run_id`` or ``key`` no store can
        hold matches none (see `execution`)."""
        ...

    def dedupe(self, row: ExecutionRow, window: float | None) -> ExecutionRecord | None:
        """Insert ``row``, a new execution with a dedupe key, unless an execution
        with its key is live, or completed less than ``window`` seconds ago on the
        store's clock (None: whenever, while its record is kept): then return
        that execution's record and insert nothing. In one transaction: of two
        callers with one key at the same instant (any processes, any hosts), one
        inserts and the other gets its record.

        Raises:
          ValueError: an execution of ``row``'s id is stored already.
        """
        ...

    def descendants(self, task_id: str) -> list[ExecutionRecord]:
        """The unfinished descendants of execution ``task_id`` (its children,
        theirs, ..., through ended ones), in submission order."""
        ...

    def execution(self, task_id: str) -> ExecutionRecord | None:
        """One execution, or None. The same on every store: an id no store can
        hold (a NUL, a lone surrogate) is None; one that is not a str is a
        TypeError naming it (`trioexec._records.matchable`, as for every lookup's
        text)."""
        ...

    def close(self) -> None:
        """Release the store's resources; idempotent."""
        ...


def matches_some(**texts: object) -> bool:
    """The text filters of a lookup (None: not filtered) can match a row: False
    if one is a text no store can hold (`matchable`). Raises TypeError naming
    one that is not a str."""
    return all(value is None or matchable(what, value) for what, value in texts.items())


def check_limit(limit: object) -> None:
    """Refuse a ``limit`` of rows a store cannot honour (None: no limit)."""
    if limit is not None:
        check_number("limit", limit, int, "None or an int >= 0", ge=0, stored=True)


def abandoned_error(attempts: int) -> str:
    return f"abandoned after {attempts} recovery attempts (owner lease expired each time)"


ORPHANED = "orphaned: its owner's lease expired and it cannot be re-created"
