"""Fixtures every test module may use: the stores a conformance test runs over,
and a throwaway PostgreSQL server (started once per session, when a test asks)."""

from __future__ import annotations

import functools
import gc
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_server import STORE_KINDS, NoServer, postgres_server

#: Set (CI does): no server is a failure, not a skip.
REQUIRE_ENV = "TRIOEXEC_REQUIRE_POSTGRES"


def pytest_configure(config: pytest.Config) -> None:
    """Under ``PYTHONDONTWRITEBYTECODE`` (set in some environments: CI's here), every
    Python child a test starts (the CLI, workers, examples: hundreds a run) would
    compile anew each module of trioexec not compiled already, and this process
    would rewrite every test module's asserts, every run. Instead they keep their
    bytecode where the variable leaves the sources alone: in the system's
    temporary directory (``PYTHONPYCACHEPREFIX``), checked against the sources
    and kept between runs as ``__pycache__`` would be. A prefix already set is kept."""
    if not sys.dont_write_bytecode or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = os.path.join(tempfile.gettempdir(), "trioexec-tests-pycache")
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection built (every test module and item, the libraries: 350,000
    objects, most of what this process ever holds) lives until the run ends: it
    is moved out of the cycle collector's sight (`gc.freeze`), so that each
    collection, automatic or `_collect_garbage_per_module`'s, walks only what the
    tests made (each took up to a second late in a run)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_per_module() -> Iterator[None]:
    """A leaked resource (a store never closed: its SQLite connections warn on
    Python 3.13) fails the module that leaked it, at its end, not whichever
    later test the cycle collector happens to run in."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The URL of a PostgreSQL server for this test session."""
    server = postgres_server()
    try:
        url = server.__enter__()
    except NoServer as exc:
        message = f"NO POSTGRESQL SERVER COULD BE STARTED: {exc}"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{message} (and {REQUIRE_ENV} is set)")
        pytest.skip(message)
    try:
        yield url
    finally:
        server.__exit__(None, None, None)


@pytest.fixture
def pg_schema(postgres_url: str) -> Iterator[str]:
    """A schema of this test's own (dropped after it): tests share the server."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield schema
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def pg_database(postgres_url: str) -> Iterator[str]:
    """The URL of a database of this test's own (dropped after it): for tests
    that hand a store's URL to another process or a CLI command."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield postgres_url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgres"])
def db_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """What a process opens a store by (`trioexec.open_store`): a SQLite file's
    path, or a PostgreSQL database's URL."""
    if request.param == "sqlite":
        return str(tmp_path / "runs.db")
    return str(request.getfixturevalue("pg_database"))


@pytest.fixture
def store_maker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``make(kind, **kw)``: a store of ``kind`` ("memory", "sqlite" or "postgres")
    that writes inline (autojump-friendly). Stores made twice in one test share
    their data (the same file; the same schema), like two processes would; all
    are closed after the test."""
    import trioexec

    stores: list[Any] = []

    def make(kind: str, **kw: Any) -> Any:
        if kind == "memory":
            store: Any = trioexec.MemoryStore(**kw)
        elif kind == "sqlite":
            kw.setdefault("inline", True)
            store = trioexec.SQLiteStore(tmp_path / "runs.db", **kw)
        elif kind == "postgres":
            url = request.getfixturevalue("postgres_url")
            schema = request.getfixturevalue("pg_schema")
            kw.setdefault("inline", True)
            store = trioexec.PostgresStore(url, schema=schema, **kw)
        else:  # pragma: no cover - a typo in a test
            raise ValueError(kind)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture(params=STORE_KINDS)
def make_store(request: pytest.FixtureRequest, store_maker: Callable[..., Any]) -> Any:
    """``make_store(**kw)``: a store of this test's kind, one test per kind in
    ``STORE_KINDS`` (two made in one test share their data; see `store_maker`)."""
    return functools.partial(store_maker, request.param)
