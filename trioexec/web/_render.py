"""What every page shares: the templates (autoescaped), the page frame, fragments,
and the small formatting helpers the templates call."""

from __future__ import annotations

import datetime
import json
import logging
import pathlib
import re
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any, cast, final

import attrs
import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response

from trioexec import ExecutionRecord, TaskStatus
from trioexec._records import age
from trioexec._store._open import is_postgres_url
from trioexec._store._pg_conn import mask, redact

from ._board import Board
from ._security import Guard, sent_path

HERE = pathlib.Path(__file__).parent
log = logging.getLogger("trioexec.web")

NAV = (
    ("/", "Overview"),
    ("/tasks", "Tasks"),
    ("/runs", "Runs"),
    ("/promises", "Promises"),
    ("/failed", "Failed"),
    ("/control", "Control"),
)


@final
class Dashboard:
    """One app's parts: the board (store and poller), the guard, the templates."""

    def __init__(self, db: str, *, guard: Guard, read_only: bool) -> None:
        self.db = db
        self.board = Board(db)
        self.guard = guard
        self.read_only = read_only
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(segment=segment, stamp=stamp, ago=ago)
        self.env.globals["waited"] = waited
        # The macros as globals, not imports: a block rendered alone (a fragment)
        # does not run its template's top-level imports.
        macros = self.env.get_template("_macros.html").module
        for name in ("csrf_field", "back_field", "task_rows", "task_head", "choice", "pager"):
            self.env.globals[name] = getattr(macros, name)
        self.db_label = db_label(db)


def dashboard_of(request: Request) -> Dashboard:
    return dashboard_of_app(request.app)


def dashboard_of_app(app: Starlette) -> Dashboard:
    return cast(Dashboard, app.state.dashboard)


#: An id a browser would resolve away as a path segment (``.``, ``..``), after
#: the tildes `segment` puts in front of it.
_DOTS = re.compile(r"~*\.\.?")


def segment(value: str) -> str:
    """An id as one segment of a URL's path, for every link and form action that
    names an object: all but letters, digits and ``-._~`` percent-encoded
    (``a/../b`` is ``a%2F..%2Fb``, never a path to ``b``), and one or two dots
    after any tildes get one more tilde in front (a browser drops a ``.``
    segment and pops the one before for ``..``, written ``%2e`` or not)."""
    text = urllib.parse.quote(value, safe="")
    return "~" + text if _DOTS.fullmatch(value) else text


def unsegment(value: str) -> str:
    """The id of a path segment `segment` made (after the server decoded it)."""
    return value[1:] if value.startswith("~") and _DOTS.fullmatch(value) else value


def one_line(text: str) -> str:
    """``text`` for one line of a log: what is not printable written as Python
    writes it (``\\n``), so nothing a request or a database holds starts a line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def db_label(db: str) -> str:
    """The database as the header shows it: a file's name, a URL without password."""
    if is_postgres_url(db):
        parts = urllib.parse.urlsplit(redact(db))
        return f"{parts.hostname or ''}{parts.path}"
    return pathlib.Path(db).name


def stamp(t: float | None) -> str:
    if t is None:
        return ""
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def ago(seconds: float | None) -> str:
    """An age for a page: 40.0s, 3.5m, 2.0h, 1.5d; empty for None."""
    return "" if seconds is None else age(seconds, tenths=True)


def waited(record: ExecutionRecord, now: float) -> str:
    """How long a live task has waited: deferred since, else (pending) since it was
    submitted; empty for a task that holds a slot or has ended."""
    if record.deferred_since is not None:
        return ago(now - record.deferred_since)
    if record.status is TaskStatus.PENDING and record.submitted_at is not None:
        return ago(now - record.submitted_at)
    return ""


def pretty_json(text: str | None) -> str:
    """JSON text indented for reading (as it is if it does not parse)."""
    if text is None:
        return "(not recorded: the arguments were not JSON)"
    try:
        return json_text(json.loads(text))
    except ValueError:
        return text


#: The most characters of a JSON value a page shows (a kept result): the rest is
#: a link away.
SHOWN_JSON = 2000
_INDENTED = json.JSONEncoder(indent=2, ensure_ascii=False)


def _utf8(text: str) -> str:
    """``text`` with its lone surrogates (a decoded ``"\\udc80"``, which no
    response can encode) written back as JSON writes them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def json_text(value: Any) -> str:
    """``value`` as JSON for reading: indented, its characters as they are (not
    ``\\u`` escapes), but a lone surrogate as an escape. The one rule of every
    JSON value a page or a response shows."""
    return _utf8(_INDENTED.encode(value))


@attrs.frozen
class Excerpt:
    """The start of a JSON value as `json_text` writes it."""

    text: str  #: at most `SHOWN_JSON` characters
    cut: bool  #: whether the value's text goes on past them


def excerpt(value: Any, limit: int = SHOWN_JSON) -> Excerpt:
    """The first ``limit`` characters of ``json_text(value)``, encoding only
    about that much (a kept result may be megabytes)."""
    chunks, length = [], 0
    for chunk in _INDENTED.iterencode(value):
        chunks.append(chunk)
        length += len(chunk)
        if length > limit:
            break
    text = _utf8("".join(chunks))
    return Excerpt(text[:limit], len(text) > limit)


def back_of(request: Request) -> str:
    """Where a form on this page returns after its action: the page itself, with its
    filters but never ``fragment=`` (a fragment's forms are put into the full page
    by its script, and must lead back to that page, not to a bare fragment)."""
    query = [(k, v) for k, v in request.query_params.multi_items() if k != "fragment"]
    return sent_path(request) + (f"?{urllib.parse.urlencode(query)}" if query else "")


def render(
    request: Request,
    template: str,
    context: Mapping[str, Any],
    *,
    status_code: int = 200,
    flash: str | None = None,
) -> Response:
    """The page (``flash``: an error to show above it), or with ``?fragment=NAME``
    only that block of it (the live parts the page's script re-fetches)."""
    dash = dashboard_of(request)
    full: dict[str, Any] = {
        "read_only": dash.read_only,
        # (no buttons that would answer 403: without the token a page is view only)
        "no_actions": dash.read_only or not dash.guard.has_token(request),
        "csrf": dash.guard.csrf,
        "nav": NAV,
        "db_label": dash.db_label,
        "version": dash.board.version,
        "flash": flash,
        "now": time.time(),
        "tz": "UTC",
        "back": back_of(request),
        **context,
    }
    full.setdefault("current", request.url.path)
    full["page_name"] = template.removesuffix(".html")  # (`page` is a page of rows)
    tmpl = dash.env.get_template(template)
    fragment = request.query_params.get("fragment")
    if fragment is not None:
        block = tmpl.blocks.get(fragment)
        if block is None or fragment == "content":
            return PlainTextResponse(f"no fragment {fragment!r} on this page", status_code=400)
        html = "".join(block(tmpl.new_context(full)))
        return HTMLResponse(html, status_code=status_code)
    return HTMLResponse(tmpl.render(full), status_code=status_code)


def message(request: Request, title: str, text: str, *, status_code: int, back: str) -> Response:
    """A page that says one thing (an action refused, a thing not found); asked
    for a fragment (the page's script), that thing in plain text."""
    if request.query_params.get("fragment") is not None:
        return PlainTextResponse(text, status_code=status_code)
    return render(
        request,
        "message.html",
        {"title": title, "text": text, "back": back},
        status_code=status_code,
    )


def redacted(db: str, text: str) -> str:
    """``text`` with ``db``'s password masked, wherever the URL appears in it."""
    return mask(text, db) if is_postgres_url(db) else text


async def store_error(request: Request, exc: Exception) -> Response:
    """503 for a page whose store read failed (the database down, the file deleted,
    locked or corrupt), saying what failed without the password; a live fragment
    gets it in plain text (its script keeps the part it has)."""
    dash = dashboard_of(request)
    text = redacted(dash.db, str(exc)) or type(exc).__name__
    where = sent_path(request)  # (percent-encoded: a %0A in it stays one)
    log.warning("%s %s: the store could not be read: %s", request.method, where, one_line(text))
    return message(
        request,
        "Store unavailable",
        f"the store could not be read: {text}",
        status_code=503,
        back=where,
    )
