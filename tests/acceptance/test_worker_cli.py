"""``trioexec worker`` (issue 18, item 6): a real ``python -m trioexec worker``
subprocess on a database (a SQLite file; also PostgreSQL for the drain), with
durable tasks created from this process, stopped by signals sent with `os.kill`.

The handlers (``worker_handlers.py``, imported by the worker from its current
directory, this one) log each run's start and end (one ``O_APPEND`` line each) and
hold their slot until a ``go`` file exists, so the test decides when work ends:
the signal always comes while runs are under way. Afterwards every task is either
fulfilled, with exactly one logged end, or pending again for another worker, with
none; and a second worker then finishes the rest, so nothing was lost.

The worker's stderr is merged into its stdout here, so `LineProcess.expect` sees
its lines (``trioexec worker: ...``) and the handlers' (``STARTED``, ``ENDED``).
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from lineproc import LineProcess

from trioexec.durable import DurableStore, PromiseState, TaskState

HERE = Path(__file__).resolve().parent
TARGET = "cli-work"
HANDLERS = "worker_handlers:HANDLERS"
SLOTS = 2
DEADLINE = 60.0  # bounds every wait; the tests take far less
WORKER = [sys.executable, "-m", "trioexec", "worker"]


class WorkerCLI(LineProcess):
    """``python -m trioexec worker DB --target ... --handlers ... ARGS`` in this
    directory, its stderr merged into the stdout `expect` reads (`LineProcess` runs
    a script with stderr to a file; the file stays, empty, for `fail`'s message)."""

    def __init__(self, db: str, args: list[str], stderr_path: Path) -> None:
        self.stderr_path = stderr_path
        self.timeout = DEADLINE
        self._stderr = stderr_path.open("wb")
        self.proc = subprocess.Popen(
            [*WORKER, db, "--target", TARGET, *args],
            cwd=HERE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self._buffer = b""
        self.lines: list[str] = []

    def said(self, text: str) -> str:
        """Wait for the worker's next line containing ``text``; return it."""
        while True:
            line = " ".join(self.expect("trioexec"))
            if text in line:
                return line

    def started(self, n: int) -> list[str]:
        return [self.expect("STARTED")[1] for _ in range(n)]

    def ended(self, n: int) -> list[str]:
        return [self.expect("ENDED")[1] for _ in range(n)]

    def exit_code(self) -> int:
        try:
            return self.proc.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            self.fail(f"still running {DEADLINE}s after it was asked to stop")
            raise


@pytest.fixture
def spawn(tmp_path):
    procs: list[WorkerCLI] = []

    def start(db: str, *args: str) -> WorkerCLI:
        proc = WorkerCLI(db, ["--handlers", HANDLERS, *args], tmp_path / f"w{len(procs)}.err")
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.cleanup()


def job_id(n: int) -> str:
    return f"job-{n:02d}"


def enqueue(db: str, n: int, log: Path, go: Path) -> None:
    """``n`` durable tasks for TARGET, alternately for the async and the sync handler."""

    async def create() -> None:
        with DurableStore(db) as ds:
            for i in range(n):
                param = {"n": i, "log": str(log), "go": str(go)}
                handler = "hold" if i % 2 == 0 else "hold_sync"
                await ds.promises.create(
                    job_id(i), 3600, target=TARGET, data={"handler": handler, "param": param}
                )

    trio.run(create)


def store_state(db: str) -> dict[str, tuple[TaskState, PromiseState, object]]:
    """Each task's state, its promise's state and value."""

    async def read() -> dict[str, tuple[TaskState, PromiseState, object]]:
        with DurableStore(db) as ds:
            tasks, _ = await ds.tasks.search(target=TARGET, limit=1000)
            out = {}
            for t in tasks:
                p = await ds.promises.get(t.id)
                assert p is not None
                out[t.id] = (t.state, p.state, p.data)
            return out

    return trio.run(read)


def runs(log: Path) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """How many runs of each task started, and how many ended (completed)."""
    lines = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    starts = collections.Counter(f[1] for f in lines if f[0] == "start")
    ends = collections.Counter(f[1] for f in lines if f[0] == "end")
    return starts, ends


def assert_done_once_or_pending(db: str, log: Path, n: int) -> set[str]:
    """Every task is fulfilled (its promise resolved with its value, one logged end)
    or pending (no logged end); none is held. Returns the fulfilled ones."""
    state = store_state(db)
    assert sorted(state) == [job_id(i) for i in range(n)]
    _, ends = runs(log)
    done = set()
    for i in range(n):
        id = job_id(i)
        task, promise, data = state[id]
        if task is TaskState.FULFILLED:
            assert (promise, data) == (PromiseState.RESOLVED, f'{{"n": {i}}}'), id
            assert ends[id] == 1, (id, ends[id])
            done.add(id)
        else:
            assert (task, promise, ends[id]) == (TaskState.PENDING, PromiseState.PENDING, 0), id
    return done


def finish_the_rest(spawn, db: str, log: Path, go: Path, n: int, left: int) -> None:
    """Another worker runs the ``left`` pending tasks; then every task is done once."""
    go.touch()
    worker = spawn(db, "--concurrency", str(SLOTS))
    worker.ended(left)
    os.kill(worker.pid, signal.SIGTERM)
    assert "drained" in worker.said("stopped")
    assert worker.exit_code() == 0
    assert assert_done_once_or_pending(db, log, n) == {job_id(i) for i in range(n)}
    _, ends = runs(log)
    assert set(ends.values()) == {1}


def test_sigterm_drains_the_running_tasks_and_gives_the_rest_back(spawn, tmp_path, db_target):
    db, log, go = db_target, tmp_path / "runs.log", tmp_path / "go"
    n = 12
    enqueue(db, n, log, go)
    worker = spawn(db, "--concurrency", str(SLOTS), "--lease", "10")
    banner = worker.said("serving")
    assert f"pid {worker.pid} serving target {TARGET!r}" in banner
    assert f"{HANDLERS} (hold, hold_sync); {SLOTS} slots, lease 10s, grace no limit" in banner
    running = worker.started(SLOTS)  # both slots taken; more are claimed ahead

    os.kill(worker.pid, signal.SIGTERM)
    assert f"SIGTERM: draining ({SLOTS} running" in worker.said("draining")
    go.touch()  # only now can the running ones end: the drain waits for them
    assert sorted(worker.ended(SLOTS)) == sorted(running)
    last = worker.said("stopped")
    assert f"stopped (SIGTERM, drained): {SLOTS} completed, 0 failed, 0 running" in last
    assert worker.exit_code() == 0

    assert assert_done_once_or_pending(db, log, n) == set(running)
    starts, _ = runs(log)
    assert starts == collections.Counter(running)  # nothing started after the signal
    go.unlink()
    finish_the_rest(spawn, db, log, go, n, n - SLOTS)


def test_a_second_signal_cancels_the_running_tasks_and_gives_them_back(spawn, tmp_path):
    db, log, go = str(tmp_path / "app.db"), tmp_path / "runs.log", tmp_path / "go"
    n = 6
    enqueue(db, n, log, go)
    worker = spawn(db, "--concurrency", str(SLOTS))
    running = worker.started(SLOTS)  # one async, one sync (threaded) handler

    os.kill(worker.pid, signal.SIGTERM)
    worker.said("draining")
    os.kill(worker.pid, signal.SIGINT)  # the go file never comes: they would run on
    assert f"SIGINT: cancelling {SLOTS} running" in worker.said("cancelling")
    last = worker.said("stopped")
    assert (
        f"stopped (SIGTERM, cancelled): 0 completed, 0 failed, {SLOTS} cancelled, 0 running" in last
    )
    assert worker.exit_code() == 0

    assert assert_done_once_or_pending(db, log, n) == set()  # all pending again
    starts, ends = runs(log)
    assert (starts, ends) == (collections.Counter(running), collections.Counter())
    finish_the_rest(spawn, db, log, go, n, n)


def test_the_grace_bounds_the_drain(spawn, tmp_path):
    db, log, go = str(tmp_path / "app.db"), tmp_path / "runs.log", tmp_path / "go"
    enqueue(db, 4, log, go)
    worker = spawn(db, "--concurrency", str(SLOTS), "--grace", "0.5")
    worker.started(SLOTS)
    os.kill(worker.pid, signal.SIGTERM)
    assert "grace of 0.5s ran out with 2 running" in worker.said("ran out")
    last = worker.said("stopped")
    assert "stopped (SIGTERM, cancelled): 0 completed, 0 failed, 2 cancelled, 0 running" in last
    assert worker.exit_code() == 0
    assert assert_done_once_or_pending(db, log, 4) == set()


@pytest.mark.parametrize(
    ("handlers", "message"),
    [
        ("no_such_module_here:HANDLERS", "no module named 'no_such_module_here'"),
        ("worker_handlers:MISSING", "module 'worker_handlers' has no attribute 'MISSING'"),
        ("worker_handlers:NOT_HANDLERS", "worker_handlers:NOT_HANDLERS is a int, not a mapping"),
        ("worker_handlers", "'worker_handlers' is not module:NAME"),
    ],
)
def test_bad_handlers_are_a_usage_error_naming_them(tmp_path, handlers, message):
    db = tmp_path / "app.db"
    done = subprocess.run(
        [*WORKER, str(db), "--target", TARGET, "--handlers", handlers],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("trioexec: Invalid value for '--handlers': "), done.stderr
    assert message in done.stderr
    assert len(done.stderr.splitlines()) == 1  # one line, no traceback
    assert not db.exists()  # refused before the database is opened


def test_a_missing_database_file_is_refused(tmp_path):
    done = subprocess.run(
        [*WORKER, "missing.db", "--target", TARGET, "--handlers", HANDLERS],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert (done.returncode, done.stderr) == (1, "trioexec: missing.db: no such database file\n")
