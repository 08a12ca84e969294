"""``trioexec dashboard DB|URL``: the web dashboard (extra ``web``), until Ctrl-C."""

from __future__ import annotations

import functools
import logging
import signal
import sys

import click
import trio

from ._common import EXIT_USAGE, fail, open_store


def log_errors_to_stderr() -> None:
    """The web app's errors (a page that failed: Hypercorn's "Error in ASGI
    Framework" and its traceback) on stderr; ``trioexec`` itself has only a
    NullHandler, and a library must not configure logging for its users."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("trioexec dashboard: %(levelname)s %(message)s"))
    web_log = logging.getLogger("trioexec.web")
    web_log.addHandler(handler)
    web_log.propagate = False


@click.command()
@click.argument("db", type=click.Path(dir_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="the address to listen on")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8321,
    show_default=True,
    help="the port (0: a free one)",
)
@click.option("--read-only", is_flag=True, help="pages only: no action can change anything")
def dashboard(db: str, host: str, port: int, read_only: bool) -> None:
    """Serve a web dashboard of DB (a SQLite file or a PostgreSQL URL).

    Slots in use, tasks and what they wait on, workflow runs with their step
    graph, promises (Resolve/Reject), failed tasks (Retry), pause and resume; it
    updates live. It prints the URL to open, with a token made at start: every
    action needs it (and every page, when --host is not a loopback address).
    Listens on 127.0.0.1 unless told otherwise; Ctrl-C stops it."""
    try:
        from trioexec import web
    except ModuleNotFoundError as exc:
        fail(
            f"the dashboard needs the 'web' extra (no module named {exc.name!r}):"
            " pip install 'trioexec[web]'",
            EXIT_USAGE,
        )
    with open_store(db) as store:  # (a missing or unreadable database: one line, exit 1)
        store.counts()
    log_errors_to_stderr()

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

            async def signalled() -> None:
                await signals.__anext__()

            async with trio.open_nursery() as nursery:
                url = await nursery.start(
                    functools.partial(
                        web.serve,
                        db,
                        host=host,
                        port=port,
                        read_only=read_only,
                        shutdown_trigger=signalled,
                    )
                )
                suffix = " (read-only)" if read_only else ""
                sys.stdout.write(f"trioexec dashboard: {url}{suffix}\n")
                sys.stdout.flush()

    try:
        trio.run(main)
    except OSError as exc:  # (the port is taken, the address is not this host's)
        fail(f"cannot listen on {host}:{port}: {exc}")
