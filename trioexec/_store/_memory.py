"""`MemoryStore`: the store contract kept in dicts. Nothing on disk; same answers
as `SQLiteStore` (a state-machine test holds them side by side)."""

from __future__ import annotations

import bisect
import contextlib
import heapq
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, final

import attrs

from .._changes import (
    Cancel,
    Change,
    Claim,
    End,
    Requeue,
    RunChange,
    RunCreated,
    StepRecorded,
)
from .._errors import StoreError
from .._records import ExecutionRecord, SubStatus, TaskStatus
from ._base import (
    LIVE,
    ORPHANED,
    RUN_ORPHANED,
    SUPERSEDED,
    Command,
    Filter,
    Order,
    Pause,
    Records,
    Recovery,
    Requeued,
    RunRecord,
    RunRecovery,
    ScheduleRecord,
    abandoned_error,
    apply_change,
    graph_of,
    matches_some,
    new_row,
)
from ._control import (
    Asked,
    Commands,
    PauseRow,
    cancel_plan,
    cancelled_by,
    issued_at,
    pause_turn,
    prune_bounds,
    requeue_refusal,
    retry_fields,
    sorted_pauses,
)
from ._durable_tables import DictTables
from ._key_ledger import PRUNE_MORE, Hold, KeyGrant, KeyRequest, full_at, settle
from ._verdict import Verdict, claimed_attempts, recovery_verdict


class MemorySchedules:
    """`MemoryStore`'s schedules (`Store.save_schedule` and its kin): a concept
    of its own, beside the executions' rows."""

    _lock: threading.Lock
    _closed: bool

    def __init__(self) -> None:
        self._schedules: dict[str, ScheduleRecord] = {}
        self._occurrences: dict[tuple[str, float], str] = {}  # claimed -> owner

    def save_schedule(self, record: ScheduleRecord) -> ScheduleRecord | None:
        with self._lock:
            if self._closed:
                raise StoreError("memory store: the store is closed")
            before = self._schedules.get(record.schedule_id)
            last = None if before is None else before.last_run
            self._schedules[record.schedule_id] = attrs.evolve(record, last_run=last)
            return before

    def schedules(self) -> list[ScheduleRecord]:
        with self._lock:
            return [self._schedules[k] for k in sorted(self._schedules)]

    def claim_occurrence(
        self, schedule_id: str, at: float, owner: str, next_run: float | None
    ) -> bool:
        with self._lock:
            if self._closed:
                raise StoreError("memory store: the store is closed")
            if (schedule_id, at) in self._occurrences:
                return False
            self._occurrences[schedule_id, at] = owner
            record = self._schedules.get(schedule_id)
            if record is not None:
                last = at if record.last_run is None else max(record.last_run, at)
                self._schedules[schedule_id] = attrs.evolve(
                    record, last_run=last, next_run=next_run
                )
            return True

    def release_occurrence(self, schedule_id: str, at: float, owner: str) -> bool:
        with self._lock:
            if self._closed:
                raise StoreError("memory store: the store is closed")
            if self._occurrences.get((schedule_id, at)) != owner:
                return False
            del self._occurrences[schedule_id, at]
            record = self._schedules.get(schedule_id)
            if record is not None and record.last_run == at:
                claimed = [t for (s, t) in self._occurrences if s == schedule_id]
                self._schedules[schedule_id] = attrs.evolve(
                    record, last_run=max(claimed, default=None)
                )
            return True


class MemoryControl(Commands):
    """`MemoryStore`'s operator commands (`Store.command`, `Store.requeue` and
    their reads), kept apart like its schedules: the rules are `_control`'s, as
    the SQL stores'."""

    _lock: threading.Lock
    _closed: bool
    _rows: dict[str, dict[str, Any]]
    _owners: dict[str, float]
    clock: Callable[[], float]

    def __init__(self) -> None:
        self._commands: list[Command] = []  # those kept, by seq
        self._seq = 0  # the last seq handed out
        self._pauses: dict[tuple[str, str], PauseRow] = {}  # (kind, value) -> its row

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            if self._closed:
                raise StoreError("memory store: the store is closed")
            yield

    def _record(self, row: dict[str, Any]) -> ExecutionRecord:
        return ExecutionRecord(**row, lease_expires_at=self._owners.get(row["owner"]))

    def _append(self, now: float, who: str, issued: float | None = None, **fields: Any) -> Command:
        values = {"name": None, "key": None, "task_id": None, **fields}
        self._seq += 1
        at = now if issued is None else issued
        command = Command(seq=self._seq, who=who, at=at, **values)
        self._commands.append(command)
        bounds = prune_bounds(self._seq, now)
        if bounds is not None:
            upto, before = bounds
            self._commands = [c for c in self._commands if c.seq > upto or c.at >= before]
            for target in [
                t for t, r in self._pauses.items() if not r.paused and r.latest < before
            ]:
                del self._pauses[target]
        return command

    def _command(self, asked: Asked) -> Command:
        kind, pause, name, key, task_id, who = (
            asked.kind, asked.pause, asked.name, asked.key, asked.task_id, asked.who
        )  # fmt: skip
        with self._locked():
            now = self.clock()
            at = issued_at(asked.issued, now)
            if pause is not None:
                new, changed, detail = pause_turn(self._pauses.get(pause), kind, who, at, now)
                if new is not None:
                    self._pauses[pause] = new
                return self._append(
                    now, who, at, kind=kind, name=name, key=key, changed=changed, detail=detail
                )
            assert task_id is not None
            row = self._rows.get(task_id)
            changed, in_store, detail = cancel_plan(None if row is None else self._record(row), now)
            if in_store:
                assert row is not None
                apply_change(row, Cancel((task_id, row["version"], now, cancelled_by(who))))
            return self._append(
                now, who, at, kind="cancel", task_id=task_id, changed=changed, detail=detail
            )

    def _commands_after(self, after: int, limit: int | None) -> list[Command]:
        with self._locked():
            start = bisect.bisect_right(self._commands, after, key=lambda c: c.seq)
            return self._commands[start : None if limit is None else start + limit]

    def last_command_seq(self) -> int:
        with self._locked():
            return self._seq

    def pauses(self) -> list[Pause]:
        with self._locked():
            return sorted_pauses(
                [
                    Pause(kind=kind, value=value, who=row.who, at=row.at)  # type: ignore[arg-type]
                    for (kind, value), row in self._pauses.items()
                    if row.paused
                ]
            )

    def _requeue(
        self, asked: list[str] | None, name: str | None, since: float | None, who: str
    ) -> Requeued:
        with self._locked():
            now = self.clock()
            todo: list[tuple[str, dict[str, Any] | None]]
            if asked is None:
                todo = [
                    (task_id, row)
                    for task_id, row in self._rows.items()
                    if row["status"] is TaskStatus.FAILED
                    and (name is None or row["name"] == name)
                    and (since is None or row["finished_at"] >= since)
                ]
            else:
                todo = [(task_id, self._rows.get(task_id)) for task_id in asked]
            done: list[ExecutionRecord] = []
            refused: list[tuple[str, str]] = []
            for task_id, found in todo:
                why = requeue_refusal(None if found is None else self._record(found))
                if why is not None:
                    refused.append((task_id, why))
                    continue
                assert found is not None
                apply_change(found, Requeue((task_id, found["version"])))
                done.append(self._record(found))
            command = self._append(now, who, **retry_fields(asked, name, len(done), len(refused)))
            return Requeued(requeued=done, refused=refused, command=command)


@final
class MemoryStore(MemorySchedules, MemoryControl, Records):
    """An in-memory store: for tests, and for executors that only want the
    recording (sub-status, queries) without a file.

    Several executors and threads may share one: every call holds the store's lock
    for its (short) duration.

    Args:
      clock: the wall clock for persisted times (``trioexec.testing.FakeWallClock``
        follows Trio's mock clock).
    """

    inline = True

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        MemorySchedules.__init__(self)
        MemoryControl.__init__(self)
        self.clock = clock
        self._rows: dict[str, dict[str, Any]] = {}
        self._owners: dict[str, float] = {}
        self._runs: dict[str, dict[str, Any]] = {}
        self._fenced: list[str] = []  # the current write's fenced ids
        self._closed = False
        self._lock = threading.Lock()
        self._durable = DictTables()
        self._holds: dict[str, dict[str, Hold]] = {}  # key -> owner -> its row
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, stamp)
        # When each is full again, and those times in a heap (some stale: skipped).
        self._full_at: dict[str, float] = {}
        self._full_heap: list[tuple[float, str]] = []

    def write(self, changes: Sequence[Change]) -> list[str]:
        with self._locked():
            fenced: list[str] = []
            self._fenced = fenced
            refused: set[str] = set()  # ids whose row was refused: the rest of theirs too
            rows = self._rows
            for change in changes:
                task_id = change[0]
                assert isinstance(task_id, str)
                if isinstance(change, RunChange):
                    self._write_run(change)
                elif isinstance(change, list):
                    if task_id in rows:
                        fenced.append(task_id)
                        refused.add(task_id)
                    else:
                        rows[task_id] = new_row(change)
                elif task_id in refused or not apply_change(rows.get(task_id), change):
                    fenced.append(task_id)
            return fenced

    def _write_run(self, change: RunChange) -> None:
        run_id = change[0]
        if isinstance(change, RunCreated):
            _, owner, workflow, context, created_at, graph = change
            self._runs.setdefault(
                str(run_id),
                {
                    "run_id": run_id,
                    "workflow": workflow,
                    "status": "running",
                    "context": context,
                    "owner": owner,
                    "created_at": created_at,
                    "finished_at": None,
                    "steps": {},
                    "recovery_attempts": 0,
                    "graph": graph_of(graph),
                },
            )
            return
        run = self._runs.get(str(run_id))
        if run is None or run["owner"] != change[1]:
            self._fenced.append(str(run_id))  # not (or no longer) this owner's run
            return
        if isinstance(change, StepRecorded):
            _, _, step_id, state, output, _task_id = change
            run["steps"][step_id] = (state, output)
        else:
            run["status"] = change[2]
            run["finished_at"] = change[3]

    def claim_runs(
        self,
        owner: str,
        now: float,
        workflows: Collection[str],
        max_recovery_attempts: int,
    ) -> RunRecovery:
        with self._locked():
            claimed, orphaned, abandoned = [], [], []
            for run in self._runs.values():
                if run["status"] != "running" or run["owner"] == owner:
                    continue
                lease = self._owners.get(run["owner"])
                if lease is not None and lease >= now:
                    continue
                if run["workflow"] not in workflows:
                    self._end_run(run, now, RUN_ORPHANED)
                    orphaned.append(self._run_record(run))
                elif run["recovery_attempts"] >= max_recovery_attempts:
                    self._end_run(run, now, abandoned_error(run["recovery_attempts"]))
                    abandoned.append(self._run_record(run))
                else:
                    run["owner"] = owner
                    run["recovery_attempts"] += 1
                    self._end_steps(run["run_id"], TaskStatus.CANCELLED, now, SUPERSEDED)
                    claimed.append(self._run_record(run))
            return RunRecovery(claimed, orphaned, abandoned)

    def _end_run(self, run: dict[str, Any], now: float, error: str) -> None:
        run["status"] = "failed"
        run["finished_at"] = now
        self._end_steps(run["run_id"], TaskStatus.FAILED, now, error)

    def _end_steps(self, run_id: str, status: TaskStatus, now: float, error: str) -> None:
        for row in self._rows.values():
            if row["run_id"] == run_id:
                apply_change(row, End((row["task_id"], row["version"], status, now, error)))

    def runs_taken_over(self, owner: str, run_ids: Collection[str]) -> list[str]:
        with self._locked():
            return [r for r in run_ids if r in self._runs and self._runs[r]["owner"] != owner]

    def run(self, run_id: str) -> RunRecord | None:
        if not matches_some(run_id=run_id):
            return None
        with self._locked():
            run = self._runs.get(run_id)
            return None if run is None else self._run_record(run)

    def runs(self, *, status: str | None = None) -> list[RunRecord]:
        if not matches_some(status=status):
            return []
        with self._locked():
            return [
                self._run_record(r)
                for r in self._runs.values()
                if status is None or r["status"] == status
            ]

    @staticmethod
    def _run_record(run: dict[str, Any]) -> RunRecord:
        graph = run["graph"]
        return RunRecord(
            **{
                **run,
                "steps": dict(run["steps"]),
                "graph": None if graph is None else {k: list(v) for k, v in graph.items()},
            }
        )

    def heartbeat(self, owner: str, lease_expires_at: float) -> None:
        with self._locked():
            self._owners[owner] = lease_expires_at

    def renew_lease(self, owner: str, lease: float) -> float:
        """`heartbeat` for ``lease`` seconds from when it is written."""
        with self._locked():
            at = self._owners[owner] = self.clock() + lease
        return at

    def release_owner(self, owner: str) -> None:
        with self._locked():
            self._owners.pop(owner, None)
            for key in list(self._holds):
                self._drop_hold(key, owner)

    def key_round(self, owner: str, requests: Sequence[KeyRequest]) -> list[KeyGrant]:
        with self._locked():
            now = self.clock()
            grants: dict[int, KeyGrant] = {}
            for i in sorted(range(len(requests)), key=lambda i: requests[i].key):
                grants[i] = self._settle_key(owner, requests[i], now)
            self._prune_buckets(now, len(requests) + PRUNE_MORE)
            return [grants[i] for i in range(len(requests))]

    def _prune_buckets(self, now: float, limit: int) -> None:
        """As the SQL stores' (`trioexec._store._sql.prune_buckets`): at most
        ``limit`` buckets full by ``now``, earliest first, go."""
        heap, full = self._full_heap, self._full_at
        while heap and heap[0][0] <= now and limit > 0:
            at, key = heapq.heappop(heap)
            if full.get(key) == at:  # (else stale: its bucket went, or changed)
                del full[key], self._buckets[key]
                limit -= 1

    def _settle_key(self, owner: str, request: KeyRequest, now: float) -> KeyGrant:
        key = request.key
        holds = self._holds.get(key, {})
        for other in [o for o in holds if o != owner]:
            lease = self._owners.get(other)
            if lease is None or lease < now:  # (as `recover`: expired before now)
                del holds[other]
        others = [h for o, h in holds.items() if o != owner]
        grant, row, bucket = settle(request, others, self._buckets.get(key), now, holds.get(owner))
        if row is None:
            self._drop_hold(key, owner)
        else:
            self._holds.setdefault(key, {})[owner] = attrs.evolve(row, owner=owner)
        if bucket is None:
            self._buckets.pop(key, None)
            self._full_at.pop(key, None)
        else:
            self._buckets[key] = bucket
            at = self._full_at[key] = full_at(request, bucket)
            heapq.heappush(self._full_heap, (at, key))
        return grant

    def _drop_hold(self, key: str, owner: str) -> None:
        holds = self._holds.get(key, {})
        holds.pop(owner, None)
        if not holds:
            self._holds.pop(key, None)

    def taken_over(self, owner: str, live: dict[str, int]) -> list[str]:
        with self._locked():
            lost = []
            for task_id, version in live.items():
                row = self._rows.get(task_id)
                if row is None:
                    continue  # not flushed yet: cannot have been taken
                if row["owner"] != owner or row["version"] != version or row["status"] not in LIVE:
                    lost.append(task_id)
            return lost

    def recover(
        self,
        owner: str,
        now: float,
        recreatable: Callable[[ExecutionRecord], bool],
        max_recovery_attempts: int,
        limit: int | None = None,
    ) -> Recovery:
        with self._locked():
            claimed: list[ExecutionRecord] = []
            orphaned: list[ExecutionRecord] = []
            abandoned: list[ExecutionRecord] = []
            for row in self._rows.values():
                if row["status"] not in LIVE or row["owner"] == owner or row["run_id"] is not None:
                    continue  # (a workflow step is resumed with its run, by claim_runs)
                lease = self._owners.get(row["owner"])
                if lease is not None and lease >= now:
                    continue
                record = self._record(row)
                room = limit is None or len(claimed) < limit
                verdict = recovery_verdict(record, recreatable(record), max_recovery_attempts, room)
                if verdict is Verdict.ABANDON:
                    self._fail(row, now, abandoned_error(row["recovery_attempts"]))
                    abandoned.append(self._record(row))
                elif verdict is Verdict.ORPHAN:
                    self._fail(row, now, ORPHANED)
                    orphaned.append(self._record(row))
                elif verdict is Verdict.CLAIM:
                    claim = (record.task_id, record.version, owner, claimed_attempts(record))
                    apply_change(row, Claim(claim))
                    claimed.append(self._record(row))
            return Recovery(claimed, orphaned, abandoned)

    @staticmethod
    def _fail(row: dict[str, Any], now: float, error: str) -> None:
        apply_change(row, End((row["task_id"], row["version"], TaskStatus.FAILED, now, error)))

    def _select(self, found: Filter, limit: int | None, order: Order) -> list[ExecutionRecord]:
        with self._locked():
            rows = self._rows.values()
            if order == "longest_deferred":
                selected = sorted(
                    (r for r in rows if _matches(r, found)),
                    key=lambda r: (r["deferred_since"] is None, r["deferred_since"] or 0.0),
                )[:limit]
            else:
                selected = []
                for row in reversed(rows) if order == "newest" else rows:
                    if len(selected) == limit:
                        break
                    if _matches(row, found):
                        selected.append(row)
            return [self._record(row) for row in selected]

    def _count(self, found: Filter, counts: dict[TaskStatus, int]) -> None:
        with self._locked():
            for row in self._rows.values():
                if _matches(row, found):
                    counts[row["status"]] += 1

    def _lookup(self, task_id: str) -> ExecutionRecord | None:
        with self._locked():
            row = self._rows.get(task_id)
            return None if row is None else self._record(row)

    def durable_tables(self) -> DictTables:
        """The durable tables of this store, for `trioexec.durable`: every
        `DurableStore` on it shares them."""
        return self._durable

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<MemoryStore {len(self._rows)} executions>"


def _matches(row: dict[str, Any], found: Filter) -> bool:
    """``row`` passes the filters ``found``."""
    return (
        (found.status is None or row["status"] is found.status)
        and (found.sub_status is None or row["sub_status"] is found.sub_status)
        and (
            found.deferred_before is None
            or (
                row["sub_status"] is SubStatus.DEFERRED
                and row["deferred_since"] <= found.deferred_before
            )
        )
        and (found.run_id is None or row["run_id"] == found.run_id)
        and (found.key is None or row["key"] == found.key)
    )
