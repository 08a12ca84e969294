"""Key limits shared through a store: `settle` (one key's arithmetic) and every
store's `key_round` (dead owners reclaimed, rows and buckets kept), across two
store objects on one database, after a migration, and in a state machine that
drives the memory and SQLite stores side by side."""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import random
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlite_utils
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from pg_server import schema_at_version
from store_rows import select

from trioexec import MemoryStore, PostgresStore, SQLiteStore, StoreError
from trioexec._store import _pg_schema, _sqlite_schema
from trioexec._store._key_ledger import Hold, KeyGrant, KeyRequest, settle

LONG = 1_000_000.0  # a lease that outlives the test


def req(
    key: str = "k",
    *,
    concurrency: int | None = 2,
    in_use: int = 0,
    wanted: int = 0,
    tokens: int = 0,
    rate: float | None = None,
    per: float = 1.0,
    returned: float = 0.0,
    late: float = 0.0,
) -> KeyRequest:
    return KeyRequest(
        key=key,
        concurrency=concurrency,
        rate=rate,
        per=per,
        in_use=in_use,
        wanted=wanted,
        tokens=tokens,
        returned=returned,
        late=late,
    )


class Clock:
    """A store clock the test moves by hand."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def holds(store: Any) -> dict[tuple[str, str], tuple[int, int]]:
    """Every ``key_holds`` row of ``store``: (key, owner) -> (held, wanted)."""
    rows = select(store, "SELECT key, owner, held, wanted FROM key_holds")
    return {(key, owner): (held, wanted) for key, owner, held, wanted in rows}


def buckets(store: Any) -> dict[str, tuple[float, float, float | None]]:
    """Every ``key_buckets`` row of ``store``: key -> (tokens, stamp, full_at)."""
    rows = select(store, "SELECT key, tokens, stamp, full_at FROM key_buckets")
    return {key: (tokens, stamp, full_at) for key, tokens, stamp, full_at in rows}


def held_in_all(store: Any, key: str = "k") -> int:
    return sum(held for (k, _), (held, _) in holds(store).items() if k == key)


# ---------------------------------------------------------------------- settle


def test_settle_never_grants_more_than_the_limit_across_owners() -> None:
    grant, row, bucket = settle(
        req(concurrency=5, wanted=4), [Hold("b", held=3, wanted=3)], None, 0.0
    )
    assert (grant.held, grant.usable) == (2, 2)
    assert row == Hold("", held=2, wanted=4, since=0.0)  # (waiting for two more from now on)
    assert bucket is None


def test_settle_gives_each_waiting_owner_its_share_rounded_up() -> None:
    # 5 slots, one other owner waiting (with its floor share): ceil(5 / 2) = 3.
    grant, _, _ = settle(req(concurrency=5, wanted=5), [Hold("b", held=2, wanted=5)], None, 0.0)
    assert (grant.held, grant.usable) == (3, 3)
    # Holding three while the other waits with two: keeps them, may use them.
    grant, _, _ = settle(
        req(concurrency=5, in_use=3, wanted=9), [Hold("b", held=2, wanted=5)], None, 0.0
    )
    assert (grant.held, grant.usable) == (3, 3)
    # Holding all five while the other waits with none: keeps them, may use two.
    grant, _, _ = settle(
        req(concurrency=5, in_use=5, wanted=9), [Hold("b", held=0, wanted=5)], None, 0.0
    )
    assert (grant.held, grant.usable) == (5, 2)
    # An owner that holds what it wants is not waiting: no share applies.
    grant, _, _ = settle(req(concurrency=5, wanted=5), [Hold("b", held=2, wanted=2)], None, 0.0)
    assert (grant.held, grant.usable) == (3, 3)


def test_settle_gives_way_to_a_waiter_below_the_floor_share() -> None:
    # 4 slots, 3 owners wanting: ceilings of 2 + 2 would keep the third at 0.
    others = [Hold("b", held=2, wanted=9), Hold("c", held=0, wanted=9)]
    grant, _, _ = settle(req(concurrency=4, in_use=2, wanted=9), others, None, 0.0)
    assert (grant.held, grant.usable) == (2, 1)  # floor(4 / 3): give one back
    grant, _, _ = settle(req(concurrency=4, in_use=1, wanted=9), others, None, 0.0)
    assert (grant.held, grant.usable) == (1, 1)
    # c then gets the slot; with every waiter at its floor, the ceiling again.
    grant, _, _ = settle(
        req(concurrency=4, wanted=9),
        [Hold("a", held=1, wanted=9), Hold("b", held=2, wanted=9)],
        None,
        0,
    )
    assert (grant.held, grant.usable) == (1, 1)
    others = [Hold("b", held=2, wanted=9), Hold("c", held=1, wanted=9)]
    grant, _, _ = settle(req(concurrency=4, in_use=1, wanted=9), others, None, 0.0)
    assert (grant.held, grant.usable) == (1, 1)  # (none free: the share is 2)
    grant, _, _ = settle(req(concurrency=5, in_use=1, wanted=9), others, None, 0.0)
    assert (grant.held, grant.usable) == (2, 2)


def test_settle_never_holds_less_than_in_use() -> None:
    grant, row, _ = settle(
        req(concurrency=2, in_use=2, wanted=2), [Hold("b", held=2, wanted=2)], None, 0.0
    )
    assert (grant.held, grant.usable) == (2, 2)  # (over: the caller let them through)
    assert row == Hold("", held=2, wanted=2)
    grant, _, _ = settle(
        req(concurrency=4, in_use=3, wanted=3), [Hold("b", held=0, wanted=4)], None, 0.0
    )
    assert (grant.held, grant.usable) == (3, 2)


def test_settle_deletes_a_row_that_holds_and_wants_nothing() -> None:
    _, row, _ = settle(req(concurrency=2), [Hold("b", held=1, wanted=1)], None, 0.0)
    assert row is None
    _, row, _ = settle(req(concurrency=2, wanted=1), [Hold("b", held=2, wanted=2)], None, 0.0)
    assert row == Hold(
        "", held=0, wanted=1, since=0.0
    )  # waiting: the others see it, and since when
    grant, row, _ = settle(req(concurrency=None, in_use=3, wanted=4), [], None, 0.0)
    assert (grant.held, grant.usable, row) == (3, 3, None)  # no limit: no row


def test_settle_bucket_starts_full_and_grants_at_most_rate() -> None:
    grant, _, bucket = settle(req(rate=3, per=2.0, tokens=5), [], None, 10.0)
    assert grant.tokens == 3
    assert bucket == (0.0, 10.0)
    assert grant.next_token_in == pytest.approx(2.0 / 3)
    grant, _, bucket = settle(req(rate=3, per=2.0, tokens=1), [], bucket, 10.0)
    assert (grant.tokens, bucket) == (0, (0.0, 10.0))


def test_settle_bucket_refills_with_time_up_to_rate() -> None:
    grant, _, bucket = settle(req(rate=2, tokens=5), [], (0.0, 10.0), 10.75)
    assert grant.tokens == 1
    assert bucket == pytest.approx((0.5, 10.75))
    assert grant.next_token_in == pytest.approx(0.25)
    grant, _, bucket = settle(req(rate=2, tokens=5), [], (0.0, 10.0), 500.0)
    assert (grant.tokens, bucket) == (2, (0.0, 500.0))  # capped at rate, not 980
    # A clock behind the stamp (another host's) neither refills nor moves it back.
    grant, _, bucket = settle(req(rate=2, tokens=1), [], (0.5, 10.0), 9.0)
    assert (grant.tokens, bucket) == (0, (0.5, 10.0))


def test_settle_returned_tokens_go_back_to_the_bucket_capped() -> None:
    grant, _, bucket = settle(req(rate=2, tokens=1, returned=1.0), [], (0.0, 10.0), 10.0)
    assert (grant.tokens, bucket) == (1, (0.0, 10.0))
    grant, _, bucket = settle(req(rate=2, returned=5.0), [], (1.5, 10.0), 10.0)
    assert (grant.tokens, grant.next_token_in, bucket) == (0, 0.0, None)  # full: deleted


def test_settle_says_when_the_bucket_would_have_been_full_and_takes_what_late_starts_owe() -> None:
    # Full (rate 2 per 1 s): taken now, it would have been full again at once.
    grant, _, bucket = settle(req(rate=2, tokens=1), [], None, 10.0)
    assert (grant.tokens, grant.full_in, bucket) == (1, 0.0, (1.0, 10.0))
    # Half a token short: full in a quarter of a second (before this grant).
    grant, _, bucket = settle(req(rate=2, tokens=1), [], (1.5, 10.0), 10.0)
    assert (grant.tokens, grant.full_in, bucket) == (1, 0.25, (0.5, 10.0))
    # A token that started 0.3 s after the bucket would have been full owes
    # 0.6 of a token: paid before anything is granted, even below zero.
    grant, _, bucket = settle(req(rate=2, tokens=1, late=0.6), [], (0.5, 10.0), 10.0)
    assert grant.tokens == 0
    assert bucket is not None
    assert bucket[0] == pytest.approx(-0.1)
    assert grant.next_token_in == pytest.approx(0.55)  # (1.1 tokens at 2 per second)


def test_settle_deletes_a_full_bucket() -> None:
    _, _, bucket = settle(req(rate=2), [], None, 10.0)
    assert bucket is None
    _, _, bucket = settle(req(rate=2), [], (1.0, 10.0), 10.5)
    assert bucket is None  # refilled to the brim
    grant, _, bucket = settle(req(rate=None, tokens=3), [], None, 10.0)
    assert (grant.tokens, grant.next_token_in, bucket) == (0, 0.0, None)


# ---------------------------------------------------------------------- key_round


def test_two_owners_never_hold_more_than_the_limit(make_store: Any) -> None:
    store = make_store(clock=Clock())
    store.heartbeat("A", LONG)
    store.heartbeat("B", LONG)
    assert store.key_round("A", [req(wanted=3)]) == [
        KeyGrant(key="k", held=2, usable=2, tokens=0, next_token_in=0.0)
    ]
    assert store.key_round("B", [req(wanted=3)]) == [
        KeyGrant(key="k", held=0, usable=0, tokens=0, next_token_in=0.0)
    ]
    assert holds(store) == {("k", "A"): (2, 3), ("k", "B"): (0, 3)}
    # B waits: A keeps its two running, may use one; B gets the first given back.
    assert store.key_round("A", [req(in_use=2, wanted=3)])[0].usable == 1
    assert store.key_round("B", [req(wanted=3)])[0].held == 0
    assert store.key_round("A", [req(in_use=1, wanted=3)])[0].held == 1
    assert store.key_round("B", [req(wanted=3)])[0] == KeyGrant(
        key="k", held=1, usable=1, tokens=0, next_token_in=0.0
    )
    assert held_in_all(store) == 2
    # Done: both rows go.
    store.key_round("A", [req()])
    store.key_round("B", [req()])
    assert holds(store) == {}


def test_a_second_owner_gets_its_share_once_the_first_gives_back(make_store: Any) -> None:
    store = make_store(clock=Clock())
    store.heartbeat("A", LONG)
    store.heartbeat("B", LONG)
    assert store.key_round("A", [req(concurrency=4, wanted=10)])[0].held == 4
    assert store.key_round("B", [req(concurrency=4, wanted=10)])[0].held == 0
    grant = store.key_round("A", [req(concurrency=4, in_use=4, wanted=10)])[0]
    assert (grant.held, grant.usable) == (4, 2)  # its share while B waits
    grant = store.key_round("A", [req(concurrency=4, in_use=2, wanted=10)])[0]
    assert (grant.held, grant.usable) == (2, 2)
    assert store.key_round("B", [req(concurrency=4, wanted=10)])[0].held == 2
    assert holds(store) == {("k", "A"): (2, 10), ("k", "B"): (2, 10)}


def test_a_dead_owners_slots_are_reclaimed_once_its_lease_expired(make_store: Any) -> None:
    clock = Clock(100.0)
    store = make_store(clock=clock)
    store.heartbeat("A", 110.0)
    store.heartbeat("B", LONG)
    assert store.key_round("A", [req(wanted=2)])[0].held == 2
    clock.now = 109.5
    assert store.key_round("B", [req(wanted=2)])[0].held == 0  # A is alive
    assert ("k", "A") in holds(store)
    clock.now = 110.0  # (a lease expiring now is still live, as `recover` has it)
    assert store.key_round("B", [req(wanted=2)])[0].held == 0
    clock.now = 110.5
    assert store.key_round("B", [req(wanted=2)])[0].held == 2
    assert holds(store) == {("k", "B"): (2, 2)}


def test_an_owner_without_a_lease_holds_nothing_for_the_others(make_store: Any) -> None:
    store = make_store(clock=Clock())
    store.heartbeat("B", LONG)
    store.key_round("ghost", [req(wanted=2)])  # (never heartbeat: not live)
    assert store.key_round("B", [req(wanted=2)])[0].held == 2
    assert holds(store) == {("k", "B"): (2, 2)}


def test_release_owner_gives_its_slots_back_at_once(make_store: Any) -> None:
    store = make_store(clock=Clock())
    store.heartbeat("A", LONG)
    store.heartbeat("B", LONG)
    store.key_round("A", [req(wanted=2), req("j", concurrency=1, wanted=1)])
    store.key_round("B", [req(wanted=2)])
    store.release_owner("A")
    assert holds(store) == {("k", "B"): (0, 2)}
    assert store.key_round("B", [req(wanted=2)])[0].held == 2


def test_the_bucket_grants_at_most_rate_and_refills_on_the_store_clock(make_store: Any) -> None:
    clock = Clock(100.0)
    store = make_store(clock=clock)
    store.heartbeat("A", LONG)
    store.heartbeat("B", LONG)
    limit = {"concurrency": None, "rate": 3.0, "per": 2.0}
    grant = store.key_round("A", [req(tokens=5, **limit)])[0]
    assert (grant.tokens, grant.next_token_in) == (3, pytest.approx(2.0 / 3))
    assert store.key_round("B", [req(tokens=1, **limit)])[0].tokens == 0  # one bucket
    clock.now = 101.0  # 1.5 tokens back
    grant = store.key_round("B", [req(tokens=2, **limit)])[0]
    assert (grant.tokens, grant.next_token_in) == (1, pytest.approx(1 / 3))
    clock.now = 1_000.0
    assert store.key_round("A", [req(tokens=9, **limit)])[0].tokens == 3  # capped at rate
    clock.now = 2_000.0
    assert store.key_round("A", [req(**limit)])[0].tokens == 0
    assert store.key_round("B", [req(tokens=1, returned=0.5, **limit)])[0].tokens == 1


def test_full_buckets_of_keys_used_once_are_pruned_by_later_rounds(make_store: Any) -> None:
    """Issue 30 (19): a key's bucket row went only when that key was settled
    again with its bucket full, so the rows of keys used once stayed forever. A
    full bucket is the same as no row: each round deletes those full by now,
    earliest first, at most one more than 16 for each key it settles."""
    clock = Clock(100.0)
    store = make_store(clock=clock)
    store.heartbeat("A", LONG)
    once = [f"once-{n:02}" for n in range(40)]
    grants = store.key_round("A", [req(key, concurrency=None, rate=1.0, tokens=1) for key in once])
    assert [g.tokens for g in grants] == [1] * 40
    slow = req("slow", concurrency=None, rate=1.0, per=100.0, tokens=1)
    assert store.key_round("A", [slow])[0].tokens == 1  # (full again at 200)
    assert buckets(store) == {
        **dict.fromkeys(once, (0.0, 100.0, 101.0)),  # (each full again at 101)
        "slow": (0.0, 100.0, 200.0),
    }
    other = req("other", concurrency=None, rate=1.0)  # (asks for nothing: no row)
    clock.now = 100.5
    store.key_round("A", [other])
    assert len(buckets(store)) == 41  # (none full yet: none goes)
    clock.now = 101.0
    store.key_round("A", [other])
    assert sorted(buckets(store)) == [*once[17:], "slow"]  # 1 + 16, earliest (then by key)
    store.key_round("A", [other, req("k")])
    assert sorted(buckets(store)) == [*once[35:], "slow"]  # 2 + 16
    store.key_round("A", [other])
    assert buckets(store) == {"slow": (0.0, 100.0, 200.0)}  # not full: kept
    # A key pruned is a key whose bucket is full: its next round finds it so.
    again = req("once-00", concurrency=None, rate=1.0, tokens=5)
    assert store.key_round("A", [again])[0].tokens == 1
    clock.now = 199.0
    assert store.key_round("A", [slow])[0].tokens == 0  # (the slow one was kept, and counts)
    clock.now = 500.0
    store.key_round("A", [])  # (a round of nothing prunes too: at most 16)
    assert buckets(store) == {}


def test_grants_come_back_in_the_requests_order(make_store: Any) -> None:
    store = make_store(clock=Clock())
    store.heartbeat("A", LONG)
    keys = ["zeta", "alpha", "mid"]
    grants = store.key_round(
        "A", [req(key, concurrency=n + 1, wanted=9) for n, key in enumerate(keys)]
    )
    assert [(g.key, g.held) for g in grants] == [("zeta", 1), ("alpha", 2), ("mid", 3)]
    assert store.key_round("A", []) == []


ODD_KEYS = ["tenant[1]", "o'brien", 'say "hi"', "🦊 fox", "a%b_c", "x; DROP TABLE t", "%", "_"]


def test_odd_keys_are_kept_as_given(make_store: Any) -> None:
    store = make_store(clock=Clock())
    store.heartbeat("A", LONG)
    store.heartbeat("B", LONG)
    store.key_round("A", [req(key, concurrency=1, wanted=1) for key in ODD_KEYS])
    assert holds(store) == {(key, "A"): (1, 1) for key in ODD_KEYS}
    grants = store.key_round("B", [req(key, concurrency=1, wanted=1) for key in ODD_KEYS])
    assert [(g.key, g.held) for g in grants] == [(key, 0) for key in ODD_KEYS]
    # No LIKE, no wildcard: look-alike keys are keys of their own.
    for key in ["a_b%c", "tenant[2]", "O'BRIEN", "🦊"]:
        assert store.key_round("B", [req(key, concurrency=1, wanted=1)])[0].held == 1, key


def test_a_closed_store_refuses_a_round(make_store: Any) -> None:
    store = make_store(clock=Clock())
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.key_round("A", [req(wanted=1)])


def test_a_read_only_sqlite_store_refuses_a_round(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    SQLiteStore(path).close()
    with SQLiteStore(path, read_only=True) as view, pytest.raises(StoreError, match="read-only"):
        view.key_round("A", [req(wanted=1)])


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_two_store_objects_on_one_database_share_the_bound(store_maker: Any, kind: str) -> None:
    clock = Clock()
    one, two = store_maker(kind, clock=clock), store_maker(kind, clock=clock)
    one.heartbeat("A", LONG)
    two.heartbeat("B", LONG)
    assert one.key_round("A", [req(concurrency=3, wanted=5)])[0].held == 3
    assert two.key_round("B", [req(concurrency=3, wanted=5)])[0].held == 0
    assert one.key_round("A", [req(concurrency=3, in_use=1, wanted=5)])[0].held == 1
    assert two.key_round("B", [req(concurrency=3, wanted=5)])[0].held == 2
    assert held_in_all(one) == held_in_all(two) == 3
    one.release_owner("A")
    assert holds(two) == {("k", "B"): (2, 5)}


def test_a_postgres_round_prunes_around_a_bucket_another_round_is_writing(
    store_maker: Any,
) -> None:
    """A round holds its keys' locks while it prunes: waiting there for the row
    of a bucket another round is writing (that round perhaps waiting for one of
    those keys) could deadlock. The row is left for a later round instead."""
    clock = Clock(100.0)
    store = store_maker("postgres", clock=clock)
    store.heartbeat("A", LONG)
    store.key_round("A", [req(key, concurrency=None, rate=1.0, tokens=1) for key in "ab"])
    clock.now = 101.0  # (both full again)
    with psycopg.connect(store.url) as other:  # another round, writing "a"'s bucket
        other.execute(f"SELECT * FROM {store.schema}.key_buckets WHERE key = 'a' FOR UPDATE")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            done = pool.submit(store.key_round, "A", [req("k", wanted=1)])
            try:
                done.result(timeout=10)  # (before: it waited for that row)
            finally:
                other.rollback()
    assert sorted(buckets(store)) == ["a"]
    store.key_round("A", [])
    assert buckets(store) == {}


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_rounds_racing_in_threads_keep_the_bound(store_maker: Any, kind: str) -> None:
    """Four owners, each on a store object of its own, in four threads: the held
    slots in all never pass the limit (on PostgreSQL the key's lock orders them)."""
    limit = 3
    assert (
        most_held_in_racing_threads([store_maker(kind, clock=Clock()) for _ in range(4)], limit)
        <= limit
    )


def most_held_in_racing_threads(stores: list[Any], limit: int) -> int:
    """One owner per store object, each in a thread of its own, making random
    rounds on one key: the most slots held in all that any of them saw."""
    for n, store in enumerate(stores):
        store.heartbeat(f"o{n}", LONG)

    def owner(n: int) -> list[int]:
        rng = random.Random(n)
        held, seen = 0, []
        for _ in range(25):
            in_use = rng.randint(0, held)
            request = req(concurrency=limit, in_use=in_use, wanted=in_use + rng.randint(0, 3))
            held = stores[n].key_round(f"o{n}", [request])[0].held
            seen.append(held_in_all(stores[n]))
        return seen

    with concurrent.futures.ThreadPoolExecutor(len(stores)) as pool:
        return max(total for totals in pool.map(owner, range(len(stores))) for total in totals)


# ---------------------------------------------------------------------- migration


def test_a_sqlite_file_from_before_key_ledger_migrates(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    db = sqlite_utils.Database(path)
    _sqlite_schema.MIGRATIONS.apply(db, stop_before="0007_key_ledger")
    db.close()
    with pytest.raises(StoreError, match="written by an older trioexec"):
        SQLiteStore(path, read_only=True)
    with SQLiteStore(path, inline=True, clock=Clock()) as store:
        store.heartbeat("A", LONG)
        assert store.key_round("A", [req(wanted=1, rate=1.0, tokens=1)])[0].held == 1
    with contextlib.closing(sqlite3.connect(path)) as conn:
        version = conn.execute(
            "SELECT value FROM trioexec_meta WHERE key = 'schema_version'"
        ).fetchone()
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        bucket = conn.execute("SELECT key, tokens, stamp FROM key_buckets").fetchall()
    assert version == (str(_sqlite_schema.SCHEMA_VERSION),)
    assert {"key_holds", "key_buckets"} <= tables
    assert bucket == [("k", 0.0, 100.0)]


def test_a_postgres_schema_from_before_key_ledger_migrates(
    postgres_url: str, pg_schema: str
) -> None:
    before = 3  # keys on executions, no key_holds yet
    with schema_at_version(postgres_url, pg_schema, before):
        pass  # (no rows of its own)
    with pytest.raises(StoreError, match="written by an older trioexec"):
        PostgresStore(postgres_url, schema=pg_schema, read_only=True)
    with PostgresStore(postgres_url, schema=pg_schema, clock=Clock()) as store:
        store.heartbeat("A", LONG)
        assert store.key_round("A", [req(wanted=1)])[0].held == 1
        assert holds(store) == {("k", "A"): (1, 1)}
    with psycopg.connect(postgres_url) as conn:
        version = conn.execute(
            f"SELECT value FROM {pg_schema}.trioexec_meta WHERE key = 'schema_version'"
        ).fetchone()
    assert version == (str(_pg_schema.SCHEMA_VERSION),)


def test_a_sqlite_file_from_before_bucket_pruning_migrates(tmp_path: Path) -> None:
    """A bucket written before its row kept the time it is full again keeps
    NULL there (its key's rate is not known to the store): no round prunes it
    until its key is settled again, which writes the time."""
    path = tmp_path / "runs.db"
    db = sqlite_utils.Database(path)
    _sqlite_schema.MIGRATIONS.apply(db, stop_before="0013_key_bucket_full")
    db.execute("INSERT INTO key_buckets (key, tokens, stamp) VALUES ('old', 0.0, 50.0)")
    db.conn.commit()
    db.close()
    with pytest.raises(StoreError, match="written by an older trioexec"):
        SQLiteStore(path, read_only=True)
    clock = Clock(1_000.0)
    with SQLiteStore(path, inline=True, clock=clock) as store:
        store.heartbeat("A", LONG)
        store.key_round("A", [req("other", concurrency=None, rate=1.0)])
        assert buckets(store) == {"old": (0.0, 50.0, None)}
        store.key_round("A", [req("old", concurrency=None, rate=1.0, tokens=1)])
        assert buckets(store) == {"old": (0.0, 1_000.0, 1_001.0)}
        clock.now = 1_001.0
        store.key_round("A", [])
        assert buckets(store) == {}
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (version,) = conn.execute(
            "SELECT value FROM trioexec_meta WHERE key = 'schema_version'"
        ).fetchone()
    assert version == str(_sqlite_schema.SCHEMA_VERSION)


def test_a_postgres_schema_from_before_bucket_pruning_migrates(
    postgres_url: str, pg_schema: str
) -> None:
    before = 8  # the dashboard's indexes, no full_at yet
    with schema_at_version(postgres_url, pg_schema, before) as conn:
        conn.execute("INSERT INTO key_buckets (key, tokens, stamp) VALUES ('old', 0.0, 50.0)")
    with pytest.raises(StoreError, match="written by an older trioexec"):
        PostgresStore(postgres_url, schema=pg_schema, read_only=True)
    clock = Clock(1_000.0)
    with PostgresStore(postgres_url, schema=pg_schema, clock=clock) as store:
        store.heartbeat("A", LONG)
        store.key_round("A", [req("other", concurrency=None, rate=1.0)])
        assert buckets(store) == {"old": (0.0, 50.0, None)}
        store.key_round("A", [req("old", concurrency=None, rate=1.0, tokens=1)])
        assert buckets(store) == {"old": (0.0, 1_000.0, 1_001.0)}
        clock.now = 1_001.0
        store.key_round("A", [])
        assert buckets(store) == {}
    with psycopg.connect(postgres_url) as conn:
        version = conn.execute(
            f"SELECT value FROM {pg_schema}.trioexec_meta WHERE key = 'schema_version'"
        ).fetchone()
    assert version == (str(_pg_schema.SCHEMA_VERSION),)


# ---------------------------------------------------------------------- state machine

CONCURRENCY, RATE, PER = 3, 2.0, 1.5
LIMITS = {"k": (CONCURRENCY, RATE), "j": (1, None)}  # key -> (concurrency, rate)
OWNERS = ("A", "B", "C")
LEASE = 5.0


class KeysShared(RuleBasedStateMachine):
    """Three owners make rounds on the memory and SQLite stores side by side; the
    two must answer alike, and the limits hold.

    An owner never claims more in use than the store has it holding (its last
    grant); one whose lease lapsed has lost its tasks, and starts again from
    nothing once it renews. Under that rule the store keeps the held slots of
    live owners within the limit. Tokens are never returned here (the returned
    ones are `settle`'s tests'), so every window counts what the bucket gave."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000.0
        self.dir = Path(tempfile.mkdtemp(prefix="trioexec-keys-"))
        self.memory = MemoryStore(clock=self.clock)
        self.sql = SQLiteStore(self.dir / "runs.db", clock=self.clock, inline=True)
        self.lease: dict[str, float] = {}  # owner -> lease end (alive while > now)
        self.held: dict[tuple[str, str], int] = {}  # (owner, key) -> its last grant
        self.taken: list[tuple[float, int]] = []  # (time, tokens) of key "k"

    def clock(self) -> float:
        return self.now

    def teardown(self) -> None:
        self.memory.close()
        self.sql.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def alive(self, owner: str) -> bool:
        return self.lease.get(owner, -math.inf) > self.now

    def lapse(self) -> None:
        """Owners whose lease ran out lose their tasks (their slots stay in the
        store until a round on the key reclaims them)."""
        for owner in OWNERS:
            if not self.alive(owner):
                for key in LIMITS:
                    self.held.pop((owner, key), None)

    @rule(owner=st.sampled_from(OWNERS))
    def renew(self, owner: str) -> None:
        self.lease[owner] = self.now + LEASE
        self.memory.heartbeat(owner, self.lease[owner])
        self.sql.heartbeat(owner, self.lease[owner])

    @rule(owner=st.sampled_from(OWNERS))
    def release(self, owner: str) -> None:
        self.lease.pop(owner, None)
        self.memory.release_owner(owner)
        self.sql.release_owner(owner)
        self.lapse()

    @rule(dt=st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 1.5, 3.0, 7.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.lapse()

    @precondition(lambda self: any(self.alive(o) for o in OWNERS))
    @rule(
        data=st.data(),
        keys=st.lists(st.sampled_from(sorted(LIMITS)), min_size=1, max_size=2, unique=True),
    )
    def round(self, data: st.DataObject, keys: list[str]) -> None:
        owner = data.draw(st.sampled_from([o for o in OWNERS if self.alive(o)]))
        requests = []
        for key in keys:
            concurrency, rate = LIMITS[key]
            in_use = data.draw(st.integers(0, self.held.get((owner, key), 0)))
            wanted = in_use + data.draw(st.integers(0, 4))
            tokens = data.draw(st.integers(0, 3)) if rate else 0
            requests.append(
                KeyRequest(
                    key=key,
                    concurrency=concurrency,
                    rate=rate,
                    per=PER,
                    in_use=in_use,
                    wanted=wanted,
                    tokens=tokens,
                )
            )
        grants = self.memory.key_round(owner, requests)
        assert self.sql.key_round(owner, requests) == grants
        for request, grant in zip(requests, grants, strict=True):
            assert grant.key == request.key
            assert grant.usable <= grant.held
            assert grant.held >= request.in_use
            assert 0 <= grant.tokens <= request.tokens
            self.held[owner, request.key] = grant.held
            if request.key == "k":
                self.taken.append((self.now, grant.tokens))

    @invariant()
    def stores_agree(self) -> None:
        assert holds(self.memory) == holds(self.sql)
        assert buckets(self.memory) == buckets(self.sql)  # (pruned alike, too)

    @invariant()
    def live_owners_hold_at_most_the_limit(self) -> None:
        for key, (concurrency, _) in LIMITS.items():
            live = [
                held
                for (k, o), (held, _) in holds(self.memory).items()
                if k == key and self.alive(o)
            ]
            assert sum(live) <= concurrency, (key, live)

    @invariant()
    def no_window_takes_more_than_the_bucket_gives(self) -> None:
        for i, (start, _) in enumerate(self.taken):
            total = 0
            for end, tokens in self.taken[i:]:
                total += tokens
                assert total <= RATE + RATE * (end - start) / PER + 1e-6, (start, end, total)


TestKeysShared = KeysShared.TestCase
# (`nox -s soak` runs it again and again under new seeds)
TestKeysShared.settings = settings(max_examples=50, stateful_step_count=40, deadline=None)


def test_settle_keeps_when_an_owner_began_to_wait() -> None:
    mine = Hold("", held=0, wanted=1, since=3.0)
    _, row, _ = settle(req(concurrency=1, wanted=1), [Hold("b", held=1, wanted=1)], None, 7.0, mine)
    assert row == Hold("", held=0, wanted=1, since=3.0)
    _, row, _ = settle(req(concurrency=1, wanted=1), [], None, 8.0, mine)
    assert row == Hold("", held=1, wanted=1, since=None)  # it has what it wants: no longer waiting


def test_settle_lets_the_longest_waiting_owner_take_a_free_slot_first() -> None:
    """One slot, free; b has waited since 1.0, the caller since 2.0: b's turn."""
    waiting_b = Hold("b", held=0, wanted=1, since=1.0)
    mine = Hold("", held=0, wanted=1, since=2.0)
    grant, _, _ = settle(req(concurrency=1, wanted=1), [waiting_b], None, 5.0, mine)
    assert (grant.held, grant.usable) == (0, 0)
    # Once b holds it, the caller is the longest waiting; b hands over after its task.
    grant, _, _ = settle(
        req(concurrency=1, wanted=1), [Hold("b", held=0, wanted=1, since=None)], None, 5.0, mine
    )
    assert (grant.held, grant.usable) == (1, 1)


def test_settle_makes_a_holder_hand_over_to_one_waiting_with_none() -> None:
    """One slot: the holder's task goes on (in use), but it starts no other, and
    gives the slot up when that task ends."""
    waiting_b = Hold("b", held=0, wanted=1, since=1.0)
    mine = Hold("", held=1, wanted=1)
    grant, row, _ = settle(req(concurrency=1, in_use=1, wanted=1), [waiting_b], None, 5.0, mine)
    assert (grant.held, grant.usable) == (1, 0)
    grant, row, _ = settle(req(concurrency=1, in_use=0, wanted=1), [waiting_b], None, 6.0, mine)
    assert (grant.held, grant.usable) == (0, 0)
    assert row == Hold("", held=0, wanted=1, since=6.0)  # now it waits its turn
