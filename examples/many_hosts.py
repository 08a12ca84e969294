"""Two hosts, one PostgreSQL database: when one host dies, another finishes its work.

"Host A" (a subprocess of this script) takes six image jobs; each waits, deferred
and holding no slot, for its upload to land in a folder. A is then killed with
SIGKILL, as a crashed machine would be: it releases nothing. "Host B" (this
process) opens an executor on the same database with ``recover=True``: once A's
lease has lapsed (``lease=1.0`` s here; 30 s by default), B claims A's six live
executions, re-creates them from their registered task and JSON arguments, and
runs them to completion. The uploads have landed meanwhile, so they finish at once.

    python examples/many_hosts.py postgresql://user@host/dbname

(or set ``TRIOEXEC_POSTGRES_URL``; ``nox -s examples`` starts a throwaway server).
The tables go into a schema of their own, dropped at the end. About 2 seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import trio

import trioexec
from trioexec import SubStatus, TaskHandle, TaskStatus

LEASE = 1.0


@trioexec.task(id="resize")
async def resize(image: str, folder: str, handle: TaskHandle) -> str:
    upload = Path(folder) / image
    await handle.defer_until(upload.exists, poll_interval=0.05)  # no slot held meanwhile
    return f"{image}: {upload.stat().st_size} bytes resized"


async def host_a(url: str, schema: str, folder: str) -> None:
    """Take six jobs, let them defer, say so, then wait to be killed."""
    with trioexec.PostgresStore(url, schema=schema) as store:
        async with trioexec.open_executor(
            store=store, recover=True, tasks=[resize], lease=LEASE, max_concurrent_tasks=2
        ) as ex:
            for n in range(6):
                await ex.submit(resize, f"img-{n}.png", folder, task_id=f"resize-img-{n}")
            while ex.statistics().deferred_count < 6:  # noqa: ASYNC110 (a statistic)
                await trio.sleep(0.01)
            await ex.flush()  # every deferral is in the database
            print(ex.owner, flush=True)
            await trio.sleep_forever()


async def host_b(url: str, schema: str, dead_owner: str) -> None:
    with trioexec.PostgresStore(url, schema=schema) as store:
        rows = store.executions(sub_status=SubStatus.DEFERRED)
        print(f"host A ({dead_owner}) died with {len(rows)} deferred executions:")
        for row in rows:
            print(f"  {row.task_id}  {row.status.value}/{row.sub_status}  owner {row.owner}")
        assert {r.owner for r in rows} == {dead_owner}
        assert len(rows) == 6

        start = trio.current_time()
        async with trioexec.open_executor(
            store=store, recover=True, tasks=[resize], lease=LEASE
        ) as ex:
            while store.counts()[TaskStatus.COMPLETED] < 6:  # noqa: ASYNC110 (the database)
                await trio.sleep(0.05)
        took = trio.current_time() - start
        print(f"host B ({ex.owner}) recovered and finished them in {took:.1f} s:")
        for row in store.executions():
            print(f"  {row.task_id}  {row.status.value}  owner {row.owner}"
                  f"  recovery_attempts {row.recovery_attempts}")  # fmt: skip
            assert row.status is TaskStatus.COMPLETED
            assert row.owner == ex.owner
            assert row.recovery_attempts == 1


def main(url: str) -> None:
    schema = f"example_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as folder:
        a = subprocess.Popen(
            [sys.executable, __file__, "--host-a", url, schema, folder],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert a.stdout is not None
            dead_owner = a.stdout.readline().strip()
            assert dead_owner, "host A did not start"
            a.send_signal(signal.SIGKILL)
            a.wait()
            for n in range(6):  # the uploads land while nobody watches
                (Path(folder) / f"img-{n}.png").write_bytes(b"x" * (1000 + n))
            trio.run(host_b, url, schema, dead_owner)
        finally:
            if a.poll() is None:
                a.kill()
                a.wait()
            if a.stdout is not None:
                a.stdout.close()
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--host-a"]:
        trio.run(host_a, *sys.argv[2:5])
    else:
        target = (sys.argv[1:] or [os.environ.get("TRIOEXEC_POSTGRES_URL", "")])[0]
        if not target:
            sys.exit(f"usage: {sys.argv[0]} postgresql://user@host/dbname")
        main(target)
