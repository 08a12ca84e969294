"""PostgreSQL going away under a running executor or durable worker (issue 30,
items 5 and 10), on a server of this module's own (tests/pg_server.py): the
connection that LISTENs for commands cut with ``pg_terminate_backend``, the
server restarted with ``pg_ctl restart -m fast``, or stopped for longer than the
store waits for it.

A cut listener is listened again (polling meanwhile); a restart is ridden out,
the calls it cut run again on a new connection (one cut during its COMMIT only
if the server says it did not commit); a store failure ends the executor with
one `StoreError` and leaves its work as the store had it, for an executor that
recovers; a durable worker's outage is one `StoreError` naming the store, never
a group, never the password.
"""

from __future__ import annotations

import inspect
import itertools
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from pg_server import USER_ENV, NoServer, pg_ctl, postgres_server

import trioexec
from trioexec import PostgresStore, StoreError, TaskStatus
from trioexec.durable import DurableStore, open_worker

DEADLINE = 60.0  # bounds every wait (a hang fails the test); they take far less


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A server of this module's own: its tests restart and stop it."""
    if os.environ.get(USER_ENV):
        pytest.skip(f"{USER_ENV} names a server these tests may not restart")
    try:
        with postgres_server() as url:
            yield url
    except NoServer as exc:
        pytest.skip(f"no PostgreSQL server could be started: {exc}")


@pytest.fixture
def schema(server: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def sql(url: str, query: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def command_listeners(url: str) -> list[int]:
    """The server processes LISTENing for executors' commands."""
    rows = sql(url, "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN trioexec_commands'")
    return [pid for (pid,) in rows]


async def until(condition: Callable[[], bool]) -> None:
    """Until ``condition()`` holds (looked at again every 10 ms; bounded)."""
    with trio.fail_after(DEADLINE):
        while not condition():
            await trio.sleep(0.01)


def statuses(url: str, schema: str) -> dict[str, int]:
    return dict(sql(url, f"SELECT status, count(*) FROM {schema}.executions GROUP BY status"))


class Gate:
    """Tasks that hold their slot until `open` (counting those that started)."""

    def __init__(self) -> None:
        self.event = trio.Event()
        self.started = 0

    async def hold(self, i: int) -> int:
        self.started += 1
        await self.event.wait()
        return i


GATE = Gate()


@trioexec.task(id="held")
async def held(i: int) -> int:
    return await GATE.hold(i)


@pytest.fixture
def gate() -> Gate:
    global GATE
    GATE = Gate()
    return GATE


async def test_a_cut_listen_connection_is_polled_then_listened_again_and_ends_nothing(
    server: str, schema: str, gate: Gate
) -> None:
    """The connection that LISTENs for commands is ended by the server, and no
    new one can be opened for a while (the database refuses connections): the
    executor goes on, polling (a command sent meanwhile is followed), listens
    again once it can, and its 120 tasks (116 of them pending) all run; none is
    recorded CANCELLED but the one the command cancelled."""
    with (
        PostgresStore(server, schema=schema) as store,
        PostgresStore(server, schema=schema) as other,  # (its connection open already)
        # (from another database: one cannot refuse connections to its own)
        psycopg.connect(server.rsplit("/", 1)[0] + "/template1", autocommit=True) as admin,
    ):

        def listeners() -> list[int]:
            rows = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN trioexec_commands'"
            ).fetchall()
            return [pid for (pid,) in rows]

        async with trioexec.open_executor(store=store, max_concurrent_tasks=4, tasks=[held]) as ex:
            refs = [await ex.submit(held, i) for i in range(120)]
            await ex.flush()
            await until(lambda: len(listeners()) == 1)
            (first,) = listeners()
            admin.execute("ALTER DATABASE postgres ALLOW_CONNECTIONS false")
            try:
                ended = admin.execute("SELECT pg_terminate_backend(%s, 10000)", (first,))
                assert ended.fetchall() == [(True,)]
                other.command("cancel", task_id=refs[-1].task_id, who="operator")
                assert (await refs[-1].wait()).status is TaskStatus.CANCELLED  # polled
                assert listeners() == []
            finally:
                admin.execute("ALTER DATABASE postgres ALLOW_CONNECTIONS true")
            await until(lambda: len(listeners()) == 1)  # listening again
            gate.event.set()
            done = [await ref.wait() for ref in refs[:-1]]
        assert {c.status for c in done} == {TaskStatus.COMPLETED}
        assert [c.result for c in done] == list(range(119))
    assert statuses(server, schema) == {"completed": 119, "cancelled": 1}


async def test_a_store_failure_leaves_the_work_for_an_executor_that_recovers(
    server: str, schema: str, gate: Gate
) -> None:
    """The store fails under an executor (its commands table is gone when it is
    notified of a command): the block ends with one StoreError, every pending
    wait() raises it, and no task is recorded CANCELLED for it: the rows stay
    pending and running, and an executor with recover=True runs every one."""
    with PostgresStore(server, schema=schema) as store:
        refs = []
        with pytest.raises(StoreError, match=r"commands") as caught:
            async with trioexec.open_executor(
                store=store, max_concurrent_tasks=4, tasks=[held]
            ) as ex:
                refs = [await ex.submit(held, i) for i in range(120)]
                await ex.flush()
                await until(lambda: gate.started == 4)
                sql(server, f"ALTER TABLE {schema}.commands RENAME TO commands_gone")
                sql(server, "SELECT pg_notify('trioexec_commands', %s)", schema)
                await trio.sleep_forever()
        assert schema in str(caught.value)
        assert statuses(server, schema) == {"pending": 116, "running": 4}
        for ref in refs:
            with pytest.raises(StoreError):
                await ref.wait()

    sql(server, f"ALTER TABLE {schema}.commands_gone RENAME TO commands")
    gate.event.set()
    later = PostgresStore(server, schema=schema, clock=lambda: time.time() + 3600)
    with later:  # (an hour on: the failed executor's lease has lapsed)
        async with trioexec.open_executor(store=later, tasks=[held], recover=True) as ex:
            await ex.wait_for_idle()
    assert statuses(server, schema) == {"completed": 120}


async def test_an_executor_rides_out_a_restart(server: str, schema: str, gate: Gate) -> None:
    """``pg_ctl restart -m fast`` under a running executor (every connection it
    had is ended): tasks running across the restart complete and are recorded,
    tasks submitted after it run, and the block ends without an error."""
    with PostgresStore(server, schema=schema) as store:
        async with trioexec.open_executor(
            store=store, max_concurrent_tasks=4, tasks=[held], lease=300
        ) as ex:
            across = [await ex.submit(held, i) for i in range(4)]
            await ex.flush()
            await until(lambda: gate.started == 4 and len(command_listeners(server)) == 1)
            await trio.to_thread.run_sync(pg_ctl, server, "restart")
            gate.event.set()
            assert [(await ref.wait()).result for ref in across] == [0, 1, 2, 3]
            after = [await ex.submit(held, i) for i in range(4, 20)]
            assert [(await ref.wait()).result for ref in after] == list(range(4, 20))
            await until(lambda: len(command_listeners(server)) == 1)  # listening again
    assert statuses(server, schema) == {"completed": 20}


def test_every_call_of_a_postgres_store_is_run_again_after_a_restart() -> None:
    """Each operation of the Store protocol on a PostgresStore (but ``close``) is
    wrapped to run again when the server ends its connection (`_retried`): one
    added later must be too."""
    from trioexec._store._base import Store

    calls = [n for n, f in vars(Store).items() if inspect.isfunction(f) and n[0] != "_"]
    assert {"write", "heartbeat", "commands"} <= set(calls)
    bare = [
        n for n in calls if n != "close" and not hasattr(getattr(PostgresStore, n), "__wrapped__")
    ]
    assert bare == []


RUNS: Counter[int] = Counter()  # how many times each `counted` task ran


@trioexec.task(id="counted")
async def counted(i: int) -> int:
    RUNS[i] += 1
    await trio.lowlevel.checkpoint()
    return i


async def test_an_executor_rides_out_restarts_with_calls_in_flight(
    server: str, schema: str
) -> None:
    """``pg_ctl restart -m fast`` three times under an executor kept busy: its
    journal always writing (three submitters, each flushing every 4 submissions;
    eight slots finishing them), its command poller reading (commands recorded by
    another store, which also reads the executions meanwhile). The calls the
    restart cuts are run again on a new connection: the block ends without an
    error, every task submitted during and after each restart runs, and each ran
    once and is recorded completed once."""
    RUNS.clear()
    refs: dict[int, trioexec.TaskRef[int]] = {}  # by argument
    numbers = itertools.count()
    with (
        trio.fail_after(DEADLINE),
        PostgresStore(server, schema=schema) as store,
        PostgresStore(server, schema=schema) as other,
    ):
        async with trioexec.open_executor(
            store=store, max_concurrent_tasks=8, tasks=[counted], lease=300
        ) as ex:

            async def submit(n: int) -> None:
                for _ in range(n):
                    i = next(numbers)
                    refs[i] = await ex.submit(counted, i)
                await ex.flush()

            def command() -> None:
                other.command("resume", name="counted", who="test")
                other.counts()

            for _ in range(3):
                restarted = trio.Event()

                async def load(call: Callable[[], Any], restarted: trio.Event = restarted) -> None:
                    while not restarted.is_set():
                        await call()

                async with trio.open_nursery() as nursery:
                    for _ in range(3):
                        nursery.start_soon(load, lambda: submit(4))
                    nursery.start_soon(load, lambda: trio.to_thread.run_sync(command))
                    await trio.to_thread.run_sync(pg_ctl, server, "restart")
                    restarted.set()
                first = len(refs)
                await submit(40)
                after = [(await refs[i].wait()).result for i in range(first, len(refs))]
                assert after == list(range(first, len(refs)))
            done = [await refs[i].wait() for i in range(len(refs))]
    assert {c.status for c in done} == {TaskStatus.COMPLETED}
    assert [c.result for c in done] == list(range(len(refs)))
    assert set(RUNS.values()) == {1}  # each ran once
    assert sorted(RUNS) == list(range(len(refs)))
    assert statuses(server, schema) == {"completed": len(refs)}


#: The advisory lock the COMMIT of a command waits for in the tests below (a
#: deferred trigger takes it): a COMMIT the test holds under way on the server.
COMMIT_LOCK = 30_005


def hold_commits(server: str, schema: str, table: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection holding `COMMIT_LOCK`: until it releases it, the COMMIT of each
    transaction that inserted into ``table`` of ``schema`` waits on the server."""
    PostgresStore(server, schema=schema).close()  # (the schema, created)
    sql(
        server,
        f"CREATE FUNCTION {schema}.hold_commit() RETURNS trigger LANGUAGE plpgsql AS"
        f" $$ BEGIN PERFORM pg_advisory_xact_lock({COMMIT_LOCK}); RETURN NULL; END $$;"
        f" CREATE CONSTRAINT TRIGGER hold_commit AFTER INSERT ON {schema}.{table}"
        " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
        f" EXECUTE FUNCTION {schema}.hold_commit()",
    )
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute("SELECT pg_advisory_lock(%s)", (COMMIT_LOCK,))
        yield admin


@pytest.fixture
def held_commits(server: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """`hold_commits` of the commands table: each command's COMMIT waits."""
    yield from hold_commits(server, schema, "commands")


@pytest.fixture
def held_durable_commits(server: str, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """`hold_commits` of the durable promises: each creation's COMMIT waits."""
    yield from hold_commits(server, schema, "durable_promises")


async def commit_waiting(admin: psycopg.Connection[Any]) -> tuple[int, int]:
    """The server process whose COMMIT waits for `COMMIT_LOCK`, and the port its
    client connected from, once there is one (bounded)."""
    found: list[tuple[int, int]] = []

    def waiting() -> bool:
        found[:] = admin.execute(
            "SELECT pid, client_port FROM pg_stat_activity"
            " WHERE right(query, 6) = 'COMMIT' AND wait_event_type = 'Lock'"
        ).fetchall()
        return len(found) == 1

    await until(waiting)
    return found[0]


def cut(port: int) -> None:
    """Shut down this process's TCP connection from local ``port``: the network
    between it and the server fails (the server's end of it lives on)."""
    for name in os.listdir("/dev/fd"):
        try:
            fd = os.dup(int(name))
        except OSError:  # (closed since it was listed)
            continue
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # (not a socket)
            os.close(fd)
            continue
        with sock:
            if sock.family == socket.AF_INET and sock.getsockname()[1] == port:
                sock.shutdown(socket.SHUT_RDWR)
                return
    pytest.fail(f"no TCP connection of this process from port {port}")


async def test_a_commit_that_took_effect_on_a_lost_connection_is_not_run_again(
    server: str, schema: str, held_commits: psycopg.Connection[Any]
) -> None:
    """The connection is lost while a command's COMMIT is under way on the server,
    which goes on and commits it: the store asks the server (on a new connection)
    whether that transaction committed, and, as it did, the call returns the
    command, recorded once."""
    recorded: list[trioexec.Command] = []
    with PostgresStore(server, schema=schema) as store:

        def record() -> None:
            recorded.append(store.command("pause", name="n", who="test"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, record)
            _, port = await commit_waiting(held_commits)
            cut(port)
            held_commits.execute("SELECT pg_advisory_unlock(%s)", (COMMIT_LOCK,))
    assert [c.seq for c in recorded] == [
        seq for (seq,) in sql(server, f"SELECT seq FROM {schema}.commands")
    ]
    assert len(recorded) == 1


async def test_a_commit_the_server_ended_is_run_again(
    server: str, schema: str, held_commits: psycopg.Connection[Any]
) -> None:
    """The server ends the connection (``pg_terminate_backend``) while a command's
    COMMIT waits there: the transaction did not commit (the server says so, asked
    on a new connection), so the call runs again and the command is recorded
    once."""
    recorded: list[trioexec.Command] = []
    with PostgresStore(server, schema=schema) as store:

        def record() -> None:
            recorded.append(store.command("pause", name="n", who="test"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, record)
            pid, _ = await commit_waiting(held_commits)
            ended = held_commits.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
            assert ended.fetchall() == [(True,)]
            held_commits.execute("SELECT pg_advisory_unlock(%s)", (COMMIT_LOCK,))
    assert [c.seq for c in recorded] == [
        seq for (seq,) in sql(server, f"SELECT seq FROM {schema}.commands")
    ]
    assert len(recorded) == 1


@pytest.mark.parametrize("lost", ["cut", "ended"])
async def test_a_durable_commit_on_a_lost_connection_is_settled_by_asking_the_server(
    server: str, schema: str, held_durable_commits: psycopg.Connection[Any], lost: str
) -> None:
    """The durable tables' connection is lost while a promise's creation COMMITs
    (as in a server restart): cut from this side, the server goes on and commits,
    and the call returns; ended by the server, nothing committed, and the call
    runs again. Either way the promise is created once and its task once."""
    with PostgresStore(server, schema=schema) as store, DurableStore(store) as ds:
        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: ds.promises.create("p", 60, target="w", data=1))
                try:
                    pid, port = await commit_waiting(held_durable_commits)
                    if lost == "cut":
                        cut(port)
                    else:
                        ended = held_durable_commits.execute(
                            "SELECT pg_terminate_backend(%s, 10000)", (pid,)
                        )
                        assert ended.fetchall() == [(True,)]
                finally:  # (the creation's thread cannot be cancelled: it goes on)
                    held_durable_commits.execute("SELECT pg_advisory_unlock(%s)", (COMMIT_LOCK,))
        record = await ds.promises.get("p")
        assert record is not None
        assert record.id == "p"
    assert sql(server, f"SELECT id FROM {schema}.durable_promises") == [("p",)]
    assert len(sql(server, f"SELECT id FROM {schema}.durable_tasks")) == 1


async def test_an_executor_under_a_long_outage_raises_one_store_error_and_leaves_its_work(
    server: str, schema: str, gate: Gate
) -> None:
    """The server stops for longer than the store waits for it (the URL's
    connect_timeout) while the executor writes: the calls it cut are tried again
    only that long, then the block raises one StoreError naming the store (never
    the password), and the work is left as the store had it, for an executor that
    recovers."""
    url = with_password(server) + "?connect_timeout=2"
    try:
        with PostgresStore(url, schema=schema) as store:
            with trio.fail_after(DEADLINE), pytest.raises(StoreError) as caught:
                async with trioexec.open_executor(
                    store=store, max_concurrent_tasks=4, tasks=[held], lease=300
                ) as ex:
                    for i in range(20):
                        await ex.submit(held, i)
                    await ex.flush()
                    await until(lambda: gate.started == 4)
                    await trio.to_thread.run_sync(pg_ctl, server, "stop")
                    gate.event.set()  # (their completions cannot be written)
                    await trio.sleep_forever()
    finally:
        pg_ctl(server, "start")
    assert type(caught.value) is StoreError
    assert "t0psecret" not in "".join(traceback.format_exception(caught.value))
    assert f"postgres:***@{server.split('@')[1]}" in str(caught.value)
    assert f"(schema {schema})" in str(caught.value)
    assert statuses(server, schema) == {"pending": 16, "running": 4}

    later = PostgresStore(server, schema=schema, clock=lambda: time.time() + 3600)
    with later:  # (an hour on: the failed executor's lease has lapsed)
        async with trioexec.open_executor(store=later, tasks=[held], recover=True) as ex:
            await ex.wait_for_idle()
    assert statuses(server, schema) == {"completed": 20}


# ---------------------------------------------------------------- durable workers


async def test_one_failure_of_the_store_met_by_several_tasks_is_one_store_error() -> None:
    """The rule the worker's nurseries (and the executor's) apply: a group of
    nothing but StoreErrors (several loops met the store's failure at once) comes
    out as one of them, never as a group."""
    from trioexec._executor import one_level

    failures = [StoreError("db: the claim failed"), StoreError("db: the heartbeat failed")]

    async def fail(error: StoreError) -> None:
        raise error

    with pytest.raises(StoreError) as caught:
        async with one_level([]), trio.open_nursery() as nursery:
            for error in failures:
                nursery.start_soon(fail, error)
    assert any(caught.value is error for error in failures)
    with pytest.raises(ExceptionGroup):  # (a StoreError and something else: both told)
        async with one_level([]), trio.open_nursery() as nursery:
            nursery.start_soon(fail, failures[0])
            nursery.start_soon(fail, ValueError("another"))


def with_password(url: str) -> str:
    """``url`` with a password (the test server trusts everyone: it is ignored)."""
    return url.replace("postgres@", "postgres:t0psecret@", 1)


async def test_a_durable_worker_rides_out_a_restart(server: str, schema: str) -> None:
    """A worker and a creator on one database restarted under them: both go on
    (their connections are opened again), and the tasks created after the
    restart run."""
    done: list[int] = []
    some = trio.Event()

    async def handler(param: int) -> None:
        done.append(param)
        if len(done) in (5, 10):
            some.set()

    with (
        PostgresStore(server, schema=schema) as store,
        DurableStore(store) as ds,
        DurableStore(store) as creator,
    ):
        async with open_worker(ds, "w", handler, poll_interval=0.2):
            for i in range(5):
                await creator.promises.create(f"a{i}", 60, target="w", data=i)
            with trio.fail_after(DEADLINE):
                await some.wait()
            some = trio.Event()
            await trio.to_thread.run_sync(pg_ctl, server, "restart")
            for i in range(5, 10):
                await creator.promises.create(f"b{i}", 60, target="w", data=i)
            with trio.fail_after(DEADLINE):
                await some.wait()
    assert sorted(done) == list(range(10))


async def test_a_durable_worker_under_a_long_outage_raises_one_store_error(
    server: str, schema: str
) -> None:
    """The server stops for longer than the store waits for it (the URL's
    connect_timeout): the worker's block raises one StoreError (not a group)
    naming the store, without the password anywhere in its chain."""
    url = with_password(server) + "?connect_timeout=2"

    async def handler(param: object) -> None:
        pass

    try:
        with PostgresStore(url, schema=schema) as store, DurableStore(store) as ds:
            with trio.fail_after(DEADLINE), pytest.raises(StoreError) as caught:
                async with open_worker(ds, "w", handler, poll_interval=0.2, lease=5):
                    await trio.to_thread.run_sync(pg_ctl, server, "stop")
                    await trio.sleep_forever()
    finally:
        pg_ctl(server, "start")
    assert type(caught.value) is StoreError
    said = "".join(traceback.format_exception(caught.value))
    assert "t0psecret" not in said
    assert f"postgres:***@{server.split('@')[1]}" in str(caught.value)
    assert f"(schema {schema})" in str(caught.value)


# ---------------------------------------------------------------- the worker command


class WorkerCommand:
    """``python -m trioexec worker DB --target w`` on ``outage_handlers:work``
    (which prints ``DONE <param>``), its stderr merged into the output read."""

    def __init__(self, db: str, cwd: Path) -> None:
        (cwd / "outage_handlers.py").write_text(
            "def work(param):\n    print('DONE', param, flush=True)\n    return param\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trioexec", "worker", db, "--target", "w",
             "--handlers", "outage_handlers:work", "--lease", "5"],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.seen: list[str] = []
        self._buffer = b""

    def until(self, text: str) -> str:
        """Its output up to its next line containing ``text`` (bounded)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + DEADLINE
        while True:
            while b"\n" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\n", 1)
                self.seen.append(raw.decode(errors="replace"))
                if text in self.seen[-1]:
                    return self.seen[-1]
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                pytest.fail(f"no line with {text!r} within {DEADLINE}s: {self.seen!r}")
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self.proc.wait()
                pytest.fail(f"exited ({code}) before a line with {text!r}: {self.seen!r}")
            self._buffer += chunk

    def exited(self) -> int:
        """Its exit code, once it exits (bounded); all its output is in `seen`."""
        code = self.proc.wait(timeout=DEADLINE)
        assert self.proc.stdout is not None
        rest = self._buffer + self.proc.stdout.read()
        self.seen += rest.decode(errors="replace").splitlines()
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def worker_db(server: str) -> Iterator[str]:
    """The URL (with a password) a worker command serves, its default schema
    created; dropped after."""
    db = with_password(server) + "?connect_timeout=2"
    PostgresStore(db, schema="trioexec").close()
    yield db
    sql(server, "DROP SCHEMA IF EXISTS trioexec CASCADE")


def create(db: str, id: str) -> None:
    async def main() -> None:
        with DurableStore(db) as ds:
            await ds.promises.create(id, 60, target="w", data=id)

    trio.run(main)


def test_the_worker_command_rides_out_a_restart(
    server: str, worker_db: str, tmp_path: Path
) -> None:
    """``trioexec worker URL`` under ``pg_ctl restart``: it goes on serving (a task
    created after the restart runs), and stops on SIGTERM as usual."""
    worker = WorkerCommand(worker_db, tmp_path)
    try:
        worker.until("serving")
        create(worker_db, "before")
        worker.until("DONE before")
        pg_ctl(server, "restart")
        create(worker_db, "after")
        worker.until("DONE after")
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.exited() == 0, worker.seen
    finally:
        worker.close()
    assert "t0psecret" not in "\n".join(worker.seen)


def test_the_worker_command_under_a_long_outage_says_one_line(
    server: str, worker_db: str, tmp_path: Path
) -> None:
    """``trioexec worker URL`` when the server stops for good: it exits 1 with one
    line naming the store (password masked), no traceback, no exception group."""
    worker = WorkerCommand(worker_db, tmp_path)
    try:
        worker.until("serving")
        pg_ctl(server, "stop")
        try:
            assert worker.exited() == 1
        finally:
            pg_ctl(server, "start")
    finally:
        worker.close()
    output = "\n".join(worker.seen)
    assert "t0psecret" not in output
    assert "Traceback" not in output
    assert "ExceptionGroup" not in output
    errors = [line for line in worker.seen if line.startswith("trioexec: ")]
    assert len(errors) == 1, output
    assert "postgres:***@127.0.0.1:" in errors[0], output
    assert "(schema trioexec)" in errors[0], output
