"""PostgreSQL going away under a running executor (issue 30, item 5), on a
server of this module's own (tests/pg_server.py): the connection that LISTENs
for commands cut with ``pg_terminate_backend``, or the server restarted with
``pg_ctl restart -m fast``.

A cut listener is listened again (polling meanwhile); a restart is ridden out;
a store failure ends the executor with one `StoreError` and leaves its work as
the store had it, for an executor that recovers.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import trio
from pg_server import USER_ENV, NoServer, pg_ctl, postgres_server

import trioexec
from trioexec import PostgresStore, StoreError, TaskStatus

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
