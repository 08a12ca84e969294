"""How-to: one key's limit across worker processes.

Two worker processes share one SQLite file. Each runs 8 calls to the same API
host with ``KeyLimit(concurrency=2)``: between them, never more than 2 calls at
once. (On PostgreSQL, give every host the same URL instead of the file.) Each
call appends ``start``/``end`` and the time to a log; this script starts the
workers, then reads the log and prints the most calls that ran at once.

Run it with ``python examples/howto_shared_key_limits.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

import trioexec
from trioexec import KeyLimit

KEY = "api.example"
LIMITS = {KEY: KeyLimit(concurrency=2)}  # the same in every process


async def worker(db: str, log: str) -> None:
    def note(event: str) -> None:
        with open(log, "a") as f:  # (one short write per line: appends stay whole)
            f.write(f"{event} {time.monotonic()}\n")

    async def call_api(i: int) -> None:
        note("start")
        await trio.sleep(0.05)  # the call
        note("end")

    with trioexec.open_store(db) as store:
        async with trioexec.open_executor(store=store, key_limits=LIMITS) as ex:
            for i in range(8):
                await ex.submit(call_api, i, key=KEY)
    print(f"worker {os.getpid()}: done")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db, log = str(Path(tmp, "runs.db")), str(Path(tmp, "calls.log"))
        trioexec.SQLiteStore(db).close()  # (created once, before the workers race)
        workers = [
            subprocess.Popen([sys.executable, __file__, "worker", db, log]) for _ in range(2)
        ]
        for process in workers:
            if process.wait() != 0:
                sys.exit(f"a worker failed with {process.returncode}")
        running = most = 0
        lines = sorted(line.split() for line in Path(log).read_text().splitlines())
        for event, _ in sorted(lines, key=lambda e: (float(e[1]), e[0] == "start")):
            running += 1 if event == "start" else -1
            most = max(most, running)
        print(f"{len(lines) // 2} calls from 2 processes, at most {most} at once")
        assert most <= 2


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        trio.run(worker, sys.argv[2], sys.argv[3])
    else:
        main()
