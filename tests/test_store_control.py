"""Operator commands as the stores keep them (issue 18 items 2 and 3): pause and
resume (idempotent, every call recorded), cancel (left to a live owner, done by
the store otherwise, fenced), the commands log polled by seq, dead letters and
their requeue for recovery to claim, the traceback and arguments a finish records,
the migrations that add them, and PostgreSQL's notification of a command."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing

import attrs
import psycopg
import pytest
import sqlite_utils
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pg_server import schema_at_version

from trioexec import PostgresStore, SQLiteStore, StoreError, SubStatus, TaskStatus
from trioexec._changes import Finish, Start, Sub, submitted
from trioexec._store import Command, Pause, Requeued, _pg_schema, _sqlite_schema
from trioexec._store._base import fold_row

WHO = "ops@host pid 7 '[🚀]'"
ODD = "batch[/] 'x' 🚀"  # brackets, a quote, an emoji
NOT_RECREATABLE = (
    "not re-creatable: submitted without a registered TaskSpec or with arguments that are not JSON"
)


class Clock:
    """A wall clock the test moves."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def submit(task_id, owner="A", *, name="job", spec="spec.x", args="[1]", run_id=None, at=1.0):
    return submitted(task_id, 1, name, run_id, spec, args, owner, at)


def ended(task_id, status, *, owner="A", at=5.0, **kw):
    """The changes of an execution that ran once and ended ``status``."""
    return [
        submit(task_id, owner, **kw),
        Start((task_id, 1, 1, 2.0)),
        Finish((task_id, 1, status, at, f"{status.value} error", f"Traceback {task_id}", None)),
    ]


# ---------------------------------------------------------------------- pause / resume


def test_pause_and_resume_are_idempotent_and_every_call_is_recorded(make_store):
    clock = Clock()
    store = make_store(clock=clock)
    calls = [
        ("pause", {"name": ODD}, True, "paused"),
        ("pause", {"name": ODD}, False, "already paused"),
        ("pause", {"key": ODD}, True, "paused"),  # a key and a name of one value: two pauses
        ("resume", {"name": ODD}, True, "resumed"),
        ("resume", {"name": ODD}, False, "not paused"),
        ("resume", {"key": "never paused"}, False, "not paused"),
        ("pause", {"name": "a"}, True, "paused"),
    ]
    for i, (kind, target, changed, detail) in enumerate(calls, start=1):
        clock.now = 1_000.0 + i
        got = store.command(kind, **target, who=WHO)
        want = Command(
            seq=i, kind=kind, **target, who=WHO, at=clock.now, changed=changed, detail=detail
        )
        assert got == want
    assert store.pauses() == [
        Pause(kind="key", value=ODD, who=WHO, at=1_003.0),
        Pause(kind="name", value="a", who=WHO, at=1_007.0),
    ]
    log = store.commands()
    assert [c.seq for c in log] == list(range(1, len(calls) + 1))
    assert [(c.kind, c.changed, c.detail) for c in log] == [(k, c, d) for k, _, c, d in calls]
    assert all(type(c.changed) is bool for c in log)


def test_a_pause_keeps_who_paused_first(make_store):
    clock = Clock()
    store = make_store(clock=clock)
    store.command("pause", key="tenant-a", who="first")
    clock.now += 5
    assert not store.command("pause", key="tenant-a", who="second").changed
    assert store.pauses() == [Pause(kind="key", value="tenant-a", who="first", at=1_000.0)]


@pytest.mark.parametrize(
    ("kind", "target", "match"),
    [
        ("stop", {"name": "a"}, "kind must be 'pause', 'resume' or 'cancel', got 'stop'"),
        ("retry", {"task_id": "t"}, "a retry is Store.requeue"),
        ("pause", {}, "exactly one of name and key"),
        ("pause", {"name": "a", "key": "b"}, "exactly one of name and key"),
        ("resume", {"task_id": "t"}, "not a task_id"),
        ("pause", {"name": ""}, "name must not be empty"),
        ("pause", {"key": "a\x00b"}, "key 'a\\\\x00b' cannot be stored"),
        ("pause", {"name": 7}, "name must be a str, got int 7"),
        ("cancel", {}, "a cancel needs a task_id"),
        ("cancel", {"task_id": "t", "name": "a"}, "a cancel takes a task_id only"),
        ("cancel", {"task_id": "x" * 1001}, "task_id is 1001 characters long"),
    ],
)
def test_a_command_that_cannot_be_carried_out_is_refused(make_store, kind, target, match):
    store = make_store()
    with pytest.raises(ValueError, match=match):
        store.command(kind, **target, who=WHO)
    with pytest.raises(ValueError, match="who must not be empty"):
        store.command("pause", name="a", who="")
    assert store.commands() == []
    assert store.pauses() == []


def test_pause_and_resume_agree_with_a_model(make_store):
    """Any sequence of pauses and resumes: the changed flags, the pauses and the
    log are those of a set (one store for every example: the model carries on)."""
    store = make_store()
    paused: set[tuple[str, str]] = set()
    seen = [0]

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["pause", "resume"]),
                st.sampled_from(["name", "key"]),
                st.sampled_from(["a", ODD, "🚀", "a'b"]),
            ),
            max_size=8,
        )
    )
    def run(steps):
        for kind, target, value in steps:
            was = (target, value) in paused
            got = store.command(kind, **{target: value}, who=WHO)
            if kind == "pause":
                paused.add((target, value))
            else:
                paused.discard((target, value))
            assert got.changed is (was is (kind == "resume"))
        log = store.commands(after=seen[0])
        assert [c.seq for c in log] == list(range(seen[0] + 1, seen[0] + len(steps) + 1))
        seen[0] += len(steps)
        assert [(p.kind, p.value) for p in store.pauses()] == sorted(paused)

    run()


# ---------------------------------------------------------------------- cancel


def test_cancel_of_an_unknown_or_finished_task_changes_nothing(make_store):
    store = make_store()
    store.write(ended("done", TaskStatus.COMPLETED))
    before = store.execution("done")
    assert store.command("cancel", task_id="nope", who=WHO).detail == "no such task"
    got = store.command("cancel", task_id="done", who=WHO)
    assert (got.changed, got.detail, got.task_id) == (False, "already finished (completed)", "done")
    assert store.execution("done") == before
    assert [c.changed for c in store.commands()] == [False, False]


def test_cancel_of_a_task_whose_owner_lives_is_sent_to_the_owner(make_store):
    clock = Clock()
    store = make_store(clock=clock)
    store.heartbeat("A", clock.now)  # (a lease that ends now is still live now)
    store.write([submit(ODD), Start((ODD, 1, 1, 2.0))])
    before = store.execution(ODD)
    got = store.command("cancel", task_id=ODD, who=WHO)
    assert (got.changed, got.detail) == (True, "sent to its owner A")
    assert store.execution(ODD) == before  # the owner cancels it: the store does not
    assert (
        store.write([Finish((ODD, 1, TaskStatus.CANCELLED, 6.0, "Cancelled()", None, None))]) == []
    )


@pytest.mark.parametrize("lease", ["expired", "none", "no owner"])
def test_cancel_of_a_task_nobody_runs_is_done_by_the_store_and_fences_it(make_store, lease):
    clock = Clock()
    store = make_store(clock=clock)
    owner = None if lease == "no owner" else "B"
    if lease == "expired":
        store.heartbeat("B", clock.now - 0.5)
    store.write(
        [
            submit("t", owner),
            Start(("t", 1, 1, 2.0)),
            Sub(("t", 1, SubStatus.DEFERRED, 3.0, "event")),
        ]
    )
    got = store.command("cancel", task_id="t", who=WHO)
    assert (got.changed, got.detail) == (True, "cancelled in the store (no live owner)")
    record = store.execution("t")
    assert record.status is TaskStatus.CANCELLED
    assert record.version == 2
    assert (record.finished_at, record.error) == (clock.now, f"cancelled by {WHO}")
    assert (record.sub_status, record.deferred_since, record.waiting_on) == (None, None, None)
    assert record.traceback is None
    assert record.owner == owner
    # Its owner, back after all, is fenced out: its next write is refused.
    assert store.write([Finish(("t", 1, TaskStatus.COMPLETED, 9.0, None, None, None))]) == ["t"]
    if owner is not None:
        assert store.taken_over(owner, {"t": 1}) == ["t"]
    assert store.execution("t") == record
    again = store.command("cancel", task_id="t", who=WHO)
    assert (again.changed, again.detail) == (False, "already finished (cancelled)")


# ---------------------------------------------------------------------- the log


def test_commands_after_a_seq_and_a_limit(make_store):
    store = make_store()
    for i in range(5):
        store.command("pause", name=f"n{i}", who=WHO)
    assert [c.seq for c in store.commands(after=2)] == [3, 4, 5]
    assert [c.seq for c in store.commands(after=1, limit=2)] == [2, 3]
    assert store.commands(after=5) == []
    assert store.commands(limit=0) == []
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="after must be an int >= 0"):
            store.commands(after=bad)
    with pytest.raises(ValueError, match="limit must be None or an int >= 0"):
        store.commands(limit=-1)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_two_stores_on_one_database_see_one_log(store_maker, kind):
    """Two processes' view: the commands of both, one seq, in order."""
    one, two = store_maker(kind), store_maker(kind)
    seqs = []
    for i in range(6):
        store = (one, two)[i % 2]
        seqs.append(store.command("pause" if i % 3 else "resume", key=f"k{i % 2}", who=WHO).seq)
    assert seqs == sorted(seqs) == list(range(1, 7))
    assert one.commands() == two.commands()
    assert [c.seq for c in two.commands(after=3)] == [4, 5, 6]
    assert one.pauses() == two.pauses()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_poller_never_skips_a_command_committed_late(store_maker, kind):
    """Commands from four threads (four store objects: four connections) while a
    poller reads what follows the last seq it saw: it sees every seq, in order,
    none skipped (PostgreSQL hands out seqs before commit: commands take turns
    so that a lower seq never commits after a higher one is read)."""
    stores = [store_maker(kind, inline=False) for _ in range(5)]
    poller, senders = stores[0], stores[1:]
    each = 25
    errors: list[BaseException] = []

    def send(store, n):
        try:
            for i in range(each):
                store.command("pause" if i % 2 else "resume", key=f"k{n}", who=WHO)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(s, n)) for n, s in enumerate(senders)]
    for thread in threads:
        thread.start()
    seen = 0
    try:
        while seen < each * len(senders) and not errors:
            got = [c.seq for c in poller.commands(after=seen)]
            assert got == list(range(seen + 1, seen + 1 + len(got)))
            seen += len(got)
    finally:
        for thread in threads:
            thread.join()
    assert errors == []
    assert seen == each * len(senders)


# ---------------------------------------------------------------------- requeue


def _dead_letters(store):
    """One execution of each kind a requeue may meet, in submission order."""
    store.write(
        [
            *ended("failed", TaskStatus.FAILED),
            *ended("timed", TaskStatus.TIMED_OUT),
            *ended("cancelled", TaskStatus.CANCELLED),
            *ended("completed", TaskStatus.COMPLETED),
            *ended("dropped", TaskStatus.DROPPED),
            *ended("step", TaskStatus.FAILED, run_id="run-1"),
            *ended("plain", TaskStatus.FAILED, spec=None, args=None),
            *ended("not json", TaskStatus.FAILED, args=None),
            submit("pending"),
            submit("running"),
            Start(("running", 1, 1, 2.0)),
        ]
    )


def test_requeue_by_id_takes_failed_timed_out_and_cancelled_and_refuses_the_rest(make_store):
    clock = Clock()
    store = make_store(clock=clock)
    _dead_letters(store)
    asked = ["timed", "nope", "failed", "completed", "dropped", "step", "plain", "not json"]
    asked += ["pending", "running", "cancelled", "failed"]  # (twice: pending by then)
    before = {t: store.execution(t) for t in ("failed", "timed", "cancelled")}
    got = store.requeue(asked, who=WHO)
    assert [r.task_id for r in got.requeued] == ["timed", "failed", "cancelled"]
    assert got.refused == [
        ("nope", "no such task"),
        ("completed", "completed"),
        ("dropped", "dropped"),
        ("step", "a workflow step: resume its run"),
        ("plain", NOT_RECREATABLE),
        ("not json", NOT_RECREATABLE),
        ("pending", "still pending"),
        ("running", "still running"),
        ("failed", "still pending"),
    ]
    for record in got.requeued:
        old = before[record.task_id]
        assert record == store.execution(record.task_id)  # as it is now
        assert record == attrs.evolve(
            old,
            status=TaskStatus.PENDING,
            owner=None,
            lease_expires_at=None,
            version=2,
            recovery_attempts=0,
            finished_at=None,
            waiting_on="slot",
        )  # attempt, error and traceback kept
        assert record.traceback == f"Traceback {record.task_id}"
    assert got.command == Command(
        seq=1,
        kind="retry",
        who=WHO,
        at=clock.now,
        changed=True,
        detail="requeued 3, refused 9",
    )
    assert store.commands() == [got.command]


def test_requeue_of_one_id_names_it_in_its_command(make_store):
    store = make_store()
    store.write(ended(ODD, TaskStatus.FAILED))
    got = store.requeue([ODD], who=WHO)
    assert isinstance(got, Requeued)
    assert (got.command.task_id, got.command.changed) == (ODD, True)
    assert got.command.detail == "requeued 1, refused 0"
    again = store.requeue([ODD], who=WHO)
    assert again.refused == [(ODD, "still pending")]
    assert (again.command.changed, again.command.detail) == (False, "requeued 0, refused 1")
    nothing = store.requeue([], who=WHO)
    assert (nothing.requeued, nothing.refused, nothing.command.task_id) == ([], [], None)
    assert len(store.commands()) == 3


def test_requeue_of_every_failed_execution_oldest_first(make_store):
    store = make_store()
    _dead_letters(store)
    store.write(ended("late", TaskStatus.FAILED, name=ODD, at=50.0))
    got = store.requeue(who=WHO)
    assert [r.task_id for r in got.requeued] == ["failed", "late"]
    assert got.refused == [
        ("step", "a workflow step: resume its run"),
        ("plain", NOT_RECREATABLE),
        ("not json", NOT_RECREATABLE),
    ]  # (timed out and cancelled ones only when asked by id)
    assert (got.command.task_id, got.command.name) == (None, None)
    assert store.execution("timed").status is TaskStatus.TIMED_OUT


def test_requeue_of_the_failed_executions_of_a_name_since_a_time(make_store):
    store = make_store()
    store.write(
        [
            *ended("a-early", TaskStatus.FAILED, name=ODD, at=10.0),
            *ended("b-other", TaskStatus.FAILED, name="other", at=30.0),
            *ended("c-late", TaskStatus.FAILED, name=ODD, at=30.0),
            *ended("d-exact", TaskStatus.FAILED, name=ODD, at=20.0),
        ]
    )
    got = store.requeue(name=ODD, since=20, who=WHO)
    assert [r.task_id for r in got.requeued] == ["c-late", "d-exact"]
    assert (got.command.name, got.command.detail) == (ODD, "requeued 2, refused 0")
    assert [r.task_id for r in store.requeue(since=0.0, who=WHO).requeued] == [
        "a-early",
        "b-other",
    ]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"task_ids": "t1"}, "task_ids must be a sequence of task ids"),
        ({"task_ids": ["t1"], "name": "job"}, "give them without task_ids"),
        ({"task_ids": ["t1"], "since": 1.0}, "give them without task_ids"),
        ({"task_ids": ["ok", ""]}, "task_id must not be empty"),
        ({"name": "a\x00"}, "cannot be stored: it holds a NUL"),
        ({"since": "yesterday"}, "since must be seconds"),
        ({"since": True}, "since must be seconds"),
        ({"since": float("nan")}, "since must be seconds"),
    ],
)
def test_a_requeue_that_cannot_be_carried_out_is_refused(make_store, args, match):
    store = make_store()
    store.write(ended("ok", TaskStatus.FAILED))
    with pytest.raises(ValueError, match=match):
        store.requeue(**args, who=WHO)
    with pytest.raises(ValueError, match="who must be a str"):
        store.requeue(["ok"], who=None)
    assert store.commands() == []
    assert store.execution("ok").status is TaskStatus.FAILED


def test_recovery_claims_a_requeued_execution_and_runs_it_as_its_next_attempt(make_store):
    clock = Clock()
    store = make_store(clock=clock)
    store.heartbeat("A", clock.now + 60)  # (its old owner lives: the row has no owner now)
    store.heartbeat("C", clock.now + 60)
    store.write(ended("dead", TaskStatus.FAILED))
    store.requeue(["dead"], who=WHO)
    found = store.recover("C", clock.now, lambda r: True, 3)
    assert (found.orphaned, found.abandoned) == ([], [])
    [claimed] = found.claimed
    assert claimed.task_id == "dead"
    # (a requeue is no lease expiry: its claim counts no recovery attempt; issue 30 item 7)
    assert (claimed.owner, claimed.version, claimed.recovery_attempts) == ("C", 3, 0)
    assert (claimed.status, claimed.attempt, claimed.waiting_on) == (TaskStatus.PENDING, 1, "slot")
    assert store.recover("D", clock.now, lambda r: True, 3).claimed == []  # C's now
    assert (
        store.write(
            [
                Start(("dead", 3, 2, 7.0)),
                Finish(("dead", 3, TaskStatus.COMPLETED, 8.0, None, None, None)),
            ]
        )
        == []
    )
    record = store.execution("dead")
    assert (record.status, record.attempt, record.error, record.traceback) == (
        TaskStatus.COMPLETED,
        2,
        None,
        None,
    )  # its finish overwrote the error and traceback it was requeued with


def test_an_abandoned_execution_requeued_is_recovered_again(make_store):
    """Recovery gave up on it (FAILED 'abandoned'); a requeue resets its count."""
    clock = Clock()
    store = make_store(clock=clock)
    store.write([submit("lost", "gone")])  # its owner has no lease
    assert [r.task_id for r in store.recover("C", clock.now, lambda r: True, 1).claimed] == [
        "lost"
    ]  # C has no lease either
    found = store.recover("D", clock.now, lambda r: True, 1)
    assert [(r.task_id, r.recovery_attempts) for r in found.abandoned] == [("lost", 1)]
    assert store.execution("lost").error.startswith("abandoned")
    [again] = store.requeue(who=WHO).requeued
    assert (again.recovery_attempts, again.version) == (0, 3)
    assert [r.task_id for r in store.recover("E", clock.now, lambda r: True, 1).claimed] == ["lost"]


def test_a_requeued_execution_waits_for_an_executor_that_can_recreate_it(make_store):
    store = make_store()
    store.write(ended("dead", TaskStatus.FAILED))
    store.requeue(["dead"], who=WHO)
    # An executor without its spec leaves it (a dead owner's would be orphaned)...
    found = store.recover("C", 10.0, lambda r: False, 3)
    assert (found.claimed, found.orphaned, found.abandoned) == ([], [], [])
    record = store.execution("dead")
    assert (record.status, record.owner) == (TaskStatus.PENDING, None)
    # ...for one that has it.
    [claimed] = store.recover("D", 10.0, lambda r: True, 3).claimed
    assert (claimed.task_id, claimed.owner) == ("dead", "D")


def test_cancel_of_a_requeued_execution_is_done_by_the_store(make_store):
    store = make_store()
    store.write(ended("dead", TaskStatus.FAILED))
    store.requeue(["dead"], who=WHO)
    got = store.command("cancel", task_id="dead", who=WHO)
    assert got.detail == "cancelled in the store (no live owner)"
    record = store.execution("dead")
    assert (record.status, record.version, record.traceback) == (TaskStatus.CANCELLED, 3, None)


# ---------------------------------------------------------------------- finish


def _finish(task_id, *extra):
    traceback, args = (*extra, None, None)[:2]
    return Finish((task_id, 1, TaskStatus.FAILED, 5.0, "ValueError('x')", traceback, args))


@pytest.mark.parametrize("batch", ["apart", "one batch", "row"])
def test_a_finish_records_the_traceback_and_arguments_the_row_lacks(make_store, batch):
    store = make_store()
    cases = {
        "tb": (None, (_finish("tb", "Traceback (most recent call last):\n  🚀"),)),
        "args": (None, (_finish("args", "tb", '["a", 1]'),)),
        "kept": ("[1]", (_finish("kept", "tb", '["other"]'),)),
        "old": ("[1]", (_finish("old"),)),
        "none": (None, (_finish("none", None, None),)),
    }
    for task_id, (args, finish) in cases.items():
        changes = [submit(task_id, spec=None, args=args), Start((task_id, 1, 1, 2.0)), *finish]
        if batch == "apart":
            for change in changes:
                assert store.write([change]) == []
        elif batch == "one batch":
            assert store.write(changes) == []
        else:
            row = changes[0]
            assert all(fold_row(row, change) for change in changes[1:])
            assert store.write([row]) == []
    got = {t: store.execution(t) for t in cases}
    assert got["tb"].traceback == "Traceback (most recent call last):\n  🚀"
    assert (got["tb"].args, got["tb"].error) == (None, "ValueError('x')")
    assert (got["args"].traceback, got["args"].args) == ("tb", '["a", 1]')
    assert (got["kept"].traceback, got["kept"].args) == ("tb", "[1]")  # args only if none
    assert (got["old"].traceback, got["old"].args) == (None, "[1]")
    assert (got["none"].traceback, got["none"].args) == (None, None)
    assert not got["args"].recreatable  # (no spec id: shown, not re-created)


# ---------------------------------------------------------------------- migrations


def test_a_sqlite_file_of_schema_9_migrates_and_keeps_its_rows(tmp_path):
    path = tmp_path / "runs.db"
    db = sqlite_utils.Database(path)
    _sqlite_schema.MIGRATIONS.apply(db, stop_before="0010_control")
    db.execute(
        "INSERT INTO executions (task_id, name, status, attempt, recovery_attempts, owner,"
        " version, submitted_at, finished_at, error, spec_id, args, waiting_on)"
        " VALUES (?, 'job', 'failed', 1, 0, 'A', 1, 1.0, 2.0, 'boom', 'spec', '[]', NULL)",
        [ODD],
    )
    db.conn.commit()
    db.close()
    with SQLiteStore(path, inline=True) as store:
        record = store.execution(ODD)
        assert (record.status, record.error, record.traceback) == (TaskStatus.FAILED, "boom", None)
        assert store.commands() == []
        assert store.pauses() == []
        assert store.requeue([ODD], who=WHO).command.seq == 1
        assert store.command("pause", name=ODD, who=WHO).seq == 2
    with closing(sqlite3.connect(path)) as conn:
        version = conn.execute(
            "SELECT value FROM trioexec_meta WHERE key = 'schema_version'"
        ).fetchone()
    assert version == (str(_sqlite_schema.SCHEMA_VERSION),)  # (10, and on)


def test_a_postgres_schema_of_version_6_migrates_and_keeps_its_rows(postgres_url, pg_schema):
    before = 6
    with schema_at_version(postgres_url, pg_schema, before) as conn:
        conn.execute(
            "INSERT INTO executions (task_id, name, status, attempt, owner, submitted_at,"
            " finished_at, error, spec_id, args) VALUES (%s, 'job', 'failed', 1, 'A', 1.0, 2.0,"
            " 'boom', 'spec', '[]')",
            (ODD,),
        )
    with PostgresStore(postgres_url, schema=pg_schema, inline=True) as store:
        assert store.execution(ODD).traceback is None
        assert store.commands() == []
        assert [r.task_id for r in store.requeue(who=WHO).requeued] == [ODD]
    assert _pg_schema.SCHEMA_VERSION >= 7  # (migrated through 7, and on)


# ---------------------------------------------------------------------- notification


def _waiter(store, timeout):
    """A thread blocked in ``store.wait_for_command(timeout)``, and its answer."""
    answer: list[object] = []

    def wait():
        try:
            answer.append(store.wait_for_command(timeout))
        except BaseException as exc:  # (shown by the test, not lost in the thread)
            answer.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, answer


def test_a_command_wakes_a_listener_on_another_store_object(store_maker):
    sender, listener = store_maker("postgres"), store_maker("postgres")
    assert listener.wait_for_command(0) is False  # listening from now on
    thread, answer = _waiter(listener, 60)
    sender.command("pause", name=ODD, who=WHO)
    thread.join(60)
    assert answer == [True]
    thread, answer = _waiter(listener, 60)
    sender.requeue(who=WHO)  # a requeue is a command too
    thread.join(60)
    assert answer == [True]
    assert listener.wait_for_command(0) is False  # (each notification wakes one wait)


def test_a_command_on_another_schema_does_not_wake_a_listener(store_maker, postgres_url):
    listener = store_maker("postgres")
    other = PostgresStore(postgres_url, schema=f"{listener.schema}_b", inline=True)
    try:
        assert listener.wait_for_command(0) is False
        other.command("pause", name=ODD, who=WHO)
        listener.command("pause", name="here", who=WHO)
        assert listener.wait_for_command(10) is True  # its own: the other's came first
        assert listener.wait_for_command(0.05) is False  # (the other's never woke it)
    finally:
        other.close()
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {listener.schema}_b CASCADE")


def test_close_wakes_a_listener_and_later_waits_fail(store_maker):
    listener = store_maker("postgres")
    assert listener.wait_for_command(0) is False
    thread, answer = _waiter(listener, 600)
    listener.close()  # long before the wait's 600 s
    thread.join(60)
    assert not thread.is_alive()
    assert answer == [False]  # (woken by close: no command came)
    with pytest.raises(StoreError, match="closed"):
        listener.wait_for_command(0)


def test_wait_for_command_checks_its_timeout(store_maker):
    store = store_maker("postgres")
    for bad in (-1, float("inf"), True, "1"):
        with pytest.raises(ValueError, match="timeout must be seconds"):
            store.wait_for_command(bad)
    assert not hasattr(store_maker("sqlite"), "wait_for_command")
    assert not hasattr(store_maker("memory"), "wait_for_command")
