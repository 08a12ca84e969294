"""`create_app`: the dashboard as a Starlette application (ASGI, on Trio through
anyio), and its live stream of Server-Sent Events."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from trioexec import StoreError

from ._actions import cancel, pause, reject, resolve, resume, retry
from ._pages import COUNTS, control, failed, overview, promises, result, run, runs, task, tasks
from ._render import HERE, Dashboard, dashboard_of, store_error
from ._security import Gate, Guard

#: Seconds between heartbeat comments on a quiet event stream (proxies and
#: browsers keep a stream that says something now and then).
HEARTBEAT = 15.0


async def events(request: Request) -> Response:
    """``text/event-stream``: a ``refresh`` event (its data: the counts and their
    version) whenever the poller sees the store change, and a heartbeat comment
    when nothing did for `HEARTBEAT` seconds. Ends when the client goes away (the
    response is cancelled) or the server stops (`Board.stop`)."""
    board = dashboard_of(request).board

    def refresh() -> str:
        counts = board.counts
        data = {
            "version": board.version,
            "counts": {} if counts is None else {what: counts.get(what) for what, _ in COUNTS},
        }
        return f"event: refresh\ndata: {json.dumps(data)}\n\n"

    async def stream() -> AsyncIterator[str]:
        seen = board.version
        yield f"retry: 3000\n{refresh()}"
        while not board.closing.is_set():
            with trio.move_on_after(HEARTBEAT):
                await board.wait_for_change(seen)
            if board.version > seen:
                seen = board.version
                yield refresh()
            elif not board.closing.is_set():
                yield ": heartbeat\n\n"

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"x-accel-buffering": "no"},  # (nginx: pass each event on at once)
    )


#: The static files' media types (the directory holds these two kinds).
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}


def static_files() -> Callable[[Request], Awaitable[Response]]:
    """The route of ``/static/NAME``: the package's few static files, read once.

    Not Starlette's `StaticFiles`: under Hypercorn's ASGI 2.1 its file response
    cancels a task group inside the send in which Hypercorn closes a
    ``Connection: close`` connection, so the connection stayed open."""
    files = {
        path.name: (path.read_bytes(), STATIC_TYPES[path.suffix])
        for path in (HERE / "static").iterdir()
        if path.suffix in STATIC_TYPES
    }

    async def static(request: Request) -> Response:
        found = files.get(request.path_params["name"])
        if found is None:
            return PlainTextResponse("Not Found", status_code=404)
        return Response(found[0], media_type=found[1])

    return static


def id_route(path: str, endpoint: Callable[[Request], Awaitable[Response]], **kw: Any) -> Route:
    """A route whose ``{...:path}`` parameter (an id) matches any text: Starlette's
    ``.*`` stops at a newline and its ``$`` matches before a last one, so an id
    that holds one would be a 404, or (ending in one) another id's page."""
    route = Route(path, endpoint, **kw)
    route.path_regex = re.compile(route.path_regex.pattern.removesuffix("$") + r"\Z", re.DOTALL)
    return route


def create_app(
    db: str, *, token: str, read_only: bool = False, require_token_for_reads: bool = False
) -> Starlette:
    """The dashboard of the database ``db`` (a SQLite file or a PostgreSQL URL).

    Args:
      db: opened read-only for the pages when the app starts (its lifespan), and
        writable for the length of each action.
      token: what the cookie must hold for an action (and for reads if
        ``require_token_for_reads``); visiting any page with ``?token=TOKEN``
        sets it.
      read_only: no action routes at all, and no forms.
      require_token_for_reads: every page needs the token too (for a server
        listening beyond loopback).

    The app's lifespan opens the store and runs the poller (one read of the counts
    a second, in a worker thread); serve it with an ASGI server that runs the
    lifespan (`serve` uses Hypercorn's Trio worker).
    """
    guard = Guard(token, require_token_for_reads=require_token_for_reads)
    dash = Dashboard(db, guard=guard, read_only=read_only)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        board = dash.board
        await trio.to_thread.run_sync(board.open)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(board.poll)
                try:
                    yield
                finally:
                    board.stop()
                    nursery.cancel_scope.cancel()
        finally:
            board.close()

    routes: list[BaseRoute] = [
        Route("/", overview),
        Route("/tasks", tasks),
        id_route("/tasks/{task_id:path}", task),
        # (not /tasks/ID/result: an id may end in "/result")
        id_route("/results/{task_id:path}", result),
        Route("/runs", runs),
        id_route("/runs/{run_id:path}", run),
        Route("/promises", promises),
        Route("/failed", failed),
        Route("/control", control),
        Route("/events", events),
        Route("/static/{name}", static_files()),
    ]
    if not read_only:
        post = ["POST"]
        routes += [
            id_route("/actions/promises/{promise_id:path}/resolve", resolve, methods=post),
            id_route("/actions/promises/{promise_id:path}/reject", reject, methods=post),
            id_route("/actions/tasks/{task_id:path}/retry", retry, methods=post),
            id_route("/actions/tasks/{task_id:path}/cancel", cancel, methods=post),
            Route("/actions/pause", pause, methods=post),
            Route("/actions/resume", resume, methods=post),
        ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Gate, guard=guard)],
        exception_handlers={StoreError: store_error},
        lifespan=lifespan,
    )
    app.state.dashboard = dash
    return app
