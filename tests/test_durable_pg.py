"""The durable store on PostgreSQL where it differs from the other backends: a URL
opens it, several connections (processes, hosts) claim and create at once without
handing a task out twice, and idle workers are woken by ``NOTIFY``.

The protocol itself runs over all three backends in tests/test_durable.py,
tests/test_durable_batch.py and tests/test_durable_worker.py.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from typing import Any

import pytest
import trio
import trio.testing

import trioexec
from trioexec._store._durable_pg import channel, payload
from trioexec.durable import DurableStore, PromiseState, TaskState, open_worker


def test_a_url_opens_a_postgres_store_of_its_own(pg_database: str) -> None:
    async def create() -> None:
        with DurableStore(pg_database) as ds:
            await ds.promises.create("p", 60, data={"x": 1}, target="w")

    trio.run(create)
    other = pg_database.replace("postgresql://", "postgres://", 1)

    async def read() -> None:
        with trioexec.PostgresStore(pg_database) as store, DurableStore(store) as ds:
            assert (await ds.promises.get("p")).data == '{"x": 1}'  # type: ignore[union-attr]
        with DurableStore(other) as ds:
            assert (await ds.tasks.get("p")).state is TaskState.PENDING  # type: ignore[union-attr]

    trio.run(read)


def test_a_bad_url_raises_store_error() -> None:
    with pytest.raises(trioexec.StoreError, match=r"127\.0\.0\.1"):
        DurableStore("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")


async def test_concurrent_claims_get_disjoint_tasks(pg_database: str) -> None:
    """Two stores (two connections, calls in threads: really concurrent) claim
    batches from one target until it is empty: every task is claimed exactly once."""
    n = 300
    with DurableStore(pg_database) as setup:
        for i in range(0, n, 50):
            async with trio.open_nursery() as nursery:  # (group-committed)
                for j in range(i, i + 50):
                    nursery.start_soon(
                        lambda j=j: setup.promises.create(f"t{j:04}", 600, target="w")
                    )
    stores = [DurableStore(pg_database) for _ in range(3)]
    claimed: dict[str, list[str]] = {}

    async def claimer(ds: DurableStore, pid: str) -> None:
        mine = claimed[pid] = []
        while batch := await ds.tasks.claim("w", pid=pid, ttl=600, limit=7):
            mine.extend(t.id for t in batch)
            assert all(t.version == 1 and t.pid == pid for t in batch)

    try:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for k, ds in enumerate(stores):
                    for m in range(2):  # two claims in flight per store
                        nursery.start_soon(claimer, ds, f"w{k}.{m}")
        every = [id for ids in claimed.values() for id in ids]
        assert len(every) == len(set(every)) == n
        assert sum(1 for ids in claimed.values() if ids) >= 2  # they did share the work
        pending, _ = await stores[0].tasks.search(state=TaskState.PENDING)
        assert pending == []
        assert await stores[0].check_invariants() == []
    finally:
        for ds in stores:
            ds.close()


async def test_concurrent_creates_of_one_id_agree(pg_database: str) -> None:
    """The same create (same idempotency key) from two connections at once: both
    get the one promise (the loser's insert meets the winner's row, and its
    transaction runs again); a different key conflicts."""
    a, b = DurableStore(pg_database), DurableStore(pg_database)
    try:
        for i in range(40):
            got: list[Any] = []

            async def create(ds: DurableStore, i: int = i, got: list[Any] = got) -> None:
                got.append(await ds.promises.create(f"p{i}", 60, idempotency_key="k", target="w"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(create, a)
                nursery.start_soon(create, b)
            assert got[0] == got[1]
        assert len((await a.tasks.search(state=TaskState.PENDING, limit=1000))[0]) == 40
    finally:
        a.close()
        b.close()


async def test_an_idle_worker_is_woken_by_a_notification(store_maker: Any) -> None:
    """A worker idle on PostgreSQL with a poll interval of an hour runs a task
    another store object creates within seconds: only the NOTIFY of the create's
    commit can have woken it (a real clock here: the worker's wait is on a socket)."""
    worker_ds = DurableStore(store_maker("postgres"))
    creator = DurableStore(store_maker("postgres"))
    ran = trio.Event()

    async def handler(param: Any) -> Any:
        ran.set()
        return param

    try:
        async with open_worker(worker_ds, "w", handler, poll_interval=3600) as worker:
            await trio.testing.wait_all_tasks_blocked()  # its first claim found nothing
            assert worker.claimed == 0
            await creator.promises.create("other", 60, target="elsewhere")
            await creator.promises.create("t", 60, target="w", data=7)
            with trio.fail_after(30):
                await ran.wait()
        assert worker.claimed == 1
        assert (await creator.promises.get("t")).state is PromiseState.RESOLVED  # type: ignore[union-attr]
        assert (await creator.tasks.get("other")).state is TaskState.PENDING  # type: ignore[union-attr]
    finally:
        worker_ds.close()
        creator.close()


async def test_a_released_task_notifies_too(store_maker: Any) -> None:
    """Not only creates: a task coming back to pending (here: released by another
    holder) wakes the idle worker."""
    worker_ds = DurableStore(store_maker("postgres"))
    other = DurableStore(store_maker("postgres"))
    ran = trio.Event()

    async def handler(param: Any) -> None:
        ran.set()

    try:
        await other.promises.create("t", 60, target="w")
        (task,) = await other.tasks.claim("w", pid="other", ttl=60, limit=1)
        async with open_worker(worker_ds, "w", handler, poll_interval=3600) as worker:
            await trio.testing.wait_all_tasks_blocked()
            assert worker.claimed == 0  # held by "other"
            await other.tasks.release(task.id, task.version)
            with trio.fail_after(30):
                await ran.wait()
    finally:
        worker_ds.close()
        other.close()


def listeners(url: str, schema: str) -> list[int]:
    """The server processes LISTENing on ``schema``'s durable channel."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE %s",
            (f'LISTEN "{channel(schema)}"%',),
        ).fetchall()
    return [pid for (pid,) in rows]


async def test_a_lost_listener_is_listened_again_and_polled_meanwhile(
    store_maker: Any, postgres_url: str, pg_schema: str
) -> None:
    """The listening connection dies (the server ends it): the worker goes on, polling
    until it listens again (a new connection), and is then woken by notifications
    again (not by its hour-long poll). (Trio's real clock: a notification takes
    real time to come, which an autojump clock would not wait for.)"""
    import psycopg

    worker_ds = DurableStore(store_maker("postgres"))
    creator = DurableStore(store_maker("postgres"))
    ran = trio.Event()

    async def handler(param: Any) -> None:
        ran.set()

    try:
        async with open_worker(worker_ds, "w", handler, poll_interval=3600) as worker:
            await trio.testing.wait_all_tasks_blocked()
            assert worker._wakeup.listening
            (first,) = listeners(postgres_url, pg_schema)
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                ended = conn.execute("SELECT pg_terminate_backend(%s, 10000)", (first,)).fetchall()
            assert ended == [(True,)]
            with trio.fail_after(60):  # (a poll of the condition, bounded)
                while not (worker._wakeup.listening and listeners(postgres_url, pg_schema)):
                    await trio.sleep(0.01)
            (second,) = listeners(postgres_url, pg_schema)
            assert second != first
            await trio.testing.wait_all_tasks_blocked()
            created = trio.current_time()
            await creator.promises.create("t", 60, target="w")
            with trio.fail_after(30):
                await ran.wait()
            assert trio.current_time() - created < 3600  # a notification woke it
    finally:
        worker_ds.close()
        creator.close()


def test_channel_and_payload_fit_postgres_limits() -> None:
    assert channel("trioexec") == "trioexec_durable_trioexec"
    long = channel("s" * 63)
    assert len(long.encode()) <= 63
    assert long != channel("s" * 62 + "t")
    assert payload("refunds") == "refunds"
    assert payload("x" * 10_000) == ""  # too long to send: wakes every listener


def durable_call(ds: DurableStore, method: str, *args: Any, **kwargs: Any) -> Any:
    group, name = method.split(".")
    return trio.run(functools.partial(getattr(getattr(ds, group), name), *args, **kwargs))


def build_durable_times(store: Any) -> None:
    """Promises and tasks the durable clock (at 1000) will have moved on: a timed-out
    promise with a task suspended on it, a timed-out promise with its own task, an
    expired lease, a pending task whose retry timeout passed, and live ones."""
    now = [0.0]
    with DurableStore(store, clock=lambda: now[0], retry_timeout=500) as ds:
        durable_call(ds, "promises.create", "gate", 100)  # times out at 100
        durable_call(ds, "promises.create", "later", 5000)
        durable_call(ds, "promises.create", "own", 100, target="mailer")  # its task too
        job = durable_call(ds, "tasks.create", "job", pid="w1", ttl=50, timeout=5000, target="m")
        assert durable_call(ds, "tasks.suspend", "job", job.version, ["gate"]) == "suspended"
        durable_call(ds, "tasks.create", "leased", pid="w2", ttl=50, timeout=5000, target="m")
        durable_call(ds, "promises.create", "queued", 5000, target="reporter")  # due at 500
        for i in range(5):
            durable_call(ds, "promises.create", f"z{i}", 5000, tags={"team": "ops"})


def test_a_read_only_view_sees_time_pass_without_writing(postgres_url: str, pg_schema: str) -> None:
    """A read-only DurableStore on PostgreSQL answers what a writer would (timeouts,
    expired leases, due retries), from memory: the tables keep what they had, and
    every other write is refused."""
    import psycopg

    other = f"{pg_schema}_rw"
    with trioexec.PostgresStore(postgres_url, schema=pg_schema) as store:
        build_durable_times(store)
    with trioexec.PostgresStore(postgres_url, schema=other) as store:
        build_durable_times(store)

    def raw() -> list[Any]:
        with psycopg.connect(postgres_url) as conn:
            return conn.execute(
                f"SELECT p.id, p.state, t.state, t.version, t.timeout_at FROM {pg_schema}"
                f".durable_promises p LEFT JOIN {pg_schema}.durable_tasks t USING (id)"
                " ORDER BY p.id"
            ).fetchall()

    before = raw()

    def answers(ds: DurableStore) -> list[Any]:
        out = [durable_call(ds, "promises.get", i) for i in ("gate", "own", "later", "nope")]
        out += [durable_call(ds, "tasks.get", i) for i in ("job", "own", "leased", "queued")]
        for state in (None, "pending", "rejected_timedout"):
            out.append(durable_call(ds, "promises.search", state=state))
            out.append(durable_call(ds, "promises.search", state=state, limit=2))
            out.append(durable_call(ds, "promises.search", state=state, limit=2, cursor="job"))
        out.append(durable_call(ds, "promises.search", tag=("team", "ops"), limit=3))
        for state in (None, "pending", "acquired", "suspended", "fulfilled"):
            out.append(durable_call(ds, "tasks.search", state=state))
            out.append(durable_call(ds, "tasks.search", state=state, limit=1, cursor="job"))
        out.append(durable_call(ds, "tasks.search", target="m"))
        out.append(trio.run(ds.check_invariants))
        return out

    try:
        with (
            trioexec.PostgresStore(postgres_url, schema=pg_schema, read_only=True) as store,
            DurableStore(store, clock=lambda: 1000.0, retry_timeout=500) as ds,
        ):
            seen = answers(ds)
            assert seen == answers(ds)  # nothing was kept between operations
            for method, args, kwargs in (
                ("promises.create", ("new", 60), {}),
                ("promises.resolve", ("later",), {}),
                ("tasks.claim", ("reporter",), {"pid": "w", "ttl": 5, "limit": 5}),
            ):
                with pytest.raises(trioexec.StoreError, match="opened read-only"):
                    durable_call(ds, method, *args, **kwargs)
        with (
            trioexec.PostgresStore(postgres_url, schema=other) as store,
            DurableStore(store, clock=lambda: 1000.0, retry_timeout=500) as ds,
        ):
            assert seen == answers(ds)
        assert seen[0].state is PromiseState.REJECTED_TIMEDOUT
        assert seen[4].state == "pending"  # "job" was resumed when its gate timed out
        assert raw() == before
        assert ("gate", "pending", None, None, None) in before
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {other} CASCADE")


async def test_workers_and_a_resolver_on_several_connections_lose_nothing(
    pg_database: str,
) -> None:
    """Three workers and a resolver, each on a connection of its own (calls in
    threads: really concurrent transactions): tasks suspend on gates the resolver
    settles meanwhile, the others run at once. Every task ends fulfilled once, with
    its gate's value; the tables hold the invariants."""
    n, gates = 120, 12
    with DurableStore(pg_database) as setup:
        for g in range(gates):
            await setup.promises.create(f"gate{g}", 600)
        for i in range(n):
            data = {"n": i, "gate": f"gate{i % gates}" if i % 3 == 0 else None}
            await setup.promises.create(f"t{i:03}", 600, target="w", data=data)
    stores = [DurableStore(pg_database) for _ in range(4)]
    fulfilled: Counter[str] = Counter()
    all_done = trio.Event()

    async def handler(param: dict[str, Any], handle: Any) -> Any:
        gate = param["gate"]
        value = None if gate is None else await handle.await_promise(gate)
        return {"n": param["n"], "gate": value}

    def counting(ds: DurableStore) -> None:
        fulfill = ds.tasks.fulfill

        async def counted(id: str, *args: Any, **kwargs: Any) -> Any:
            record = await fulfill(id, *args, **kwargs)
            fulfilled[id] += 1
            if len(fulfilled) == n:
                all_done.set()
            return record

        ds.tasks.fulfill = counted  # type: ignore[method-assign]

    async def worker(ds: DurableStore, pid: str) -> None:
        counting(ds)
        async with open_worker(ds, "w", handler, pid=pid, lease=30, poll_interval=0.05):
            await all_done.wait()

    async def resolver(ds: DurableStore) -> None:
        for g in range(gates):
            await trio.lowlevel.checkpoint()
            await ds.promises.resolve(f"gate{g}", data=g)

    try:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for k in range(3):
                    nursery.start_soon(worker, stores[k], f"w{k}")
                nursery.start_soon(resolver, stores[3])
        assert fulfilled == dict.fromkeys([f"t{i:03}" for i in range(n)], 1)
        page, _ = await stores[3].promises.search(state="resolved", limit=1000)
        values = {p.id: json.loads(p.data) for p in page if p.id.startswith("t")}
        assert values == {
            f"t{i:03}": {"n": i, "gate": (i % gates) if i % 3 == 0 else None} for i in range(n)
        }
        tasks, _ = await stores[3].tasks.search(limit=1000)
        assert {t.state for t in tasks} == {TaskState.FULFILLED}
        assert await stores[3].check_invariants() == []
    finally:
        for ds in stores:
            ds.close()


def test_a_schema_of_version_1_is_migrated_with_its_durable_rows(
    postgres_url: str, pg_schema: str
) -> None:
    """Migration 2 (the durable indexes made partial) on a schema written at version
    1: the rows stay, and claims and time work on the new indexes."""
    import psycopg

    from trioexec._store._pg_schema import MIGRATIONS

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {pg_schema}")
        conn.execute(f"SET search_path TO {pg_schema}")
        conn.execute(MIGRATIONS[0].encode())
        conn.execute("INSERT INTO trioexec_meta VALUES ('schema_version', '1')")
        conn.execute(
            "INSERT INTO durable_promises VALUES"
            " ('old', 'pending', NULL, 1e12, NULL, NULL, '{}', 1.0, NULL)"
        )
        conn.execute(
            "INSERT INTO durable_tasks VALUES ('old', 'pending', 0, 'w', NULL, NULL, NULL, 1e12)"
        )
    with (
        trioexec.PostgresStore(postgres_url, schema=pg_schema) as store,
        DurableStore(store) as ds,
    ):
        (task,) = durable_call(ds, "tasks.claim", "w", pid="p", ttl=60, limit=5)
        assert (task.id, task.version) == ("old", 1)
        assert durable_call(ds, "tasks.fulfill", "old", 1, data=1).state is PromiseState.RESOLVED
    with psycopg.connect(postgres_url) as conn:
        version = conn.execute(
            f"SELECT value FROM {pg_schema}.trioexec_meta WHERE key = 'schema_version'"
        ).fetchone()
        partial = conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s"
            " AND indexdef LIKE '%%WHERE%%' ORDER BY indexname",
            (pg_schema,),
        ).fetchall()
    assert version == (str(len(MIGRATIONS)),)
    assert [name for (name,) in partial if name.startswith("durable")] == [
        "durable_promises_pending",
        "durable_tasks_claim",
        "durable_tasks_lease",
        "durable_tasks_retry",
    ]


async def test_a_busy_worker_reads_its_notifications_before_each_claim(store_maker: Any) -> None:
    """What came on the listening connection is read before a claim (which sees
    those tasks anyway), so a worker that never idles never lets its connection
    back up; a drained wake-up then waits (here: it stays blocked)."""
    from trioexec.durable._store import open_wakeup

    ds = DurableStore(store_maker("postgres"))
    creator = DurableStore(store_maker("postgres"))
    try:
        async with open_wakeup(ds, "w") as wakeup:
            assert wakeup.listening
            await creator.promises.create("a", 60, target="w")
            with trio.fail_after(30):
                await wakeup.wait(3600)  # notified
            await creator.promises.create("b", 60, target="w")
            with trio.fail_after(30):  # it came
                await trio.lowlevel.wait_readable(wakeup._listener.fileno())  # type: ignore[union-attr]
            wakeup.drain()
            async with trio.open_nursery() as nursery:
                woken = trio.Event()

                async def waiting() -> None:
                    await wakeup.wait(3600)
                    woken.set()

                nursery.start_soon(waiting)
                await trio.testing.wait_all_tasks_blocked()
                assert not woken.is_set()  # nothing was left to wake it
                nursery.cancel_scope.cancel()
            assert wakeup.listening
        assert not wakeup.listening  # closed with the block
    finally:
        ds.close()
        creator.close()


def test_a_batch_claim_and_fulfil_find_their_rows_by_key(store_maker: Any) -> None:
    """The one statement that claims a batch, and the one that fulfils a batch,
    read and write their rows through their keys: no table is scanned whole,
    however many rows it holds (a join with the batch planned as a hash join
    scanned the table once per batch)."""
    from trioexec._store._durable_pg import _CLAIM, _FULFIL_MANY, _json
    from trioexec.durable._protocol import Core

    tables = store_maker("postgres").durable_tables()
    core = Core(tables, lambda: 1_000.0)
    creates = [
        functools.partial(core.create_promise, f"t{i:05d}", 600, target="w") for i in range(3000)
    ]
    assert all(ok for ok, _ in core.run(lambda: creates))
    claimed = core.claim_work("w", pid="p", ttl=60, limit=64)
    batch = _json([{"id": t.id, "version": t.version, "state": "resolved"} for t, _ in claimed])
    plans = []
    with tables.transaction():
        tables.conn.execute("ANALYZE durable_tasks; ANALYZE durable_promises")
        for sql, args in [(_CLAIM, ("w", 64, "p", 60.0, 1060.0)), (_FULFIL_MANY, (batch, 64, 1.0))]:
            plans.append("\n".join(row[0] for row in tables.conn.execute(f"EXPLAIN {sql}", args)))
    tables.close()
    for plan in plans:
        assert "Seq Scan on durable_tasks" not in plan, plan
        assert "Seq Scan on durable_promises" not in plan, plan
