"""Read any store's tables directly (a test's view below the store's API)."""

from __future__ import annotations

from typing import Any


def select(store: Any, sql: str) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` (no parameters) on ``store``'s database: a SQLite file,
    a `MemoryStore`'s database in memory, or a PostgreSQL store's schema."""
    with store._db.reading("read in a test") as conn:
        return [tuple(row) for row in conn.execute(sql).fetchall()]
