"""The dashboard's routes, in process: httpx's ASGI client under pytest-trio against
a SQLite file a real executor wrote (and a PostgreSQL database, for the overview,
the task list and the task tree), the app's lifespan run as a server runs it.

Every route renders; the filters filter; every value from the database is escaped
(a task named ``<script>alert(1)</script>``, names with ``[``, ``'``, an emoji);
every action is refused without the token, without the CSRF field, from another
Origin, and does not exist under ``read_only``; the actions do what they say. A
task's page links its parent and lists its first children, whatever their ids.
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import logging
import re
import sqlite3
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import markupsafe
import pytest
import trio
import trio.testing

import trioexec
from trioexec import SubStatus, TaskStatus, Workflow, task
from trioexec._changes import Finish, RunCreated, Start, StepRecorded, Sub, submitted
from trioexec.durable import DurableStore, PromiseState
from trioexec.web import create_app
from trioexec.web._render import SHOWN_JSON, Excerpt, excerpt, json_text, segment
from trioexec.web._security import cookie_name, cookie_value, csrf_of

TOKEN = "test-token-0123456789"
COOKIE = cookie_name(TOKEN)
BASE = "http://127.0.0.1:8321"
ORIGIN = {"origin": BASE}
SCRIPT = "<script>alert(1)</script>"
ODD_NAMES = (SCRIPT, "batch[/]", "it's", "rocket 🚀")


def esc(text: str) -> str:
    return str(markupsafe.escape(text))


@task(id="web-boom")
async def boom(n: int) -> None:
    raise ValueError(f"boom {n} <b>bold</b>")


@task(id="fetch")
async def fetch(context: trioexec.Context) -> None:
    context["rows"] = 3


@task(id="load", dependencies=["fetch"])
async def load(context: trioexec.Context) -> None:
    await trio.lowlevel.checkpoint()


@task(id="index", dependencies=["fetch"])
async def index(context: trioexec.Context) -> None:
    await trio.lowlevel.checkpoint()


@task(id="publish", dependencies=["load", "index"])
async def publish(context: trioexec.Context) -> None:
    await trio.lowlevel.checkpoint()


LIVE_GRAPH = {"fetch": [], "approve": ["fetch"], "pay": ["approve"]}


@attrs.frozen
class Db:
    target: str
    failed: str  # the failed, re-creatable task's id
    odd: dict[str, str]  # odd name -> its task id


async def build(target: str) -> Db:
    """A database written by a real executor: odd names completed, a failed
    re-creatable task, a workflow run of four steps; then live rows another
    executor left (two deferred, one active, one pending), and promises."""
    odd: dict[str, str] = {}

    async def noop() -> None:
        await trio.lowlevel.checkpoint()

    with trioexec.open_store(target) as store:
        async with trioexec.open_executor(store=store, tasks=[boom]) as ex:
            for name in ODD_NAMES:
                ref = await ex.submit(noop, name=name)
                assert (await ref.wait()).ok
                odd[name] = ref.task_id
            bad = await ex.submit(boom, 7, task_id="dead-1")
            assert not (await bad.wait()).ok
            done = await ex.run_workflow(
                Workflow("etl", [fetch, load, index, publish]), context={"job": 1}, run_id="run-1"
            )
            assert done.ok
        now = time.time()
        store.write(
            [
                submitted("approval-old", 1, "approval", None, None, None, "w2", now - 3600),
                Start(("approval-old", 1, 1, now - 3600)),
                Sub(("approval-old", 1, SubStatus.DEFERRED, now - 3600, "promise approval-7")),
                submitted("webhook-new", 1, "webhook", None, None, None, "w2", now - 5),
                Start(("webhook-new", 1, 1, now - 5)),
                Sub(("webhook-new", 1, SubStatus.DEFERRED, now - 5, "event")),
                submitted("crunch-1", 1, "crunch", None, None, None, "w2", now - 5),
                Start(("crunch-1", 1, 1, now - 5)),
                submitted("queued-1", 1, "queued", None, None, None, "w2", now - 5),
                # A run under way on that executor: its approval step waits.
                RunCreated(("run-live", "w2", "refund", "{}", now - 60, json.dumps(LIVE_GRAPH))),
                StepRecorded(("run-live", "w2", "fetch", "completed", "1", "fetch-9")),
                submitted("approve-9", 1, "approve", "run-live", None, None, "w2", now - 50),
                Start(("approve-9", 1, 1, now - 50)),
                Sub(("approve-9", 1, SubStatus.DEFERRED, now - 50, "promise approval-7")),
            ]
        )
    with DurableStore(target) as ds:
        await ds.promises.create("approval-7", 3600, data={"who": "bob"}, tags={"team": "ops"})
        await ds.promises.create(f"p-{SCRIPT}", 3600)
        await ds.promises.create("done-1", 3600)
        await ds.promises.resolve("done-1", data=42)
    return Db(target, "dead-1", odd)


@pytest.fixture
async def db(tmp_path: Path) -> Db:
    return await build(str(tmp_path / "app.db"))


@asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    """Run the app's lifespan as an ASGI server does (httpx's transport does not)."""
    to_app, app_in = trio.open_memory_channel[dict[str, Any]](4)
    app_out, from_app = trio.open_memory_channel[dict[str, Any]](4)
    async with trio.open_nursery() as nursery:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        nursery.start_soon(app, scope, app_in.receive, app_out.send)
        await to_app.send({"type": "lifespan.startup"})
        assert (await from_app.receive())["type"] == "lifespan.startup.complete"
        try:
            yield
        finally:
            await to_app.send({"type": "lifespan.shutdown"})
            assert (await from_app.receive())["type"] == "lifespan.shutdown.complete"


@asynccontextmanager
async def client(
    target: str, *, logged_in: bool = True, **options: Any
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(target, token=TOKEN, **options)
    async with lifespan(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as c:
            if logged_in:
                r = await c.get(f"/?token={TOKEN}")
                assert r.status_code == 303
                assert r.headers["location"] == "/"
                assert c.cookies.get(COOKIE) == cookie_value(TOKEN)
            yield c


def form(**fields: str) -> dict[str, str]:
    return {"csrf": csrf_of(TOKEN), **fields}


def rows_of(page: str, table: str) -> list[str]:
    """The data-task-id of each row of ``table#<table>``, in order."""
    body = page.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
    return [html.unescape(i) for i in re.findall(r'data-task-id="([^"]*)"', body)]


# ---------------------------------------------------------------------- pages


PAGES = ["/", "/tasks", "/tasks/dead-1", "/runs", "/runs/run-1", "/promises", "/failed", "/control"]


@pytest.mark.parametrize("read_only", [False, True])
async def test_every_page_renders_with_nav_and_headers(db: Db, read_only: bool) -> None:
    async with client(db.target, read_only=read_only) as c:
        for path in PAGES:
            r = await c.get(path)
            assert r.status_code == 200, (path, r.text[:500])
            assert r.headers["content-type"].startswith("text/html")
            assert "script-src 'self'" in r.headers["content-security-policy"]
            assert "unsafe-inline" not in r.headers["content-security-policy"]
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["x-content-type-options"] == "nosniff"
            assert f'data-read-only="{str(read_only).lower()}"' in r.text
            for href in ("/", "/tasks", "/runs", "/promises", "/failed", "/control"):
                assert f'<a href="{href}"' in r.text
            assert "<script>" not in r.text  # (only <script src=...> from the package)
            with_actions = path in ("/tasks/dead-1", "/promises", "/failed", "/control")
            assert ('method="post"' in r.text) is (with_actions and not read_only), path
        for path in ("/static/dashboard.js", "/static/dashboard.css"):
            assert (await c.get(path)).status_code == 200


async def test_overview_counts_charts_and_longest_waiting(db: Db) -> None:
    async with client(db.target) as c:
        page = (await c.get("/")).text
    counts = dict(re.findall(r'data-count="(\w+)">(\d+)<', page))
    assert counts["active"] == "1"
    assert counts["deferred"] == "3"
    assert counts["pending"] == "1"
    assert counts["failed"] == "1"
    assert int(counts["completed"]) == len(ODD_NAMES) + 4
    for chart in ("chart-slots", "chart-throughput", "chart-failures"):
        assert f'<svg id="{chart}"' in page
    waiting = rows_of(page, "waiting")
    assert waiting[:2] == ["approval-old", "queued-1"] or waiting[0] == "approval-old"
    assert "promise approval-7" in page


async def test_task_list_filters(db: Db) -> None:
    async with client(db.target) as c:

        async def ids(**query: str) -> list[str]:
            r = await c.get("/tasks", params=query)
            assert r.status_code == 200, r.text
            return rows_of(r.text, "tasks")

        assert await ids(status="failed") == ["dead-1"]
        assert set(await ids(sub_status="deferred")) == {"approval-old", "webhook-new", "approve-9"}
        assert await ids(name="crunch") == ["crunch-1"]
        assert await ids(waiting_on="promise", order="oldest") == ["approval-old", "approve-9"]
        assert await ids(waiting_on="event") == ["webhook-new"]
        assert await ids(name=SCRIPT) == [db.odd[SCRIPT]]
        longest = await ids(order="longest_waiting")
        assert longest[0] == "approval-old"
        everything = await ids()
        assert set(everything) >= {"dead-1", "crunch-1", *db.odd.values()}
        bad = await c.get("/tasks", params={"status": "exploded"})
        assert bad.status_code == 400
        assert "exploded" in bad.text


async def test_task_list_pages_by_cursor(db: Db) -> None:
    async with client(db.target) as c:
        seen: list[str] = []
        url: str | None = "/tasks?order=oldest"
        import trioexec.web._pages as pages

        pages_before, pages.PAGE_SIZE = pages.PAGE_SIZE, 3
        try:
            while url:
                page = (await c.get(url)).text
                seen += rows_of(page, "tasks")
                found = re.search(r'class="next" rel="next" href="([^"]*)"', page)
                url = html.unescape(found.group(1)) if found else None
        finally:
            pages.PAGE_SIZE = pages_before
        everything = rows_of((await c.get("/tasks?order=oldest")).text, "tasks")
    assert seen == everything
    assert len(seen) == len(set(seen)) > 3


async def test_the_runs_page_pages_newest_first(db: Db) -> None:
    with trioexec.open_store(db.target) as store:
        store.write(
            [RunCreated((f"many-{i:02d}", "w3", "bulk", "{}", 2e9 + i, "{}")) for i in range(60)]
        )
    async with client(db.target) as c:
        first = (await c.get("/runs")).text
        [next_url] = re.findall(r'rel="next" href="([^"]*)"', first)
        second = (await c.get(html.unescape(next_url))).text
    ids = re.findall(r'data-run-id="([^"]*)"', first)
    assert ids == [f"many-{i:02d}" for i in reversed(range(10, 60))]
    assert re.findall(r'data-run-id="([^"]*)"', second) == [
        *(f"many-{i:02d}" for i in reversed(range(10))),
        "run-1",
        "run-live",  # (written as created a minute before run-1)
    ]
    assert 'rel="next"' not in second


async def test_a_cursor_out_of_range_is_a_400_naming_it(db: Db) -> None:
    huge = base64.urlsafe_b64encode(b'["newest",99999999999999999999999999]').decode()
    async with client(db.target) as c:
        for path in ("/tasks", "/failed"):
            r = await c.get(path, params={"cursor": huge})
            assert r.status_code == 400, (path, r.text[:300])
            assert "cursor" in r.text
            assert '<a href="/tasks"' in r.text


async def test_one_task_shows_timeline_error_traceback_and_args(db: Db) -> None:
    async with client(db.target) as c:
        page = (await c.get("/tasks/dead-1")).text
        missing = await c.get("/tasks/nope")
    assert 'id="timeline"' in page
    assert len(re.findall(r"<li class=\"event-", page)) >= 3
    assert '<li class="event-ended-badly">' in page  # (its dot is red, not green)
    assert '<li class="event-finished">' not in page
    error = page.split('id="error"', 1)[1].split("</pre>", 1)[0]
    assert "boom 7 &lt;b&gt;bold&lt;/b&gt;" in error
    assert "ValueError" in page.split('id="traceback"', 1)[1]
    args = page.split('id="args"', 1)[1].split("</pre>", 1)[0]
    assert json.loads(html.unescape(args.split(">", 1)[1])) == [7]
    assert missing.status_code == 404
    assert "nope" in missing.text


async def test_run_page_draws_the_graph_by_depth(db: Db) -> None:
    async with client(db.target) as c:
        page = (await c.get("/runs/run-1")).text
        listing = (await c.get("/runs")).text
        missing = await c.get("/runs/none")
    steps = dict(
        re.findall(r'<g class="step state-\w+" data-step="(\w+)" data-state="(\w+)"', page)
    )
    assert steps == dict.fromkeys(("fetch", "load", "index", "publish"), "completed")
    x = {
        step: int(n)
        for step, n in re.findall(
            r'data-step="(\w+)" data-state="\w+" transform="translate\((\d+)', page
        )
    }
    assert x["fetch"] < x["load"] == x["index"] < x["publish"]
    assert len(re.findall(r'<path class="edge"', page)) == 4
    assert 'data-run-id="run-1"' in listing
    assert missing.status_code == 404


async def test_a_run_under_way_shows_each_step_as_its_task_is(db: Db) -> None:
    async with client(db.target) as c:
        page = (await c.get("/runs/run-live")).text
    steps = dict(re.findall(r'data-step="(\w+)" data-state="(\w+)"', page))
    assert steps == {"fetch": "completed", "approve": "running", "pay": "pending"}
    assert "<title>approve: running, waiting on promise approval-7</title>" in page
    assert "approve-9" in page


def test_the_graph_layout_without_a_graph_and_with_a_cycle() -> None:
    from trioexec.web._svg import depths, run_graph

    column = run_graph(None, {"b": "completed", "a": "running"})
    assert [(s.step_id, s.x) for s in column.steps] == [("b", 10), ("a", 10)]
    assert column.steps[0].y < column.steps[1].y
    assert not column.edges
    assert not column.layered
    # (a broken record: the cycle is cut where it is met)
    assert depths({"a": ["b"], "b": ["a"], "c": ["a"]}) == {"a": 2, "b": 1, "c": 3}
    layered = run_graph({"x": ["gone"]}, {})
    assert {s.step_id: s.state for s in layered.steps} == {"x": "pending", "gone": "pending"}
    # A long chain listed dependents first (a foreign or hand-written record):
    # laid out without recursion, one step a column.
    chain = {f"s{i}": [f"s{i - 1}"] if i else [] for i in reversed(range(1200))}
    assert depths(chain) == {f"s{i}": i for i in range(1200)}
    long = run_graph(chain, {"s0": "completed"})
    assert len(long.steps) == 1200
    assert len({s.x for s in long.steps}) == 1200


async def test_fragments_render_alone_and_unknown_ones_are_refused(db: Db) -> None:
    async with client(db.target) as c:
        rows = await c.get("/tasks", params={"fragment": "rows", "status": "failed"})
        graph = await c.get("/runs/run-1", params={"fragment": "run"})
        counts = await c.get("/", params={"fragment": "counts"})
        bad = await c.get("/tasks", params={"fragment": "<x>"})
    assert rows.status_code == 200
    assert "<html" not in rows.text
    assert re.findall(r'data-task-id="([^"]*)"', rows.text) == ["dead-1"]
    assert '<svg id="graph"' in graph.text
    assert 'data-count="active">1<' in counts.text
    assert bad.status_code == 400
    assert "<x>" not in bad.headers["content-type"]
    assert bad.headers["content-type"].startswith("text/plain")


async def test_a_fragments_forms_lead_back_to_the_page_not_the_fragment(db: Db) -> None:
    """The script puts a fragment's forms into the page: their ``back`` is the page
    (its filters kept), never ``?fragment=`` (a bare fragment, no nav, after the
    action)."""
    async with client(db.target) as c:
        failed = await c.get("/failed", params={"fragment": "rows", "name": "web-boom"})
        promised = await c.get("/promises", params={"state": "pending", "fragment": "rows"})
        detail = await c.get("/tasks/queued-1", params={"fragment": "detail"})
        backs = [
            html.unescape(b)
            for page in (failed, promised, detail)
            for b in re.findall(r'name="back" value="([^"]*)"', page.text)
        ]
        r = await c.post(
            "/actions/promises/approval-7/resolve",
            data=form(data="1", back=backs[len(re.findall('name="back"', failed.text))]),
            headers=ORIGIN,
        )
    assert "/failed?name=web-boom" in backs
    assert "/promises?state=pending" in backs
    assert "/tasks/queued-1" in backs
    assert not [b for b in backs if "fragment" in b]
    assert r.status_code == 303
    assert r.headers["location"] == "/promises?state=pending"


async def test_every_value_from_the_database_is_escaped(db: Db) -> None:
    async with client(db.target) as c:
        pages = [(await c.get(p)).text for p in ("/", "/tasks", "/promises", "/control")]
        pages += [(await c.get(f"/tasks/{db.odd[n]}")).text for n in ODD_NAMES]
        names = (await c.get("/tasks", params={"order": "oldest"})).text
    for page in pages:
        assert SCRIPT not in page
        assert "alert(1)" not in page or "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert esc(SCRIPT) in names
    for name in ODD_NAMES:
        assert esc(name) in names
    assert f'data-promise-id="p-{esc(SCRIPT)}"' in pages[2]


async def test_a_page_needs_the_token_when_reads_require_it(db: Db) -> None:
    async with client(db.target, logged_in=False, require_token_for_reads=True) as c:
        assert (await c.get("/")).status_code == 403
        assert (await c.get("/tasks")).status_code == 403
        assert (await c.get("/events")).status_code == 403
        assert (await c.get("/?token=wrong")).status_code == 403
        r = await c.get(f"/tasks?status=failed&token={TOKEN}")
        assert r.status_code == 303
        assert r.headers["location"] == "/tasks?status=failed"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        assert (await c.get("/tasks")).status_code == 200
    async with client(db.target, logged_in=False) as c:  # loopback: reads are free
        assert (await c.get("/")).status_code == 200
        # ... by a loopback name only: a rebound name (DNS rebinding) needs the token.
        rebound = {"host": "evil.example:8321"}
        assert (await c.get("/", headers=rebound)).status_code == 403
        assert (await c.get("/", headers={"host": "localhost:8321"})).status_code == 200
        c.cookies.set(COOKIE, cookie_value(TOKEN))
        assert (await c.get("/", headers=rebound)).status_code == 200  # (a reverse proxy)


# ---------------------------------------------------------------------- actions

ACTIONS: list[tuple[str, dict[str, str]]] = [
    ("/actions/promises/approval-7/resolve", {"data": '{"ok": true}'}),
    ("/actions/promises/approval-7/reject", {"data": '"no"'}),
    ("/actions/tasks/dead-1/retry", {}),
    ("/actions/tasks/crunch-1/cancel", {}),
    ("/actions/pause", {"kind": "name", "value": "crunch"}),
    ("/actions/resume", {"kind": "name", "value": "crunch"}),
]


async def nothing_changed(target: str) -> None:
    with trioexec.open_store(target, read_only=True) as store:
        assert store.commands(0) == []
        assert store.execution("dead-1").status is TaskStatus.FAILED  # type: ignore[union-attr]
    with DurableStore(target) as ds:
        assert (await ds.promises.get("approval-7")).state is PromiseState.PENDING  # type: ignore[union-attr]


@pytest.mark.parametrize(("path", "fields"), ACTIONS, ids=[a[0] for a in ACTIONS])
async def test_an_action_is_refused_without_token_csrf_or_origin(
    db: Db, path: str, fields: dict[str, str]
) -> None:
    async with client(db.target, logged_in=False) as c:
        r = await c.post(path, data=form(**fields), headers=ORIGIN)
        assert r.status_code == 403, "no token"
        assert "token" in r.text
    async with client(db.target) as c:
        r = await c.post(path, data=fields, headers=ORIGIN)
        assert r.status_code == 403, "no csrf"
        assert "CSRF" in r.text
        r = await c.post(path, data={**fields, "csrf": "x" * 64}, headers=ORIGIN)
        assert r.status_code == 403, "wrong csrf"
        r = await c.post(path, data=form(**fields), headers={"origin": "http://evil.example"})
        assert r.status_code == 403, "foreign origin"
        r = await c.post(path, data=form(**fields), headers={"sec-fetch-site": "cross-site"})
        assert r.status_code == 403, "cross-site fetch"
        c.cookies.set(COOKIE, "not-the-token")
        r = await c.post(path, data=form(**fields), headers=ORIGIN)
        assert r.status_code == 403, "wrong token"
    await nothing_changed(db.target)


@pytest.mark.parametrize(("path", "fields"), ACTIONS, ids=[a[0] for a in ACTIONS])
async def test_no_action_exists_under_read_only(db: Db, path: str, fields: dict[str, str]) -> None:
    async with client(db.target, read_only=True) as c:
        r = await c.post(path, data=form(**fields), headers=ORIGIN)
        assert r.status_code in (404, 405)
    await nothing_changed(db.target)


async def test_resolve_a_promise(db: Db) -> None:
    async with client(db.target) as c:
        r = await c.post(
            "/actions/promises/approval-7/resolve",
            data=form(data='{"approved": true}', back="/promises?state=pending"),
            headers=ORIGIN,
        )
        assert r.status_code == 303
        assert r.headers["location"] == "/promises?state=pending"
        page = (await c.get("/promises")).text
        again = await c.post(
            "/actions/promises/approval-7/reject", data=form(data=""), headers=ORIGIN
        )
    with DurableStore(db.target) as ds:
        record = await ds.promises.get("approval-7")
    assert record is not None
    assert record.state is PromiseState.RESOLVED
    assert json.loads(record.data or "null") == {"approved": True}
    row = page.split('data-promise-id="approval-7"', 1)[1].split("</tr>", 1)[0]
    assert 'class="state state-resolved">resolved<' in row
    assert again.status_code == 409  # settled already: said on the page
    assert 'id="flash"' in again.text


async def test_reject_with_bad_json_says_so_and_changes_nothing(db: Db) -> None:
    async with client(db.target) as c:
        r = await c.post(
            "/actions/promises/approval-7/reject", data=form(data="{not json"), headers=ORIGIN
        )
        assert r.status_code == 400
        flash = r.text.split('id="flash"', 1)[1].split("</p>", 1)[0]
        assert "not JSON" in flash
        assert 'data-promise-id="approval-7"' in r.text  # the page, to try again
        ok = await c.post(
            "/actions/promises/approval-7/reject", data=form(data='"too late"'), headers=ORIGIN
        )
        assert ok.status_code == 303
    with DurableStore(db.target) as ds:
        record = await ds.promises.get("approval-7")
    assert record is not None
    assert record.state is PromiseState.REJECTED


async def test_retry_requeues_a_failed_task(db: Db) -> None:
    async with client(db.target) as c:
        r = await c.post("/actions/tasks/dead-1/retry", data=form(back="/failed"), headers=ORIGIN)
        assert r.status_code == 303
        assert r.headers["location"] == "/failed"
        refused = await c.post("/actions/tasks/crunch-1/retry", data=form(), headers=ORIGIN)
    assert refused.status_code == 409
    assert "crunch-1" in refused.text
    with trioexec.open_store(db.target, read_only=True) as store:
        record = store.execution("dead-1")
        assert record is not None
        assert record.status is TaskStatus.PENDING
        [command, _] = store.commands(0)
    assert command.kind == "retry"
    assert "(dashboard, from " in command.who


async def test_cancel_a_live_task(db: Db) -> None:
    async with client(db.target) as c:
        r = await c.post("/actions/tasks/queued-1/cancel", data=form(), headers=ORIGIN)
        assert r.status_code == 303
        assert r.headers["location"] == "/tasks/queued-1"
        again = await c.post("/actions/tasks/nope/cancel", data=form(), headers=ORIGIN)
    assert again.status_code == 409
    with trioexec.open_store(db.target, read_only=True) as store:
        [command, _] = store.commands(0)
    assert (command.kind, command.task_id) == ("cancel", "queued-1")


async def test_pause_and_resume_by_name_and_key(db: Db) -> None:
    async with client(db.target) as c:
        for kind, value in (("name", SCRIPT), ("key", "tenant-1")):
            r = await c.post("/actions/pause", data=form(kind=kind, value=value), headers=ORIGIN)
            assert r.status_code == 303
            assert r.headers["location"] == "/control"
        page = (await c.get("/control")).text
        with trioexec.open_store(db.target, read_only=True) as store:
            assert {(p.kind, p.value) for p in store.pauses()} == {
                ("name", SCRIPT),
                ("key", "tenant-1"),
            }
        r = await c.post("/actions/resume", data=form(kind="name", value=SCRIPT), headers=ORIGIN)
        assert r.status_code == 303
        bad = await c.post("/actions/pause", data=form(kind="sql", value="x"), headers=ORIGIN)
        empty = await c.post("/actions/pause", data=form(kind="name", value=""), headers=ORIGIN)
    assert esc(SCRIPT) in page
    assert SCRIPT not in page
    assert bad.status_code == 400
    assert "sql" in bad.text
    assert empty.status_code == 400
    with trioexec.open_store(db.target, read_only=True) as store:
        assert [(p.kind, p.value) for p in store.pauses()] == [("key", "tenant-1")]
        assert [c.kind for c in store.commands(0)] == ["pause", "pause", "resume"]
        assert all("dashboard" in c.who for c in store.commands(0))


async def test_two_dashboards_on_one_host_keep_their_own_login(db: Db, tmp_path: Path) -> None:
    """Cookies are scoped by host, not port: each dashboard's cookie has its own
    name, so logging in to a second one leaves the first one's login as it was."""
    other = create_app(str(tmp_path / "other.db"), token="other-token-9876543210")
    with trioexec.open_store(str(tmp_path / "other.db")):
        pass
    first = create_app(db.target, token=TOKEN)
    mounts = {
        BASE: httpx.ASGITransport(app=first),
        "http://127.0.0.1:8322": httpx.ASGITransport(app=other),
    }
    async with lifespan(first), lifespan(other), httpx.AsyncClient(mounts=mounts) as c:
        assert (await c.get(f"{BASE}/?token={TOKEN}")).status_code == 303
        r = await c.get("http://127.0.0.1:8322/?token=other-token-9876543210")
        assert r.status_code == 303
        assert len(c.cookies.jar) == 2
        r = await c.post(
            f"{BASE}/actions/pause", data=form(kind="name", value="crunch"), headers=ORIGIN
        )
    assert r.status_code == 303, r.text
    with trioexec.open_store(db.target, read_only=True) as store:
        assert [(p.kind, p.value) for p in store.pauses()] == [("name", "crunch")]


async def test_a_foreign_back_field_is_not_followed(db: Db) -> None:
    async with client(db.target) as c:
        r = await c.post(
            "/actions/pause",
            data=form(kind="name", value="x", back="//evil.example/"),
            headers=ORIGIN,
        )
    assert r.status_code == 303
    assert r.headers["location"] == "/control"


# ---------------------------------------------------------------------- store errors


def says_store_error(r: httpx.Response, *words: str) -> None:
    assert r.status_code == 503, r.text[:300]
    assert '<a href="/tasks"' in r.text  # the page's frame, its nav
    line = r.text.split('id="message"', 1)[1].split("</p>", 1)[0]
    assert "the store could not be read" in line
    for word in words:
        assert word in line


async def test_a_deleted_sqlite_file_is_said_on_every_page_and_never_recreated(db: Db) -> None:
    async with client(db.target) as c:
        assert (await c.get("/")).status_code == 200
        await trio.Path(db.target).unlink()
        for path in PAGES:
            says_store_error(await c.get(path), "deleted", "restart the dashboard")
        fragment = await c.get("/tasks", params={"fragment": "rows"})
        settled = await c.post(
            "/actions/promises/approval-7/resolve", data=form(data="1"), headers=ORIGIN
        )
        retried = await c.post("/actions/tasks/dead-1/retry", data=form(), headers=ORIGIN)
    assert fragment.status_code == 503
    assert fragment.headers["content-type"].startswith("text/plain")
    assert settled.status_code == 503
    assert "deleted" in settled.text
    assert retried.status_code == 400
    assert "deleted" in retried.text
    assert not await trio.Path(db.target).exists()  # (no action made a new file there)


async def test_a_postgres_database_gone_is_a_503_page_without_the_password(
    pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    import trioexec._store._pg_conn

    # (each read waits this long for a connection the server no longer gives)
    monkeypatch.setattr(trioexec._store._pg_conn, "CONNECT_TIMEOUT", 0.5)
    await build(pg_database)
    scheme, rest = pg_database.split("://", 1)
    user, host = rest.split("@", 1) if "@" in rest else ("postgres", rest)
    target = f"{scheme}://{user.split(':')[0]}:S3cretPW@{host}"  # (trust: never checked)
    async with client(target) as c:
        assert (await c.get("/")).status_code == 200
        admin = pg_database.rsplit("/", 1)[0] + "/postgres"
        with psycopg.connect(admin, autocommit=True) as conn:
            name = pg_database.rsplit("/", 1)[1]
            conn.execute(f"DROP DATABASE {name} WITH (FORCE)")
        pages = [await c.get(path) for path in PAGES]
        settled = await c.post(
            "/actions/promises/approval-7/resolve", data=form(data="1"), headers=ORIGIN
        )
    for r in pages:
        says_store_error(r)
    assert settled.status_code == 503
    assert all("S3cretPW" not in r.text for r in [*pages, settled])


# ---------------------------------------------------------------------- events


async def test_events_say_refresh_when_the_store_changes(db: Db) -> None:
    app = create_app(db.target, token=TOKEN)
    async with lifespan(app):
        board = app.state.dashboard.board
        with trio.fail_after(10):
            await board.wait_for_change(0)  # (the poller's first read)
        assert board.counts is not None
        got: list[str] = []
        first = trio.Event()
        changed = trio.Event()

        async def receive() -> dict[str, Any]:
            await trio.sleep_forever()
            raise AssertionError  # pragma: no cover

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                assert dict(message["headers"])[b"content-type"].startswith(b"text/event-stream")
            body = message.get("body", b"").decode()
            got.append(body)
            if "event: refresh" in body:
                (changed if first.is_set() else first).set()

        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.1"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/events",
            "raw_path": b"/events",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"127.0.0.1:8321")],
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 8321),
        }
        async with trio.open_nursery() as nursery:
            nursery.start_soon(app, scope, receive, send)
            with trio.fail_after(10):
                await first.wait()
            version = board.version
            with trioexec.open_store(db.target) as store:
                store.command("cancel", task_id="queued-1", who="test")
            with trio.fail_after(10):
                await changed.wait()
            assert board.version > version
            board.stop()  # as the server stopping does: the stream ends
        data = [
            json.loads(line[6:])
            for b in got
            for line in b.splitlines()
            if line.startswith("data: ")
        ]
        assert data[-1]["counts"]["cancelled"] == 1
        assert got[-1] == ""  # the response's last, empty body: it ended


# ---------------------------------------------------------------------- PostgreSQL


async def test_overview_and_tasks_on_postgres(pg_database: str) -> None:
    db = await build(pg_database)
    async with client(db.target) as c:
        page = (await c.get("/")).text
        failed = (await c.get("/tasks", params={"status": "failed"})).text
        deferred = (await c.get("/tasks", params={"sub_status": "deferred"})).text
        names = (await c.get("/tasks")).text
        for path in PAGES:
            assert (await c.get(path)).status_code == 200, path
    counts = dict(re.findall(r'data-count="(\w+)">(\d+)<', page))
    assert (counts["active"], counts["deferred"], counts["pending"]) == ("1", "3", "1")
    assert rows_of(failed, "tasks") == ["dead-1"]
    assert set(rows_of(deferred, "tasks")) == {"approval-old", "webhook-new", "approve-9"}
    assert SCRIPT not in names
    assert esc(SCRIPT) in names
    assert "postgresql" not in page or ":***@" in page or "password" not in page


# ---------------------------------------------------------------------- odd ids

#: Ids a browser would send elsewhere if a link or a form's action held them as
#: they are (or with only some characters encoded): dot segments (``%2e`` is a dot
#: too), slashes, percent signs, and the ones from issue 30.
ODD_IDS = (
    "..",
    ".",
    "~.",
    "~~..",
    "a/../b",
    "a/..",
    "%2e%2e",
    ".%2E",
    "x%2Fy",
    "q?x=1#f",
    "back\\slash",
    "[",
    "'",
    "🚀",
    "decoy/../../tasks/victim",
    "refund-small/../refund-big",
    "line\nbreak",
    "x\n",
    "y/cancel",
)
#: Where those would land instead: they exist too, and must be left alone.
VICTIMS = ("b", "victim", "refund-big", "x/y", "~..", "x")
_SINGLE, _DOUBLE = {".", "%2e"}, {"..", ".%2e", "%2e.", "%2e%2e"}


def browser_url(page: str, reference: str) -> str:
    """The URL a browser requests for ``reference`` (an ``href``, a form's action
    or a redirect's Location, as the page holds it) on ``page``, by the WHATWG URL
    rules for http: tabs and newlines dropped, a backslash before the query is a
    slash, and the path's ``.`` and ``..`` segments resolved away, written
    ``%2e`` or not, in any case. (`urllib.parse.urljoin` resolves ``..`` but
    not ``%2e%2e``, and keeps a backslash.)"""
    reference = re.sub(r"[\t\n\r]", "", reference.strip(" "))
    end = min((i for i in (reference.find("?"), reference.find("#")) if i >= 0), default=None)
    target, tail = reference[:end].replace("\\", "/"), reference[len(reference[:end]) :]
    base = urllib.parse.urlsplit(page)
    scheme, netloc = base.scheme, base.netloc
    if found := re.match(r"([a-zA-Z][a-zA-Z0-9+.-]*):(//.*)", target):
        scheme, target = found.group(1).lower(), found.group(2)
    if target.startswith("//"):
        netloc, _, rest = target[2:].partition("/")
        path = "/" + rest
    elif target.startswith("/"):
        path = target
    else:
        path = base.path.rsplit("/", 1)[0] + "/" + target
    segments = path[1:].split("/")
    out: list[str] = []
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg.lower() in _DOUBLE:
            if out:
                out.pop()
            if last:
                out.append("")
        elif seg.lower() in _SINGLE:
            if last:
                out.append("")
        else:
            out.append(seg)
    return f"{scheme}://{netloc}/{'/'.join(out)}{tail}"


def test_browser_url_resolves_as_a_browser_does() -> None:
    page = f"{BASE}/failed?name=x"
    for reference, expected in (
        ("/tasks/a/../b", "/tasks/b"),
        ("/tasks/a/%2E%2e/b/./c/%2e", "/tasks/b/c/"),
        ("/actions/tasks/decoy/../../tasks/victim/retry", "/actions/tasks/victim/retry"),
        ("/tasks/..", "/"),
        ("/tasks/.%2e?q=a/../b", "/?q=a/../b"),
        ("/x\\..\\y#a/..", "/y#a/.."),
        ("/tasks/a%2F..%2Fb", "/tasks/a%2F..%2Fb"),
        ("/tasks/~..", "/tasks/~.."),
        ("/t\nasks/.\t./z", "/z"),
        ("retry", "/retry"),
    ):
        assert browser_url(page, reference) == BASE + expected, reference
    assert browser_url(page, "//evil.example/x") == "http://evil.example/x"
    assert browser_url(page, "/\\evil.example/x") == "http://evil.example/x"
    assert browser_url(page, "https://evil.example/a/../b") == "https://evil.example/b"


#: Live tasks to cancel: the first would cancel ``queued-1`` if its action were
#: its id as it is.
LIVE_ODD = ("c/../queued-1", "c/..", "%2E", "~~.", "z/retry")


@pytest.fixture
async def odd(db: Db) -> Db:
    """`db`, with a failed (re-creatable) task, a pending promise and a workflow
    run of each odd id and of each victim, and a pending task of each `LIVE_ODD`."""
    now = time.time()
    with trioexec.open_store(db.target) as store:
        async with trioexec.open_executor(store=store, tasks=[boom]) as ex:
            for task_id in (*ODD_IDS, *VICTIMS):
                assert not (await (await ex.submit(boom, 1, task_id=task_id)).wait()).ok
        store.write(
            [
                *(
                    RunCreated((r, "w9", "odd", "{}", now, '{"s": []}'))
                    for r in (*ODD_IDS, *VICTIMS)
                ),
                *(submitted(t, 1, "queued", None, None, None, "w9", now) for t in LIVE_ODD),
            ]
        )
    with DurableStore(db.target) as ds:
        for promise_id in (*ODD_IDS, *VICTIMS):
            await ds.promises.create(promise_id, 3600)
    return db


def attribute(page: str, row: str, name: str) -> str:
    """The first ``name="..."`` attribute in ``row`` of ``page`` (unescaped)."""
    found = re.search(rf'{re.escape(row)}.*?\b{name}="([^"]*)"', page, re.S)
    assert found, (row, name)
    return html.unescape(found.group(1))


def task_row(task_id: str) -> str:
    return f'<tr data-task-id="{esc(task_id)}">'


def statuses(target: str) -> dict[str, TaskStatus]:
    with trioexec.open_store(target, read_only=True) as store:
        return {
            t: store.execution(t).status  # type: ignore[union-attr]
            for t in (*ODD_IDS, *VICTIMS, *LIVE_ODD, "queued-1")
        }


def heading(page: str) -> str:
    found = re.search(r"<h1>\w+ <code>([^<]*)</code></h1>", page)
    assert found, page[:500]
    return html.unescape(found.group(1))


async def test_every_link_and_retry_reaches_its_own_task_whatever_its_id(odd: Db) -> None:
    """Issue 30, 1: each odd id's link opens its own page, and Retry (on the failed
    list, and on the task's page) requeues that task and no other, then leads
    back to the page it was clicked on: every URL as a browser resolves it."""
    async with client(odd.target) as c:
        for i, task_id in enumerate((*ODD_IDS, *VICTIMS)):
            before = statuses(odd.target)
            failed_url = f"{BASE}/failed"
            failed = (await c.get(failed_url)).text
            row = task_row(task_id)
            page_url = browser_url(failed_url, attribute(failed, row, "href"))
            page = await c.get(page_url)
            assert page.status_code == 200, (task_id, page_url)
            assert heading(page.text) == task_id, page_url
            where, source = (failed_url, failed) if i % 2 else (page_url, page.text)
            start = row if i % 2 else '<div class="actions">'
            action = browser_url(where, attribute(source, start, "action"))
            back = attribute(source, start, 'name="back" value')
            r = await c.post(action, data=form(back=back), headers=ORIGIN)
            assert r.status_code == 303, (task_id, action, r.text[:300])
            assert browser_url(action, r.headers["location"]) == where
            after = statuses(odd.target)
            assert after.pop(task_id) is TaskStatus.PENDING, (task_id, action)
            before.pop(task_id)
            assert after == before, (task_id, action)


async def test_resolve_and_reject_reach_their_own_promise_whatever_its_id(odd: Db) -> None:
    async def states() -> dict[str, PromiseState]:
        with DurableStore(odd.target) as ds:
            return {
                p: (await ds.promises.get(p)).state  # type: ignore[union-attr]
                for p in (*ODD_IDS, *VICTIMS)
            }

    async with client(odd.target) as c:
        for i, promise_id in enumerate((*ODD_IDS, *VICTIMS)):
            before = await states()
            url = f"{BASE}/promises?state=pending"
            page = (await c.get(url)).text
            row = f'<tr data-promise-id="{esc(promise_id)}">'
            how = "formaction" if i % 2 else "action"
            action = browser_url(url, attribute(page, row, how))
            r = await c.post(action, data=form(data="1", back="/promises"), headers=ORIGIN)
            assert r.status_code == 303, (promise_id, action, r.text[:300])
            after = await states()
            settled = PromiseState.REJECTED if i % 2 else PromiseState.RESOLVED
            assert after.pop(promise_id) is settled, (promise_id, action)
            before.pop(promise_id)
            assert after == before, (promise_id, action)


async def test_every_run_link_and_cancel_reaches_its_own_object_whatever_its_id(odd: Db) -> None:
    async with client(odd.target) as c:
        url = f"{BASE}/runs"
        listing = (await c.get(url)).text
        for run_id in (*ODD_IDS, *VICTIMS):
            href = attribute(listing, f'<tr data-run-id="{esc(run_id)}">', "href")
            page = await c.get(browser_url(url, href))
            assert page.status_code == 200, (run_id, href)
            assert heading(page.text) == run_id, href
        for task_id in LIVE_ODD:
            url = f"{BASE}/tasks?status=pending"
            listing = (await c.get(url)).text
            page_url = browser_url(url, attribute(listing, task_row(task_id), "href"))
            page = (await c.get(page_url)).text
            assert heading(page) == task_id, page_url
            action = browser_url(page_url, attribute(page, '<div class="actions">', "action"))
            back = attribute(page, '<div class="actions">', 'name="back" value')
            r = await c.post(action, data=form(back=back), headers=ORIGIN)
            assert r.status_code == 303, (task_id, action, r.text[:300])
            assert browser_url(action, r.headers["location"]) == page_url
    with trioexec.open_store(odd.target, read_only=True) as store:
        assert [(c.kind, c.task_id) for c in store.commands(0)] == [("cancel", t) for t in LIVE_ODD]


# ---------------------------------------------------------------------- the login


async def test_the_token_url_redirects_only_to_a_path_of_this_site(db: Db) -> None:
    """Issue 30, 3: ``//evil.example/?token=`` (and a backslash's trick) signs in
    and stays here; any other path keeps its query and its encoded ``/``."""

    def url(path: str) -> httpx.URL:  # (as sent: httpx would read //x/ as a host)
        raw = f"{path}?token={TOKEN}&status=failed".encode()
        return httpx.URL(scheme="http", host="127.0.0.1", port=8321, raw_path=raw)

    async with client(db.target, logged_in=False) as c:
        for path, expected in (
            ("//evil.example/", "/"),
            ("///evil.example/", "/"),
            ("/\\evil.example/", "/%5Cevil.example/"),  # (a browser reads %5C as itself)
            ("/\\\\x/", "/%5C%5Cx/"),
        ):
            r = await c.get(url(path))
            assert r.status_code == 303, path
            location = r.headers["location"]
            assert browser_url(f"{BASE}/", location).startswith(f"{BASE}/"), location
            assert location == f"{expected}?status=failed", (path, location)
            assert c.cookies.get(COOKIE) == cookie_value(TOKEN)
        r = await c.get(url("/tasks/a%2F..%2Fb"))
        assert r.headers["location"] == "/tasks/a%2F..%2Fb?status=failed"
    from trioexec.web._security import is_local_path

    for path in ("/", "/tasks?x=//y", "/tasks/a%2F..%2Fb", "/%5Cx", "/a/b//c"):
        assert is_local_path(path), path
    for path in ("//x", "/\\x", "\\\\x", "http://x/", "x", "", "/\t/x", "/\n/x", " /x", "/x y"):
        assert not is_local_path(path), path


async def test_the_cookie_holds_a_value_derived_from_the_token_never_the_token(
    db: Db, tmp_path: Path
) -> None:
    """Issue 30, 4: a browser sends the cookie to every port of the host; what it
    holds is an HMAC of the token, not the token, and the token itself in the
    cookie is refused (as is another dashboard's cookie value)."""
    async with client(db.target, logged_in=False) as c:
        r = await c.get(f"/?token={TOKEN}")
        header = r.headers["set-cookie"]
        assert TOKEN not in header
        assert c.cookies.get(COOKIE) == cookie_value(TOKEN) != csrf_of(TOKEN)
        assert len(cookie_value(TOKEN)) == 64
        assert cookie_value("other-token-9876543210") != cookie_value(TOKEN)
        path, fields = ACTIONS[4]
        for wrong in (TOKEN, cookie_value("other-token-9876543210"), csrf_of(TOKEN)):
            c.cookies.set(COOKIE, wrong)
            r = await c.post(path, data=form(**fields), headers=ORIGIN)
            assert r.status_code == 403, wrong
        c.cookies.set(COOKIE, cookie_value(TOKEN))
        assert (await c.post(path, data=form(**fields), headers=ORIGIN)).status_code == 303
    async with client(db.target, logged_in=False, require_token_for_reads=True) as c:
        c.cookies.set(COOKIE, TOKEN)
        assert (await c.get("/")).status_code == 403
        c.cookies.set(COOKIE, cookie_value(TOKEN))
        assert (await c.get("/")).status_code == 200


async def test_the_store_error_log_line_is_one_line_whatever_the_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 30, 4: neither the path (``%0d``, ``%0a``) nor the error (here naming
    a file whose name holds a newline) can forge a line of the dashboard's log:
    the path is written as it was sent, percent-encoded, the error escaped."""
    db = await build(str(tmp_path / "app\n2026-01-01 FORGED.db"))
    async with client(db.target) as c:
        await trio.Path(db.target).unlink()
        with caplog.at_level(logging.WARNING, logger="trioexec.web"):
            # (a CR sends a terminal back to the line's start; a last LF ends it)
            r = await c.get("/tasks/x%0dGET%20/%20FORGED%0a?status=failed")
    assert r.status_code == 503
    [record] = [r for r in caplog.records if r.name == "trioexec.web"]
    text = record.getMessage()
    assert "\n" not in text
    assert "\r" not in text
    assert text.startswith("GET /tasks/x%0dGET%20/%20FORGED%0a: the store could not be read")
    assert "app\\n2026-01-01 FORGED.db: the database file was deleted" in text
    from trioexec.web._render import one_line

    assert one_line("a\nb\r\x1b[31m\u2028é") == "a\\nb\\r\\x1b[31m\\u2028é"


# ---------------------------------------------------------------------- values


DEEP = "[" * 100_000 + "]" * 100_000
#: Values Python's JSON parser takes or chokes on, and no store can keep.
UNSTORABLE = {
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "NaN": '{"x": NaN}',
    "1e400": "[1e400]",  # (a float out of range: inf)
    "digits": "1" * 5000,  # (more digits than Python converts)
    "deep": DEEP,
}


@pytest.mark.parametrize("how", ["resolve", "reject"])
@pytest.mark.parametrize("what", UNSTORABLE)
async def test_a_value_no_store_can_keep_is_one_clear_refusal(db: Db, how: str, what: str) -> None:
    """Issue 30, 14: the promise is untouched, the page says what is wrong in one
    line (400), never a 500."""
    async with client(db.target) as c:
        r = await c.post(
            f"/actions/promises/approval-7/{how}", data=form(data=UNSTORABLE[what]), headers=ORIGIN
        )
    assert r.status_code == 400, r.text[:300]
    flash = html.unescape(r.text.split('id="flash"', 1)[1].split("</p>", 1)[0])
    assert "approval-7" in flash
    assert "nothing was done" in flash
    assert any(word in flash for word in ("JSON", "nested")), flash
    assert 'data-promise-id="approval-7"' in r.text  # (the page, to try again)
    with DurableStore(db.target) as ds:
        record = await ds.promises.get("approval-7")
    assert record is not None
    assert record.state is PromiseState.PENDING


async def test_an_empty_promise_id_is_refused_by_the_store_not_a_500(db: Db) -> None:
    async with client(db.target) as c:
        r = await c.post("/actions/promises//resolve", data=form(data="1"), headers=ORIGIN)
    assert r.status_code == 400
    assert "non-empty" in html.unescape(r.text.split('id="flash"', 1)[1].split("</p>", 1)[0])


NUL_PAGES = {
    "/tasks/%00": 404,
    "/tasks/a%00b?fragment=detail": 404,
    "/runs/%00": 404,
    "/runs/r%00?fragment=run": 404,
    "/tasks?cursor=%00": 400,
    "/failed?cursor=a%00": 400,
    "/runs?cursor=%00": 400,
    "/promises?cursor=%00": 400,
    "/promises?cursor=p%00&state=pending": 400,
    "/tasks?name=%00": 200,
    "/tasks?key=k%00&status=pending": 200,
    "/tasks?waiting_on=%00": 200,
    "/failed?name=%00": 200,
    "/runs?status=%00": 400,
}
NUL_ACTIONS = {
    "/actions/tasks/%00/retry": 400,
    "/actions/tasks/%00/cancel": 400,
    "/actions/promises/%00/resolve": 404,
    "/actions/promises/a%00/reject": 404,
}


async def test_a_nul_in_an_id_cursor_or_filter_on_postgres_is_a_404_or_400(
    pg_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 30, 15: PostgreSQL's text cannot hold a NUL, so no task, run or
    promise has one: an id with one is unknown (404), a cursor with one malformed
    (400), a filter with one matches nothing; never a 503 "the store could not
    be read" with an outage on the log."""
    db = await build(pg_database)
    got = {}
    async with client(db.target) as c:
        with caplog.at_level(logging.WARNING, logger="trioexec.web"):
            for path in NUL_PAGES:
                got[path] = (await c.get(path)).status_code
            for path in NUL_ACTIONS:
                r = await c.post(path, data=form(data="1"), headers=ORIGIN)
                got[path] = r.status_code
            assert (await c.get("/tasks/dead-1")).status_code == 200  # (the pool is fine)
    assert got == {**NUL_PAGES, **NUL_ACTIONS}
    assert [r.getMessage() for r in caplog.records if r.name == "trioexec.web"] == []
    await nothing_changed(db.target)


# ---------------------------------------------------------------------- counts


async def test_the_overview_counts_every_execution_that_ended_as_finished(db: Db) -> None:
    """Issue 30, 16: cancelled, dropped and rejected executions are finished too
    (every status but pending and running)."""
    async with client(db.target) as c:
        before = (await c.get("/")).text
        now = time.time()
        with trioexec.open_store(db.target) as store:
            ended = (TaskStatus.CANCELLED, TaskStatus.DROPPED, TaskStatus.REJECTED)
            store.write(
                [
                    change
                    for i, status in enumerate((*ended, TaskStatus.TIMED_OUT))
                    for change in (
                        submitted(f"end-{i}", 1, "ender", None, None, None, "w2", now - 9),
                        Finish(
                            (
                                f"end-{i}",
                                1,
                                status,
                                now - 5,
                                f"{status.value} here",
                                None,
                                None,
                            )
                        ),
                    )
                ]
            )
        after = (await c.get("/")).text
    with sqlite3.connect(db.target) as conn:
        [(finished,)] = conn.execute(
            "SELECT count(*) FROM executions WHERE finished_at IS NOT NULL"
        )
    conn.close()

    def said(page: str) -> tuple[int, str]:
        found = re.search(r"(\d+)(?:</span>)? finished, failure rate ([\d.]+) %", page)
        assert found, page
        return int(found.group(1)), found.group(2)

    assert said(after) == (finished, f"{2 / finished * 100:.1f}")  # (dead-1, end-3)
    assert said(after)[0] == said(before)[0] + 4
    assert "cancelled, dropped or rejected" in after


#: The backoff test's events (a run's context holds JSON only).
SIGNALS: dict[str, trio.Event] = {}


@task(id="first")
async def first(context: trioexec.Context) -> None:
    await trio.lowlevel.checkpoint()


@task(
    id="flaky", dependencies=["first"], retries=1, backoff=trioexec.Backoff(initial=3600, max=3600)
)
async def flaky(context: trioexec.Context) -> None:
    SIGNALS["tried"].set()
    raise ConnectionError("try again later")


@task(id="held", dependencies=["first"])
async def held(context: trioexec.Context) -> None:
    await SIGNALS["release"].wait()


@task(id="last", dependencies=["flaky", "held"])
async def last(context: trioexec.Context) -> None:
    await trio.lowlevel.checkpoint()


async def test_a_step_in_its_retry_backoff_is_in_progress_on_the_graph_and_the_list(
    db: Db,
) -> None:
    """Issue 30, 17: a step waiting out its retry's backoff has started (the run
    counts it in progress): the graph draws it running, waiting on the backoff;
    the runs list counts the run's steps from its graph and its live tasks, not
    only the ones recorded (which are the ended ones)."""
    release = SIGNALS["release"] = trio.Event()
    tried = SIGNALS["tried"] = trio.Event()
    with trioexec.open_store(db.target) as store, trio.CancelScope() as scope:
        async with trioexec.open_executor(store=store, tasks=[first, flaky, held, last]) as ex:
            await ex.start_workflow(
                Workflow("backoff", [first, flaky, held, last]), run_id="run-backoff"
            )
            with trio.fail_after(20):
                await tried.wait()
                await trio.testing.wait_all_tasks_blocked()
                await ex.flush()
            async with client(db.target) as c:
                page = (await c.get("/runs/run-backoff")).text
                listing = (await c.get("/runs")).text
            release.set()
            scope.cancel()  # (the backoff is an hour: not waited out)
    steps = dict(re.findall(r'data-step="(\w+)" data-state="(\w+)"', page))
    assert steps == {"first": "completed", "flaky": "running", "held": "running", "last": "pending"}
    assert "<title>flaky: running, waiting on retry backoff</title>" in page
    row = listing.split('data-run-id="run-backoff"', 1)[1].split("</tr>", 1)[0]
    pills = re.findall(r'class="pill state-\w+">(\d+ \w+)<', row)
    assert pills == ["1 pending", "2 running", "1 completed"]
    live = listing.split('data-run-id="run-live"', 1)[1].split("</tr>", 1)[0]
    assert re.findall(r'class="pill state-\w+">(\d+ \w+)<', live) == [
        "1 pending",
        "1 running",
        "1 completed",
    ]


# ---------------------------------------------------------------- a newcomer's view (issue 34)


async def test_without_the_token_a_page_says_view_only_and_shows_no_buttons(db: Db) -> None:
    async with client(db.target, logged_in=False) as c:
        for path in ("/failed", "/promises", "/control", "/tasks/webhook-new"):
            page = (await c.get(path)).text
            assert 'id="view-only"' in page, path
            assert "open the URL <code>trioexec dashboard</code> printed" in page
            assert 'method="post"' not in page, path  # (no action: a filter still shows)
    async with client(db.target) as c:  # (logged in: the buttons, no banner)
        page = (await c.get("/failed")).text
        assert 'id="view-only"' not in page
        assert '<button class="retry"' in page
    async with client(db.target, read_only=True, logged_in=False) as c:
        page = (await c.get("/failed")).text
        assert 'id="view-only"' not in page  # (read-only says so itself)
        assert "read-only" in page


@pytest.mark.parametrize(("path", "name"), [("/tasks", "tasks"), ("/failed", "failed")])
async def test_the_body_names_the_page_not_a_repr_of_its_rows(db: Db, path: str, name: str) -> None:
    async with client(db.target) as c:
        page = (await c.get(path)).text
    assert f'data-page="{name}"' in page
    assert "Page(rows=" not in page
    assert "ExecutionRecord(" not in page


async def test_rows_whose_owner_is_gone_say_so(db: Db) -> None:
    with trioexec.open_store(db.target) as store:  # w2 died 3 minutes ago
        store.heartbeat("w2", time.time() - 180)
    async with client(db.target) as c:
        page = (await c.get("/tasks?status=running")).text
        one = (await c.get("/tasks/crunch-1")).text
    row = page.split('data-task-id="crunch-1"', 1)[1].split("</tr>", 1)[0]
    assert 'class="waiting-on owner-gone"' in row
    assert "owner gone 3m ago; orphaned: it cannot be re-created, recovery will fail it" in row
    assert '<dd class="owner-gone">owner gone 3m ago' in one
    approve = page.split('data-task-id="approve-9"', 1)[1].split("</tr>", 1)[0]
    assert "an executor with recover=True will resume its run" in approve


# ---------------------------------------------------------------------- kept results

SMALL = {"html": SCRIPT, "quote": 'it\'s "q"', "bracket": "batch[/]", "emoji": "rocket 🚀"}
LONG = {"rows": [f"row {i:03}" for i in range(400)], "end": SCRIPT}
#: Ids whose result links must reach their own task (as `ODD_IDS`); "b" is where
#: "a/../b"'s would land if written as it is.
KEPT_ODD = ("..", "a/../b", "b", "x/result", "line\nbreak", "🚀")


@task(id="echo")
async def echo(value: object) -> object:
    await trio.lowlevel.checkpoint()
    return value


@pytest.fixture
async def kept(tmp_path: Path) -> str:
    """A database whose tasks an executor with ``keep_results=True`` ran: a small
    result of odd text, a long one, ``None``, a lone surrogate (its argument too),
    one submitted with ``keep_result=False``, a long one for each `KEPT_ODD`; and
    a pending task."""
    target = str(tmp_path / "kept.db")
    values: list[tuple[str, object, bool | None]] = [
        ("small", SMALL, None),
        ("long", LONG, None),
        ("null", None, None),
        ("lone", "\udc80 <lone>", None),
        ("unkept", 1, False),
        *((t, [t, *LONG["rows"]], None) for t in KEPT_ODD),
    ]
    with trioexec.open_store(target) as store:
        async with trioexec.open_executor(store=store, tasks=[echo], keep_results=True) as ex:
            for task_id, value, keep in values:
                ref = await ex.submit(echo, value, task_id=task_id, keep_result=keep)
                assert (await ref.wait()).ok, task_id
        store.write([submitted("live-1", 1, "echo", None, None, None, "w9", time.time())])
    return target


def pre(page: str, pre_id: str) -> str:
    """The text of the page's ``<pre id="PRE_ID">`` (unescaped)."""
    found = re.search(rf'<pre id="{pre_id}"[^>]*>(.*?)</pre>', page, re.S)
    assert found, (pre_id, page[:500])
    return html.unescape(found.group(1))


async def test_a_kept_result_is_shown_indented_and_escaped(kept: str) -> None:
    async with client(kept) as c:
        page = (await c.get("/tasks/small")).text
        detail = (await c.get("/tasks/small", params={"fragment": "detail"})).text
        null = (await c.get("/tasks/null")).text
    shown = pre(page, "result")
    assert shown == json.dumps(SMALL, indent=2, ensure_ascii=False)
    assert SCRIPT not in page
    assert esc(SCRIPT) in page
    assert "rocket 🚀" in page
    assert 'id="result-whole"' not in page  # (whole already)
    assert "not kept" not in page
    assert pre(detail, "result") == shown  # (in the live part: it appears when the task ends)
    assert pre(null, "result") == "null"


async def test_a_long_result_is_cut_and_its_link_serves_it_whole(kept: str) -> None:
    async with client(kept) as c:
        url = f"{BASE}/tasks/long"
        page = (await c.get(url)).text
        whole = await c.get(browser_url(url, attribute(page, 'id="result-whole"', "href")))
    shown = pre(page, "result")
    assert len(shown) == SHOWN_JSON
    assert "The first 2,000 characters" in page
    assert "end" not in shown
    assert whole.status_code == 200
    assert whole.headers["content-type"] == "application/json"
    assert whole.headers["x-content-type-options"] == "nosniff"
    assert "default-src 'none'" in whole.headers["content-security-policy"]
    assert json.loads(whole.text) == LONG
    assert whole.text.startswith(shown)


async def test_a_result_not_kept_is_not_shown(kept: str) -> None:
    async with client(kept) as c:
        unkept = (await c.get("/tasks/unkept")).text
        live = (await c.get("/tasks/live-1")).text
        refused = [await c.get(f"/results/{t}") for t in ("unkept", "live-1", "nope")]
    assert 'id="result"' not in unkept
    assert '<dt>result</dt><dd class="note"' in unkept
    assert ">not kept</dd>" in unkept
    assert 'id="result"' not in live
    assert "not kept" not in live  # (it has not completed)
    assert [r.status_code for r in refused] == [404, 404, 404]
    assert "task &#39;unkept&#39; (completed) has no kept result" in refused[0].text
    assert "task &#39;live-1&#39; (pending) has no kept result" in refused[1].text
    assert "no task &#39;nope&#39;" in refused[2].text


async def test_a_results_link_reaches_its_own_task_whatever_its_id(kept: str) -> None:
    async with client(kept) as c:
        url = f"{BASE}/tasks"
        listing = (await c.get(url)).text
        for task_id in KEPT_ODD:
            page_url = browser_url(url, attribute(listing, task_row(task_id), "href"))
            page = (await c.get(page_url)).text
            assert heading(page) == task_id, page_url
            href = attribute(page, 'id="result-whole"', "href")
            whole = await c.get(browser_url(page_url, href))
            assert whole.status_code == 200, (task_id, href)
            assert json.loads(whole.text)[0] == task_id, href


async def test_a_lone_surrogate_in_a_result_or_its_arguments_is_shown_as_an_escape(
    kept: str,
) -> None:
    """Decoded, ``"\\udc80"`` is a str no response can encode: it is shown as
    JSON writes it."""
    async with client(kept) as c:
        page = await c.get("/tasks/lone")
        whole = await c.get("/results/lone")
    assert page.status_code == 200
    assert pre(page.text, "result") == '"\\udc80 <lone>"'
    assert json.loads(pre(page.text, "args")) == ["\udc80 <lone>"]
    assert "<lone>" not in page.text
    assert whole.status_code == 200
    assert whole.text == '"\\udc80 <lone>"'


async def test_the_results_route_is_a_read_like_the_pages(kept: str) -> None:
    async with client(kept, logged_in=False, require_token_for_reads=True) as c:
        assert (await c.get("/results/small")).status_code == 403
    async with client(kept, read_only=True) as c:
        assert json.loads((await c.get("/results/small")).text) == SMALL


def test_an_excerpt_encodes_about_what_it_shows() -> None:
    class Counted(list[int]):
        seen = 0

        def __iter__(self) -> Iterator[int]:
            for item in super().__iter__():
                self.seen += 1
                yield item

    value = Counted(range(100_000))
    shown = excerpt(value)
    assert shown.cut
    assert len(shown.text) == SHOWN_JSON
    assert value.seen < 1000
    assert json_text(value).startswith(shown.text)
    exact = "x" * (SHOWN_JSON - 2)  # (with its quotes: SHOWN_JSON characters)
    assert excerpt(exact) == Excerpt(json.dumps(exact), cut=False)
    assert excerpt(exact + "x").cut


# ---------------------------------------------------------------------- the task tree


async def leaf() -> None:
    await trio.lowlevel.checkpoint()


async def build_tree(target: str) -> None:
    """A task tree a real executor ran: ``tree-root`` submits ``kid-a`` (with a
    dedupe key; it submits ``grandkid``), ``kid-b`` (it fails) and a detached
    ``kid-free`` (a root), then waits for them."""
    with trioexec.open_store(target) as store:
        async with trioexec.open_executor(store=store, tasks=[boom]) as ex:

            async def middle() -> None:
                await (await ex.submit(leaf, task_id="grandkid", name="leaf")).wait()

            async def root() -> None:
                kids = [
                    await ex.submit(middle, task_id="kid-a", name="middle", dedupe_key="order-42"),
                    await ex.submit(boom, 2, task_id="kid-b"),
                    await ex.submit(leaf, task_id="kid-free", name="free", detached=True),
                ]
                for kid in kids:
                    await kid.wait()

            assert (await (await ex.submit(root, task_id="tree-root", name="root")).wait()).ok


def fact(page: str, kind: str) -> str | None:
    """The text of the page's ``<dd class="KIND">`` (unescaped), None if none."""
    found = re.search(rf'<dd class="{kind}">(.*?)</dd>', page, re.S)
    return None if found is None else html.unescape(re.sub(r"<[^>]*>", "", found.group(1)))


def children_of(page: str) -> list[tuple[str, str, str]]:
    """Each row of the page's children: (task id, name, status), unescaped."""
    if 'id="children"' not in page:
        return []
    body = page.split('id="children"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(
        r'<tr data-task-id="([^"]*)">.*?<td class="name">([^<]*)</td>'
        r'\s*<td class="status[^"]*">([^<]*)</td>',
        body,
        re.S,
    )
    return [(html.unescape(t), html.unescape(n), s) for t, n, s in rows]


async def test_a_task_page_links_its_parent_and_lists_its_children(db_target: str) -> None:
    await build_tree(db_target)
    async with client(db_target) as c:
        url = f"{BASE}/tasks/tree-root"
        root = (await c.get(url)).text
        kid = (await c.get(f"{BASE}/tasks/kid-a")).text
        detail = (await c.get(f"{BASE}/tasks/kid-a", params={"fragment": "detail"})).text
        free = (await c.get(f"{BASE}/tasks/kid-free")).text
        grandkid_url = f"{BASE}/tasks/grandkid"
        grandkid = (await c.get(grandkid_url)).text
        parent_url = browser_url(grandkid_url, attribute(grandkid, 'class="parent"', "href"))
        parent = (await c.get(parent_url)).text
    # a root: no parent; its children in submission order, not the detached one
    # nor a grandchild, each with its name and status
    assert fact(root, "parent") is None
    assert children_of(root) == [("kid-a", "middle", "completed"), ("kid-b", "web-boom", "failed")]
    assert "children-more" not in root
    assert fact(root, "dedupe-key") is None
    assert fact(kid, "parent") == "tree-root"
    assert browser_url(url, attribute(kid, 'class="parent"', "href")) == url
    assert fact(kid, "dedupe-key") == "order-42"
    assert children_of(kid) == [("grandkid", "leaf", "completed")]
    # (the live part holds both: a child appears as it is submitted)
    assert fact(detail, "parent") == "tree-root"
    assert children_of(detail) == children_of(kid)
    assert fact(free, "parent") is None  # (detached: a root)
    assert children_of(free) == []
    assert fact(grandkid, "parent") == "kid-a"
    assert 'id="children"' not in grandkid
    assert heading(parent) == "kid-a"


async def test_a_task_page_lists_its_first_children_and_says_how_many_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trioexec._store import _browse
    from trioexec.web._pages import CHILDREN_SHOWN

    target = str(tmp_path / "app.db")
    ids = [f"c-{i:03}" for i in range(CHILDREN_SHOWN + 3)]

    async def many() -> None:
        kids = [await ex.submit(leaf, task_id=i, name=f"leaf {i}") for i in ids]
        for kid in kids:
            await kid.wait()

    with trioexec.open_store(target) as store:
        async with trioexec.open_executor(store=store) as ex:
            assert (await (await ex.submit(many, task_id="many", name="many")).wait()).ok
    async with client(target) as c:
        page = (await c.get("/tasks/many")).text
        monkeypatch.setattr(_browse, "COUNT_LIMIT", CHILDREN_SHOWN + 1)
        uncounted = (await c.get("/tasks/many")).text
    assert children_of(page) == [(i, f"leaf {i}", "completed") for i in ids[:CHILDREN_SHOWN]]
    assert '<p class="note children-more">and 3 more</p>' in page
    assert children_of(uncounted) == children_of(page)
    assert '<p class="note children-more">and at least 2 more</p>' in uncounted


async def chain(ex: trioexec.Executor, ids: tuple[str, ...]) -> None:
    """Submit ``ids[0]`` (named after it), which submits the rest of the chain."""
    if ids:
        ref = await ex.submit(chain, ex, ids[1:], task_id=ids[0], name=f"link {ids[0]}")
        assert (await ref.wait()).ok, ids[0]


async def test_parent_and_child_links_reach_their_own_task_whatever_its_id(
    tmp_path: Path,
) -> None:
    """Each odd id is the child of the one before it in `ODD_IDS` (and the parent
    of the one after): its row on its parent's page opens its own page, and its
    parent link opens its parent's, every URL as a browser resolves it; the
    victims exist, for a link that would land elsewhere to land somewhere."""
    target = str(tmp_path / "odd.db")
    with trioexec.open_store(target) as store:
        async with trioexec.open_executor(store=store, max_concurrent_tasks=50) as ex:
            for victim in VICTIMS:
                await (await ex.submit(leaf, task_id=victim, name=SCRIPT)).wait()
            await chain(ex, ODD_IDS)
    async with client(target) as c:
        url = f"{BASE}/tasks/{segment(ODD_IDS[0])}"
        for parent_id, task_id in itertools.pairwise(ODD_IDS):
            page = (await c.get(url)).text
            assert heading(page) == parent_id, url
            assert children_of(page) == [(task_id, f"link {task_id}", "completed")], url
            child_url = browser_url(url, attribute(page, task_row(task_id), "href"))
            child = (await c.get(child_url)).text
            assert heading(child) == task_id, child_url
            assert fact(child, "parent") == parent_id
            back = browser_url(child_url, attribute(child, 'class="parent"', "href"))
            assert back == url, (task_id, back)
            url = child_url
    assert SCRIPT not in page
