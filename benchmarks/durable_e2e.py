"""Durable tasks end to end (create -> claim -> fulfil) on PostgreSQL, trioexec
beside procrastinate, on the same server and machine (issue 16).

    python benchmarks/durable_e2e.py SERVER_URL [N] [--workers 1,4] [--systems S,...]

For each system and worker count, a fresh database on the server at SERVER_URL,
then that many worker processes (this file, run as ``--worker``), each running
four tasks at once: trioexec's ``open_worker(ds, "work", noop)`` on a
``DurableStore(URL)``; procrastinate's ``run_worker_async(concurrency=4)`` on its
``PsycopgConnector``. Once every worker is ready, this process creates N tasks as
fast as the system lets a producer: trioexec, 64 concurrent
``ds.promises.create(..., target="work")`` calls (its group commit writes them
together); procrastinate, ``batch_defer_async`` of 500 jobs at a time. The rate
is N over the time from the first create to the last completed task in any
worker (``time.monotonic``: one clock for every process on Linux).

``--workers 0`` measures the producer alone (N creates, no worker: the rate no
number of workers can pass on this machine). Each case also says how many of
the machine's CPUs were busy from the first create to the last completed task
(``busy_cpus``, from ``/proc/stat``, every process counted: the server's too),
which tells a machine-bound rate from a slow one.

Prints one JSON line per case, then a table. ``--systems`` is a comma-separated
list of ``trioexec`` and ``procrastinate``. Needs the ``bench`` and
``postgres`` extras.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import psycopg
import trio

N = 5000
CONCURRENCY = 4  # tasks at once in each worker, both systems
CREATORS = 64


# ------------------------------------------------------------------ trioexec


async def trioexec_worker(url: str) -> dict[str, Any]:
    from trioexec.durable import DurableStore, open_worker

    stats: dict[str, Any] = {"done": 0, "last": None}

    async def noop(param: Any) -> None:
        stats["done"] += 1
        stats["last"] = time.monotonic()

    with DurableStore(url) as ds:
        async with open_worker(ds, "work", noop, max_concurrent_tasks=CONCURRENCY) as w:
            await _until_stdin_closes()
        stats["conflicts"] = w.lost
    return stats


async def trioexec_create(url: str, n: int) -> None:
    from trioexec.durable import DurableStore

    with DurableStore(url) as ds:
        ids = iter(range(n))

        async def creator() -> None:
            for i in ids:
                await ds.promises.create(f"t{i:07d}", 3600, target="work")

        async with trio.open_nursery() as nursery:
            for _ in range(CREATORS):
                nursery.start_soon(creator)


def trioexec_prepare(url: str) -> None:
    from trioexec import PostgresStore

    PostgresStore(url).close()  # the schema, before the workers race to create it


async def _until_stdin_closes() -> None:
    stream = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    async with stream:
        while await stream.receive_some():
            pass


# ------------------------------------------------------------------ procrastinate


def _procrastinate_app(url: str, stats: dict[str, Any] | None = None) -> Any:
    import logging

    import procrastinate

    # (it warns that an App made in __main__ cannot be found by its CLI: not used here)
    logging.getLogger("procrastinate").setLevel(logging.ERROR)

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop", queue="work")
    async def noop() -> None:
        if stats is not None:
            stats["done"] += 1
            stats["last"] = time.monotonic()

    return app


def procrastinate_worker(url: str) -> dict[str, Any]:
    stats: dict[str, Any] = {"done": 0, "last": None, "conflicts": 0}

    async def main() -> None:
        app = _procrastinate_app(url, stats)
        async with app.open_async():
            worker = asyncio.ensure_future(
                app.run_worker_async(
                    queues=["work"],
                    concurrency=CONCURRENCY,
                    wait=True,
                    install_signal_handlers=False,
                    delete_jobs="never",
                )
            )
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, sys.stdin.read)  # until stdin closes
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    asyncio.run(main())
    return stats


def procrastinate_create(url: str, n: int) -> None:
    async def main() -> None:
        app = _procrastinate_app(url)
        async with app.open_async():
            task = app.tasks["noop"]
            for start in range(0, n, 500):
                await task.batch_defer_async(*({} for _ in range(start, min(n, start + 500))))

    asyncio.run(main())


def procrastinate_prepare(url: str) -> None:
    app = _procrastinate_app(url)
    with app.open():
        app.schema_manager.apply_schema()


SYSTEMS = {
    "trioexec": (trioexec_prepare, lambda url, n: trio.run(trioexec_create, url, n)),
    "procrastinate": (procrastinate_prepare, procrastinate_create),
}


def worker_main(system: str, url: str) -> None:
    print("READY", flush=True)
    stats = trio.run(trioexec_worker, url) if system == "trioexec" else procrastinate_worker(url)
    print("DONE " + json.dumps(stats), flush=True)


# ------------------------------------------------------------------ driver


def _read(proc: subprocess.Popen[str], word: str) -> str:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(word):
            return line[len(word) :].strip()
    raise RuntimeError(f"worker {proc.pid} exited ({proc.wait()}) before {word!r}")


def _completed(system: str, url: str) -> int:
    sql = (
        "SELECT count(*) FROM trioexec.durable_tasks WHERE state = 'fulfilled'"
        if system == "trioexec"
        else "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
    )
    with psycopg.connect(url) as conn:
        row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) clock ticks of every CPU so far, from ``/proc/stat``; None
    where there is none (not Linux)."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(t) for t in stat.readline().split()[1:]]
    except OSError:
        return None
    idle = ticks[3] + ticks[4]  # idle, iowait
    return sum(ticks) - idle, sum(ticks)


def measure(server: str, system: str, n: int, workers: int) -> dict[str, Any]:
    name = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = server.rsplit("/", 1)[0] + "/" + name
    prepare, create = SYSTEMS[system]
    procs: list[subprocess.Popen[str]] = []
    try:
        prepare(url)
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", system, url],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(workers)
        ]
        for p in procs:
            _read(p, "READY")
        time.sleep(0.5)  # (the workers open their connections and start waiting)
        start, ticks = time.monotonic(), _cpu_ticks()
        create(url, n)
        created = time.monotonic() - start
        deadline = time.monotonic() + 600
        # (other processes' progress: poll the database)
        while workers and _completed(system, url) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system}: not all {n} tasks completed in 600 s")
            time.sleep(0.05)
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
        ticks_after = _cpu_ticks()
        done = [json.loads(_read(p, "DONE")) for p in procs]
        for p in procs:
            if p.wait(timeout=60) != 0:
                raise RuntimeError(f"worker {p.pid} exited with {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    total = sum(d["done"] for d in done)
    if workers and total != n:
        raise RuntimeError(f"{system}: {total} of {n} tasks ran ({done})")
    seconds = max(d["last"] for d in done if d["last"] is not None) - start if done else created
    busy = None
    if ticks is not None and ticks_after is not None and ticks_after[1] > ticks[1]:
        share = (ticks_after[0] - ticks[0]) / (ticks_after[1] - ticks[1])
        busy = round(share * (os.cpu_count() or 1), 2)
    return {
        "bench": "durable_e2e",
        "system": system,
        "workers": workers,
        "tasks": n,
        "seconds": round(seconds, 3),
        "tasks_per_s": round(n / seconds, 1),
        "create_s": round(created, 3),
        "per_worker": [d["done"] for d in done],
        "conflicts": sum(d["conflicts"] for d in done),
        "cpus": os.cpu_count(),
        "busy_cpus": busy,
    }


def main(argv: list[str]) -> None:
    if argv[:1] == ["--worker"]:
        worker_main(argv[1], argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("server", help="a PostgreSQL server's URL (a database is made per case)")
    parser.add_argument("n", type=int, nargs="?", default=N)
    parser.add_argument("--workers", default="1,4")
    parser.add_argument("--systems", default="trioexec,procrastinate")
    args = parser.parse_args(argv)
    results = []
    for system in args.systems.split(","):
        for workers in (int(w) for w in args.workers.split(",")):
            result = measure(args.server, system, args.n, workers)
            print(json.dumps(result), flush=True)
            results.append(result)
    print(
        f"\n{'system':>14} {'workers':>7} {'tasks':>6} {'seconds':>8} {'tasks/s':>9}"
        f" {'busy CPUs':>9}"
    )
    for r in results:
        print(
            f"{r['system']:>14} {r['workers']:>7} {r['tasks']:>6} {r['seconds']:>8.2f}"
            f" {r['tasks_per_s']:>9.1f} {r['busy_cpus'] or '?':>9}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
