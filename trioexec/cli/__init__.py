"""The ``trioexec`` command; docs/reference/cli.rst says what each command promises
(read-only views, one-line failures, what the database holds printed as plain text).

The only package that imports the CLI libraries (click, rich). Here: the group and the
console-script entry point, `run`.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

import trioexec
from trioexec import StoreError

from ._common import EXIT_PROBLEM, EXIT_USAGE, MISSING_EXTRA, fail

__all__ = ["main", "run", "version"]


def version() -> str:
    """The installed distribution's version (``trioexec.__version__`` when the
    package runs from a checkout that was never installed)."""
    try:
        return importlib.metadata.version("trioexec")
    except importlib.metadata.PackageNotFoundError:
        return trioexec.__version__


def _version_line() -> str:
    return f"trioexec, version {version()}"


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_version_line())
        ctx.exit()


def _interrupted() -> NoReturn:
    fail("interrupted", 130)


class _Commands(click.Group):
    """A Ctrl-C in a command ends it as `run` says (left to click, it would print
    a blank line and "aborted", exit 1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            _interrupted()


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the installed version and exit.",
)
def main() -> None:
    """trioexec: tasks that give their slot back while they wait.

    Start with `trioexec demo`; the other commands look at the SQLite database an
    executor (or the demo) writes, from any other process.
    """


if MISSING_EXTRA is None:  # the commands render with rich; without it `run` says so
    from ._control import cancel, commands, pause, resume, retry
    from ._dashboard import dashboard
    from ._demo import demo
    from ._durable import check, promises, tasks
    from ._result import result
    from ._schedules import schedules
    from ._views import runs, status, watch
    from ._worker import worker

    for _command in (demo, status, watch, runs, result, schedules, promises, tasks, check, worker):
        main.add_command(_command)
    for _command in (pause, resume, cancel, retry, commands, dashboard):
        main.add_command(_command)


def _store_error(exc: BaseException) -> StoreError | None:
    """The StoreError ``exc`` is, or the first of a group made only of StoreErrors
    (the demo's nurseries wrap the executor's)."""
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, BaseExceptionGroup) and exc.split(StoreError)[1] is None:
        return _store_error(exc.exceptions[0])
    return None


def run(args: Sequence[str] | None = None) -> None:
    """Console-script entry point. Every failure is one line on stderr: usage errors
    (and a missing `cli` extra) exit 2, problems with the database (unreadable rows,
    a locked file) exit 1, Ctrl-C 130. ``trioexec --version`` works without the
    extra too."""
    argv = list(sys.argv[1:] if args is None else args)
    if MISSING_EXTRA is not None:
        if argv == ["--version"]:
            sys.stdout.write(f"{_version_line()}\n")
            return
        sys.stderr.write(
            f"trioexec: the command line needs the 'cli' extra (no module named"
            f" {MISSING_EXTRA!r}): pip install 'trioexec[cli]'\n"
        )
        raise SystemExit(EXIT_USAGE)
    try:
        code = main.main(args=argv, prog_name="trioexec", standalone_mode=False)
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        fail(f"{exc.format_message()}{hint}", EXIT_USAGE)
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except click.Abort:
        fail("aborted", EXIT_PROBLEM)
    except (StoreError, ValueError, KeyError) as exc:
        # A row this trioexec cannot read, a locked or broken table, ...
        fail(f"cannot read the database: {type(exc).__name__}: {exc}")
    except KeyboardInterrupt:
        _interrupted()
    except BaseExceptionGroup as exc:
        if exc.subgroup(KeyboardInterrupt) is not None:
            _interrupted()
        store_error = _store_error(exc)
        if store_error is not None:
            fail(str(store_error))
        raise
    if isinstance(code, int) and code:
        raise SystemExit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
