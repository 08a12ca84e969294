"""`serve`: the dashboard on Hypercorn's Trio worker."""

from __future__ import annotations

import functools
import logging
import urllib.parse
from collections.abc import Awaitable, Callable

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve

from ._app import create_app
from ._render import dashboard_of_app
from ._security import is_loopback, new_token

#: How long open requests (a page being rendered) get to finish once the server
#: stops; event streams end at once. Short: a page takes milliseconds, and an idle
#: keep-alive connection (a browser's open tab) holds the exit this long.
GRACE = 0.25


def url_of(bound: str, host: str, token: str) -> str:
    """The URL to print: the host as asked (a wildcard address as the name a
    browser on this machine can open), the port as bound, the token."""
    port = urllib.parse.urlsplit(bound).port
    if host in ("0.0.0.0", "::", ""):
        shown = "127.0.0.1" if host != "::" else "[::1]"
    elif ":" in host:
        shown = f"[{host}]"
    else:
        shown = host
    return f"http://{shown}:{port}/?token={token}"


async def serve(
    db: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8321,
    read_only: bool = False,
    token: str | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the dashboard of ``db`` on ``host``:``port`` (0: a free port) until
    ``shutdown_trigger()`` returns (then it stops gracefully: event streams end,
    requests under way get `GRACE` seconds) or this is cancelled.

    ``task_status.started(url)``: the URL to open, token included (a random one
    unless ``token`` is given). Reads need the token too unless ``host`` is a
    loopback address.

    Example::

        async with trio.open_nursery() as nursery:
            url = await nursery.start(functools.partial(serve, "runs.db", port=0))
    """
    token = token or new_token()
    app = create_app(
        db, token=token, read_only=read_only, require_token_for_reads=not is_loopback(host)
    )
    board = dashboard_of_app(app).board
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("trioexec.web")
    config.graceful_timeout = GRACE

    async def stop_when_told() -> None:
        if shutdown_trigger is None:
            await trio.sleep_forever()
        else:
            await shutdown_trigger()
        board.stop()  # (the event streams end, so the connections can close)

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            functools.partial(
                hypercorn_serve,
                app,  # type: ignore[arg-type]
                config,
                shutdown_trigger=stop_when_told,
            )
        )
        task_status.started(url_of(binds[0], host, token))
