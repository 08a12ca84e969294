"""The commands log is bounded (issue 30 item 19, its commands part).

Every command was kept forever, and every executor read the whole log as it
started, only to learn the newest seq. Now an executor starts from
`Store.last_command_seq` and the pauses (a bounded number of rows, however long
the log), and the log keeps the newest `KEEP_COMMANDS` commands and those of the
last `KEEP_SECONDS`; older commands, and targets resumed that long ago, are
deleted as new commands are recorded. What is paused is still right after: a
pause whose command was pruned long ago stays paused.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from pg_server import schema_at_version

import trioexec
from trioexec import PostgresStore, SQLiteStore
from trioexec._store import Pause, _control, _pg_schema, _sqlite_schema

WHO = "ops@host pid 7"


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_log_keeps_the_newest_and_the_last_hour_and_pauses_stay_right(
    make_store: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # (smaller than the defaults, 1,000 and 100, for a short test)
    monkeypatch.setattr(_control, "KEEP_COMMANDS", 40, raising=False)
    monkeypatch.setattr(_control, "PRUNE_EVERY", 10, raising=False)
    clock = Clock()
    store = make_store(clock=clock)
    store.command("pause", name="kept", who=WHO)  # paused for good: seq 1
    store.command("pause", key="gone", who=WHO)
    store.command("resume", key="gone", who=WHO)
    for i in range(197):  # seq 4..200, one a minute: 3 h 17 min of commands
        clock.now += 60.0
        store.command("cancel", task_id=f"t{i}", who=WHO)
    log = store.commands()
    assert log[-1].seq == 200
    # Those of the last hour (61, its start included) are more than the newest
    # 40: all kept, nothing older (deleted at seq 200: issued before 1 h ago).
    assert [c.seq for c in log] == list(range(140, 201))
    assert all(c.at >= clock.now - 3_600.0 for c in log)
    assert store.commands(after=190, limit=3)[0].seq == 191
    assert store.pauses() == [Pause(kind="name", value="kept", who=WHO, at=1_000.0)]
    # A quiet day later, the next prune keeps the newest 40 only.
    clock.now += 86_400.0
    for i in range(10):
        store.command("cancel", task_id=f"later{i}", who=WHO)
    assert [c.seq for c in store.commands()] == list(range(171, 211))
    assert [p.value for p in store.pauses()] == ["kept"]
    # The resumed target was forgotten; pausing it again is a new pause.
    assert store.command("pause", key="gone", who=WHO).detail == "paused"


class Counting:
    """A store (forwarded to the real one) that counts the rows its reads return."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.rows: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if not callable(found) or name in ("clock", "write", "heartbeat", "renew_lease"):
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            out = found(*args, **kwargs)
            self.rows[name] = self.rows.get(name, 0) + (len(out) if isinstance(out, list) else 1)
            return out

        return counted


async def test_an_executor_starts_reading_a_bounded_number_of_rows(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with SQLiteStore(path) as store:
        store.command("pause", name="sync", who=WHO)
    many = 5_000
    with closing(sqlite3.connect(path)) as conn, conn:  # (the log of a busy year)
        conn.executemany(
            "INSERT INTO commands (kind, task_id, who, at, changed, detail)"
            " VALUES ('cancel', ?, ?, 2000.0, 0, 'no such task')",
            [(f"t{i}", WHO) for i in range(many)],
        )
    with SQLiteStore(path) as real:
        store = Counting(real)
        async with trioexec.open_executor(store=store) as ex:
            started = dict(store.rows)
            assert ex.paused() == (frozenset({"sync"}), frozenset())
        assert sum(started.values()) <= 5, started  # not the 5,001 commands
        assert real.last_command_seq() == many + 1


def test_a_sqlite_file_of_schema_11_migrates_its_pauses(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    db = sqlite_utils.Database(path)
    _sqlite_schema.MIGRATIONS.apply(db, stop_before="0012_command_order")
    db.execute("INSERT INTO pauses (kind, value, who, at) VALUES ('name', 'sync', 'ops', 5.0)")
    db.conn.commit()
    db.close()
    with SQLiteStore(path, inline=True, clock=lambda: 10.0) as store:
        assert store.pauses() == [Pause(kind="name", value="sync", who="ops", at=5.0)]
        # Its order is the pause's time: a resume issued before it is superseded.
        assert store.command("resume", name="sync", who="B", at=4.0).changed is False
        assert store.command("resume", name="sync", who="B").detail == "resumed"
        assert store.pauses() == []
    with closing(sqlite3.connect(path)) as conn:
        [(version,)] = conn.execute("SELECT value FROM trioexec_meta WHERE key = 'schema_version'")
    assert version == str(_sqlite_schema.SCHEMA_VERSION)  # (12, and on)


def test_a_postgres_schema_of_version_8_migrates_its_pauses(
    postgres_url: str, pg_schema: str
) -> None:
    before = 8
    with schema_at_version(postgres_url, pg_schema, before) as conn:
        conn.execute("INSERT INTO pauses (kind, value, who, at) VALUES ('key', 'k', 'ops', 5.0)")
    with PostgresStore(postgres_url, schema=pg_schema, inline=True, clock=lambda: 10.0) as store:
        assert store.pauses() == [Pause(kind="key", value="k", who="ops", at=5.0)]
        assert store.command("resume", key="k", who="B", at=4.0).changed is False
        assert store.command("resume", key="k", who="B").detail == "resumed"
        assert store.pauses() == []
    assert _pg_schema.SCHEMA_VERSION >= 9  # (migrated through 9, and on)


def test_the_newest_seq_is_where_the_log_ends(make_store: Callable[..., Any]) -> None:
    store = make_store()
    assert store.last_command_seq() == 0
    for i in range(3):
        store.command("pause", name=f"n{i}", who=WHO)
    store.requeue(who=WHO)
    assert store.last_command_seq() == store.commands()[-1].seq == 4
