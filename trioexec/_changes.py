"""The changes an executor journals and a store writes, a batch at a time (group
commit): one small class per kind.

A change is a tuple of its fields, made in one C call on the hot path (a class
with an ``__init__`` costs a Python frame per change); its class names the kind.
A transition of an execution starts with its task id and the version its writer
holds (a store fences out any other version); what each kind does to the row is
`TRANSITIONS` (`_base`), its fields after the version being the columns the
table marks `ARG` or `FIRST`, in order. A workflow run's changes start with the
run id and the owner writing them (applied only while that owner has the run).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, TypeAlias

from ._columns import EXECUTIONS, ROW_COLUMNS, SPARSE


class Transition(tuple[Any, ...]):
    """A change of an execution: (task id, version, *the kind's fields)."""

    __slots__ = ()
    kind: ClassVar[str]  #: its entry in `TRANSITIONS`

    def __init_subclass__(cls, kind: str) -> None:
        cls.kind = kind


class Start(Transition, kind="start"):
    """(task id, version, attempt, started_at): an attempt began."""

    __slots__ = ()


class Sub(Transition, kind="sub"):
    """(task id, version, sub_status, deferred_since, waiting_on): it deferred
    (waiting on its condition) or resumed (waiting on nothing)."""

    __slots__ = ()


class Wait(Transition, kind="wait"):
    """(task id, version, waiting_on): only what it waits on changed (journaled
    off the hot path: a key let it through or held it back, a pause)."""

    __slots__ = ()


class Retry(Transition, kind="retry"):
    """(task id, version, error): back to pending for its next attempt."""

    __slots__ = ()


class Finish(Transition, kind="finish"):
    """(task id, version, status, finished_at, error, traceback, args): it ended.
    ``traceback``: of the exception that ended it, or None; ``args``: the
    arguments' JSON, kept only if the row has none (a dead letter shows them)."""

    __slots__ = ()


class Kept(Transition, kind="kept"):
    """(task id, version, result): its value's JSON, kept with its completion
    (journaled right after its `Finish`, for the tasks that keep one)."""

    __slots__ = ()


# What a store does on its own (never journaled by an executor).


class End(Transition, kind="end"):
    """(task id, version, status, finished_at, error): a recovery verdict, or a
    run's superseded step."""

    __slots__ = ()


class Cancel(Transition, kind="cancel"):
    """(task id, version, finished_at, error): a cancel command for an execution
    no live executor owns."""

    __slots__ = ()


class Claim(Transition, kind="claim"):
    """(task id, version, owner, recovery_attempts): recovery takes it over."""

    __slots__ = ()


class Release(Transition, kind="release"):
    """(task id, version): a claim given back before it ran (its executor began
    to close meanwhile): ownerless, so the next claim counts no recovery more."""

    __slots__ = ()


class Requeue(Transition, kind="requeue"):
    """(task id, version): an operator's retry of a dead letter."""

    __slots__ = ()


#: A new execution: its whole row, in `ROW_COLUMNS`' order (refused if the
#: execution exists), into which the journal folds the changes that follow while
#: the batch gathers, so a short task is one change, not three (`Journal.fold`).
#: Its sparse columns (the last ones) are there only once it has a value for one
#: (`widen`).
#: A plain list: a list subclass would cost each of those writes a slow path.
ExecutionRow: TypeAlias = list[Any]


class RunChange(tuple[Any, ...]):
    """A change of a workflow run: (run id, the owner writing it, *fields)."""

    __slots__ = ()
    kind: ClassVar[str]

    def __init_subclass__(cls, kind: str) -> None:
        cls.kind = kind


class RunCreated(RunChange, kind="run"):
    """(run id, owner, workflow, context JSON, created_at, graph JSON)."""

    __slots__ = ()


class StepRecorded(RunChange, kind="step"):
    """(run id, owner, step id, state: a `StepState` value, output JSON, task id)."""

    __slots__ = ()


class RunEnded(RunChange, kind="run_end"):
    """(run id, owner, status, finished_at): status a `RunStatus` value."""

    __slots__ = ()


Change = Transition | ExecutionRow | RunChange

#: Where a field sits in an `ExecutionRow`.
R_ID = ROW_COLUMNS.index("task_id")
R_VERSION = ROW_COLUMNS.index("version")
R_OWNER = ROW_COLUMNS.index("owner")
R_WAITING = ROW_COLUMNS.index("waiting_on")
R_STATUS = ROW_COLUMNS.index("status")
R_DEDUPE = ROW_COLUMNS.index("dedupe_key")
R_PARENT = ROW_COLUMNS.index("parent_id")
#: A row is this long until it has a value for a sparse column (`Column.sparse`,
#: the last ones): a plain task's row carries none of them (`widen`).
DENSE = len(ROW_COLUMNS) - len(SPARSE)
assert tuple(range(DENSE, len(ROW_COLUMNS))) == SPARSE  # (the sparse columns come last)
_PAD = (None,) * len(SPARSE)


def widen(row: ExecutionRow) -> ExecutionRow:
    """``row``, with its sparse columns (None) if it had none yet."""
    if len(row) == DENSE:
        row.extend(_PAD)
    return row


#: What a submission gives of a new execution's row, in `submitted`'s order (with
#: defaults for the rest); every other column starts at its `Column.initial`.
_GIVEN = ("task_id", "version", "name", "run_id", "spec_id", "args", "owner", "submitted_at")
_DEFAULTED = {"key": None, "priority": 0, "waiting_on": "slot"}


class _Submitted(Protocol):
    def __call__(
        self,
        task_id: str,
        version: int,
        name: str,
        run_id: str | None,
        spec_id: str | None,
        args: str | None,
        owner: str | None,
        submitted_at: float | None,
        key: str | None = None,
        priority: int = 0,
        waiting_on: str | None = "slot",
    ) -> ExecutionRow: ...


def _write_submitted() -> _Submitted:
    """`submitted`, written out from `EXECUTIONS` (as attrs writes an ``__init__``):
    one list display, as cheap as a literal row."""
    params = [*_GIVEN, *(f"{name}={value!r}" for name, value in _DEFAULTED.items())]
    names = {*_GIVEN, *_DEFAULTED}
    values = [
        c.name
        if c.name in names
        # (a constant, as a literal: None, a number, a text; a status from the list)
        else repr(c.initial)
        if c.initial is None or type(c.initial) in (int, str)
        else f"_initial[{i}]"
        for i, c in enumerate(EXECUTIONS)
        if not c.sparse
    ]
    source = f"def submitted({', '.join(params)}):\n    return [{', '.join(values)}]\n"
    scope: dict[str, Any] = {"_initial": [c.initial for c in EXECUTIONS]}
    exec(source, scope)  # (the source holds only the column list's own names)
    made: _Submitted = scope["submitted"]
    return made


#: ``submitted(task_id, version, name, run_id, spec_id, args, owner, submitted_at,
#: key=None, priority=0, waiting_on="slot")``: a new execution's row, pending
#: (`DENSE` long: `widen` it to give it a sparse value).
submitted = _write_submitted()
