"""The pages (GET). Each reads the store in worker threads (`Board.read`) and renders
a template; every value from the database reaches the HTML through Jinja's
autoescaping, and no input becomes SQL: filters go to the store's functions as values.
`result` is no page: a task's kept result, whole, as JSON.
"""

from __future__ import annotations

import collections
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import attrs
import trio
from starlette.requests import Request
from starlette.responses import Response

from trioexec import ExecutionRecord, RunStatus, StepState, SubStatus, TaskStatus
from trioexec._records import FAILURES
from trioexec._store import Command, RunRecord
from trioexec._store._browse import (
    activity,
    browse,
    runs_page,
    storable,
    task_children,
    task_commands,
    task_names,
)
from trioexec._store._durable_rows import PromiseState

from ._board import Board, read_counts
from ._render import (
    SHOWN_JSON,
    dashboard_of,
    excerpt,
    json_text,
    message,
    pretty_json,
    render,
    segment,
    unsegment,
)
from ._security import sent_path
from ._svg import HEIGHT, PAD, STEP_H, STEP_W, WIDTH, bars, line, run_graph

PAGE_SIZE = 50
COMMANDS_SHOWN = 50
CHILDREN_SHOWN = 50  #: the first a task's page lists, in submission order
ORDERS = (
    ("newest", "newest first"),
    ("oldest", "oldest first"),
    ("longest_waiting", "longest waiting first"),
)
#: The overview's counts (`Counts.get`), each with its label.
COUNTS = tuple(
    (what, what.replace("_", " "))
    for what in ("active", "deferred", "pending", "completed", "failed", "timed_out", "cancelled")
)
PROMISE_STATES = tuple(s.value for s in PromiseState)
RUN_STATES = tuple(s.value for s in RunStatus)
T = TypeVar("T")


def _choice(query: Mapping[str, str], field: str, allowed: tuple[str, ...]) -> str | None:
    value = query.get(field) or None
    if value is not None and value not in allowed:
        raise ValueError(f"{field} {value!r} is not one of {', '.join(allowed)}")
    return value


def _url(path: str, params: Mapping[str, str | None]) -> str:
    kept = {k: v for k, v in params.items() if v}
    return f"{path}?{urllib.parse.urlencode(kept)}" if kept else path


def _pager(
    path: str, params: Mapping[str, str | None], cursor: str | None, next_cursor: str | None
) -> dict[str, str | None]:
    """A page's pager: the cursor it shows, its first page, its next (None: last)."""
    return {
        "cursor": cursor,
        "first_url": _url(path, params),
        "next_url": next_cursor and _url(path, {**params, "cursor": next_cursor}),
    }


def _board(request: Request) -> tuple[Board, int]:
    """The board, and its version before the page's reads: a change meanwhile
    makes the page's script fetch the page again."""
    board = dashboard_of(request).board
    return board, board.version


async def _find(
    board: Board, request: Request, param: str, read: Callable[[Any, str], T | None]
) -> tuple[str, T | None]:
    """The id the path names, and ``read(store, id)``: None if there is no such
    thing (an id no store can hold, a NUL, is none: not a read that fails)."""
    id = unsegment(request.path_params[param])
    return id, (await board.read(read, id) if storable(id) else None)


def _missing(request: Request, what: str, named: str) -> Response:
    """The 404 page of a task or run not in the database."""
    text = f"no {named} in this database"
    return message(request, f"No such {what}", text, status_code=404, back=f"/{what}s")


def bad_query(request: Request, exc: ValueError) -> Response:
    return message(request, "Bad request", str(exc), status_code=400, back=sent_path(request))


async def overview(request: Request) -> Response:
    board, version = _board(request)
    now = time.time()
    counts = board.counts or await board.read(read_counts, 0)
    buckets = await board.read(activity, since=now - 3600, bucket=60.0, now=now)
    waiting = await board.read(browse, order="longest_waiting", limit=10)
    pauses = await board.read(lambda store: store.pauses())
    samples = list(board.samples)
    finished = [
        (b.start, b.ended[TaskStatus.COMPLETED], sum(b.ended[s] for s in FAILURES), b.finished)
        for b in buckets
    ]
    rates = [(start, bad / n if n else 0.0) for start, _, bad, n in finished]
    context = {
        "version": version,
        "title": "Overview",
        "counts": counts,
        "count_labels": COUNTS,
        "slots": line([(t, a) for t, a, _ in samples]),
        "deferred": line([(t, d) for t, _, d in samples]),
        "throughput": bars(finished),
        "failures": line(rates),
        "waiting": waiting.rows,
        "pauses": pauses,
        "W": WIDTH,
        "H": HEIGHT,
        "P": PAD,
    }
    return render(request, "overview.html", context)


async def tasks(request: Request) -> Response:
    board, version = _board(request)
    query = request.query_params
    try:
        f = {  # (as `browse` takes them)
            "status": _choice(query, "status", tuple(s.value for s in TaskStatus)),
            "sub_status": _choice(query, "sub_status", tuple(s.value for s in SubStatus)),
            **{field: query.get(field) or None for field in ("name", "key", "waiting_on")},
            "order": _choice(query, "order", tuple(o for o, _ in ORDERS)) or "newest",
        }
        cursor = query.get("cursor") or None
        page = await board.read(browse, limit=PAGE_SIZE, cursor=cursor, **f)
    except ValueError as exc:
        return bad_query(request, exc)
    names = await board.read(task_names)
    context = {
        "version": version,
        "title": "Tasks",
        "f": f,
        "page": page,
        "names": names,
        "statuses": [s.value for s in TaskStatus],
        "sub_statuses": [s.value for s in SubStatus],
        "orders": ORDERS,
        **_pager("/tasks", f, cursor, page.next_cursor),
    }
    return render(request, "tasks.html", context)


@attrs.frozen
class Moment:
    at: float
    kind: str
    text: str


def timeline(record: ExecutionRecord, commands: list[Command]) -> list[Moment]:
    """The task's transitions the store keeps (submitted, first started, deferred
    since, finished) and the commands that named it, in time order."""
    out = []
    if record.submitted_at is not None:
        key = f" with key {record.key}, priority {record.priority}" if record.key else ""
        out.append(Moment(record.submitted_at, "submitted", f"submitted{key}"))
    if record.started_at is not None:
        out.append(Moment(record.started_at, "started", "started (first attempt)"))
    if record.deferred_since is not None:
        what = f", waiting on {record.waiting_on}" if record.waiting_on else ""
        out.append(Moment(record.deferred_since, "deferred", f"deferred{what}"))
    if record.finished_at is not None:
        why = f": {record.error}" if record.error else ""
        text = f"{record.status.value} after attempt {record.attempt}{why}"
        ended = "finished" if record.status is TaskStatus.COMPLETED else "ended-badly"
        out.append(Moment(record.finished_at, ended, text))
    for c in commands:
        out.append(Moment(c.at, "command", f"{c.kind} by {c.who}: {c.detail}"))
    return sorted(out, key=lambda m: m.at)


async def task(request: Request) -> Response:
    board, version = _board(request)
    task_id, record = await _find(board, request, "task_id", lambda store, id: store.execution(id))
    if record is None:
        return _missing(request, "task", f"task {task_id!r}")
    commands = await board.read(task_commands, task_id)
    children = await board.read(task_children, task_id, CHILDREN_SHOWN)
    context = {
        "version": version,
        "title": f"Task {task_id}",
        "task": record,
        "children": children,
        "timeline": timeline(record, commands),
        "args_text": pretty_json(record.args),
        "result": excerpt(record.result) if record.result_kept else None,
        "shown_json": SHOWN_JSON,
        "current": "/tasks",
        "back": f"/tasks/{segment(task_id)}",
    }
    return render(request, "task.html", context)


async def result(request: Request) -> Response:
    """A task's kept result, whole, as JSON (its page shows the start of it)."""
    board, _ = _board(request)
    task_id, record = await _find(board, request, "task_id", lambda store, id: store.execution(id))
    if record is None:
        return _missing(request, "task", f"task {task_id!r}")
    if not record.result_kept:
        text = f"task {task_id!r} ({record.status.value}) has no kept result"
        return message(
            request, "No result", text, status_code=404, back=f"/tasks/{segment(task_id)}"
        )
    # (in a thread: indenting is Python's own encoder, and a result may be megabytes)
    whole = await trio.to_thread.run_sync(json_text, record.result)
    return Response(whole, media_type="application/json")


def step_states(run: RunRecord, tasks: Iterable[ExecutionRecord]) -> dict[str, str]:
    """Each step's state: as the run records it once it ended; before, from its
    live task (a step's task is named after the step): "running" once it has
    started (running, deferred, or pending again to wait out a retry's backoff:
    the run counts it in progress), "ready" while it is pending for its first
    attempt; any other step of the run's graph "pending"."""
    states = {step: state for step, (state, _) in run.steps.items()}
    for record in tasks:
        if record.name in states:
            continue
        if record.status is TaskStatus.RUNNING:
            states[record.name] = StepState.RUNNING.value
        elif record.status is TaskStatus.PENDING:
            retrying = record.attempt > 0
            states[record.name] = (StepState.RUNNING if retrying else StepState.READY).value
    for step in run.graph or ():
        states.setdefault(step, StepState.PENDING.value)
    return states


def step_summary(run: RunRecord, tasks: Iterable[ExecutionRecord]) -> list[tuple[str, int]]:
    """How many of the run's steps are in each state (`step_states`), in the
    order of a step's life."""
    counted = collections.Counter(step_states(run, tasks).values())
    return sorted(counted.items(), key=lambda item: (_LIFE.get(item[0], len(_LIFE)), item[0]))


_LIFE = {state.value: i for i, state in enumerate(StepState)}


async def runs(request: Request) -> Response:
    board, version = _board(request)
    try:
        status = _choice(request.query_params, "status", RUN_STATES)
        cursor = request.query_params.get("cursor") or None
        page = await board.read(runs_page, status=status, limit=PAGE_SIZE, cursor=cursor)
    except ValueError as exc:
        return bad_query(request, exc)
    context = {
        "version": version,
        "title": "Runs",
        "runs": page.rows,
        **_pager("/runs", {"status": status}, cursor, page.next_cursor),
        "status": status,
        "statuses": RUN_STATES,
        "steps": {r.run_id: step_summary(r, page.live.get(r.run_id, ())) for r in page.rows},
    }
    return render(request, "runs.html", context)


async def run(request: Request) -> Response:
    board, version = _board(request)
    run_id, record = await _find(board, request, "run_id", lambda store, id: store.run(id))
    if record is None:
        return _missing(request, "run", f"workflow run {run_id!r}")
    its_tasks = await board.read(browse, run_id=run_id, order="oldest", limit=200)
    states = step_states(record, its_tasks.rows)
    context = {
        "version": version,
        "title": f"Run {run_id}",
        "run": record,
        "graph": run_graph(
            record.graph,
            states,
            {r.name: r.waiting_on for r in its_tasks.rows if r.waiting_on and r.name in states},
        ),
        "step_w": STEP_W,
        "step_h": STEP_H,
        "tasks": its_tasks.rows,
        "context_text": pretty_json(record.context),
        "current": "/runs",
        "back": f"/runs/{segment(run_id)}",
    }
    return render(request, "run.html", context)


async def promises(request: Request, flash: str | None = None, status_code: int = 200) -> Response:
    board, version = _board(request)
    query = request.query_params if request.method == "GET" else {}
    try:
        state = _choice(query, "state", PROMISE_STATES)
        cursor = query.get("cursor") or None
        if cursor is not None and not storable(cursor):  # (a NUL: no promise's id, no read)
            raise ValueError(f"malformed cursor {cursor!r}")
        await trio.to_thread.run_sync(board.check_file)  # (StoreError: the 503 page)
        found, next_cursor = await board.durable.promises.search(
            state=state, limit=PAGE_SIZE, cursor=cursor
        )
    except ValueError as exc:
        return bad_query(request, exc)
    context = {
        "version": version,
        "title": "Promises",
        "promises": found,
        "state": state,
        "states": PROMISE_STATES,
        **_pager("/promises", {"state": state}, cursor, next_cursor),
        "current": "/promises",
    }
    if request.method != "GET":  # (an action's refusal, shown on the page)
        context["back"] = "/promises"
    return render(request, "promises.html", context, status_code=status_code, flash=flash)


async def failed(request: Request) -> Response:
    board, version = _board(request)
    name = request.query_params.get("name") or None
    cursor = request.query_params.get("cursor") or None
    try:
        page = await board.read(
            browse, status="failed", name=name, order="newest", limit=PAGE_SIZE, cursor=cursor
        )
    except ValueError as exc:
        return bad_query(request, exc)
    context = {
        "version": version,
        "title": "Failed tasks",
        "page": page,
        "name": name,
        "names": await board.read(task_names),
        **_pager("/failed", {"name": name}, cursor, page.next_cursor),
    }
    return render(request, "failed.html", context)


async def control(request: Request) -> Response:
    board, version = _board(request)
    pauses = await board.read(lambda store: store.pauses())
    # The last ~50 by seq, and any newer than the poller has seen: never the whole log.
    after = 0 if board.counts is None else max(0, board.counts.last_command - COMMANDS_SHOWN)
    log = await board.read(lambda store: store.commands(after))
    context = {
        "version": version,
        "title": "Control",
        "pauses": pauses,
        "commands": list(reversed(log[-COMMANDS_SHOWN:])),
        "names": await board.read(task_names),
    }
    return render(request, "control.html", context)
