"""Key limits across processes (issue 17, deliver 3): real worker processes on
one SQLite file or one PostgreSQL database (every test runs on both) keep a key's
concurrency and rate between them, and a worker killed with SIGKILL gives its key
slot back within one lease.

The subprocess side is ``key_worker.py`` next to this file. Nothing here sleeps to
wait for a state: the workers announce theirs on stdout, and the in-process
executor polls inside a ``trio.fail_after``.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import trio
from lineproc import LineProcess

from trioexec import KeyLimit, open_executor, open_store

HERE = Path(__file__).resolve().parent
WORKER = HERE / "key_worker.py"
KEY = "api.example.com/v1 [o'brien] 🚀"  # (kept as given, through argv and the store)


@pytest.fixture
def spawn(tmp_path):
    workers: list[LineProcess] = []

    def start(*args: object) -> LineProcess:
        worker = LineProcess(
            WORKER,
            [str(a) for a in args],
            tmp_path / f"worker-{len(workers)}.stderr",
            stdin=subprocess.PIPE,
        )
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.cleanup()


def _go(workers: list[LineProcess]) -> None:
    for worker in workers:
        assert worker.proc.stdin is not None
        worker.proc.stdin.write(b"go\n")
        worker.proc.stdin.flush()


def _events(log: Path) -> list[tuple[float, str, int]]:
    """(time, event, pid) for every line, in time order (an end before a start at
    the same instant)."""
    events = []
    for line in log.read_text().splitlines():
        event, _, pid, at = line.split()
        events.append((float(at), event, int(pid)))
    return sorted(events, key=lambda e: (e[0], e[1] == "start"))


def _run_two(spawn, db: str, log: Path, n: int, conc: int, rate: float, seconds: float):
    workers = [spawn("run", db, log, KEY, n, conc, rate, 5.0, seconds) for _ in range(2)]
    for worker in workers:
        worker.expect("READY")
    _go(workers)
    for worker in workers:
        assert worker.expect("DONE", timeout=120)[1] == str(n)
        assert worker.proc.wait(timeout=30) == 0
    return _events(log)


def test_two_processes_keep_one_key_concurrency(tmp_path, spawn, db_target):
    events = _run_two(spawn, db_target, tmp_path / "log", n=12, conc=2, rate=0, seconds=0.1)
    assert sum(e[1] == "end" for e in events) == 24
    now = most = 0
    for _, event, _ in events:
        now += 1 if event == "start" else -1
        most = max(most, now)
    assert most == 2
    assert len({pid for _, _, pid in events}) == 2


def test_two_processes_keep_one_key_rate(tmp_path, spawn, db_target):
    rate, per = 5.0, 1.0
    events = _run_two(spawn, db_target, tmp_path / "log", n=10, conc=0, rate=rate, seconds=0)
    starts = [at for at, event, _ in events if event == "start"]
    assert len(starts) == 20
    # A token is taken a moment before its task logs its start: allow that moment.
    slack = 0.25
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            window = starts[j] - first
            assert j - i + 1 <= rate + rate * (window + slack) / per, (i, j, window)


LEASE = 2.0


async def _wait_for_the_key(db: str, killed: list[float], kill) -> tuple[float, float]:
    """Run a task of KEY here while the other process holds it; kill that process
    once this task is seen waiting for the key. Returns (kill time, start time)."""
    started: list[float] = []

    async def mine() -> None:
        started.append(time.monotonic())

    with open_store(db) as store:
        async with open_executor(
            store=store, key_limits={KEY: KeyLimit(concurrency=1)}, lease=LEASE
        ) as ex:
            ref = await ex.submit(mine, key=KEY)
            with trio.fail_after(60):
                while ref.waiting_on != f"key concurrency {KEY}" or ex._core.keyshare.rounds < 2:
                    await trio.sleep(0.05)
            assert not started  # the other process holds the key
            kill()
            killed.append(time.monotonic())
            with trio.fail_after(60):
                await ref.wait()
    return killed[0], started[0]


def test_a_killed_process_gives_its_key_slot_back_within_a_lease(spawn, db_target):
    holder = spawn("hold", db_target, KEY, 1, LEASE)
    holder.expect("READY")
    holder.expect("HOLDING")

    def kill() -> None:
        holder.proc.kill()  # SIGKILL: no clean exit, no lease released
        assert holder.proc.wait(timeout=10) == -9

    killed_at, started_at = trio.run(_wait_for_the_key, db_target, [], kill)
    assert started_at > killed_at
    # Its lease (renewed every LEASE / 3) lapses at most LEASE after the kill; this
    # executor asks again at least every second.
    assert started_at - killed_at <= LEASE + 1.0 + 1.0  # (+1 s for a loaded machine)
