"""The stores side by side. A hypothesis state machine drives a `MemoryStore` and a
`SQLiteStore` (a real file), or a `PostgresStore` (a real server), with the same
calls, and checks after every step that every answer agrees, with each other and
with a reference model of the store contract kept here. Then, as targeted tests,
the disagreements and contract gaps it cannot reach."""

from __future__ import annotations

import datetime
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from pg_server import STORE_KINDS

from trioexec import (
    ExecutionRecord,
    MemoryStore,
    PostgresStore,
    RunStatus,
    SQLiteStore,
    StepState,
    StoreError,
    SubStatus,
    TaskStatus,
)
from trioexec._changes import (
    Finish,
    Retry,
    RunCreated,
    RunEnded,
    Start,
    StepRecorded,
    Sub,
    Wait,
    submitted,
)

IDS = tuple(f"t{i:02d}" for i in range(24))
OWNERS = ("A", "B", "C")
RUN_IDS = (None, None, None, "run-1", "run-2")  # a run id makes an execution a workflow step
WORKFLOWS = ("etl", "report")
SPEC_IDS = ("spec.known", "spec.known", "spec.other", "spec.unregistered", None)
ARGS = ("[]", "[1, 2]", "[]", None)  # None: the arguments were not JSON
REGISTERED = frozenset({"spec.known", "spec.other"})
MAX_RECOVERY_ATTEMPTS = 2
LIVE = (TaskStatus.PENDING, TaskStatus.RUNNING)
TERMINAL = tuple(s for s in TaskStatus if s not in LIVE)
# deferred_longer_than values the queries use: around the clock steps, and a timedelta.
DEFERRED_LONGER_THAN = (-1.0, 0, 0.5, 2.5, 5.0, 30.0, datetime.timedelta(seconds=5))


def recreatable(record: ExecutionRecord) -> bool:
    """What an executor with the specs in REGISTERED would re-create."""
    return record.spec_id in REGISTERED and record.args is not None


def row_fields(record: ExecutionRecord) -> ExecutionRecord:
    """The execution's own row: ``lease_expires_at`` is the owner's lease, joined in."""
    return attrs.evolve(record, lease_expires_at=None)


class StartsWith:
    """Equal to any string starting with ``prefix``: the API fixes only how the
    errors recovery writes begin ('orphaned', 'abandoned')."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other.startswith(self.prefix)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StartsWith({self.prefix!r})"


@attrs.define
class Row:
    """The reference model of one execution: ExecutionRecord without the lease."""

    task_id: str
    name: str
    run_id: str | None
    owner: str | None
    submitted_at: float
    spec_id: str | None
    args: str | None
    version: int = 1
    status: TaskStatus = TaskStatus.PENDING
    sub_status: SubStatus | None = None
    attempt: int = 0
    recovery_attempts: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    deferred_since: float | None = None
    error: Any = None
    key: str | None = None
    priority: int = 0
    waiting_on: str | None = "slot"

    def apply(self, change: tuple[Any, ...]) -> bool:
        """A transition, as the contract says; False if it is fenced out."""
        if change[1] != self.version or self.status not in LIVE:
            return False
        if isinstance(change, Start):
            self.status, self.sub_status = TaskStatus.RUNNING, SubStatus.ACTIVE
            self.attempt, self.waiting_on = change[2], None
            if self.started_at is None:  # the first start
                self.started_at = change[3]
        elif isinstance(change, Sub):
            self.sub_status, self.deferred_since, self.waiting_on = change[2:]
        elif isinstance(change, Wait):
            self.waiting_on = change[2]
        elif isinstance(change, Retry):
            self.status, self.sub_status, self.deferred_since = TaskStatus.PENDING, None, None
            self.error, self.waiting_on = change[2], "retry backoff"
        else:
            self.end(change[2], change[3], change[4])
        return True

    def end(self, status: TaskStatus, at: float, error: Any) -> None:
        self.status, self.sub_status, self.deferred_since = status, None, None
        self.finished_at, self.error, self.waiting_on = at, error, None

    def record(self, leases: dict[str, float]) -> ExecutionRecord:
        lease = None if self.owner is None else leases.get(self.owner)
        return ExecutionRecord(**attrs.asdict(self), lease_expires_at=lease)


@attrs.define
class Run:
    """The reference model of one workflow run (a RunRecord)."""

    run_id: str
    workflow: str
    context: str
    owner: str | None
    created_at: float
    status: str = "running"
    finished_at: float | None = None
    steps: dict[str, tuple[str, str | None]] = attrs.Factory(dict)
    recovery_attempts: int = 0
    graph: dict[str, list[str]] | None = None


# A change as hypothesis draws it, resolved against the model when the rule runs: the
# target is mostly an execution already submitted (an index into those the change
# applies to), else any id; the version an offset from the current one (0: current,
# else stale).
version_delta = st.sampled_from([0, 0, 0, 0, -1, 1])
index = st.integers(min_value=0, max_value=len(IDS) - 1)
targets = st.one_of(index, index, index, st.sampled_from(IDS))
submit_spec = st.tuples(
    st.just("submit"),
    st.one_of(st.sampled_from(IDS), index),  # a new id, or a duplicate
    st.sampled_from(["fetch", "load"]),
    st.sampled_from(RUN_IDS),
    st.sampled_from(SPEC_IDS),
    st.sampled_from(ARGS),
    st.sampled_from((*OWNERS, None)),
    st.sampled_from((None, None, "tenant-a", "tenant-b")),  # key
    st.sampled_from((0, 0, 3, -(2**62) + 1)),  # priority
)
start_spec = st.tuples(st.just("start"), targets, version_delta)
#: What a change says a task waits on.
WAITING = (None, "slot", "event", "condition is_ready", "key concurrency t'[%]🚀", "promise p*")
sub_spec = st.tuples(
    st.just("sub"),
    targets,
    version_delta,
    st.sampled_from(SubStatus),
    st.sampled_from(WAITING),
)
wait_spec = st.tuples(st.just("wait"), targets, version_delta, st.sampled_from(WAITING))
retry_spec = st.tuples(st.just("retry"), targets, version_delta, st.sampled_from(["boom", "E(1)"]))
finish_spec = st.tuples(
    st.just("finish"),
    targets,
    version_delta,
    st.sampled_from(TERMINAL),
    st.sampled_from([None, "ValueError('x')"]),
)
any_spec = st.one_of(submit_spec, start_spec, sub_spec, wait_spec, retry_spec, finish_spec)


class StoresAgree(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000.0  # the one wall clock both stores read
        self.dir = Path(tempfile.mkdtemp(prefix="trioexec-model-"))
        self.path = self.dir / "runs.db"
        self.memory = MemoryStore(clock=self.clock)
        self.sql = self.open_sql()
        self.rows: dict[str, Row] = {}  # in submission order
        self.runs: dict[str, Run] = {}
        self.leases: dict[str, float] = {}
        self.finished: dict[str, ExecutionRecord] = {}  # finished rows, as first seen

    def clock(self) -> float:
        return self.now

    def open_sql(self) -> Any:
        """The SQL store under test (opened again by `reopen_sql`)."""
        return SQLiteStore(self.path, clock=self.clock, inline=True)

    def teardown(self) -> None:
        self.memory.close()
        self.sql.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def both(self, method: str, *args: Any) -> Any:
        """Call ``method`` on both stores; they must answer the same."""
        from_memory = getattr(self.memory, method)(*args)
        from_sql = getattr(self.sql, method)(*args)
        assert from_memory == from_sql, (method, args)
        return from_memory

    def lease_held(self, owner: str | None, now: float) -> bool:
        """A lease that expires at ``now`` (or later) still holds."""
        lease = None if owner is None else self.leases.get(owner)
        return lease is not None and lease >= now

    # ------------------------------------------------------------------ writes

    def target(self, kind: str, drawn: object) -> str:
        """A drawn id as is; a drawn index picks among the executions this kind of
        change applies to (pending ones for start, running ones for sub, live ones
        for the rest), falling back to any."""
        if isinstance(drawn, str):
            return drawn
        assert isinstance(drawn, int)
        wanted = {
            "submit": tuple(TaskStatus),
            "start": (TaskStatus.PENDING,),
            "sub": (TaskStatus.RUNNING,),
        }.get(kind, LIVE)
        known = [t for t, row in self.rows.items() if row.status in wanted]
        known = known or [t for t, row in self.rows.items() if row.status in LIVE]
        known = known or list(self.rows) or list(IDS)
        return known[drawn % len(known)]

    def write(self, specs: list[tuple[Any, ...]]) -> None:
        """Turn drawn specs into changes against the model (applying them to it in
        order), write them to both stores in one batch, and check what was fenced."""
        changes: list[tuple[Any, ...]] = []
        expected: list[str] = []
        refused: set[str] = set()  # a refused submit fences the rest of that id's batch
        for spec in specs:
            kind = spec[0]
            if kind == "run":  # ("run", run_id, workflow, owner): a workflow run starts
                _, run_id, workflow, owner = spec
                context = '{"job": 7}'
                changes.append(RunCreated((run_id, owner, workflow, context, self.now, None)))
                self.runs.setdefault(run_id, Run(run_id, workflow, context, owner, self.now))
                continue
            task_id = self.target(kind, spec[1])
            row = self.rows.get(task_id)
            if kind == "submit":
                _, _, name, run_id, spec_id, args, owner, *keyed = spec
                changes.append(
                    submitted(task_id, 1, name, run_id, spec_id, args, owner, self.now, *keyed)
                )
                if row is None:
                    self.rows[task_id] = Row(
                        task_id, name, run_id, owner, self.now, spec_id, args,
                        **dict(zip(("key", "priority"), keyed, strict=False)),
                    )  # fmt: skip
                else:
                    expected.append(task_id)
                    refused.add(task_id)
                continue
            delta = spec[2]
            # The executor only starts pending executions and moves the sub-status
            # of running ones: current-version changes stay within that, the rest
            # go out with a stale version (and must be fenced).
            if (
                row is not None
                and delta == 0
                and (
                    (kind == "start" and row.status is TaskStatus.RUNNING)
                    or (kind == "sub" and row.status is TaskStatus.PENDING)
                )
            ):
                delta = 1
            version = (1 if row is None else row.version) + delta
            if kind == "start":
                attempt = 1 if row is None else row.attempt + 1
                change: tuple[Any, ...] = Start((task_id, version, attempt, self.now))
            elif kind == "sub":
                since = self.now if spec[3] is SubStatus.DEFERRED else None
                change = Sub((task_id, version, spec[3], since, spec[4] if spec[4:] else None))
            elif kind == "wait":
                change = Wait((task_id, version, spec[3]))
            elif kind == "retry":
                change = Retry((task_id, version, spec[3]))
            else:
                change = Finish((task_id, version, spec[3], self.now, spec[4], None, None))
            changes.append(change)
            if task_id in refused or row is None or not row.apply(change):
                expected.append(task_id)
        # (the ids fenced, each at least once: a refused submission's row takes
        # the id's later changes in the batch with it)
        assert sorted(set(self.both("write", changes))) == sorted(set(expected)), changes
        event(f"write: {len(changes) - len(expected)} applied, {len(expected)} fenced")

    @rule(spec=submit_spec)
    def submit(self, spec: tuple[Any, ...]) -> None:
        self.write([spec])

    @rule(spec=start_spec)
    def start(self, spec: tuple[Any, ...]) -> None:
        self.write([spec])

    @rule(spec=sub_spec)
    def sub(self, spec: tuple[Any, ...]) -> None:
        self.write([spec])

    @rule(spec=wait_spec)
    def wait(self, spec: tuple[Any, ...]) -> None:
        self.write([spec])

    @rule(spec=retry_spec)
    def retry(self, spec: tuple[Any, ...]) -> None:
        self.write([spec])

    @rule(spec=finish_spec)
    def finish(self, spec: tuple[Any, ...]) -> None:
        self.write([spec])

    @rule(specs=st.lists(any_spec, min_size=2, max_size=6))
    def batch(self, specs: list[tuple[Any, ...]]) -> None:
        self.write(specs)

    @rule(
        owner=st.sampled_from(OWNERS),
        run_id=st.sampled_from(RUN_IDS),
        workflow=st.sampled_from(WORKFLOWS),
        spec_id=st.sampled_from(SPEC_IDS),
        args=st.sampled_from(ARGS),
        defer=st.booleans(),
    )
    def submit_and_start(
        self,
        owner: str,
        run_id: str | None,
        workflow: str,
        spec_id: str | None,
        args: str | None,
        defer: bool,
    ) -> None:
        """One group commit as an executor often writes it: a new execution (with its
        workflow run, the first time), started, maybe deferred at once."""
        fresh = [t for t in IDS if t not in self.rows]
        if fresh:
            specs: list[tuple[Any, ...]] = []
            if run_id is not None and run_id not in self.runs:
                specs.append(("run", run_id, workflow, owner))
            specs += [
                ("submit", fresh[0], "job", run_id, spec_id, args, owner),
                ("start", fresh[0], 0),
            ]
            if defer:
                specs.append(("sub", fresh[0], 0, SubStatus.DEFERRED))
            self.write(specs)

    @rule(
        pick=index,
        defer=st.booleans(),
        outcome=st.sampled_from(["retry", "finish", "still running"]),
        gap=st.sampled_from([0.5, 2.5]),
    )
    def attempt(self, pick: int, defer: bool, outcome: str, gap: float) -> None:
        """One attempt of a pending execution as the executor writes it, one group
        commit per transition: start, maybe defer and resume, then retry or finish."""
        pending = [t for t, row in self.rows.items() if row.status is TaskStatus.PENDING]
        if not pending:
            return
        task_id = pending[pick % len(pending)]
        self.write([("start", task_id, 0)])
        self.now += gap
        if defer:
            self.write([("sub", task_id, 0, SubStatus.DEFERRED)])
            self.now += gap
            self.write([("sub", task_id, 0, SubStatus.ACTIVE)])
        if outcome == "retry":
            self.write([("retry", task_id, 0, "boom")])
        elif outcome == "finish":
            self.write([("finish", task_id, 0, TaskStatus.COMPLETED, None)])

    @rule(data=st.data())
    def stale(self, data: st.DataObject) -> None:
        """A change from an owner that no longer has the execution: fenced by both."""
        if not self.rows:
            return
        task_id = data.draw(st.sampled_from(sorted(self.rows)))
        row = self.rows[task_id]
        version = data.draw(st.sampled_from([row.version - 1, row.version + 1]))
        change = data.draw(
            st.sampled_from(
                [
                    Start((task_id, version, row.attempt + 1, self.now)),
                    Sub((task_id, version, SubStatus.DEFERRED, self.now, None)),
                    Retry((task_id, version, "stale")),
                    Finish((task_id, version, TaskStatus.COMPLETED, self.now, None, None, None)),
                ]
            )
        )
        assert self.both("write", [change]) == [task_id]

    # ------------------------------------------------------------------ leases, clock

    @rule(owner=st.sampled_from(OWNERS), ttl=st.sampled_from([-1.0, 0.0, 2.5, 30.0]))
    def heartbeat(self, owner: str, ttl: float) -> None:
        self.both("heartbeat", owner, self.now + ttl)
        self.leases[owner] = self.now + ttl

    @rule(owner=st.sampled_from(OWNERS))
    def release_owner(self, owner: str) -> None:
        self.both("release_owner", owner)
        self.leases.pop(owner, None)

    @rule(
        seconds=st.one_of(
            st.sampled_from([0.5, 2.5, 5.0, 30.0]),
            st.floats(min_value=0.0, max_value=60.0, allow_nan=False),
        )
    )
    def advance_clock(self, seconds: float) -> None:
        self.now += seconds

    def recover_at(self, owner: str, now: float, limit: int | None) -> None:
        expected: dict[str, list[str]] = {"claimed": [], "orphaned": [], "abandoned": []}
        for task_id, row in self.rows.items():
            # Workflow steps are resumed with their run (claim_runs), not here.
            if row.status not in LIVE or row.owner == owner or row.run_id is not None:
                continue
            if self.lease_held(row.owner, now):
                continue
            # No owner: requeued by an operator, no lease expired. It is never
            # failed, and its claim counts no recovery attempt (issue 30 item 7).
            requeued = row.owner is None
            can = row.spec_id in REGISTERED and row.args is not None
            if not requeued and row.recovery_attempts >= MAX_RECOVERY_ATTEMPTS:
                expected["abandoned"].append(task_id)
                row.end(TaskStatus.FAILED, now, StartsWith("abandoned"))
            elif not can:
                if requeued:
                    continue  # (left for an executor that can re-create it)
                expected["orphaned"].append(task_id)
                row.end(TaskStatus.FAILED, now, StartsWith("orphaned"))
            elif limit is None or len(expected["claimed"]) < limit:
                expected["claimed"].append(task_id)
                row.status, row.sub_status, row.deferred_since = TaskStatus.PENDING, None, None
                row.owner, row.waiting_on = owner, "slot"
                row.version += 1
                row.recovery_attempts += 0 if requeued else 1
        result = self.both("recover", owner, now, recreatable, MAX_RECOVERY_ATTEMPTS, limit)
        for field, want in expected.items():
            got = getattr(result, field)
            assert got == [self.rows[t].record(self.leases) for t in want], field
            if want:
                event(f"recover: {field}")

    @rule(
        owner=st.sampled_from(OWNERS),
        limit=st.sampled_from([None, None, 0, 1, 2]),
        data=st.data(),
    )
    def recover(self, owner: str, limit: int | None, data: st.DataObject) -> None:
        # At the clock's now, or exactly at an owner's lease expiry (still held).
        now = self.now
        if self.leases and data.draw(st.booleans()):
            now = data.draw(st.sampled_from(sorted(self.leases.values())))
        self.recover_at(owner, now, limit)

    @rule(
        pick=index,
        survivor=st.sampled_from(OWNERS),
        limit=st.sampled_from([None, None, 1]),
        workflows=st.sets(st.sampled_from(WORKFLOWS)),
        ttl=st.sampled_from([0.0, 2.5, 30.0]),
    )
    def crash(
        self, pick: int, survivor: str, limit: int | None, workflows: set[str], ttl: float
    ) -> None:
        """An owner with work renews its lease one last time and dies: at the lease's
        expiry its runs and executions are still its own; just after, ``survivor``
        takes them over."""
        busy = sorted(
            {r.owner for r in self.runs.values() if r.status == "running" and r.owner}
            | {r.owner for r in self.rows.values() if r.status in LIVE and r.owner}
        )
        dead = (busy or list(OWNERS))[pick % len(busy or OWNERS)]
        self.heartbeat(dead, ttl)
        self.now += ttl
        self.claim_runs_at(survivor, self.now, workflows)
        self.recover_at(survivor, self.now, limit)
        self.now += 1.0
        self.claim_runs_at(survivor, self.now, workflows)
        self.recover_at(survivor, self.now, limit)

    @rule(owner=st.sampled_from(OWNERS), data=st.data())
    def taken_over(self, owner: str, data: st.DataObject) -> None:
        # Mostly what this owner runs (as far as it knows), plus a few others. Finished
        # rows are left out: there the stores disagree (see
        # test_taken_over_reports_an_execution_failed_by_recovery).
        live_rows = [t for t, row in self.rows.items() if row.status in LIVE]
        mine = [t for t in live_rows if self.rows[t].owner == owner]
        others = [t for t in IDS if t not in self.rows] + live_rows
        chosen = data.draw(st.lists(st.sampled_from(mine), unique=True)) if mine else []
        chosen += [
            t
            for t in data.draw(st.lists(st.sampled_from(others), unique=True, max_size=3))
            if t not in chosen
        ]
        live = {}
        for task_id in chosen:
            row = self.rows.get(task_id)
            live[task_id] = (1 if row is None else row.version) + data.draw(version_delta)
        expected = sorted(
            t
            for t, v in live.items()
            if t in self.rows and (self.rows[t].owner != owner or self.rows[t].version != v)
        )
        from_memory = self.memory.taken_over(owner, live)
        from_sql = self.sql.taken_over(owner, live)
        # The order of the answer is no part of the contract (SQLite returns some of
        # it in index order): compare as sets.
        assert sorted(from_memory) == sorted(from_sql) == expected, live
        assert len(set(from_sql)) == len(from_sql)
        event(f"taken_over: {len(expected)} lost")

    @rule()
    def reopen_sql(self) -> None:
        """Everything written so far survives closing and reopening the store."""
        self.sql.close()
        self.sql = self.open_sql()

    # ------------------------------------------------------------------ workflow runs

    @rule(
        run_id=st.sampled_from(RUN_IDS[3:]),
        workflow=st.sampled_from(WORKFLOWS),
        owner=st.sampled_from(OWNERS),
    )
    def start_run(self, run_id: str, workflow: str, owner: str) -> None:
        self.write([("run", run_id, workflow, owner)])

    @rule(
        data=st.data(),
        step_id=st.sampled_from(["fetch", "load"]),
        state=st.sampled_from(StepState),
        output=st.sampled_from([None, "[1]"]),
        task_id=st.sampled_from((None, *IDS[:3])),
    )
    def step(
        self,
        data: st.DataObject,
        step_id: str,
        state: StepState,
        output: str | None,
        task_id: str | None,
    ) -> None:
        if self.runs:  # the executor writes a run before any of its steps
            run_id = data.draw(st.sampled_from(sorted(self.runs)))
            run = self.runs[run_id]
            # Mostly the run's owner; sometimes one it was taken from (fenced).
            owner = data.draw(st.sampled_from([run.owner, run.owner, *OWNERS]))
            change = StepRecorded((run_id, owner, step_id, state, output, task_id))
            if owner == run.owner:
                assert self.both("write", [change]) == []
                run.steps[step_id] = (state, output)
            else:
                assert self.both("write", [change]) == [run_id]

    @rule(data=st.data(), status=st.sampled_from([s for s in RunStatus if s != "running"]))
    def end_run(self, data: st.DataObject, status: RunStatus) -> None:
        if self.runs:
            run_id = data.draw(st.sampled_from(sorted(self.runs)))
            run = self.runs[run_id]
            owner = data.draw(st.sampled_from([run.owner, run.owner, *OWNERS]))
            fenced = self.both("write", [RunEnded((run_id, owner, status, self.now))])
            if owner == run.owner:
                assert fenced == []
                run.status = status
                run.finished_at = self.now
            else:
                assert fenced == [run_id]

    @rule(owner=st.sampled_from(OWNERS), workflows=st.sets(st.sampled_from(WORKFLOWS)))
    def claim_runs(self, owner: str, workflows: set[str]) -> None:
        self.claim_runs_at(owner, self.now, workflows)

    def claim_runs_at(self, owner: str, now: float, workflows: set[str]) -> None:
        expected: dict[str, list[str]] = {"claimed": [], "orphaned": [], "abandoned": []}
        for run_id, run in self.runs.items():
            if run.status != "running" or run.owner == owner:
                continue
            if self.lease_held(run.owner, now):
                continue
            if run.workflow not in workflows or run.recovery_attempts >= MAX_RECOVERY_ATTEMPTS:
                kind = "orphaned" if run.workflow not in workflows else "abandoned"
                expected[kind].append(run_id)
                run.status = "failed"
                run.finished_at = now
                error = StartsWith("orphaned" if kind == "orphaned" else "abandoned")
                for row in self.rows.values():
                    if row.run_id == run_id and row.status in LIVE:
                        row.end(TaskStatus.FAILED, now, error)
                continue
            expected["claimed"].append(run_id)
            run.owner = owner
            run.recovery_attempts += 1
            for row in self.rows.values():
                if row.run_id == run_id and row.status in LIVE:  # the step runs again
                    row.end(TaskStatus.CANCELLED, now, StartsWith("superseded"))
        result = self.both("claim_runs", owner, now, workflows, MAX_RECOVERY_ATTEMPTS)
        for kind, ids in expected.items():
            got = [attrs.asdict(r) for r in getattr(result, kind)]
            assert got == [attrs.asdict(self.runs[r]) for r in ids], kind
            if ids:
                event(f"claim_runs: {kind}")

    # ------------------------------------------------------------------ checks

    @invariant()
    def queries_agree(self) -> None:
        queries: list[dict[str, Any]] = [{}]
        queries += [{"status": s} for s in TaskStatus]
        queries += [{"status": s.value} for s in LIVE]
        queries += [{"sub_status": s} for s in SubStatus]
        queries += [{"sub_status": "deferred"}]
        queries += [{"status": TaskStatus.RUNNING, "sub_status": s} for s in SubStatus]
        queries += [{"deferred_longer_than": d} for d in DEFERRED_LONGER_THAN]
        queries += [{"run_id": r} for r in RUN_IDS[3:]]
        queries += [{"run_id": "run-1", "status": s} for s in LIVE]
        queries += [{"run_id": "run-2", "deferred_longer_than": 0.5}]
        queries += [{"key": k} for k in ("tenant-a", "tenant-b", "none")]
        queries += [{"key": "tenant-a", "status": s} for s in LIVE]
        for query in queries:
            from_memory = self.memory.executions(**query)
            from_sql = self.sql.executions(**query)
            assert from_memory == from_sql, query
            assert repr(from_memory) == repr(from_sql), query
            if from_memory and "deferred_longer_than" in query:
                event(f"deferred_longer_than={query['deferred_longer_than']} matched")
        # Sorted and cut in SQL, in Python for the memory store: the same answer.
        for query in (
            {"order": "newest", "limit": 3},
            {"order": "longest_deferred"},
            {"order": "longest_deferred", "sub_status": "deferred", "limit": 2},
            {"order": "longest_deferred", "status": TaskStatus.RUNNING, "limit": 3},
        ):
            assert self.memory.executions(**query) == self.sql.executions(**query), query
        for filters in ({"sub_status": SubStatus.DEFERRED}, {"deferred_longer_than": 2.5}):
            assert self.memory.counts(**filters) == self.sql.counts(**filters), filters
        for task_id in (*self.rows, "never-submitted"):
            one = self.memory.execution(task_id)
            assert one == self.sql.execution(task_id), task_id
            assert repr(one) == repr(self.sql.execution(task_id)), task_id

    @invariant()
    def stores_follow_the_model(self) -> None:
        expected = [row.record(self.leases) for row in self.rows.values()]
        assert self.memory.executions() == expected  # oldest submission first
        assert self.memory.executions(order="newest") == expected[::-1]
        assert self.sql.executions(order="newest", limit=2) == expected[::-1][:2]
        longest = sorted(  # stable: submission order breaks ties
            expected, key=lambda r: (r.deferred_since is None, r.deferred_since or 0.0)
        )
        assert self.memory.executions(order="longest_deferred") == longest
        assert self.sql.executions(order="longest_deferred", limit=4) == longest[:4]
        counts = dict.fromkeys(TaskStatus, 0)
        for r in expected:
            counts[r.status] += 1
        assert self.memory.counts() == counts
        assert self.sql.counts() == counts
        # deferred_longer_than right at (and around) how long each row has waited.
        waits = {self.now - r.deferred_since for r in expected if r.deferred_since is not None}
        for wait in sorted(waits | {2.5}):
            for seconds in (wait - 0.1, wait, wait + 0.1):
                cutoff = self.now - seconds
                want = [
                    r
                    for r in expected
                    if r.sub_status is SubStatus.DEFERRED and r.deferred_since <= cutoff
                ]
                assert self.memory.executions(deferred_longer_than=seconds) == want, seconds
                assert self.sql.executions(deferred_longer_than=seconds) == want, seconds
        runs = [attrs.asdict(run) for run in self.runs.values()]
        assert [attrs.asdict(r) for r in self.memory.runs()] == runs
        assert [attrs.asdict(r) for r in self.sql.runs()] == runs
        for status in RunStatus:
            assert self.memory.runs(status=status) == self.sql.runs(status=status)
        for run_id in (*RUN_IDS[3:], "no-such-run"):
            assert self.memory.run(run_id) == self.sql.run(run_id)

    @invariant()
    def record_invariants(self) -> None:
        for record in self.memory.executions():
            assert isinstance(record.status, TaskStatus)
            # Sub-status exactly while running; deferred_since exactly while deferred.
            if record.status is TaskStatus.RUNNING:
                assert isinstance(record.sub_status, SubStatus), record
                assert record.started_at is not None
                assert record.attempt >= 1
            else:
                assert record.sub_status is None, record
            assert (record.deferred_since is not None) == (
                record.sub_status is SubStatus.DEFERRED
            ), record
            assert (record.finished_at is not None) == (record.status not in LIVE), record
            assert record.recovery_attempts <= MAX_RECOVERY_ATTEMPTS

    @invariant()
    def finished_rows_never_change(self) -> None:
        for record in self.memory.executions():
            if record.status in LIVE:
                assert record.task_id not in self.finished, record
            else:
                first = self.finished.setdefault(record.task_id, row_fields(record))
                assert row_fields(record) == first


TestStoresAgree = StoresAgree.TestCase
# (`nox -s soak` runs it again and again under new seeds)
TestStoresAgree.settings = settings(max_examples=30, stateful_step_count=50, deadline=None)


class PostgresAgrees(StoresAgree):
    """The same machine with a `PostgresStore` (a schema of its own per example)."""

    url = ""  # set by the test below

    def open_sql(self) -> Any:
        if not hasattr(self, "schema"):
            self.schema = f"model_{uuid.uuid4().hex[:12]}"
        return PostgresStore(self.url, schema=self.schema, clock=self.clock, inline=True)

    def teardown(self) -> None:
        super().teardown()
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")


@pytest.mark.hypothesis  # (the soak runs it again with new seeds)
def test_postgres_agrees_with_memory_and_the_model(postgres_url: str) -> None:
    """~2 s an example (a schema made and dropped each): 4 by default (the soak
    runs it again under new seeds; ``TRIOEXEC_PG_MODEL_EXAMPLES`` sets it)."""
    PostgresAgrees.url = postgres_url
    examples = int(os.environ.get("TRIOEXEC_PG_MODEL_EXAMPLES") or 4)
    run_state_machine_as_test(
        PostgresAgrees,
        settings=settings(max_examples=examples, stateful_step_count=50, deadline=None),
    )


# ---------------------------------------------------------------------- targeted


@pytest.mark.parametrize(
    "make_store",
    STORE_KINDS,
    indirect=True,
)
def test_taken_over_reports_an_execution_failed_by_recovery(make_store):
    now = 100.0
    store = make_store(clock=lambda: now)
    store.heartbeat("A", 110.0)
    # Not re-creatable: recovery will fail it `orphaned`, leaving owner and version.
    store.write([submitted("t1", 1, "job", None, None, None, "A", now)])
    store.write([Start(("t1", 1, 1, now))])
    recovery = store.recover("B", 200.0, recreatable, MAX_RECOVERY_ATTEMPTS)
    assert [r.task_id for r in recovery.orphaned] == ["t1"]
    # "A" is still alive (say, a slow heartbeat) and still runs t1, version 1.
    assert store.taken_over("A", {"t1": 1}) == ["t1"]


@pytest.mark.parametrize(
    "make_store",
    STORE_KINDS,
    indirect=True,
)
def test_sub_status_is_never_set_on_a_pending_execution(make_store):
    store = make_store(clock=lambda: 5.0)
    store.write([submitted("t1", 1, "job", None, None, None, "A", 5.0)])
    store.write([Sub(("t1", 1, SubStatus.DEFERRED, 5.0, None))])
    record = store.execution("t1")
    assert record is not None
    assert record.status is TaskStatus.PENDING
    assert record.sub_status is None


@pytest.mark.parametrize(
    "make_store",
    STORE_KINDS,
    indirect=True,
)
def test_executions_limit_order_and_counts(make_store):
    """What the CLI's views ask for: the first (or last) few rows, the longest
    waits first, and how many there are per status, without loading every row."""
    store = make_store(clock=lambda: 100.0)
    changes = []
    for i, since in enumerate([50.0, None, 20.0, None, 20.0, 70.0]):
        t = f"t{i}"
        changes.append(submitted(t, 1, "job", None, None, None, "A", float(i)))
        changes.append(Start((t, 1, 1, float(i))))
        if since is not None:
            changes.append(Sub((t, 1, SubStatus.DEFERRED, since, None)))
    changes.append(Finish(("t3", 1, TaskStatus.FAILED, 9.0, "boom", None, None)))
    store.write(changes)

    def ids(**query):
        return [r.task_id for r in store.executions(**query)]

    assert ids() == ["t0", "t1", "t2", "t3", "t4", "t5"]
    assert ids(limit=2) == ["t0", "t1"]
    assert ids(limit=0) == []
    assert ids(order="newest", limit=3) == ["t5", "t4", "t3"]
    assert ids(order="longest_deferred") == ["t2", "t4", "t0", "t5", "t1", "t3"]
    assert ids(sub_status="deferred", order="longest_deferred", limit=3) == ["t2", "t4", "t0"]
    assert ids(deferred_longer_than=40, order="longest_deferred") == ["t2", "t4", "t0"]
    assert ids(status="running", order="newest", limit=1) == ["t5"]
    assert store.counts() == {
        **dict.fromkeys(TaskStatus, 0),
        TaskStatus.RUNNING: 5,
        TaskStatus.FAILED: 1,
    }
    assert store.counts(sub_status="deferred")[TaskStatus.RUNNING] == 4
    assert store.counts(deferred_longer_than=40)[TaskStatus.RUNNING] == 3
    assert sum(store.counts(run_id="no-such-run").values()) == 0
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            store.executions(limit=bad)
    with pytest.raises(ValueError, match="'sideways'"):
        store.executions(order="sideways")


@pytest.mark.parametrize(
    "make_store",
    STORE_KINDS,
    indirect=True,
)
def test_use_after_close_raises_store_error(make_store):
    store = make_store()
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        store.executions()
    with pytest.raises(StoreError, match="closed"):
        store.write([submitted("t1", 1, "job", None, None, None, "A", 1.0)])
