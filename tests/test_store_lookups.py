"""A store's lookups agree on texts no store can hold (review of issue 30 item 15).

A task id, run id, key or status with a NUL (PostgreSQL's text cannot hold
one) or a lone surrogate (not UTF-8) is nothing any store holds, so it matches
nothing: `Store.execution` and `Store.run` answer None, `Store.executions` and
`Store.runs` an empty list, `Store.counts` zeros, on every store alike. They
were a `StoreError` on PostgreSQL (an outage, to its callers) and a raw
UnicodeEncodeError on SQLite. One that is not a str is a TypeError naming it
(memory and SQLite answered None). The rule is `trioexec._records.matchable`,
written once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from trioexec import TaskStatus
from trioexec._changes import submitted

UNHOLDABLE = ["a\x00b", "\x00", "\ud800", "a\udcffb"]

# (what is asked, its answer for a text no store holds); each asks for ``v``.
LOOKUPS: list[tuple[str, Callable[[Any, object], object], object]] = [
    ("execution", lambda s, v: s.execution(v), None),
    ("run", lambda s, v: s.run(v), None),
    ("runs status", lambda s, v: s.runs(status=v), []),
    ("executions run_id", lambda s, v: s.executions(run_id=v), []),
    ("executions key", lambda s, v: s.executions(key=v), []),
    ("executions key, newest", lambda s, v: s.executions(key=v, order="newest", limit=5), []),
    ("counts run_id", lambda s, v: s.counts(run_id=v), dict.fromkeys(TaskStatus, 0)),
    ("counts key", lambda s, v: s.counts(key=v), dict.fromkeys(TaskStatus, 0)),
]
# (what is asked, the name its TypeError gives the value)
NAMED = ["task_id", "run_id", "status", "run_id", "key", "key", "run_id", "key"]


def _submitted(store: Any) -> None:
    """One execution (of key "k", in run "r"), so that a lookup has rows to miss."""
    change = submitted("t", 1, "job", "r", None, None, "A", 1.0, "k", 0, "slot")
    assert store.write([change]) == []


@pytest.mark.parametrize("value", UNHOLDABLE, ids=["nul", "only nul", "surrogate", "surrogates"])
@pytest.mark.parametrize(
    ("lookup", "nothing"), [(f, n) for _, f, n in LOOKUPS], ids=[i for i, _, _ in LOOKUPS]
)
def test_a_text_no_store_can_hold_matches_nothing_on_every_store(
    make_store: Any, lookup: Callable[[Any, object], object], nothing: object, value: str
) -> None:
    store = make_store()
    _submitted(store)
    assert lookup(store, value) == nothing
    # (and the store still answers what it holds: nothing was taken for an outage)
    assert store.execution("t") is not None
    assert [r.task_id for r in store.executions(key="k", run_id="r")] == ["t"]
    assert store.counts(key="k")[TaskStatus.PENDING] == 1


@pytest.mark.parametrize("value", [5, b"t", 1.5], ids=["int", "bytes", "float"])
@pytest.mark.parametrize(
    ("lookup", "name"),
    [(f, n) for (_, f, _), n in zip(LOOKUPS, NAMED, strict=True)],
    ids=[i for i, _, _ in LOOKUPS],
)
def test_a_lookup_of_what_is_not_a_str_is_a_type_error_naming_it(
    make_store: Any, lookup: Callable[[Any, object], object], name: str, value: object
) -> None:
    store = make_store()
    _submitted(store)
    with pytest.raises(TypeError, match=rf"^{name} must be a str, got {type(value).__name__} "):
        lookup(store, value)
