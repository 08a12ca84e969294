"""The arguments of the durable protocol's operations, checked, and its rows as
records: what the protocol (`_protocol.Core`) and its batched paths (`_bulk`)
share."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from .._records import check_number
from .._store._durable_rows import Row
from ._records import PromiseRecord, PromiseState, TaskState


def encode(data: Any, what: str = "data") -> str | None:
    """``data`` as JSON text (None stays None). Strict JSON: NaN and infinities are
    refused like any other value JSON cannot carry (ValueError naming ``what``)."""
    if data is None:
        return None
    try:
        return json.dumps(data, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(
            f"{what} must be JSON-serialisable, got {type(data).__qualname__}: {exc}"
        ) from None


def check_id(value: object, what: str = "id") -> str:
    """``value`` if it is a usable promise/task id (or pid, target, key): a non-empty
    str that SQLite can store (no lone surrogates); else ValueError naming it."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty str, got {value!r}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                f"{what} {value!r} contains a lone surrogate (not storable text)"
            ) from None
    return value


def check_optional_id(value: object, what: str) -> None:
    if value is not None:
        check_id(value, what)


def check_create(id: object, ikc: object, target: object, tags: object) -> None:
    """The arguments of a promise's create (but its timeout and data) are usable;
    else ValueError naming the first that is not."""
    check_id(id, "promise id")
    check_optional_id(ikc, "idempotency_key")
    check_optional_id(target, "target")
    check_tags(tags)


def check_holds(pid: object, tasks: Iterable[tuple[object, int]]) -> None:
    """``pid`` and the id of each of ``tasks`` (id, version) are usable ids."""
    check_id(pid, "pid")
    for id, _ in tasks:
        check_id(id, "task id")


def promise_record(row: Row) -> PromiseRecord:
    return PromiseRecord(
        id=row["id"],
        state=PromiseState(row["state"]),
        data=row["data"],
        timeout_at=row["timeout_at"],
        idempotency_key_create=row["ikc"],
        idempotency_key_settle=row["iku"],
        tags=dict(row["tags"]),
        created_at=row["created_at"],
        settled_at=row["settled_at"],
    )


def check_seconds(value: object, what: str, *, zero: bool = False) -> None:
    """``value`` is a finite number of seconds (not a bool) above 0, or 0 too with
    ``zero``, that a store can hold (a timeout, a lease, an interval); else
    ValueError naming it."""
    must = f"a finite number of seconds {'>=' if zero else '>'} 0"
    check_number(what, value, float, must, ge=0, gt=None if zero else 0, lt=math.inf, stored=True)


def check_limit(limit: int) -> None:
    check_number("limit", limit, int, "an int >= 1", ge=1, stored=True)


def check_tags(tags: object) -> None:
    if tags is None:
        return
    if not isinstance(tags, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tags.items()
    ):
        raise ValueError(f"tags must be a dict of str to str, got {tags!r}")


def new_rows(
    id: str,
    timeout: float,
    ikc: str | None,
    data: Any,
    tags: dict[str, str] | None,
    target: str | None,
    now: float,
    retry_timeout: float,
) -> tuple[Row, Row | None]:
    """A new promise's row, and its task's (pending) if it has a ``target``
    (ValueError: ``data`` is not JSON)."""
    row: Row = {
        "id": id,
        "state": PromiseState.PENDING.value,
        "data": encode(data),
        "timeout_at": now + timeout,
        "ikc": ikc,
        "iku": None,
        "tags": dict(tags or {}),
        "created_at": now,
        "settled_at": None,
    }
    if target is None:
        return row, None
    row["tags"]["resonate:target"] = target
    task: Row = {
        "id": id,
        "state": TaskState.PENDING.value,
        "version": 0,
        "target": target,
        "pid": None,
        "ttl": None,
        "lease_expires_at": None,
        "timeout_at": now + retry_timeout,
    }
    return row, task
