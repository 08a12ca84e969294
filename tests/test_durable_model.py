"""`trioexec.durable`'s protocol against a reference model, step by step.

A hypothesis state machine drives four implementations of the promise/task
protocol with the same calls under one moving wall clock: the reference model in
``durable_model.py`` (written from the seed and API.md, not from the code), ``Core``
over ``SQLiteTables`` on a real SQLite file, ``Core`` over ``PostgresTables`` on a
PostgreSQL schema (emptied for each example), and ``Core`` over a `MemoryStore`'s. Every
answer must agree (records, or the exception's type); after every step the stores'
raw tables (read without letting time act) must equal the model's state, and
``check_invariants()`` must be ``[]`` everywhere.

Ids come from a small alphabet so that operations collide, and most task calls pick
an existing task in a useful state (`Pick`) with its current version.
``TRIOEXEC_DURABLE_EXAMPLES`` sets the number of examples (default 50; the issue
asks for 2,000 to pass, which ``nox -s soak`` runs).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs
import pytest
from durable_model import Model
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import trioexec
from trioexec.durable import PromiseCreate, PromiseSettle, PromiseState, Suspend, TaskState
from trioexec.durable._protocol import Core, promise_record

EXAMPLES = int(os.environ.get("TRIOEXEC_DURABLE_EXAMPLES", "50"))
RETRY_TIMEOUT = 10.0

IDS = ("p0", "p1", "p2", "p3", "p4", "p5")
MISSING = "px"  # never created: NotFound wherever an existing id is needed
PIDS = ("w0", "w1")
TARGETS = ("t0", "t1")

ids = st.sampled_from(IDS)
any_ids = st.sampled_from((*IDS, MISSING))


@attrs.frozen
class Pick:
    """Resolved at the step: the ``index``-th (mod) existing id of this ``kind`` (see
    `DurableAgrees.candidates`), so that most calls hit something that exists."""

    kind: str
    index: int


def id_for(*kinds: str) -> st.SearchStrategy[str | Pick]:
    """An id: two times in three an existing one of one of these kinds, else any."""
    pick = st.builds(Pick, st.sampled_from(kinds), st.integers(0, 7))
    return st.one_of(pick, pick, any_ids)


held_ids = id_for("acquired", "acquired", "acquired", "task")  # calls that need a holder
promise_ids = id_for("promise", "pending_promise", "awaited", "awaited")
keys = st.sampled_from((None, None, "k0", "k1"))
datas = st.sampled_from((None, 1, "x", {"a": [1, 2]}))
tag_sets = st.sampled_from(
    (None, {}, {"k": "v"}, {"k": "w"}, {"a.b": "v"}, {"resonate:target": "t1"})
)
tag_filters = st.sampled_from(
    (
        None,
        ("k", "v"),
        ("k", "w"),
        ("a.b", "v"),
        ("resonate:target", "t0"),
        ("resonate:target", "t1"),
    )
)
targets = st.sampled_from((None, *TARGETS))
timeouts = st.sampled_from((0, 1, 2.5, 5, 10, 20, 60, 300, 300))
ttls = st.sampled_from((1, 5, 10, 2.5, 5, 20))
bad_ttls = st.sampled_from((0, -1.0, True))
some_ttls = st.one_of(ttls, ttls, ttls, bad_ttls)  # mostly valid
settle_states = st.sampled_from(
    (
        PromiseState.RESOLVED,
        PromiseState.REJECTED,
        PromiseState.REJECTED_CANCELED,
        PromiseState.RESOLVED,
        PromiseState.PENDING,  # ValueError
        PromiseState.REJECTED_TIMEDOUT,  # ValueError
    )
)
# A version: the task's current one (most often), one behind it, or a fixed number.
CURRENT, STALE = "current", "stale"
versions = st.sampled_from((CURRENT, CURRENT, CURRENT, CURRENT, CURRENT, STALE, 0, 1, 2))
limits = st.sampled_from((1, 2, 3, 1, 2, 100, 0))  # 0: ValueError
clock_steps = st.sampled_from((0.5, 1, 2.5, 5, 10, 30))

_TEMPLATE: list[Path] = []
#: The PostgreSQL store every example runs on (its tables emptied first): set for
#: the module by `postgres_store`.
_POSTGRES: list[Any] = []


@pytest.fixture(autouse=True, scope="module")
def postgres_store(postgres_url: str) -> Any:
    import psycopg

    schema = "durable_model"
    store = trioexec.PostgresStore(postgres_url, schema=schema, inline=True)
    _POSTGRES[:] = [store]
    yield store
    _POSTGRES.clear()
    store.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def template_db() -> Path:
    """A migrated, empty trioexec database, made once and copied per example."""
    if not _TEMPLATE:
        where = tempfile.mkdtemp(prefix="trioexec-durable-template-")
        atexit.register(shutil.rmtree, where, ignore_errors=True)
        path = Path(where) / "template.db"
        trioexec.SQLiteStore(path, inline=True).close()
        _TEMPLATE.append(path)
    return _TEMPLATE[0]


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:
        return ("raised", type(exc))


def core_state(core: Core) -> tuple[dict[str, Any], dict[str, Any], set[tuple[str, str]]]:
    """A store's raw tables as records, read without applying time."""
    t = core.tables
    with t.transaction():
        promises = {r["id"]: promise_record(r) for r in t.all_promises()}
        tasks = {r["id"]: core.task_record(r) for r in t.all_tasks()}
        callbacks = set(t.all_callbacks())
    return promises, tasks, callbacks


def model_state(model: Model) -> tuple[dict[str, Any], dict[str, Any], set[tuple[str, str]]]:
    promises = {id: model._promise_record(id) for id in model.promises}
    tasks = {id: model._task_record(id) for id in model.tasks}
    return promises, tasks, model.callbacks()


class DurableAgrees(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000.0
        self.steps = 0
        self.dir = Path(tempfile.mkdtemp(prefix="trioexec-durable-model-"))
        path = self.dir / "durable.db"
        shutil.copyfile(template_db(), path)
        self.store = trioexec.SQLiteStore(path, inline=True)
        self.tables = self.store.durable_tables()
        self.model = Model(self.clock, RETRY_TIMEOUT)
        self.sqlite = Core(self.tables, self.clock, RETRY_TIMEOUT)
        self.memory_store = trioexec.MemoryStore()
        self.memory_tables = self.memory_store.durable_tables()
        self.memory = Core(self.memory_tables, self.clock, RETRY_TIMEOUT)
        self.pg_tables = _POSTGRES[0].durable_tables()
        self.pg_tables.conn.execute(
            "TRUNCATE durable_promises, durable_tasks, durable_callbacks RESTART IDENTITY"
        )
        self.postgres = Core(self.pg_tables, self.clock, RETRY_TIMEOUT)
        self.cores = (("sqlite", self.sqlite), ("postgres", self.postgres), ("memory", self.memory))

    def clock(self) -> float:
        return self.now

    def teardown(self) -> None:
        event(f"steps: {self.steps // 10 * 10}+")
        self.tables.close()
        self.store.close()
        self.pg_tables.close()
        self.memory_tables.close()
        self.memory_store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[str, Any]:
        """Make the same call on the model and both stores; all must answer alike."""
        expected = outcome(getattr(self.model, name), *args, **kwargs)
        for label, core in self.cores:
            got = outcome(getattr(core, name), *args, **kwargs)
            assert got == expected, (label, name, args, kwargs, got, expected)
        kind, value = expected
        event(f"{name}: {value.__name__ if kind == 'raised' else 'ok'}")
        return expected

    # ------------------------------------------------------------------ drawing ids

    def candidates(self, kind: str) -> list[str]:
        m = self.model
        if kind == "task":
            return sorted(m.tasks)
        if kind in ("pending", "acquired", "suspended", "halted"):
            return sorted(id for id, t in m.tasks.items() if t["state"] == kind)
        if kind == "promise":
            return sorted(m.promises)
        if kind == "pending_promise":
            return sorted(id for id, p in m.promises.items() if p["state"] == "pending")
        assert kind == "awaited", kind
        return sorted({p for awaited in m.awaiting.values() for p in awaited})

    def resolve(self, drawn: str | Pick) -> str:
        if isinstance(drawn, str):
            return drawn
        # None of that kind: any task (for task kinds) or promise, else any id.
        fallback = (
            "task" if drawn.kind in ("pending", "acquired", "suspended", "halted") else "promise"
        )
        found = self.candidates(drawn.kind) or self.candidates(fallback) or list(IDS)
        return found[drawn.index % len(found)]

    def version(self, id: str, choice: str | int) -> int:
        task = self.model.tasks.get(id)
        current = 0 if task is None else task["version"]
        if choice == CURRENT:
            return current
        if choice == STALE:
            return current - 1
        assert isinstance(choice, int)
        return choice

    def task(self, id: str) -> dict[str, Any]:
        """A copy of the model's task (empty if none)."""
        return dict(self.model.tasks.get(id) or {})

    # ------------------------------------------------------------------ start

    @initialize(
        seeds=st.lists(
            st.tuples(ids, st.sampled_from((10, 60, 300, 300)), st.sampled_from((*TARGETS, None))),
            min_size=1,
            max_size=4,
        )
    )
    def seed_promises(self, seeds: list[tuple[str, float, str | None]]) -> None:
        for id, timeout, to in seeds:
            self.call("create_promise", id, timeout, target=to)

    # ------------------------------------------------------------------ time

    @rule(dt=clock_steps)
    def advance_clock(self, dt: float) -> None:
        self.steps += 1
        self.now += dt
        m = self.model
        awaited = {p for aw in m.awaiting.values() for p in aw}
        for id, p in m.promises.items():
            if p["state"] is PromiseState.PENDING and p["timeout_at"] <= self.now:
                event("time: an awaited promise times out" if id in awaited else "time: timeout")
        for t in m.tasks.values():
            if t["state"] is TaskState.ACQUIRED and t["lease_expires_at"] <= self.now:
                exactly = t["lease_expires_at"] == self.now
                event("time: a lease expires" + (" exactly now" if exactly else ""))
            if t["state"] is TaskState.PENDING and t["timeout_at"] <= self.now:
                event("time: a pending task's retry timeout passes")

    # ------------------------------------------------------------------ promises

    @rule(id=ids, timeout=timeouts, key=keys, data=datas, tags=tag_sets, to=targets)
    def create_promise(
        self, id: str, timeout: float, key: str | None, data: Any, tags: Any, to: str | None
    ) -> None:
        self.steps += 1
        if id in self.model.promises:
            same = key is not None and self.model.promises[id]["ikc"] == key
            event("create existing: same key" if same else "create existing: other key")
        self.call(
            "create_promise", id, timeout, idempotency_key=key, data=data, tags=tags, target=to
        )

    @rule(id=promise_ids, state=settle_states, key=keys, data=datas)
    def settle_promise(self, id: Any, state: PromiseState, key: str | None, data: Any) -> None:
        self.steps += 1
        id = self.resolve(id)
        before = dict(self.model.promises.get(id) or {})
        if before and before["state"] != "pending" and key is not None:
            event("settle settled: " + ("same key" if before["iku"] == key else "other key"))
        waiting = [t for t, awaited in self.model.awaiting.items() if id in awaited]
        kind, _ = self.call("settle_promise", id, state, idempotency_key=key, data=data)
        if kind == "ok" and waiting and before["state"] == "pending":
            event("settle resumed a suspended task")
            for t in waiting:  # no polling: pending the moment the settle returns
                # (unless its own promise timed out as the settle began: then it ended)
                own = self.model.promises.get(t) or {}
                if t != id and own.get("state") == "pending":
                    assert self.model.tasks[t]["state"] is TaskState.PENDING

    @rule(promise=promise_ids, task=id_for("task"))
    def get(self, promise: Any, task: Any) -> None:
        self.steps += 1
        self.call("get_promise", self.resolve(promise))
        self.call("get_task", self.resolve(task))

    @rule(
        state=st.sampled_from((None, None, *PromiseState, "bogus")),
        tag=tag_filters,
        limit=limits,
    )
    def search_promises(self, state: Any, tag: Any, limit: int) -> None:
        self.steps += 1
        self.paginate("search_promises", limit, state=state, tag=tag)

    @rule(
        state=st.sampled_from((None, None, *TaskState, "bogus")),
        to=st.sampled_from((None, None, *TARGETS, "t9")),
        limit=limits,
    )
    def search_tasks(self, state: Any, to: Any, limit: int) -> None:
        self.steps += 1
        self.paginate("search_tasks", limit, state=state, target=to)

    def paginate(self, name: str, limit: int, **filters: Any) -> None:
        """Follow the cursors to the end; the pages must add up to one big search."""
        found: list[Any] = []
        cursor = None
        for _ in range(len(IDS) + 2):
            kind, value = self.call(name, limit=limit, cursor=cursor, **filters)
            if kind == "raised":
                return
            page, cursor = value
            assert len(page) <= limit
            assert cursor is None or cursor == page[-1].id
            found.extend(page)
            if cursor is None:
                break
        else:
            raise AssertionError(f"{name}: the cursors never end")
        if len(found) > limit:
            event(f"{name}: several pages")
        kind, (everything, last) = self.call(name, limit=100, **filters)
        assert last is None
        assert found == everything
        assert [r.id for r in found] == sorted({r.id for r in found})

    # ------------------------------------------------------------------ tasks

    @rule(
        id=ids,
        pid=st.sampled_from(PIDS),
        ttl=some_ttls,
        timeout=timeouts,
        data=datas,
        to=st.sampled_from(TARGETS),
    )
    def create_task(
        self, id: str, pid: str, ttl: float, timeout: float, data: Any, to: str
    ) -> None:
        self.steps += 1
        self.call("create_task", id, pid=pid, ttl=ttl, timeout=timeout, data=data, target=to)

    @rule(
        id=id_for("pending", "pending", "task"),
        version=versions,
        pid=st.sampled_from(PIDS),
        ttl=some_ttls,
    )
    def acquire(self, id: Any, version: Any, pid: str, ttl: Any) -> None:
        self.steps += 1
        id = self.resolve(id)
        before = self.task(id)
        v = self.version(id, version)
        kind, record = self.call("acquire", id, v, pid=pid, ttl=ttl)
        if kind == "ok":
            # pending, or acquired with a lease that expired by now
            assert before["state"] in (TaskState.PENDING, TaskState.ACQUIRED)
            assert record.version == before["version"] + 1
            assert record.lease_expires_at == self.now + ttl
            if before["version"] > 0:
                event("acquire: a re-acquisition")

    @rule(
        pid=st.sampled_from(PIDS),
        pairs=st.lists(st.tuples(held_ids, versions), max_size=4),
    )
    def heartbeat(self, pid: str, pairs: list[tuple[Any, Any]]) -> None:
        self.steps += 1
        batch = [(id, self.version(id, v)) for id, v in ((self.resolve(i), v) for i, v in pairs)]
        kind, renewed = self.call("heartbeat", pid, batch)
        if kind == "ok" and 0 < renewed < len(batch):
            event("heartbeat: some pairs skipped")

    @rule(
        id=held_ids,
        version=versions,
        awaited=st.one_of(*[st.lists(promise_ids, min_size=1, max_size=3)] * 3, st.just([])),
    )
    def suspend(self, id: Any, version: Any, awaited: list[Any]) -> None:
        self.steps += 1
        id = self.resolve(id)
        awaited_ids = [self.resolve(a) for a in awaited]
        kind, value = self.call("suspend", id, self.version(id, version), awaited_ids)
        if kind == "ok":
            event(f"suspend: {value.value}")
            expected = TaskState.ACQUIRED if value is Suspend.ALREADY_SETTLED else "suspended"
            assert self.model.tasks[id]["state"] == expected

    @rule(id=id_for("suspended", "task"), version=versions)
    def resume(self, id: Any, version: Any) -> None:
        self.steps += 1
        id = self.resolve(id)
        self.call("resume", id, self.version(id, version))

    @rule(id=held_ids, version=versions)
    def release(self, id: Any, version: Any) -> None:
        self.steps += 1
        id = self.resolve(id)
        before = self.task(id)
        kind, record = self.call("release", id, self.version(id, version))
        if kind == "ok":
            assert record.version == before["version"]
            assert record.state is TaskState.PENDING

    @rule(id=held_ids, version=versions, data=datas, rejected=st.booleans())
    def fulfill(self, id: Any, version: Any, data: Any, rejected: bool) -> None:
        self.steps += 1
        id = self.resolve(id)
        self.call("fulfill", id, self.version(id, version), data=data, rejected=rejected)

    @rule(
        id=held_ids,
        version=versions,
        create=st.builds(
            PromiseCreate,
            id=ids,
            timeout=st.one_of(timeouts, st.just(-1)),
            idempotency_key=keys,
            data=datas,
            tags=tag_sets,
        ),
        settle=st.tuples(promise_ids, settle_states, keys, datas),
        creating=st.booleans(),
    )
    def fence(self, id: Any, version: Any, create: Any, settle: Any, creating: bool) -> None:
        self.steps += 1
        id = self.resolve(id)
        if creating:
            action: Any = create
        else:
            target, state, key, data = settle
            action = PromiseSettle(
                id=self.resolve(target), state=state, idempotency_key=key, data=data
            )
        kind, _ = self.call("fence", id, self.version(id, version), action)
        if kind == "ok":
            event(f"fence: {type(action).__name__} ok")

    @rule(id=id_for("task"))
    def halt(self, id: Any) -> None:
        self.steps += 1
        self.call("halt", self.resolve(id))

    @rule(id=id_for("halted", "task"))
    def continue_(self, id: Any) -> None:
        self.steps += 1
        self.call("continue_", self.resolve(id))

    @rule(
        id=id_for("pending", "pending", "task"),
        pid=st.sampled_from(PIDS),
        ttl=ttls,
        awaited=st.lists(id_for("pending_promise", "promise"), min_size=1, max_size=3),
        then=st.sampled_from(
            (
                "suspend",
                "suspend+settle",
                "suspend+settle",
                "suspend+settle",
                "suspend+halt",
                "fence create",
                "fence settle",
                "fulfill",
                "release",
                "nothing",
            )
        ),
        state=st.sampled_from(
            (PromiseState.RESOLVED, PromiseState.REJECTED, PromiseState.REJECTED_CANCELED)
        ),
    )
    def work(
        self, id: Any, pid: str, ttl: float, awaited: list[Any], then: str, state: PromiseState
    ) -> None:
        """A worker's turn: claim a pending task at its version, then act on it."""
        self.steps += 1
        id = self.resolve(id)
        kind, record = self.call("acquire", id, self.version(id, CURRENT), pid=pid, ttl=ttl)
        if kind != "ok":
            return
        v = record.version
        others = [self.resolve(a) for a in awaited]
        if then.startswith("suspend"):
            kind, value = self.call("suspend", id, v, others)
            if kind == "ok":
                event(f"work: suspend {value.value}")
            if then == "suspend+settle":
                waiting = self.model.tasks[id]["state"] is TaskState.SUSPENDED
                kind, _ = self.call("settle_promise", others[-1], state)
                if kind == "ok" and waiting:
                    event("work: a settle resumed the task")
                    assert self.model.tasks[id]["state"] in ("pending", "fulfilled")
            elif then == "suspend+halt":
                self.call("halt", id)
                self.call("settle_promise", others[-1], state)  # must not resume it
        elif then == "fence create":
            self.call("fence", id, v, PromiseCreate(id=others[0], timeout=20))
        elif then == "fence settle":
            self.call("fence", id, v, PromiseSettle(id=others[0], state=state))
        elif then == "fulfill":
            self.call("fulfill", id, v, data="done")
        elif then == "release":
            self.call("release", id, v)

    # ------------------------------------------------------------------ after every step

    @invariant()
    def same_state(self) -> None:
        expected = model_state(self.model)
        for label, core in self.cores:
            assert core_state(core) == expected, label

    @invariant()
    def invariants_hold(self) -> None:
        assert self.model.check_invariants() == []
        for label, core in self.cores:
            assert core.check_invariants() == [], label


TestDurableAgrees = DurableAgrees.TestCase
TestDurableAgrees.settings = settings(max_examples=EXAMPLES, stateful_step_count=35, deadline=None)
