"""The actions (POST, form-encoded, 303 back to the page on success).

Each passes `Guard.refusal`, then opens a writable store for its one operation (in a
worker thread), recorded with who sent it (``user@host pid N (dashboard, from
ADDRESS)``). Nothing from the form becomes SQL or code: ids and names are values to
the store's operations, the payload is parsed as JSON and stored as data.
"""

from __future__ import annotations

import functools
import json
import math
import urllib.parse
from collections.abc import Callable
from typing import TypeVar

import trio
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

import trioexec
from trioexec import PostgresStore, SQLiteStore, StoreError
from trioexec._control import who_am_i
from trioexec._store._browse import storable

from ._pages import promises
from ._render import dashboard_of, message, redacted, segment, unsegment
from ._security import is_local_path

T = TypeVar("T")

#: The largest form accepted (a promise's JSON payload is most of it).
MAX_FORM = 1 << 20
FORM_TYPE = "application/x-www-form-urlencoded"


async def _form(request: Request) -> dict[str, str]:
    """The form's fields (the last value of each), read without a multipart
    parser: the dashboard's forms are all url-encoded."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise HTTPException(413, f"the form is larger than {MAX_FORM} bytes")
    if kind != FORM_TYPE and body:
        raise HTTPException(415, f"an action takes a form ({FORM_TYPE}), not {kind!r}")
    try:
        pairs = urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        raise HTTPException(400, "the form is not UTF-8") from None
    return dict(pairs)


def _back(form: dict[str, str], default: str) -> str:
    """Where to go after the action: the form's page, only ever a path here."""
    back = form.get("back", "")
    return back if is_local_path(back) else default


async def _checked(request: Request) -> dict[str, str]:
    guard = dashboard_of(request).guard
    if not guard.has_token(request):  # (before the body is even read)
        raise HTTPException(403, guard.refusal(request, {}) or "")
    form = await _form(request)
    why = guard.refusal(request, form)
    if why is not None:
        raise HTTPException(403, why)
    return form


async def _write(request: Request, fn: Callable[[SQLiteStore | PostgresStore, str], T]) -> T:
    """``fn(store, who)`` on a writable store opened for it, in a worker thread
    (``who``: the command's sender, as recorded)."""
    dash = dashboard_of(request)
    client = request.client
    who = who_am_i(f"dashboard, from {client.host}" if client else "dashboard")

    def call() -> T:
        dash.board.check_file()  # (never create a new file where the old one was)
        with trioexec.open_store(dash.db) as store:
            return fn(store, who)

    return await trio.to_thread.run_sync(call)


def _refused(request: Request, exc: HTTPException, back: str) -> Response:
    return message(request, "Not done", exc.detail, status_code=exc.status_code, back=back)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is no JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is beyond the largest number a store keeps")
    return value


def _value(text: str) -> object:
    """The JSON value typed in (None if nothing was). ValueError saying why not:
    not JSON, ``NaN``, ``Infinity`` or a number past the floats (Python's parser
    takes them, JSON and the stores do not), nested deeper than the parser goes."""
    if not text:
        return None
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("the value is nested too deeply to be read") from None
    except ValueError as exc:  # (JSONDecodeError; an integer of too many digits)
        raise ValueError(f"the value is not JSON ({exc})") from None


async def _settle(request: Request, how: str) -> Response:
    from trioexec.durable import Conflict, DurableStore, NotFound

    promise_id = unsegment(request.path_params["promise_id"])
    try:
        form = await _checked(request)
    except HTTPException as exc:
        return _refused(request, exc, "/promises")
    back = _back(form, "/promises")
    try:
        value = _value(form.get("data", "").strip())
    except ValueError as exc:
        flash = f"promise {promise_id}: {exc}; nothing was done"
        return await promises(request, flash=flash, status_code=400)
    if not storable(promise_id):  # (a NUL: no store holds such a promise)
        flash = f"promise {promise_id!r}: no such promise"
        return await promises(request, flash=flash, status_code=404)
    dash = dashboard_of(request)

    def open_durable() -> DurableStore:
        dash.board.check_file()
        return DurableStore(dash.db)

    try:
        ds = await trio.to_thread.run_sync(open_durable)
        with ds:
            await getattr(ds.promises, how)(promise_id, data=value)
    except (Conflict, NotFound) as exc:
        flash = f"promise {promise_id}: {exc}"
        return await promises(request, flash=flash, status_code=409)
    except ValueError as exc:  # (the store's own checks, before it writes anything)
        flash = f"promise {promise_id!r}: {exc}; nothing was done"
        return await promises(request, flash=flash, status_code=400)
    except StoreError as exc:
        text = f"promise {promise_id}: {redacted(dash.db, str(exc))}"
        return message(request, f"Not {how}d", text, status_code=503, back=back)
    return RedirectResponse(back, status_code=303)


resolve = functools.partial(_settle, how="resolve")
reject = functools.partial(_settle, how="reject")


async def retry(request: Request) -> Response:
    task_id = unsegment(request.path_params["task_id"])
    try:
        form = await _checked(request)
        back = _back(form, "/failed")
        result = await _write(request, lambda store, who: store.requeue([task_id], who=who))
    except HTTPException as exc:
        return _refused(request, exc, "/failed")
    except (ValueError, StoreError) as exc:
        return message(request, "Not retried", str(exc), status_code=400, back="/failed")
    if result.refused:
        [(_, why)] = result.refused
        return message(request, "Not retried", f"task {task_id}: {why}", status_code=409, back=back)
    return RedirectResponse(back, status_code=303)


async def cancel(request: Request) -> Response:
    task_id = unsegment(request.path_params["task_id"])
    try:
        form = await _checked(request)
        back = _back(form, f"/tasks/{segment(task_id)}")
        command = await _write(
            request, lambda store, who: store.command("cancel", task_id=task_id, who=who)
        )
    except HTTPException as exc:
        return _refused(request, exc, "/tasks")
    except (ValueError, StoreError) as exc:
        return message(request, "Not cancelled", str(exc), status_code=400, back="/tasks")
    if not command.changed:
        text = f"task {task_id}: {command.detail}"
        return message(request, "Not cancelled", text, status_code=409, back=back)
    return RedirectResponse(back, status_code=303)


async def _pause_or_resume(request: Request, kind: str) -> Response:
    try:
        form = await _checked(request)
        back = _back(form, "/control")
        what, value = form.get("kind", ""), form.get("value", "").strip()
        if what not in ("name", "key"):
            raise HTTPException(400, f"kind {what!r} is neither name nor key")
        if not value:
            raise HTTPException(400, f"give the {what} to {kind}")
        name, key = (value, None) if what == "name" else (None, value)
        await _write(request, lambda store, who: store.command(kind, who=who, name=name, key=key))
    except HTTPException as exc:
        return _refused(request, exc, "/control")
    except (ValueError, StoreError) as exc:
        return message(request, f"Not {kind}d", str(exc), status_code=400, back="/control")
    return RedirectResponse(back, status_code=303)


pause = functools.partial(_pause_or_resume, kind="pause")
resume = functools.partial(_pause_or_resume, kind="resume")
