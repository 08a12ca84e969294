"""`MemoryStore`: the SQLite store's code on a database in memory. What is its
own: each store's database is private, lives while the store or a durable store
on it is open, is freed quietly when dropped unclosed, and needs SQLite 3.36."""

from __future__ import annotations

import gc
import sqlite3
import warnings

import pytest

from trioexec import MemoryStore, StoreError
from trioexec.durable import DurableStore

START = 1_000.0


async def test_each_memory_store_has_a_database_of_its_own() -> None:
    with MemoryStore() as a, MemoryStore() as b, DurableStore(a) as da, DurableStore(b) as db:
        await da.promises.create("p", 60)
        assert (await da.promises.get("p")) is not None
        assert (await db.promises.get("p")) is None


async def test_durable_stores_on_one_memory_store_share_it_while_one_is_open() -> None:
    store = MemoryStore()
    with DurableStore(store) as one, DurableStore(store) as two:
        await one.promises.create("shared", 60)
        assert (await two.promises.get("shared")) is not None
        store.close()  # the database lives on while a durable store on it is open
        assert (await two.promises.get("shared")) is not None


def test_a_memory_store_dropped_unclosed_frees_its_database_without_a_warning() -> None:
    store = MemoryStore()
    store.heartbeat("owner", START + 60)
    assert store.execution("missing") is None  # (a reader of this thread, checked out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (Python 3.13 warns of an unclosed connection)
        del store
        gc.collect()


async def test_a_durable_store_on_a_memory_store_both_dropped_unclosed_warn_nothing() -> None:
    ds = DurableStore(MemoryStore())  # (as tests, and API.md's example, write it)
    await ds.promises.create("p", 60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        del ds
        gc.collect()


def test_after_close_every_call_names_the_closed_store() -> None:
    store = MemoryStore()
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="memory store: the store is closed"):
        store.executions()
    with pytest.raises(StoreError, match="memory store: the store is closed"):
        store.heartbeat("owner", START)


def test_an_old_sqlite_is_refused_naming_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 35, 5))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.35.5")
    with pytest.raises(StoreError, match=r"3\.36 or later; this Python's is 3\.35\.5"):
        MemoryStore()
