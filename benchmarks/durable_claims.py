"""Claim throughput of `trioexec.durable.open_worker` on one SQLite file.

    python benchmarks/durable_claims.py [N] [WORKERS ...]

Defaults: N=2000 tasks, WORKERS = 1 4. For each worker count, a fresh database
gets N promises (``target="work"``), then that many worker processes (this file,
run as ``--worker``) open ``open_worker(ds, "work", noop, lease=5.0)`` (default
``max_concurrent_tasks=4`` and ``poll_interval``) at one signal. Throughput is N
over the time from that signal to the last successful fulfil in any worker
(``time.monotonic()``, one clock for every process): acquire+fulfill cycles per
second, the search/get/heartbeat calls of the worker included. Workers claim in
batches and `DurableStore` writes the operations queued meanwhile (fulfils,
claims, heartbeats) in one transaction, so no claim races another; ``conflicts``
counts the fulfils that lost one all the same (`Conflict`: the lease was lost,
`Worker.lost`).

Prints one JSON line per case, then a table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import trio

from trioexec.durable import DurableStore, open_worker

N = 2000
LEASE = 5.0


# ------------------------------------------------------------------ worker process


async def _lines(stream: trio.lowlevel.FdStream):
    buffer = b""
    while chunk := await stream.receive_some():
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield line.decode()


async def worker(db: str) -> None:
    """READY, then wait for GO on stdin, then work until stdin closes; DONE <json>."""
    stats: dict[str, Any] = {"first": None, "last": None}
    with DurableStore(db) as ds:
        fulfill = ds.tasks.fulfill

        async def timed_fulfill(*args: Any, **kwargs: Any) -> Any:
            record = await fulfill(*args, **kwargs)
            stats["last"] = time.monotonic()
            stats["first"] = stats["first"] or stats["last"]
            return record

        ds.tasks.fulfill = timed_fulfill  # type: ignore[method-assign]

        async def noop(param: Any) -> None:
            pass

        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        async with stdin:
            lines = _lines(stdin)
            print("READY", flush=True)
            assert await anext(lines) == "GO"
            async with open_worker(ds, "work", noop, lease=LEASE) as w:
                async for _ in lines:
                    pass  # until end of file
        stats.update(claimed=w.claimed, fulfilled=w.fulfilled, conflicts=w.lost)
    print("DONE " + json.dumps(stats), flush=True)


# ------------------------------------------------------------------ driver


async def _create(db: str, n: int) -> None:
    with DurableStore(db) as ds:
        for i in range(n):
            await ds.promises.create(f"t{i:06d}", 3600, target="work", data={"i": i})


async def _wait_done(db: str, deadline: float) -> None:
    with DurableStore(db) as ds, trio.fail_after(deadline):
        # Waiting on other processes' progress: nothing in this one to wait on.
        while (await ds.promises.search(state="pending", limit=1))[0]:  # noqa: ASYNC110
            await trio.sleep(0.05)


def _read(proc: subprocess.Popen[str], word: str) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(word):
            return line[len(word) :].strip()
    raise RuntimeError(f"worker {proc.pid} exited ({proc.wait()}) before {word!r}")


def measure(n: int, workers: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "claims.db")
        t = time.perf_counter()
        trio.run(_create, db, n)
        create_s = time.perf_counter() - t
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", db],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(workers)
        ]
        try:
            for p in procs:
                _read(p, "READY")
            start = time.monotonic()
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("GO\n")
                p.stdin.flush()
            trio.run(_wait_done, db, 300.0)
            for p in procs:
                assert p.stdin is not None
                p.stdin.close()
            done = [json.loads(_read(p, "DONE")) for p in procs]
            for p in procs:
                if p.wait(timeout=30) != 0:
                    raise RuntimeError(f"worker {p.pid} exited with {p.returncode}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    fulfilled = sum(d["fulfilled"] for d in done)
    assert fulfilled == n, done
    seconds = max(d["last"] for d in done) - start
    return {
        "bench": "durable_claims",
        "workers": workers,
        "tasks": n,
        "seconds": round(seconds, 3),
        "claims_per_s": round(n / seconds, 1),
        "conflicts": sum(d["conflicts"] for d in done),
        "claimed_per_worker": [d["claimed"] for d in done],
        "create_promises_per_s": round(n / create_s, 1),
        "cpus": os.cpu_count(),
    }


def main(argv: list[str]) -> None:
    if argv[:1] == ["--worker"]:
        trio.run(worker, argv[1])
        return
    n = int(argv[0]) if argv else N
    counts = [int(a) for a in argv[1:]] or [1, 4]
    results = []
    for workers in counts:
        result = measure(n, workers)
        print(json.dumps(result), flush=True)
        results.append(result)
    print(f"\n{'workers':>7} {'tasks':>6} {'seconds':>8} {'claims/s':>9} {'conflicts':>9}")
    for r in results:
        print(
            f"{r['workers']:>7} {r['tasks']:>6} {r['seconds']:>8.2f} "
            f"{r['claims_per_s']:>9.1f} {r['conflicts']:>9}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
