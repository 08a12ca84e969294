"""Numbers no store column can hold (issue 30 item 13): an int past a 64-bit
column (``after=``, ``limit=``, a version) or one no float can hold (``since=``,
``deferred_longer_than=``, a durable ``timeout`` or ``ttl``) is one ValueError
naming the parameter and the value, on every store alike, before anything is
written; never a raw OverflowError, and never ``[]`` from one store where
another raises. The check is `stored_int` / `stored_float`, written once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from trioexec import MemoryStore
from trioexec.durable import DurableStore

HUGE = 10**400
INT64_MAX = 2**63 - 1
WHO = "ops@host pid 7"

# (what is called, the parameter its message names); each with HUGE in it.
STORE_CALLS: list[tuple[str, Callable[[Any, int], object], str]] = [
    ("commands after", lambda s, n: s.commands(after=n), "after"),
    ("commands limit", lambda s, n: s.commands(limit=n), "limit"),
    ("requeue since", lambda s, n: s.requeue(since=n, who=WHO), "since"),
    ("executions limit", lambda s, n: s.executions(limit=n), "limit"),
    (
        "executions deferred",
        lambda s, n: s.executions(deferred_longer_than=n),
        "deferred_longer_than",
    ),
    ("counts deferred", lambda s, n: s.counts(deferred_longer_than=n), "deferred_longer_than"),
]


@pytest.mark.parametrize(
    ("call", "param"), [(c, p) for _, c, p in STORE_CALLS], ids=[i for i, _, _ in STORE_CALLS]
)
def test_a_huge_int_is_one_value_error_naming_it_on_every_store(
    make_store: Any, call: Callable[[Any, int], object], param: str
) -> None:
    store = make_store()
    with pytest.raises(ValueError, match=rf"^{param}\b.*an int of 401 digits"):
        call(store, HUGE)
    assert store.commands() == []  # (a refused requeue recorded no command)


@pytest.mark.parametrize("param", ["after", "limit"])
def test_the_64_bit_edge_is_the_same_on_every_store(make_store: Any, param: str) -> None:
    store = make_store()
    assert store.commands(**{param: INT64_MAX}) == []
    with pytest.raises(ValueError, match=rf"{param} must be an int from 0 to 2\*\*63 - 1"):
        store.commands(**{param: INT64_MAX + 1})
    assert store.executions(limit=INT64_MAX) == []
    with pytest.raises(ValueError, match="limit must be an int from 0 to 2"):
        store.executions(limit=INT64_MAX + 1)


DURABLE_CALLS: list[tuple[str, Callable[[DurableStore, int], Any], str]] = [
    ("promise timeout", lambda ds, n: ds.promises.create("p", n), "timeout"),
    (
        "task timeout",
        lambda ds, n: ds.tasks.create("t", pid="w", ttl=1, timeout=n, target="x"),
        "timeout",
    ),
    ("task ttl", lambda ds, n: ds.tasks.create("t", pid="w", ttl=n, timeout=1, target="x"), "ttl"),
    ("acquire ttl", lambda ds, n: ds.tasks.acquire("t", 1, pid="w", ttl=n), "ttl"),
    ("acquire version", lambda ds, n: ds.tasks.acquire("t", n, pid="w", ttl=1), "version"),
    ("fulfill version", lambda ds, n: ds.tasks.fulfill("t", n), "version"),
    ("release version", lambda ds, n: ds.tasks.release("t", n), "version"),
    ("heartbeat version", lambda ds, n: ds.tasks.heartbeat("w", [("t", n)]), "version"),
    ("promise search limit", lambda ds, n: ds.promises.search(limit=n), "limit"),
    ("task search limit", lambda ds, n: ds.tasks.search(limit=n), "limit"),
    ("claim limit", lambda ds, n: ds.tasks.claim("x", pid="w", ttl=1, limit=n), "limit"),
]


@pytest.mark.parametrize(
    ("call", "param"), [(c, p) for _, c, p in DURABLE_CALLS], ids=[i for i, _, _ in DURABLE_CALLS]
)
async def test_a_huge_int_in_the_durable_protocol_is_one_value_error(
    make_store: Any, call: Callable[[DurableStore, int], Any], param: str
) -> None:
    with DurableStore(make_store()) as ds:
        with pytest.raises(ValueError, match=rf"^{param}\b.*an int of 401 digits"):
            await call(ds, HUGE)
        assert await ds.promises.get("p") is None  # nothing was created
        assert await ds.tasks.get("t") is None
        assert await ds.check_invariants() == []


async def test_durable_options_too_large_for_a_float_are_refused() -> None:
    with pytest.raises(ValueError, match="retry_timeout is too large for a float"):
        DurableStore(MemoryStore(), retry_timeout=HUGE)
    with DurableStore(MemoryStore()) as ds, pytest.raises(ValueError, match="poll is too large"):
        ds.promises.settled("p", poll=HUGE)


def test_the_checks() -> None:
    from trioexec._records import check_number, stored_int

    def stored_float(what, value):  # (what a store keeps: any float, NaN and inf too)
        return check_number(what, value, float, "a number of seconds", stored=True)

    assert stored_int("n", -(2**63)) == -(2**63)
    assert stored_int("n", INT64_MAX, minimum=1) == INT64_MAX
    for bad in (True, 1.0, "1", None):
        with pytest.raises(ValueError, match="n must be an int, got"):
            stored_int("n", bad)
    with pytest.raises(ValueError, match=r"n must be an int from 1 to 2\*\*63 - 1, got 0"):
        stored_int("n", 0, minimum=1)
    with pytest.raises(ValueError, match="got a negative int of 401 digits"):
        stored_int("n", -HUGE)
    # An int too long for str() (Python refuses past 4,300 digits) is still named.
    with pytest.raises(ValueError, match="got an int of 5001 digits"):
        stored_int("n", 10**5000)
    assert stored_float("s", 10**300) == 1e300
    assert stored_float("s", float("inf")) == float("inf")  # (the caller's range decides)
    with pytest.raises(ValueError, match="s is too large for a float"):
        stored_float("s", 2**1024)
    with pytest.raises(ValueError, match="s must be a number of seconds, got True"):
        stored_float("s", True)
