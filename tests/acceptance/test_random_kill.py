"""SIGKILL at random moments, many rounds, then check that every execution ended once.

Each round starts one or two executor processes (``kill_executor.py``: a
`SQLiteStore` file, ``recover=True``, short leases; quick tasks, tasks that defer
on the wall clock or on a gate file, tasks that fail and are retried) and one or
two durable workers (``kill_durable.py``: `open_worker` on a `DurableStore` file;
handlers that return, defer, reject, or await a durable promise that this test
resolves), while this process submits durable work, opens gates and resolves
promises at random moments. Every child is SIGKILLed at a random moment (after
it announced itself, at a random point of its start-up, or the moment an executor
reports its submissions durable): the next round's
processes recover what the dead ones held. After the last round, fresh processes
that are never killed recover everything, and then:

- every planned execution is COMPLETED in the store, exactly once: the side
  effects each run logs show no two runs of one execution overlapping, no run
  after a *completed* run unless the process that completed it was killed before
  the new run started (its completion was not durable yet), and no run at all of
  an execution the store had as COMPLETED at the end of an earlier round; every
  acknowledged submission is in the store at the end of each round;
- every durable task is FULFILLED once, its promise settled by the last run (the
  resolved value names that run's pid and version), each (task, version) run at
  most once (but for the worker's in-place re-run of a handler whose awaited
  promise settled just before its suspend was written: same process, right after
  the run unwound), and the store's invariants hold after every round.

The plan of each round (batches, kinds, the moments of kills, gates and promise
resolutions) comes from a seeded RNG: ``TRIOEXEC_KILL_SEED`` picks the seed (a
random one otherwise; every failure names it) and ``TRIOEXEC_KILL_ROUNDS`` the
number of rounds. Killing at a random moment is the point, so the rounds wait
real time before each kill; nothing waits for a state by sleeping: the children
announce their states on stdout (read with a deadline) and the final wait polls
the store under a deadline. ``test_random_kill_soak`` (marker ``slow``, run by
``nox -s soak``) repeats whole campaigns for ``TRIOEXEC_SOAK_MINUTES``.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import random
import select
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from trioexec import ExecutionRecord, SQLiteStore, TaskStatus
from trioexec.durable import DurableStore, PromiseRecord, PromiseState, TaskState

HERE = Path(__file__).resolve().parent
EXECUTOR = HERE / "kill_executor.py"
DURABLE = HERE / "kill_durable.py"

LEASE = 1.0  # seconds, executors and durable workers alike: a dead one's work lapses fast
MAX_DELAY = 2.5  # a kill comes up to this long after the child announced itself ...
EARLY_KILL = 0.15  # ... or, with this chance, at a random moment of its start-up ...
ACK_KILL = 0.15  # ... or (an executor) the moment it reports its submissions durable
EARLY_WINDOW = 0.8  # seconds after the spawn
DEADLINE = 60.0  # bounds every wait for a child or for the final recovery
DEFAULT_ROUNDS = 4  # (a short campaign: the soak runs 30-round ones for minutes)
SOAK_ROUNDS = 30
SOAK_MINUTES = 8.0
TARGET = "kill"  # kill_durable.TARGET

EXEC_KINDS = ("quick", "until", "gate", "flaky")
EXEC_WEIGHTS = (5, 2, 2, 2)
DURABLE_KINDS = ("plain", "gate", "defer", "fail")
DURABLE_WEIGHTS = (4, 3, 2, 1)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def _seed() -> int:
    value = os.environ.get("TRIOEXEC_KILL_SEED", "").strip()
    return int(value) if value else random.SystemRandom().randrange(2**32)


# ------------------------------------------------------------------ child processes


class Child:
    """A helper script in a subprocess; its stdout is read line by line without
    blocking (several children are watched at once with `select`)."""

    def __init__(self, name: str, script: Path, args: list[object], tmp: Path, *, stdin: bool):
        self.name = name
        self.stderr_path = tmp / f"{name}.stderr"
        self._stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        )
        self.spawned = time.monotonic()
        self.announced: float | None = None  # when its OPEN/READY line was read
        self.killed_at: float | None = None  # just before the SIGKILL was sent
        self.lines: list[str] = []
        self.eof = False
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fileno(self) -> int:
        assert self.proc.stdout is not None
        return self.proc.stdout.fileno()

    def read(self) -> None:
        """One read from stdout (call when `select` says it is readable)."""
        chunk = os.read(self.fileno(), 65536)
        if not chunk:
            self.eof = True
            return
        self._buffer += chunk
        *complete, self._buffer = self._buffer.split(b"\n")
        self.lines += [raw.decode() for raw in complete]

    def line(self, word: str) -> list[str] | None:
        """The fields of the first line starting with ``word`` read so far."""
        for line in self.lines:
            if line.split(" ", 1)[0] == word:
                return line.split()
        return None

    def expect(self, word: str, timeout: float) -> list[str]:
        """Wait on the pipe (bounded) for a line starting with ``word``."""
        deadline = time.monotonic() + timeout
        while (fields := self.line(word)) is None:
            if self.eof:
                self.proc.wait()
                raise AssertionError(
                    f"{self.describe()} exited with {self.proc.returncode} before {word!r}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{self.describe()}: no {word!r} line within {timeout}s")
            if select.select([self.fileno()], [], [], remaining)[0]:
                self.read()
        return fields

    def kill(self) -> None:
        self.killed_at = time.monotonic()
        self.proc.kill()
        self.proc.wait(timeout=10)
        while not self.eof:  # what it printed before it died (the writer is gone)
            self.read()
        if self.proc.returncode != -9:  # it had died by itself
            raise AssertionError(f"{self.describe()} exited with {self.proc.returncode}")

    def stop(self) -> None:
        """Close its stdin (a durable worker then leaves its block cleanly)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def describe(self) -> str:
        self._stderr.flush()
        stderr = self.stderr_path.read_text(errors="replace")[-4000:]
        return f"{self.name} (pid {self.pid}); stdout {self.lines!r}; stderr:\n{stderr}"

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stdin):
            if pipe is not None and not pipe.closed:
                pipe.close()
        self._stderr.close()


# ------------------------------------------------------------------ the effect logs


@dataclass
class Run:
    """One run of an execution (or of a durable task at one version), from its log."""

    pid: int
    start: float
    version: int = 0
    how: str | None = None  # done / fail / unwound; None: no end logged (killed)
    end: float | None = None
    awaited: float | None = None  # durable: when it called await_promise
    rerun: bool = False  # durable: run again in place (its suspension found the promise settled)


def read_runs(log: Path, *, durable: bool) -> dict[str, list[Run]]:
    """Execution id -> its runs in the order they started.

    A durable (task, version) starts at most once, but for the worker's in-place
    re-run: a run that asked to suspend (``await`` then ``unwound``) whose awaited
    promise settled before the worker's suspend was written (`Suspend.ALREADY_SETTLED`)
    is run again at once, by the same process under the same lease and version.
    """
    runs: dict[str, list[Run]] = collections.defaultdict(list)
    running: dict[tuple[str, int], Run] = {}  # (id, pid) -> its open run
    started: dict[tuple[str, int], Run] = {}  # durable (id, version) -> its last run
    if not log.exists():
        return runs
    for line in log.read_text().splitlines():
        if durable:
            event, tid, version, pid, at = line.split()
        else:
            event, tid, pid, at = line.split()
            version = "0"
        key, t = (tid, int(pid)), float(at)
        if event == "start":
            assert key not in running, f"{tid} started again in pid {pid} while running: {line}"
            run = running[key] = Run(int(pid), t, int(version))
            if durable:
                before = started.get((tid, run.version))
                in_place = (
                    before is not None
                    and before.pid == run.pid
                    and before.how == "unwound"
                    and before.awaited is not None
                )
                assert before is None or in_place, f"{tid} v{version} ran twice: {line}"
                run.rerun = in_place
                started[(tid, run.version)] = run
            runs[tid].append(run)
        elif event == "await":
            running[key].awaited = t
        else:
            assert key in running, f"an end without a start: {line}"
            run = running.pop(key)
            assert run.version == int(version), line
            run.how, run.end = event, t
    for tid in runs:
        runs[tid].sort(key=lambda run: run.start)
    return runs


# ------------------------------------------------------------------ one campaign


async def _with_durable(db: Path, fn: Callable[[DurableStore], Any]) -> Any:
    with DurableStore(db) as ds:
        return await fn(ds)


async def _all_pages(search: Callable[..., Any]) -> list[Any]:
    out: list[Any] = []
    cursor = None
    while True:
        page, cursor = await search(limit=500, cursor=cursor)
        out += page
        if cursor is None:
            return out


async def _durable_state(ds: DurableStore) -> tuple[dict[str, PromiseRecord], dict, list[str]]:
    promises = await _all_pages(ds.promises.search)
    tasks = await _all_pages(ds.tasks.search)
    return {p.id: p for p in promises}, {t.id: t for t in tasks}, await ds.check_invariants()


@dataclass
class Gate:
    """A gate file (executor tasks defer on it) or a gate promise (durable handlers
    await it), opened at ``offset`` seconds into round ``round``."""

    name: str
    round: int
    offset: float
    opened_at: float | None = None  # monotonic, just before it was opened
    value: Any = None


@dataclass
class Kid:
    """A child of the current round and when it is to be killed."""

    child: Child
    role: str  # executor / durable
    c: int  # its index among the round's children of that role
    mode: str  # its kill comes: early (in start-up), late (after it announced), at its ACK
    u: float  # uniform in [0, 1): where in its kill window the kill falls
    kill_at: float | None = None  # monotonic; None until it announces itself (or its ACK)


class Campaign:
    """Rounds of random kills on one pair of database files, then the final check."""

    def __init__(self, tmp: Path, seed: int, rounds: int) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp, self.seed, self.rounds = tmp, seed, rounds
        self.rng = random.Random(seed)
        self.db, self.ddb = tmp / "runs.db", tmp / "durable.db"
        self.log, self.dlog = tmp / "executor.log", tmp / "durable.log"
        self.gates = tmp / "gates"
        self.gates.mkdir(exist_ok=True)
        self.plan_path = tmp / "plan.json"
        self.plan: dict[str, list[list[Any]]] = {}  # "<round>.<child>" -> batch
        self.kind: dict[str, str] = {}  # execution id -> kind
        self.acked: set[str] = set()  # executions a child reported durable
        self.killed: dict[int, float] = {}  # os pid -> when its SIGKILL was sent
        self.owners: dict[int, str] = {}  # executor os pid -> executor owner id
        self.gate_files: list[Gate] = []
        self.gate_promises: list[Gate] = []
        self.durable: dict[str, dict[str, Any]] = {}  # durable task id -> its param
        self.created: set[str] = set()  # durable tasks and gate promises created so far
        self.exec_rows: dict[str, ExecutionRecord] = {}  # the last snapshot
        self.promises: dict[str, PromiseRecord] = {}  # the last snapshot
        self.completed_by: dict[str, float] = {}  # id -> snapshot time it was first seen ended
        self.settled_by: dict[str, float] = {}
        self.children: list[Child] = []
        self.stats: collections.Counter[str] = collections.Counter()
        self._n = itertools.count()

    # ------------------------------------------------------------ plan

    def _plan_round(self, r: int) -> tuple[list[tuple[float, Callable[[], None]]], list]:
        """This round's batches, gates, durable tasks, timed actions and children."""
        rng = self.rng
        actions: list[tuple[float, Callable[[], None]]] = []

        def later() -> tuple[int, float]:
            # a gate opens in this round (60%), in one of the next two, or at the end
            return r + rng.choice((0, 0, 0, 1, 2)), rng.uniform(0.0, MAX_DELAY + 1.0)

        files = [Gate(f"g{r}-{k}", *later()) for k in range(2)]
        promises = [Gate(f"gate-{r}-{k}", *later()) for k in range(2)]
        self.gate_files += files
        self.gate_promises += promises

        n_exec = rng.choice((1, 1, 2))
        for c in range(n_exec):
            batch = []
            for i in range(rng.randint(8, 24)):
                tid = f"e{r}.{c}-{i:02d}"
                kind = rng.choices(EXEC_KINDS, EXEC_WEIGHTS)[0]
                if kind == "quick":
                    param: Any = rng.choice((0.0, rng.uniform(0.0, 0.05), rng.uniform(0.1, 0.6)))
                elif kind == "until":
                    param = time.time() + rng.uniform(0.2, 2.5)
                elif kind == "gate":
                    param = rng.choice(files).name
                else:
                    param = rng.randint(1, 2)
                batch.append([tid, kind, param])
                self.kind[tid] = kind
            self.plan[f"{r}.{c}"] = batch

        early, late = [], []
        for i in range(rng.randint(6, 16)):
            tid = f"d{r}-{i:02d}"
            kind = rng.choices(DURABLE_KINDS, DURABLE_WEIGHTS)[0]
            data: dict[str, Any] = {"n": next(self._n), "kind": kind}
            data["hold"] = rng.choice((0.0, rng.uniform(0.0, 0.3)))
            if kind == "gate":
                data["gate"] = rng.choice(promises).name
            elif kind == "defer":
                data["defer"] = rng.uniform(0.2, 2.0)  # "until" is set at creation
            self.durable[tid] = data
            (early if rng.random() < 0.6 else late).append(tid)
        actions.append((0.0, lambda: self._create_durable(early)))
        actions.append((rng.uniform(0.3, MAX_DELAY), lambda: self._create_durable(late)))

        for gate in self.gate_files:
            if gate.round == r:
                actions.append((gate.offset, lambda g=gate: self._open_file(g)))
        for gate in self.gate_promises:
            if gate.round == r:
                actions.append((gate.offset, lambda g=gate: self._resolve([g])))

        children = []
        modes, weights = ("early", "ack", "late"), (EARLY_KILL, ACK_KILL, 1 - EARLY_KILL - ACK_KILL)
        for c in range(n_exec):
            children.append(("executor", c, rng.choices(modes, weights)[0], rng.random()))
        for c in range(rng.choice((1, 2, 2))):
            mode = rng.choices(modes[::2], weights[::2])[0]
            children.append(("durable", c, mode, rng.random()))
        return sorted(actions, key=lambda a: a[0]), children

    def _write_plan(self) -> None:
        tmp = self.plan_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.plan))
        tmp.replace(self.plan_path)

    # ------------------------------------------------------------ actions

    def _create_durable(self, ids: list[str]) -> None:
        async def create(ds: DurableStore) -> None:
            for gate in self.gate_promises:  # before any task awaits it
                if gate.name not in self.created:
                    await ds.promises.create(gate.name, 3600)
                    self.created.add(gate.name)
            for tid in ids:
                param = self.durable[tid]
                if param["kind"] == "defer":
                    param["until"] = time.time() + param["defer"]
                await ds.promises.create(tid, 3600, target=TARGET, data=param)
                self.created.add(tid)

        trio.run(_with_durable, self.ddb, create)

    def _open_file(self, gate: Gate) -> None:
        if gate.opened_at is None:
            gate.opened_at = time.monotonic()
            (self.gates / gate.name).touch()

    def _resolve(self, gates: list[Gate]) -> None:
        async def resolve(ds: DurableStore) -> None:
            for gate in gates:
                if gate.opened_at is None:
                    gate.opened_at = time.monotonic()
                    gate.value = {"gate": gate.name, "at": gate.opened_at}
                    await ds.promises.resolve(gate.name, idempotency_key="test", data=gate.value)

        trio.run(_with_durable, self.ddb, resolve)

    # ------------------------------------------------------------ rounds

    def _spawn(self, role: str, c: int, r: int | None) -> Child:
        n = len(self.children)
        if role == "executor":
            args: list[object] = [self.db, self.log, self.gates, self.plan_path, LEASE]
            if r is None:
                child = Child(
                    f"{n}-exec-final", EXECUTOR, ["final", *args, DEADLINE], self.tmp, stdin=False
                )
            else:
                name = f"{n}-exec-r{r}.{c}"
                child = Child(name, EXECUTOR, ["run", *args, r, c], self.tmp, stdin=False)
        else:
            name = f"{n}-durable-" + ("final" if r is None else f"r{r}.{c}")
            child = Child(name, DURABLE, [self.ddb, self.dlog, LEASE], self.tmp, stdin=True)
        self.children.append(child)
        return child

    def _after_kill(self, child: Child, role: str, r: int, c: int) -> None:
        assert child.killed_at is not None
        self.killed[child.pid] = child.killed_at
        self.stats["kills"] += 1
        if child.announced is None:
            self.stats["kills before announcing"] += 1
        if role == "executor":
            if opened := child.line("OPEN"):
                self.owners[child.pid] = opened[1]
            if child.line("ACK"):
                self.acked.update(tid for tid, _, _ in self.plan[f"{r}.{c}"])
                if c == 0:  # it submitted whatever earlier rounds left out
                    for key, batch in self.plan.items():
                        if int(key.split(".")[0]) < r:
                            self.acked.update(tid for tid, _, _ in batch)

    def run_round(self, r: int) -> None:
        actions, plans = self._plan_round(r)
        self._write_plan()
        t0 = time.monotonic()
        while actions and actions[0][0] <= 0.0:
            actions.pop(0)[1]()
        alive = []
        for role, c, mode, u in plans:
            kid = Kid(self._spawn(role, c, r), role, c, mode, u)
            if mode == "early":
                kid.kill_at = kid.child.spawned + u * EARLY_WINDOW
            alive.append(kid)
        while alive:
            now = time.monotonic()
            while actions and t0 + actions[0][0] <= now:
                actions.pop(0)[1]()
            for kid in list(alive):
                child = kid.child
                if kid.kill_at is not None and kid.kill_at <= now:
                    child.kill()
                    self.stats[f"kills {kid.mode}"] += 1
                    self._after_kill(child, kid.role, r, kid.c)
                    alive.remove(kid)
                elif child.eof:
                    child.proc.wait()
                    raise AssertionError(f"{child.describe()} exited by itself")
                elif child.announced is None and now > child.spawned + DEADLINE:
                    raise AssertionError(f"{child.describe()} did not start in {DEADLINE}s")
            if not alive:
                break
            wake = [kid.kill_at for kid in alive if kid.kill_at is not None]
            if actions:
                wake.append(t0 + actions[0][0])
            timeout = max(0.0, min([now + 1.0, *wake]) - time.monotonic())
            ready = select.select([kid.child.fileno() for kid in alive], [], [], timeout)[0]
            for kid in alive:
                child = kid.child
                if child.fileno() in ready:
                    child.read()
                    word = "OPEN" if kid.role == "executor" else "READY"
                    if child.announced is None and child.line(word):
                        child.announced = time.monotonic()
                        if kid.mode == "late":
                            kid.kill_at = child.announced + kid.u * MAX_DELAY
                    if kid.mode == "ack" and kid.kill_at is None and child.line("ACK"):
                        kid.kill_at = time.monotonic()  # at once: was it durable?
        for _, fn in actions:  # the round's remaining moments come now
            fn()
        self._snapshot(f"after round {r}")

    # ------------------------------------------------------------ snapshots

    def _snapshot(self, when: str) -> None:
        at = time.monotonic()
        rows: dict[str, ExecutionRecord] = {}
        if self.db.exists():
            with SQLiteStore(self.db) as store:
                rows = {row.task_id: row for row in store.executions()}
        lost = sorted(self.acked - rows.keys())
        assert not lost, f"{when}: acknowledged submissions missing from the store: {lost}"
        assert rows.keys() <= self.kind.keys(), f"{when}: unplanned rows {rows.keys() - self.kind}"
        vanished = sorted(self.exec_rows.keys() - rows.keys())
        assert not vanished, f"{when}: rows disappeared from the store: {vanished}"
        for tid, row in rows.items():
            assert row.status in (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.COMPLETED), (
                f"{when}: {tid} ended {row.status}, not completed: {row}"
            )
            before = self.exec_rows.get(tid)
            if before is not None and before.status is TaskStatus.COMPLETED:
                assert _ended(row) == _ended(before), (
                    f"{when}: completed row {tid} changed: {before} -> {row}"
                )
            if row.status is TaskStatus.COMPLETED:
                self.completed_by.setdefault(tid, at)
        self.exec_rows = rows

        promises, tasks, violated = trio.run(_with_durable, self.ddb, _durable_state)
        assert violated == [], f"{when}: durable store invariants violated: {violated}"
        missing = sorted(self.created - promises.keys())
        assert not missing, f"{when}: created durable tasks missing: {missing}"
        for key, promise in promises.items():
            if key in self.durable:
                fails = self.durable[key]["kind"] == "fail"
                ok = PromiseState.REJECTED if fails else PromiseState.RESOLVED
                assert promise.state in (PromiseState.PENDING, ok), (when, promise)
                assert (tasks[key].state is TaskState.FULFILLED) == (not promise.pending), (
                    when,
                    promise,
                    tasks[key],
                )
            before = self.promises.get(key)
            if before is not None and not before.pending:
                assert promise == before, f"{when}: settled promise changed: {before} -> {promise}"
            if not promise.pending:
                self.settled_by.setdefault(key, at)
        self.promises = promises

    # ------------------------------------------------------------ the end

    def finish(self) -> None:
        for gate in self.gate_files:
            self._open_file(gate)
        self._resolve(self.gate_promises)
        self._create_durable(sorted(self.durable.keys() - self.created))
        ex = self._spawn("executor", 0, None)
        dw = self._spawn("durable", 0, None)
        _, owner, pid = ex.expect("OPEN", DEADLINE)
        assert int(pid) == ex.pid
        self.owners[ex.pid] = owner
        _, _, pid = dw.expect("READY", DEADLINE)
        assert int(pid) == dw.pid
        _, _, completed = ex.expect("DONE", DEADLINE + 10)
        assert ex.proc.wait(timeout=10) == 0, ex.describe()

        async def settled(ds: DurableStore) -> list[Any]:
            with trio.move_on_after(DEADLINE):
                while (await ds.promises.search(state="pending", limit=1))[0]:
                    await trio.sleep(0.05)
                return []
            return [
                (promise, await ds.tasks.get(promise.id))
                for promise in await _all_pages(
                    lambda **kw: ds.promises.search(state="pending", **kw)
                )
            ]

        stuck = trio.run(_with_durable, self.ddb, settled)
        assert not stuck, f"durable tasks not settled {DEADLINE}s into the final run: {stuck}"
        dw.stop()
        _, claimed, fulfilled, _ = dw.expect("DONE", DEADLINE)
        assert int(claimed) >= int(fulfilled), dw.describe()
        assert dw.proc.wait(timeout=10) == 0, dw.describe()
        self._snapshot("after the final recovery")
        self._check_executions(ex.pid, owner, int(completed))
        self._check_durable(dw.pid, int(fulfilled))

    def _check_executions(self, final_pid: int, final_owner: str, completed: int) -> None:
        rows = self.exec_rows
        assert sorted(rows) == sorted(self.kind), "planned executions missing from the store"
        runs = read_runs(self.log, durable=False)
        for tid, row in rows.items():
            what = f"execution {tid} ({self.kind[tid]}): {row}; runs {runs.get(tid)}"
            assert row.status is TaskStatus.COMPLETED, what
            assert (row.sub_status, row.error, row.deferred_since) == (None, None, None), what
            assert row.finished_at is not None, what
            assert tid in runs, what
            self._check_sequence(runs[tid], what, terminal=("done",))
            last = runs[tid][-1]
            if last.pid in self.owners:
                assert row.owner == self.owners[last.pid], f"completed by another owner: {what}"
            if ended := self.completed_by.get(tid):
                late = [run for run in runs[tid] if run.start > ended]
                assert not late, f"ran again after the store had it COMPLETED: {what}"
            self.stats["executor runs"] += len(runs[tid])
            self.stats["executor runs cut by a kill"] += sum(run.how is None for run in runs[tid])
            self.stats["executor completions re-run"] += sum(
                run.how == "done" for run in runs[tid][:-1]
            )
            self.stats["executor planned failures"] += sum(run.how == "fail" for run in runs[tid])
        mine = sum(row.owner == final_owner for row in rows.values())
        assert completed == mine, (completed, mine)
        self.stats["executions"] = len(rows)

    def _check_durable(self, final_pid: int, fulfilled: int) -> None:
        promises = self.promises
        _, tasks, _ = trio.run(_with_durable, self.ddb, _durable_state)
        runs = read_runs(self.dlog, durable=True)
        by_final = 0
        for gate in self.gate_promises:
            assert promises[gate.name].state is PromiseState.RESOLVED, promises[gate.name]
        for tid, param in self.durable.items():
            promise, task = promises[tid], tasks[tid]
            what = f"durable task {tid} {param}: {promise}; {task}; runs {runs.get(tid)}"
            assert task.state is TaskState.FULFILLED, what
            assert tid in runs, what
            versions = [run.version for run in runs[tid] if not run.rerun]
            assert versions == sorted(set(versions)), f"versions out of order: {what}"
            terminal = ("fail",) if param["kind"] == "fail" else ("done",)
            self._check_sequence(runs[tid], what, terminal=terminal)
            last = runs[tid][-1]
            assert last.version == task.version, f"not settled by its last run: {what}"
            if param["kind"] == "fail":
                assert promise.state is PromiseState.REJECTED, what
                assert f"planned rejection of {tid}" in (promise.data or ""), what
            else:
                assert promise.state is PromiseState.RESOLVED, what
                value = json.loads(promise.data or "null")
                expected = {"n": param["n"], "square": param["n"] ** 2}
                assert {k: value[k] for k in expected} == expected, what
                assert (value["pid"], value["version"]) == (last.pid, last.version), what
                if param["kind"] == "gate":
                    (gate,) = [g for g in self.gate_promises if g.name == param["gate"]]
                    assert value["gate"] == gate.value, what
                    assert last.end is not None, what
                    assert last.end > gate.opened_at, what
                else:
                    assert value["gate"] is None, what
            if ended := self.settled_by.get(tid):
                late = [run for run in runs[tid] if run.start > ended]
                assert not late, f"ran again after its promise was settled: {what}"
            by_final += last.pid == final_pid
            self.stats["durable runs"] += len(runs[tid])
            self.stats["durable runs cut by a kill"] += sum(run.how is None for run in runs[tid])
            # (A run asked to suspend; its promise then settled before the suspend
            # was written: re-run in place, not suspended.)
            reruns = sum(run.rerun for run in runs[tid])
            self.stats["durable suspensions"] += (
                sum(run.how == "unwound" and run.awaited is not None for run in runs[tid]) - reruns
            )
            self.stats["durable re-runs in place"] += reruns
        assert fulfilled == by_final, (fulfilled, by_final)
        self.stats["durable tasks"] = len(self.durable)

    def _check_sequence(self, runs: list[Run], what: str, *, terminal: tuple[str, ...]) -> None:
        """One execution's runs: one at a time, each ended or killed; a finished
        run is followed by another only if its process was killed before it."""
        for a, b in itertools.pairwise(runs):
            if a.how is None:
                assert a.pid in self.killed, f"a run never ended in a live process: {what}"
                end = self.killed[a.pid]
            elif a.how == "unwound" and a.awaited is not None:
                end = a.awaited  # suspended: its unwinding may be logged after the next start
            else:
                assert a.end is not None
                end = a.end
            assert end <= b.start, f"two runs at once ({a} and {b}): {what}"
            if a.how in terminal:
                why = f"ran again after a live process completed it ({a} then {b}): {what}"
                assert a.pid in self.killed, why
                assert self.killed[a.pid] <= b.start, why
        assert runs[-1].how in terminal, f"the last run did not complete: {what}"

    def cleanup(self) -> None:
        for child in self.children:
            child.cleanup()


def _ended(row: ExecutionRecord) -> tuple[object, ...]:
    return (row.status, row.owner, row.attempt, row.version, row.finished_at, row.error)


def run_campaign(tmp: Path, seed: int, rounds: int, nodeid: str) -> collections.Counter[str]:
    print(f"random-kill campaign: TRIOEXEC_KILL_SEED={seed} TRIOEXEC_KILL_ROUNDS={rounds} in {tmp}")
    campaign = Campaign(tmp, seed, rounds)
    start = time.monotonic()
    try:
        for r in range(rounds):
            campaign.run_round(r)
        campaign.finish()
    except BaseException as exc:
        exc.add_note(
            f"random-kill seed {seed}, {rounds} rounds, files in {tmp}; the plan and the "
            f"kill moments follow the seed, the interleavings do not. Rerun with: "
            f"TRIOEXEC_KILL_SEED={seed} TRIOEXEC_KILL_ROUNDS={rounds} pytest -m '' {nodeid}"
        )
        raise
    finally:
        campaign.cleanup()
    stats = campaign.stats
    stats["seconds"] = round(time.monotonic() - start)
    print(f"random-kill seed {seed}: {dict(stats)}")
    return stats


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize(
    ("second", "accepted"),
    [
        ("unwound-after-await", True),  # the worker's in-place re-run (seed 3064598182)
        ("unwound", False),  # unwound without asking to suspend: a cancelled run
        ("done", False),
        ("other-pid", False),
    ],
)
def test_read_runs_accepts_a_version_twice_only_for_an_in_place_rerun(tmp_path, second, accepted):
    pid = 7 if second != "other-pid" else 8
    first = ["start d-1 1 7 1.0"]
    if second in ("unwound-after-await", "other-pid"):
        first += ["await d-1 1 7 1.1", "unwound d-1 1 7 1.2"]
    else:
        first += [f"{second} d-1 1 7 1.2"]
    log = tmp_path / "durable.log"
    log.write_text("\n".join([*first, f"start d-1 1 {pid} 1.5", f"done d-1 1 {pid} 1.6"]) + "\n")
    if not accepted:
        with pytest.raises(AssertionError, match="d-1 v1 ran twice"):
            read_runs(log, durable=True)
        return
    runs = read_runs(log, durable=True)["d-1"]
    assert [(run.version, run.how, run.rerun) for run in runs] == [
        (1, "unwound", False),
        (1, "done", True),
    ]


def test_random_kill(tmp_path, request):
    rounds = _env_int("TRIOEXEC_KILL_ROUNDS", DEFAULT_ROUNDS)
    stats = run_campaign(tmp_path, _seed(), rounds, request.node.nodeid)
    if rounds >= 3:  # the kills hit what they are meant to hit
        assert stats["executor runs cut by a kill"] > 0, stats
        assert stats["durable suspensions"] > 0, stats


@pytest.mark.slow
def test_random_kill_soak(tmp_path, request):
    """Whole campaigns, one after another (seeds seed, seed + 1, ...), until
    ``TRIOEXEC_SOAK_MINUTES`` would be exceeded by one more."""
    budget = float(os.environ.get("TRIOEXEC_SOAK_MINUTES", "") or SOAK_MINUTES) * 60
    rounds = _env_int("TRIOEXEC_KILL_ROUNDS", SOAK_ROUNDS)
    seed = _seed()
    start = time.monotonic()
    longest = 0.0
    total: collections.Counter[str] = collections.Counter()
    for k in itertools.count():
        began = time.monotonic()
        total += run_campaign(tmp_path / f"campaign-{k}", seed + k, rounds, request.node.nodeid)
        total["campaigns"] += 1
        longest = max(longest, time.monotonic() - began)
        if time.monotonic() - start + longest > budget:
            break
    print(f"random-kill soak from seed {seed}: {dict(total)}")
    assert total["executor runs cut by a kill"] > 0, total
    assert total["durable suspensions"] > 0, total
