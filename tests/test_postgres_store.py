"""What is PostgreSQL's own in `PostgresStore` (the behaviour it shares with the
other stores is in the conformance tests): schemas, migrations, read-only views,
what errors name, and `open_store`."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import psycopg
import pytest

import trioexec
from trioexec import PostgresStore, SQLiteStore, StoreError, TaskStatus, open_store
from trioexec._changes import Start, submitted
from trioexec._store._pg_schema import SCHEMA_VERSION
from trioexec.durable import DurableStore


def submit(task_id: str, owner: str = "me") -> tuple[object, ...]:
    return submitted(task_id, 1, "job", None, None, None, owner, 1.0)


def test_two_schemas_in_one_database_do_not_see_each_other(postgres_url: str) -> None:
    with (
        PostgresStore(postgres_url, schema="app_one") as one,
        PostgresStore(postgres_url, schema="app_two") as two,
    ):
        try:
            assert one.write([submit("a")]) == []
            assert two.execution("a") is None
            assert [r.task_id for r in one.executions()] == ["a"]
        finally:
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute("DROP SCHEMA app_one CASCADE")
                conn.execute("DROP SCHEMA app_two CASCADE")


def test_many_processes_opening_a_new_schema_at_once_migrate_it_once(
    postgres_url: str, pg_schema: str
) -> None:
    def open_and_write(k: int) -> list[str]:
        with PostgresStore(postgres_url, schema=pg_schema) as store:
            return store.write([submit(f"t{k}")])

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(open_and_write, range(8))) == [[]] * 8
    with PostgresStore(postgres_url, schema=pg_schema) as store:
        assert sorted(r.task_id for r in store.executions()) == [f"t{k}" for k in range(8)]
    with psycopg.connect(postgres_url) as conn:
        version = conn.execute(
            f"SELECT value FROM {pg_schema}.trioexec_meta WHERE key = 'schema_version'"
        ).fetchone()
    assert version == (str(SCHEMA_VERSION),)


def test_a_schema_with_foreign_tables_is_left_alone(postgres_url: str, pg_schema: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {pg_schema}")
        conn.execute(f"CREATE TABLE {pg_schema}.invoices (id int)")
    with pytest.raises(StoreError, match=r"not trioexec's \(it has tables invoices"):
        PostgresStore(postgres_url, schema=pg_schema)
    with psycopg.connect(postgres_url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (pg_schema,),
        ).fetchall()
    assert tables == [("invoices",)]


def test_a_schema_from_a_newer_trioexec_is_refused(postgres_url: str, pg_schema: str) -> None:
    PostgresStore(postgres_url, schema=pg_schema).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {pg_schema}.trioexec_meta SET value = %s WHERE key = 'schema_version'",
            (str(SCHEMA_VERSION + 1),),
        )
    for read_only in (False, True):
        with pytest.raises(StoreError, match="written by a newer trioexec"):
            PostgresStore(postgres_url, schema=pg_schema, read_only=read_only)


def test_read_only_never_creates_or_writes(postgres_url: str, pg_schema: str) -> None:
    with pytest.raises(StoreError, match="no trioexec schema there"):
        PostgresStore(postgres_url, schema=pg_schema, read_only=True)
    with psycopg.connect(postgres_url) as conn:
        assert (
            conn.execute(
                "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (pg_schema,)
            ).fetchone()
            is None
        )
    with PostgresStore(postgres_url, schema=pg_schema) as writer:
        writer.write([submit("a")])
    with PostgresStore(postgres_url, schema=pg_schema, read_only=True) as view:
        assert view.execution("a") is not None
        assert view.counts()[TaskStatus.PENDING] == 1
        with pytest.raises(StoreError, match="opened read-only"):
            view.write([submit("b")])
        with pytest.raises(StoreError, match="opened read-only"):
            view.heartbeat("me", 1.0)


def test_an_execution_another_host_inserted_first_is_refused(
    postgres_url: str, pg_schema: str
) -> None:
    with (
        PostgresStore(postgres_url, schema=pg_schema) as a,
        PostgresStore(postgres_url, schema=pg_schema) as b,
    ):
        assert a.write([submit("same", owner="a")]) == []
        assert set(b.write([submit("same", owner="b"), Start(("same", 1, 1, 2.0))])) == {"same"}
        record = a.execution("same")
        assert record is not None
        assert (record.owner, record.status) == ("a", TaskStatus.PENDING)


def test_errors_and_reprs_never_show_the_password(postgres_url: str) -> None:
    url = "postgresql://someone:s3cret@127.0.0.1:1/nothing"
    with pytest.raises(StoreError) as caught:
        PostgresStore(url)
    assert "s3cret" not in str(caught.value)
    assert "someone:***@127.0.0.1:1" in str(caught.value)
    with PostgresStore(postgres_url, schema="trioexec_repr") as store:
        try:
            assert repr(store) == f"<PostgresStore {postgres_url!r} schema='trioexec_repr'>"
        finally:
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute("DROP SCHEMA trioexec_repr CASCADE")


@pytest.mark.parametrize("schema", ["", "1abc", "a-b", "x" * 64, "a b", "robert'); drop", None])
def test_a_bad_schema_name_is_a_value_error_naming_it(schema: object) -> None:
    with pytest.raises(ValueError, match="schema must be a PostgreSQL identifier") as caught:
        PostgresStore("postgresql://127.0.0.1:1/x", schema=schema)  # type: ignore[arg-type]
    assert repr(schema) in str(caught.value)


def test_a_closed_store_says_so(postgres_url: str, pg_schema: str) -> None:
    store = PostgresStore(postgres_url, schema=pg_schema)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="the store is closed"):
        store.execution("a")


def test_without_the_extra_the_error_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['psycopg_pool'] = None\n"
        "import trioexec\n"
        "try:\n"
        "    trioexec.PostgresStore('postgresql://127.0.0.1:1/x')\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert "pip install 'trioexec[postgres]'" in out


def test_open_store_names_the_store_by_its_target(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for target, path in [
        ("runs.db", "runs.db"),
        (tmp_path / "p.db", str(tmp_path / "p.db")),
        ("sqlite:///rel.db", "rel.db"),
        (f"sqlite:///{tmp_path}/abs.db", f"{tmp_path}/abs.db"),
        ("sqlite:///with%20space.db", "with space.db"),
    ]:
        with open_store(target) as store:
            assert isinstance(store, SQLiteStore)
            assert store.path == path
    assert (tmp_path / "with space.db").exists()
    with open_store(postgres_url, schema="trioexec_open") as pg:
        try:
            assert isinstance(pg, PostgresStore)
        finally:
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute("DROP SCHEMA trioexec_open CASCADE")
    with pytest.raises(ValueError, match="unknown store URL scheme 'mysql'"):
        open_store("mysql://db/app")
    with pytest.raises(ValueError, match="no database path"):
        open_store("sqlite:///")
    with pytest.raises(TypeError, match="a path or a URL"):
        open_store(42)  # type: ignore[arg-type]
    assert trioexec.open_store is open_store


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:s3cret@h:5/db", "postgresql://u:***@h:5/db"),
        ("postgresql://u:p%40s3cret@h/db", "postgresql://u:***@h/db"),
        (
            "postgresql://u@h/db?password=s3cret&sslmode=require",
            "postgresql://u@h/db?password=***&sslmode=require",
        ),
        ("host=h password=s3cret dbname=db", "host=h password=*** dbname=db"),
        ("host=h password='s 3cret' dbname=db", "host=h password=*** dbname=db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        # mistyped: a raw %, @ or /, a broken IPv6 host, another scheme
        ("postgresql://u:s3%cret@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:s3@c/ret@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:s3cret@[::1/db", "postgresql://u:***@[::1/db"),
        ("postgresql+psycopg://u:s3cret@h/db", "postgresql+psycopg://u:***@h/db"),
        ("postgresql://:s3cret@h/db", "postgresql://:***@h/db"),
    ],
)
def test_every_form_of_password_is_hidden(url: str, shown: str) -> None:
    from trioexec._store._pg_conn import redact

    assert redact(url) == shown


#: Mistyped URLs whose password `open_store` or libpq quoted (issue 30): a raw
#: ``%`` in the password, a broken IPv6 host, a SQLAlchemy-style scheme.
MISTYPED = [
    "postgresql://alice:t0p%secret@127.0.0.1:1/db",
    "postgresql://alice:t0psecret@[::1/db",
    "postgresql+psycopg://alice:t0psecret@127.0.0.1:1/db",
]


def everything_said(exc: BaseException) -> str:
    """What a traceback of ``exc`` prints (its chain of causes and contexts
    included), and its repr."""
    return "".join(traceback.format_exception(exc)) + repr(exc)


@pytest.mark.parametrize("url", MISTYPED)
@pytest.mark.parametrize(
    "opener", [open_store, PostgresStore, DurableStore], ids=lambda f: f.__name__
)
def test_a_mistyped_url_is_refused_without_its_password(url: str, opener: Any) -> None:
    with pytest.raises((StoreError, ValueError)) as caught:
        opener(url)
    assert "alice:***@" in str(caught.value)  # (it still says which URL)
    assert "t0p" not in everything_said(caught.value)


def test_mask_masks_a_password_a_message_quotes_alone() -> None:
    from trioexec._store._pg_conn import mask

    url = "postgresql://postgres:postgres@h/db"
    said = 'role "postgres" of postgresql://postgres:postgres@h/db; token: "postgres"'
    assert mask(said, url) == 'role "***" of postgresql://***:***@h/db; token: "***"'
    assert mask("postgresql and postgres_fdw", url) == "postgresql and postgres_fdw"


def test_an_id_inserted_by_another_host_during_the_write_is_refused_not_lost(
    postgres_url: str, pg_schema: str
) -> None:
    """The race the batch's existence check cannot see: another host inserts the
    same id after the check and before the insert. Only that id is refused; the
    rest of the batch is written."""
    with PostgresStore(postgres_url, schema=pg_schema) as store:
        with psycopg.connect(postgres_url) as other:
            other.execute(f"SET search_path TO {pg_schema}")
            other.execute(
                "INSERT INTO executions (task_id, name, status, owner) VALUES"
                " ('raced', 'job', 'pending', 'other')"
            )  # not committed yet: the store's check does not see it
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                writing = pool.submit(store.write, [submit("first"), submit("raced")])
                with psycopg.connect(postgres_url, autocommit=True) as watcher:
                    while not watcher.execute(  # the insert waits on the other's key
                        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND query LIKE 'INSERT INTO executions%%'"
                    ).fetchone():
                        assert not writing.done(), writing.result()
                other.commit()
                assert writing.result(timeout=30) == ["raced"]
        assert store.execution("first") is not None
        raced = store.execution("raced")
        assert raced is not None
        assert raced.owner == "other"
