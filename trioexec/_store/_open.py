"""`open_store`: a store from what a user types (a path or a URL)."""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

from ._pg_conn import redact
from ._postgres import PostgresStore
from ._sqlite import SQLiteStore

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(target: object) -> bool:
    return isinstance(target, str) and target.startswith(_POSTGRES_SCHEMES)


def open_store(target: str | os.PathLike[str], **options: Any) -> SQLiteStore | PostgresStore:
    """The store ``target`` names: ``"postgresql://..."`` (or ``"postgres://..."``)
    opens a `PostgresStore`; ``"sqlite:///runs.db"`` (relative) or
    ``"sqlite:////srv/runs.db"`` (absolute), or a plain path, a `SQLiteStore`.
    ``options`` go to the store's constructor (``clock``, ``read_only``, ...).

    Raises:
      ValueError: for a URL of another scheme (``mysql://...``).
      StoreError: if the store cannot be opened (see each store).
    """
    if isinstance(target, os.PathLike):
        return SQLiteStore(target, **options)
    if not isinstance(target, str) or not target:
        raise TypeError(f"target must be a path or a URL, got {target!r}")
    if is_postgres_url(target):
        return PostgresStore(target, **options)
    if target.startswith("sqlite://"):
        path = urllib.parse.unquote(urllib.parse.urlsplit(target).path)
        if target.startswith("sqlite:///"):
            path = path[1:]  # sqlite:///rel.db -> rel.db; sqlite:////abs.db -> /abs.db
        if not path:
            raise ValueError(f"no database path in {redact(target)!r} (sqlite:///runs.db)")
        return SQLiteStore(path, **options)
    scheme = urllib.parse.urlsplit(target).scheme
    if "://" in target and len(scheme) > 1:  # (not a Windows drive letter)
        raise ValueError(
            f"unknown store URL scheme {scheme!r} in {redact(target)!r}: use a path,"
            " sqlite:///PATH or postgresql://..."
        )
    return SQLiteStore(target, **options)
