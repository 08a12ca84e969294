"""Crash recovery with real processes: a SQLite file on disk or a PostgreSQL
database (every test runs on both), a worker process
killed with SIGKILL mid-run, and recovering executors in other processes.

The subprocess side is ``crash_worker.py`` next to this file (see its docstring).
Nothing here sleeps to wait for a state: the workers announce their states on
stdout, and the in-process recovery polls the store inside a ``trio.fail_after``.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import time
from pathlib import Path

import pytest
import trio
from lineproc import LineProcess
from worklog import any_live

from trioexec import Store, SubStatus, TaskStatus, open_executor, open_store
from trioexec._changes import Start, submitted

HERE = Path(__file__).resolve().parent
WORKER = HERE / "crash_worker.py"


def _load_worker():
    # Load by path: independent of pytest's import mode and of sys.path.
    spec = importlib.util.spec_from_file_location("trioexec_acceptance_crash_worker", WORKER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


crash_worker = _load_worker()
WORK = crash_worker.WORK  # the same spec id the subprocesses register


class Worker(LineProcess):
    """A ``crash_worker.py`` subprocess."""

    def __init__(self, args: list[str], stderr_path: Path) -> None:
        super().__init__(WORKER, args, stderr_path)


@pytest.fixture
def spawn(tmp_path):
    workers: list[Worker] = []

    def start(*args: object) -> Worker:
        n = len(workers)
        worker = Worker([str(a) for a in args], tmp_path / f"worker-{n}.stderr")
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.cleanup()


def read_log(log: Path) -> dict[str, list[tuple[str, int, float]]]:
    """task id -> [(event, pid, time), ...] in the order written."""
    runs: dict[str, list[tuple[str, int, float]]] = collections.defaultdict(list)
    if not log.exists():
        return runs
    for line in log.read_text().splitlines():
        event, task_id, pid, at = line.split()
        runs[task_id].append((event, int(pid), float(at)))
    return runs


# --------------------------------------------------------------------------- crash


N_DEFER, N_FIRST, N_HOLD, N_REST = 40, 60, crash_worker.MAX_CONCURRENT, 96
LEASE = 1.0


async def _recover_in_process(db: str, marker: Path, n_defer: int) -> tuple[str, object]:
    """Recover the dead worker's executions here; create ``marker`` once the
    interrupted deferred tasks have deferred again under this executor."""
    store = open_store(db)
    try:
        async with open_executor(
            store=store,
            recover=True,
            tasks=[WORK],
            lease=LEASE,
            max_concurrent_tasks=crash_worker.MAX_CONCURRENT,
        ) as ex:
            with trio.fail_after(30):
                # The dead owner's lease lapses <= LEASE after the kill; the recovery
                # pass every LEASE seconds then claims its live executions.
                while (
                    sum(r.owner == ex.owner for r in store.executions(sub_status="deferred"))
                    < n_defer
                ):
                    await trio.sleep(0.02)
                await trio.Path(marker).touch()
                while any_live(store):
                    await trio.sleep(0.02)
                await ex.wait_for_idle()
        return ex.owner, ex.statistics()
    finally:
        store.close()


def test_sigkill_mid_run_then_recover_completes_every_execution_once(tmp_path, spawn, db_target):
    db, marker, log = db_target, tmp_path / "marker", tmp_path / "effects.log"
    ids = crash_worker.task_ids(N_DEFER, N_FIRST, N_HOLD, N_REST)
    all_ids = [tid for group in ids.values() for tid in group]
    worker = spawn("crash", db, marker, log, N_DEFER, N_FIRST, N_HOLD, N_REST, LEASE)

    _, total, dead_owner, pid = worker.expect("READY")
    assert int(total) == len(all_ids) == 200
    with open_store(db) as observer:  # another connection, from another process
        assert sorted(r.task_id for r in observer.executions()) == sorted(all_ids)
        worker.expect("HALFWAY")
        # The worker is alive and stuck in a known state, everything flushed.
        by_status = collections.defaultdict(set)
        for r in observer.executions():
            assert r.owner == dead_owner
            by_status[r.status, r.sub_status].add(r.task_id)
        assert dict(by_status) == {
            (TaskStatus.COMPLETED, None): set(ids["first"]),
            (TaskStatus.RUNNING, SubStatus.DEFERRED): set(ids["defer"]),
            (TaskStatus.RUNNING, SubStatus.ACTIVE): set(ids["hold"]),
            (TaskStatus.PENDING, None): set(ids["rest"]),
        }
        assert {r.task_id for r in observer.executions(sub_status="deferred")} == set(ids["defer"])
        assert all(r.deferred_since is not None for r in observer.executions(sub_status="deferred"))
        assert observer.executions(deferred_longer_than=3600) == []

        worker.proc.kill()  # SIGKILL: no cleanup, no lease release
        assert worker.proc.wait(timeout=10) == -9

        # Nothing changed by dying.
        after = {(r.task_id, r.status, r.sub_status, r.owner) for r in observer.executions()}
        assert len(after) == 200
        assert {tid for tid, s, _, _ in after if s is TaskStatus.COMPLETED} == set(ids["first"])

    new_owner, stats = trio.run(_recover_in_process, db, marker, N_DEFER)
    assert new_owner != dead_owner
    recovered = set(ids["defer"] + ids["hold"] + ids["rest"])
    assert stats.completed_count == len(recovered)
    assert stats.failed_count == stats.cancelled_count == 0

    with open_store(db) as store:
        rows = {r.task_id: r for r in store.executions()}
        assert sorted(rows) == sorted(all_ids)  # no row lost, none added
        assert {r.status for r in rows.values()} == {TaskStatus.COMPLETED}
        assert store.executions(status="failed") == []
        assert store.executions(sub_status="deferred") == []
        assert store.executions(sub_status="active") == []
        for tid, r in rows.items():
            assert r.error is None, (tid, r.error)
            assert r.sub_status is None
            assert r.deferred_since is None
            assert r.finished_at is not None
            if tid in recovered:
                assert (r.owner, r.recovery_attempts, r.version) == (new_owner, 1, 2), r
                # interrupted while running: that attempt, then ours; never started: ours
                assert r.attempt == (1 if tid in ids["rest"] else 2), r
            else:
                assert (r.owner, r.recovery_attempts, r.version, r.attempt) == (
                    dead_owner,
                    0,
                    1,
                    1,
                ), r
        assert json.loads(rows["rest-000"].args) == ["quick", str(marker), str(log)]

    # Side effects: at-least-once is all recovery promises in general; here every
    # completion before the kill was durable (ref.wait) and nothing else had got
    # past its work, so each task's work finished exactly once, in the right process.
    runs = read_log(log)
    assert sorted(runs) == sorted(all_ids)
    dead_pid, here = int(pid), os.getpid()
    for tid, events in runs.items():
        ends = [p for e, p, _ in events if e == "end"]
        starts = [p for e, p, _ in events if e == "start"]
        if tid in ids["first"]:
            assert (starts, ends) == ([dead_pid], [dead_pid]), (tid, events)
        elif tid in ids["rest"]:
            assert (starts, ends) == ([here], [here]), (tid, events)
        else:  # interrupted: ran in the dead process, then again here
            assert (starts, ends) == ([dead_pid, here], [here]), (tid, events)


# --------------------------------------------------------------------------- race


# Long enough that a loaded machine never lets a live worker's own lease lapse (the
# other worker then takes its tasks, as a lapsed lease allows). A renewal used to
# wait for the worker's store calls in progress: on a loaded machine one recovery
# pass of 60 rows took 2.5 s on PostgreSQL and single calls up to 5 s, and a lease
# lapsed in CI even at 8 s; renewals now run beside those calls. Both processes
# recover every RACE_LEASE seconds from the same start, and the dead owners' lapses
# are spread over 1.2 leases between their passes, so the passes still race
# whatever their length.
RACE_LEASE = 8.0
RACE_DEADLINE = 90  # seconds: the last lapse comes 1.2 leases in, then a pass and 30 tasks
N_EXPIRED = 60  # one dead owner whose lease lapsed before the workers started
N_OWNERS, PER_OWNER = 8, 30  # dead owners whose leases lapse one after another later


def _dead_rows(store: Store, owner: str, n: int, marker: Path, log: Path) -> list[str]:
    changes = []
    ids = []
    for i in range(n):
        tid = f"{owner}-{i:03d}"
        ids.append(tid)
        args = json.dumps(["quick", str(marker), str(log)])
        changes.append(submitted(tid, 1, WORK.id, None, WORK.id, args, owner, time.time()))
        changes.append(Start((tid, 1, 1, time.time())))
    store.write(changes)
    return ids


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = peak = 0
    for _, delta in points:  # at a tie, an end (-1) sorts before a start
        now += delta
        peak = max(peak, now)
    return peak


def test_two_processes_recover_one_store_each_execution_runs_once(tmp_path, spawn, db_target):
    db, marker, log = db_target, tmp_path / "marker", tmp_path / "effects.log"
    far = time.time() + 3600
    with open_store(db) as store:
        all_ids = _dead_rows(store, "expired", N_EXPIRED, marker, log)
        store.heartbeat("expired", time.time() - 60)
        owners = [f"dead{k}" for k in range(N_OWNERS)]
        for owner in owners:
            all_ids += _dead_rows(store, owner, PER_OWNER, marker, log)
            store.heartbeat(owner, far)  # alive, for now

        # Both start at once: their first recovery passes race for "expired".
        workers = [spawn("recover", db, RACE_LEASE, RACE_DEADLINE) for _ in range(2)]
        opened = {}
        for w in workers:
            _, owner, pid = w.expect("OPEN")
            opened[owner] = int(pid)
        assert len(opened) == 2

        # Now let the other owners lapse one after another, while both recover
        # every RACE_LEASE seconds.
        start = time.time()
        for k, owner in enumerate(owners):
            store.heartbeat(owner, start + RACE_LEASE * 0.15 * (k + 1))

        done = {}
        for w in workers:
            _, owner, completed = w.expect("DONE", timeout=RACE_DEADLINE)
            done[owner] = int(completed)
            assert w.proc.wait(timeout=10) == 0, w.lines

        rows = {r.task_id: r for r in store.executions()}
        assert len(all_ids) == 300
        assert sorted(rows) == sorted(all_ids)
        assert {r.status for r in rows.values()} == {TaskStatus.COMPLETED}
        for tid, r in rows.items():
            assert r.owner in opened, (tid, r.owner)
            assert (r.recovery_attempts, r.version, r.attempt, r.error) == (1, 2, 2, None), r
        assert sum(done.values()) == 300
        per_owner = collections.Counter(r.owner for r in rows.values())
        assert dict(per_owner) == {o: n for o, n in done.items() if n}

    runs = read_log(log)
    assert sorted(runs) == sorted(all_ids)
    by_pid: dict[int, list[tuple[float, float]]] = collections.defaultdict(list)
    for tid, events in runs.items():
        # exactly one run, start then end, in the process that owns the row
        assert [e for e, _, _ in events] == ["start", "end"], (tid, events)
        (_, p1, t1), (_, p2, t2) = events
        assert p1 == p2 == opened[rows[tid].owner], (tid, events)
        assert t1 <= t2
        by_pid[p1].append((t1, t2))
    for intervals in by_pid.values():  # the slot bound held in each process
        assert _max_overlap(intervals) <= crash_worker.MAX_CONCURRENT
    names = {owner: f"p{i}" for i, owner in enumerate(sorted(opened, key=opened.get))}
    claims = {
        dead: "".join(sorted({names[r.owner] for t, r in rows.items() if t.startswith(dead + "-")}))
        for dead in ["expired", *owners]
    }
    print(f"race split: {sorted(done.values())}; claimed by: {claims}")
