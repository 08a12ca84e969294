"""The dashboard as a person uses it (issue 20, deliver 4): a real headless
Chromium (the system's, driven by Selenium through the system's chromedriver:
nothing is downloaded) on a real ``trioexec dashboard`` process showing a SQLite
file that a real executor process (``dashboard_executor.py``) is writing.

A person sees a deferred task appear with what it waits on, without reloading;
resolves a durable promise by typing a JSON payload and clicking Resolve, and
watches the workflow step that waited on it complete on the run's graph; retries
a failed task by clicking. Nothing changes without the token; the read-only
dashboard has no buttons and no action routes.

A screenshot of each page goes to ``$TRIOEXEC_SCREENSHOTS`` (default
``build/screenshots/``), and with ``TRIOEXEC_UPDATE_DOCS_SCREENSHOTS=1`` to
``docs/_static/dashboard/`` too, for the how-to.

Without Chromium, chromedriver or selenium these tests skip, unless
``TRIOEXEC_REQUIRE_BROWSER`` is set (CI sets it): then they fail. Nothing here
sleeps: every wait is for a line from a process or a state of the page, with a
deadline.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import trioexec
from trioexec._changes import Finish, Kept, submitted

ROOT = Path(__file__).resolve().parent.parent
EXECUTOR = Path(__file__).resolve().parent / "dashboard_executor.py"


def _system(name: str) -> str:
    """The system's ``name`` (/usr/bin first, where Debian's packages put it;
    else on PATH, where .ci/run looks): never one Selenium would download."""
    usr_bin = f"/usr/bin/{name}"
    return usr_bin if os.access(usr_bin, os.X_OK) else (shutil.which(name) or usr_bin)


CHROMIUM = _system("chromium")
CHROMEDRIVER = _system("chromedriver")
REQUIRE_ENV = "TRIOEXEC_REQUIRE_BROWSER"
SHOTS_ENV = "TRIOEXEC_SCREENSHOTS"
UPDATE_DOCS_ENV = "TRIOEXEC_UPDATE_DOCS_SCREENSHOTS"
DOCS_SHOTS = ROOT / "docs" / "_static" / "dashboard"
WINDOW = (1280, 860)
MAX_SHOT = 2400  # pixels: a screenshot's most height
# Bounds a hang, never a wait for success: a loaded two-core CI machine starts
# Python processes and Chromium slowly.
PROCESS_TIMEOUT = 60.0
PAGE_TIMEOUT = 20.0
PAYLOAD = {"approved": True, "by": "ops@example.com", "note": "refund OK"}


def _missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is not installed"
    for module in ("selenium", "starlette", "hypercorn", "jinja2", "httpx"):
        if importlib.util.find_spec(module) is None:
            return f"the Python package {module} is not installed"
    return None


@pytest.fixture
def browser_available() -> None:
    """Skip (or, under TRIOEXEC_REQUIRE_BROWSER, fail) before anything starts."""
    why = _missing()
    if why is None:
        return
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"NO BROWSER FOR THE DASHBOARD TESTS: {why} (and {REQUIRE_ENV} is set)")
    pytest.skip(why)


# ------------------------------------------------------------------ processes


class Process:
    """A child process whose stdout is read line by line, with deadlines."""

    def __init__(self, argv: list[str], stderr_path: Path, *, stdin: bool = False) -> None:
        self.stderr_path = stderr_path
        self._stderr = stderr_path.open("wb")
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        )
        self._buffer = b""
        self.lines: list[str] = []

    def expect(self, start: str, timeout: float = PROCESS_TIMEOUT) -> str:
        """Read stdout until a line that starts with ``start``; return it."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\n", 1)
                line = raw.decode()
                self.lines.append(line)
                if line.startswith(start):
                    return line
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.fail(f"printed no line starting {start!r} within {timeout}s")
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.proc.wait()
                    self.fail(f"exited with {self.proc.returncode} before a line {start!r}")
                self._buffer += chunk

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n".encode())
        self.proc.stdin.flush()

    def fail(self, why: str) -> None:
        self._stderr.flush()
        pytest.fail(
            f"{self.proc.args!r} {why}; stdout: {self.lines!r}\n"
            f"stderr:\n{self.stderr_path.read_text(errors='replace')}"
        )

    def stop(self) -> int:
        """SIGTERM, then the exit code (killed after PROCESS_TIMEOUT: a hang)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(PROCESS_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.fail("did not exit on SIGTERM")
            raise  # (fail raised)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stdin):
            if pipe is not None:
                pipe.close()
        self._stderr.close()


class Executor:
    """``dashboard_executor.py`` on a database, once it said READY."""

    def __init__(self, tmp_path: Path, db: Path) -> None:
        inbox = tmp_path / "inbox"
        inbox.mkdir()
        self.inbox = inbox
        self.process = Process(
            [sys.executable, str(EXECUTOR), str(db), str(inbox)],
            tmp_path / "executor.stderr",
            stdin=True,
        )
        try:
            ready = self.process.expect("READY").split()
        except BaseException:
            self.process.cleanup()
            raise
        _, self.run_id, self.promise_id, self.failed_id, self.approval_id = ready


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "work.db"


@pytest.fixture
def executor(tmp_path: Path, db: Path) -> Iterator[Executor]:
    ex = Executor(tmp_path, db)
    try:
        yield ex
    finally:
        ex.process.cleanup()


def start_dashboard(tmp_path: Path, db: Path, *extra: str) -> tuple[Process, str]:
    """``trioexec dashboard DB --port 0 ...`` and the URL it printed."""
    name = "dashboard-ro" if extra else "dashboard"
    process = Process(
        [sys.executable, "-m", "trioexec", "dashboard", str(db), "--port", "0", *extra],
        tmp_path / f"{name}.stderr",
    )
    try:
        line = process.expect("trioexec dashboard: ")
        words = line.split()
        assert words[2].startswith("http://127.0.0.1:"), line
        assert "?token=" in words[2], line
        assert words[3:] == (["(read-only)"] if "--read-only" in extra else []), line
    except BaseException:
        process.cleanup()
        raise
    return process, words[2]


@pytest.fixture
def dashboard(tmp_path: Path, db: Path, executor: Executor) -> Iterator[tuple[Process, str]]:
    process, url = start_dashboard(tmp_path, db)
    try:
        yield process, url
    finally:
        process.cleanup()


# -------------------------------------------------------------------- browser


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",  # (as root, in a container)
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        # A tab in the background keeps its timers and its SSE stream going:
        "--disable-background-timer-throttling",
        "--disable-renderer-backgrounding",
        "--disable-backgrounding-occluded-windows",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    service = Service(executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(PAGE_TIMEOUT)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot_dirs() -> list[Path]:
    dirs = [Path(os.environ.get(SHOTS_ENV) or ROOT / "build" / "screenshots")]
    if os.environ.get(UPDATE_DOCS_ENV) == "1":
        dirs.append(DOCS_SHOTS)
    return dirs


def shot(driver: Any, name: str) -> None:
    """Save the whole page as it is now (not only the window: up to `MAX_SHOT`
    pixels high) as NAME.png, in each screenshot directory."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    clip = {
        "x": 0,
        "y": 0,
        "width": max(size["width"], WINDOW[0]),
        "height": min(max(size["height"], 200), MAX_SHOT),
        "scale": 1,
    }
    taken = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    png = base64.b64decode(taken["data"])
    assert png.startswith(b"\x89PNG"), name
    for directory in screenshot_dirs():
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"{name}.png").write_bytes(png)


def wait_for(driver: Any, what: str, check: Callable[[Any], Any]) -> Any:
    """``check(driver)``'s first truthy value (polled; the page is live)."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    waiting = WebDriverWait(
        driver,
        PAGE_TIMEOUT,
        poll_frequency=0.05,
        ignored_exceptions=(StaleElementReferenceException,),
    )
    try:
        return waiting.until(check)
    except TimeoutException:
        live = driver.execute_script(
            "var l = document.getElementById('live');"
            " return [document.body.getAttribute('data-version'),"
            " l && l.getAttribute('data-state'), l && l.textContent];"
        )
        console = [entry["message"] for entry in driver.get_log("browser")]
        pytest.fail(
            f"{what}: not seen within {PAGE_TIMEOUT}s on {driver.current_url}\n"
            f"data-version, #live state and text: {live}; browser console: {console}\n"
            f"page text:\n{driver.find_element('tag name', 'body').text}"
        )


def click(driver: Any, what: str, selector: str, *, typing: str | None = None) -> None:
    """Click the first element matching ``selector`` (or, with ``typing``, put
    that text in it), once it is there and can take it: a live page may replace
    it (its part re-fetched) between finding it and clicking it."""
    from selenium.common.exceptions import ElementNotInteractableException

    def attempt(d: Any) -> bool:
        found = css(d, selector)
        if not found:
            return False
        try:
            if typing is None:
                found[0].click()
                return True
            if found[0].get_attribute("value") != typing:
                found[0].clear()
                found[0].send_keys(typing)
            return bool(found[0].get_attribute("value") == typing)
        except ElementNotInteractableException:
            return False

    wait_for(driver, what, attempt)


def css(driver: Any, selector: str) -> list[Any]:
    return driver.find_elements("css selector", selector)


def text_of(driver: Any, selector: str) -> str | None:
    """The text of the first element matching ``selector`` (None: no such element)."""
    found = css(driver, selector)
    return found[0].text.strip() if found else None


def attribute_of(driver: Any, selector: str, name: str) -> str | None:
    found = css(driver, selector)
    return found[0].get_attribute(name) if found else None


def mark_page(driver: Any) -> None:
    """Mark this page's window object: a reload (or navigation) loses the mark."""
    driver.execute_script("window.__trioexec_test_mark = 'same page';")


def same_page(driver: Any) -> bool:
    return driver.execute_script("return window.__trioexec_test_mark;") == "same page"


def base_of(url: str) -> str:
    return url.split("?", 1)[0].rstrip("/")


def task_row(task_id: str) -> str:
    return f'table#tasks tbody tr[data-task-id="{task_id}"]'


def step(step_id: str) -> str:
    return f'svg#graph g.step[data-step="{step_id}"]'


def pauses_in(db: Path) -> list[tuple[str, str]]:
    with trioexec.open_store(str(db), read_only=True) as store:
        return [(p.kind, p.value) for p in store.pauses()]


def status_of(db: Path, task_id: str) -> str:
    with trioexec.open_store(str(db), read_only=True) as store:
        record = store.execution(task_id)
    assert record is not None, task_id
    return record.status.value


# ---------------------------------------------------------------------- tests


@pytest.mark.usefixtures("browser_available")
def test_a_person_watches_resolves_a_promise_and_retries(
    browser: Any, executor: Executor, dashboard: tuple[Process, str], db: Path
) -> None:
    import httpx
    from selenium.webdriver.support.ui import Select

    server, url = dashboard
    base = base_of(url)
    driver = browser

    # The overview, opened from the printed URL (its token becomes a cookie).
    driver.get(url)
    assert attribute_of(driver, "body", "data-read-only") == "false"
    wait_for(driver, "1 failed", lambda d: text_of(d, '#counts [data-count="failed"]') == "1")
    wait_for(driver, "1 deferred", lambda d: text_of(d, '#counts [data-count="deferred"]') == "1")
    for kind in ("active", "pending", "completed"):
        assert (text_of(driver, f'#counts [data-count="{kind}"]') or "").isdigit(), kind
    links = {a.get_attribute("href") for a in css(driver, "nav a[href]")}
    for page in ("/tasks", "/runs", "/promises", "/failed", "/control"):
        assert f"{base}{page}" in links, (page, links)

    # Nothing changes without the token (its cookie), even with the form's other
    # fields (its CSRF field, as the page has it), nor with the cookie but
    # without those fields.
    driver.get(f"{base}/failed")
    failed = f'tr[data-task-id="{executor.failed_id}"]'
    wait_for(driver, "the failed task", lambda d: css(d, f"{failed} button.retry"))
    hidden = {
        field.get_attribute("name"): field.get_attribute("value")
        for field in css(driver, f"{failed} form input[type='hidden']")
    }
    cookies = {c["name"]: c["value"] for c in driver.get_cookies()}
    assert cookies, "the token URL set no cookie"
    anonymous = httpx.Client(base_url=base, timeout=PAGE_TIMEOUT)
    with anonymous, httpx.Client(base_url=base, cookies=cookies, timeout=PAGE_TIMEOUT) as cookied:
        for path, form in (
            (f"/actions/tasks/{executor.failed_id}/retry", {}),
            (f"/actions/promises/{executor.promise_id}/resolve", {"data": "{}"}),
            ("/actions/pause", {"kind": "name", "value": "charge-card"}),
        ):
            refused = anonymous.post(path, data={**hidden, **form})
            assert refused.status_code == 403, (path, refused.status_code, refused.text[:300])
            no_csrf = cookied.post(path, data={"page": "x", **form})
            assert no_csrf.status_code == 403, (path, no_csrf.status_code, no_csrf.text[:300])
    assert status_of(db, executor.failed_id) == "failed"

    # The tasks page: a task deferred after it was opened appears, with its wait
    # reason, without a reload.
    driver.get(f"{base}/tasks")
    mark_page(driver)
    wait_for(
        driver,
        "the approval step waiting on its promise",
        lambda d: (
            f"promise {executor.promise_id}"
            in (text_of(d, f"{task_row(executor.approval_id)} td.waiting-on") or "")
        ),
    )
    assert css(driver, task_row(executor.failed_id))
    executor.process.send("defer")
    deferred = executor.process.expect("DEFERRED").split()[1]
    row = task_row(deferred)
    wait_for(driver, f"row of {deferred}", lambda d: css(d, row))
    wait_for(
        driver,
        f"{deferred} waiting on the report",
        lambda d: "condition inbox/report.csv exists" in (text_of(d, f"{row} td.waiting-on") or ""),
    )
    assert text_of(driver, f"{row} td.name") == "import-report"
    assert text_of(driver, f"{row} td.sub-status") == "deferred"
    assert same_page(driver), "the tasks page reloaded to show the new task"
    shot(driver, "tasks")

    # One task: the failed one, its timeline, error, traceback and arguments.
    driver.get(f"{base}/tasks/{executor.failed_id}")
    assert "503 Service Unavailable" in (text_of(driver, "#error") or "")
    assert "ConnectionError" in (text_of(driver, "#traceback") or "")
    assert "120" in (text_of(driver, "#args") or "")
    assert len(css(driver, "#timeline li")) >= 2
    shot(driver, "task")

    # The runs, then the run's graph: the approval step waits, fetch-order is done.
    driver.get(f"{base}/runs")
    link = wait_for(
        driver, "a link to the run", lambda d: css(d, f'a[href$="/runs/{executor.run_id}"]')
    )
    shot(driver, "runs")
    link[0].click()
    wait_for(driver, "the run's graph", lambda d: css(d, step("approval")))
    assert attribute_of(driver, step("fetch-order"), "data-state") == "completed"
    # (StepState: RUNNING is "started (active or deferred)"; PENDING would say
    # its dependencies are not complete.)
    waiting_state = attribute_of(driver, step("approval"), "data-state")
    assert waiting_state in ("running", "deferred"), waiting_state
    assert attribute_of(driver, step("notify"), "data-state") != "completed"
    mark_page(driver)
    shot(driver, "run")
    run_tab = driver.current_window_handle

    # In another tab: the overview, two tasks deferred now (on its charts too).
    driver.switch_to.new_window("tab")
    driver.get(base)
    wait_for(driver, "2 deferred", lambda d: text_of(d, '#counts [data-count="deferred"]') == "2")
    assert len(css(driver, "table tbody tr[data-task-id]")) >= 2, "waiting longest"
    shot(driver, "overview")

    # The promise, resolved with a typed JSON payload.
    driver.get(f"{base}/promises")
    promise = f'tr[data-promise-id="{executor.promise_id}"]'
    wait_for(
        driver, "the pending promise", lambda d: text_of(d, f"{promise} td.state") == "pending"
    )
    textarea = css(driver, f"{promise} textarea[name='data']")[0]
    textarea.clear()
    textarea.send_keys(json.dumps(PAYLOAD))
    shot(driver, "promises")
    click(driver, "the promise's resolve button", f"{promise} button.resolve")
    wait_for(
        driver,
        "the promise resolved",
        lambda d: (text_of(d, f"{promise} td.state") or "resolved") == "resolved",
    )

    # Back on the run's tab: the step that waited completes, and so does the run,
    # without a reload.
    driver.switch_to.window(run_tab)
    for step_id in ("approval", "pay", "notify"):
        wait_for(
            driver,
            f"step {step_id} completed",
            lambda d, s=step_id: attribute_of(d, step(s), "data-state") == "completed",
        )
    assert same_page(driver), "the run page reloaded to show the step's new state"
    finished = executor.process.expect(f"RUN {executor.run_id}").split(" ", 3)
    assert finished[2] == "completed", finished
    assert json.loads(finished[3]) == {"state": "resolved", "data": PAYLOAD}
    assert status_of(db, executor.approval_id) == "completed"

    # The failed page: Retry, and the executor (recover=True) runs it again.
    driver.get(f"{base}/failed")
    wait_for(driver, "the failed task", lambda d: css(d, f"{failed} button.retry"))
    shot(driver, "failed")
    click(driver, "the failed task's retry button", f"{failed} button.retry")
    executor.process.expect(f"OK {executor.failed_id}")
    driver.get(f"{base}/tasks")
    wait_for(
        driver,
        "the retried task completed",
        lambda d: text_of(d, f"{task_row(executor.failed_id)} td.status") == "completed",
    )

    # The deferred task's file appears: its row says completed, live.
    mark_page(driver)
    (executor.inbox / "report.csv").write_text("order,amount\nA-1042,120.00\n")
    executor.process.expect(f"IMPORTED {deferred}")
    wait_for(
        driver,
        f"{deferred} completed",
        lambda d: text_of(d, f"{task_row(deferred)} td.status") == "completed",
    )
    assert same_page(driver)

    # The control page: pause a name by the form, see it paused (and in the
    # store), resume it by its row's button; the commands sent are listed.
    driver.get(f"{base}/control")
    Select(css(driver, "form#pause select[name='kind']")[0]).select_by_value("name")
    css(driver, "form#pause input[name='value']")[0].send_keys("resize-image")
    css(driver, "form#pause button.pause")[0].click()
    paused = '#pauses tr[data-pause-kind="name"][data-pause-value="resize-image"]'
    wait_for(driver, "resize-image paused", lambda d: css(d, paused))
    assert pauses_in(db) == [("name", "resize-image")]
    commands = driver.find_element("css selector", "#commands").text
    assert "retry" in commands, commands
    assert "pause" in commands, commands
    shot(driver, "control")
    click(driver, "the pause's resume button", f"{paused} button.resume")
    wait_for(driver, "resize-image resumed", lambda d: not css(d, paused))
    assert pauses_in(db) == []

    executor.process.send("quit")
    executor.process.expect("BYE")
    assert server.stop() == 0


@pytest.mark.usefixtures("browser_available")
def test_the_read_only_dashboard_has_no_buttons_and_no_actions(
    browser: Any, executor: Executor, db: Path, tmp_path: Path
) -> None:
    import httpx

    server, url = start_dashboard(tmp_path, db, "--read-only")
    try:
        base = base_of(url)
        driver = browser
        driver.get(url)
        assert attribute_of(driver, "body", "data-read-only") == "true"
        promise = f'tr[data-promise-id="{executor.promise_id}"]'
        failed = f'tr[data-task-id="{executor.failed_id}"]'
        for page, row in (("/promises", promise), ("/failed", failed), ("/control", None)):
            driver.get(f"{base}{page}")
            if row is not None:
                wait_for(driver, f"{row} on {page}", lambda d, r=row: css(d, r))
            assert not css(driver, "button.resolve, button.reject, button.retry"), page
            assert not css(driver, "textarea, form[method='post'], form[method='POST']"), page
        cookies = {c["name"]: c["value"] for c in driver.get_cookies()}
        with httpx.Client(base_url=base, cookies=cookies, timeout=PAGE_TIMEOUT) as http:
            for path in (
                f"/actions/promises/{executor.promise_id}/resolve",
                f"/actions/tasks/{executor.failed_id}/retry",
                "/actions/pause",
            ):
                refused = http.post(path, data={"data": "{}", "kind": "name", "value": "x"})
                assert refused.status_code in (404, 405), (path, refused.status_code)
        driver.get(f"{base}/promises")
        wait_for(  # (the page is live: its rows may come a moment after it)
            driver,
            "the promise, still pending",
            lambda d: text_of(d, f"{promise} td.state") == "pending",
        )
        assert status_of(db, executor.failed_id) == "failed"
        assert server.stop() == 0
    finally:
        server.cleanup()


@pytest.mark.usefixtures("browser_available")
def test_a_click_on_a_row_whose_id_holds_dot_segments_acts_on_that_row(
    browser: Any, db: Path, tmp_path: Path
) -> None:
    """Issue 30, 1: Chromium resolves ``..`` segments (and ``%2e``) in a form's
    action before it posts; Retry on the task ``decoy/../../tasks/victim`` (and
    ``..``) and Resolve on the promise ``refund-small/../refund-big`` reach their
    own rows, and ``victim`` and ``refund-big`` stay as they were."""
    import trio

    from trioexec.durable import DurableStore, PromiseState

    odd_tasks, victim = ("decoy/../../tasks/victim", ".."), "victim"
    odd_promise, victim_promise = "refund-small/../refund-big", "refund-big"
    now = time.time()
    with trioexec.open_store(str(db)) as store:
        store.write(
            [
                change
                for task_id in (*odd_tasks, victim)
                for change in (
                    submitted(task_id, 1, "charge-card", None, "charge-card", "[1]", "w", now),
                    Finish(
                        (
                            task_id,
                            1,
                            trioexec.TaskStatus.FAILED,
                            now,
                            "ConnectionError",
                            None,
                            None,
                        )
                    ),
                )
            ]
        )

    async def promise_states(create: bool = False) -> dict[str, PromiseState]:
        with DurableStore(str(db)) as ds:
            if create:
                for promise_id in (odd_promise, victim_promise):
                    await ds.promises.create(promise_id, 3600)
            found = {p: await ds.promises.get(p) for p in (odd_promise, victim_promise)}
        return {p: record.state for p, record in found.items() if record is not None}

    trio.run(promise_states, True)
    server, url = start_dashboard(tmp_path, db)
    try:
        base = base_of(url)
        driver = browser
        driver.get(url)
        for task_id in odd_tasks:
            driver.get(f"{base}/failed")
            row = f'tr[data-task-id="{task_id}"]'
            click(driver, f"Retry on {task_id}", f"{row} button.retry")
            wait_for(
                driver,
                f"{task_id} (or another task) retried",
                lambda d, t=task_id: "pending" in (status_of(db, t), status_of(db, victim)),
            )
            assert status_of(db, victim) == "failed", f"Retry on {task_id} requeued {victim}"
            assert status_of(db, task_id) == "pending"
            assert base_of(driver.current_url) == f"{base}/failed", driver.current_url

        driver.get(f"{base}/promises")
        row = f'tr[data-promise-id="{odd_promise}"]'
        click(driver, "the odd promise's value", f"{row} textarea[name='data']", typing="1")
        click(driver, "Resolve on the odd promise", f"{row} button.resolve")
        wait_for(
            driver,
            "the odd promise resolved",
            lambda d: (text_of(d, f"{row} td.state") or "") == "resolved",
        )
        assert trio.run(promise_states) == {
            odd_promise: PromiseState.RESOLVED,
            victim_promise: PromiseState.PENDING,
        }
        assert status_of(db, victim) == "failed"
        assert server.stop() == 0
    finally:
        server.cleanup()


def test_the_screenshot_directories_follow_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(SHOTS_ENV, str(tmp_path / "shots"))
    monkeypatch.delenv(UPDATE_DOCS_ENV, raising=False)
    assert screenshot_dirs() == [tmp_path / "shots"]
    monkeypatch.setenv(UPDATE_DOCS_ENV, "1")
    assert screenshot_dirs() == [tmp_path / "shots", DOCS_SHOTS]
    monkeypatch.delenv(SHOTS_ENV)
    monkeypatch.delenv(UPDATE_DOCS_ENV)
    assert screenshot_dirs() == [ROOT / "build" / "screenshots"]


@pytest.mark.usefixtures("browser_available")
def test_a_kept_result_shows_on_its_page_and_its_link_shows_it_whole(
    browser: Any, db: Path, tmp_path: Path
) -> None:
    """The task page shows the start of a long kept result, escaped; its link
    shows the whole value as JSON."""
    value = {"note": "<script>alert(1)</script> 🚀", "rows": [f"row {i}" for i in range(400)]}
    now = time.time()
    with trioexec.open_store(str(db)) as store:
        store.write(
            [
                submitted("report-1", 1, "report", None, None, None, "w", now),
                Finish(("report-1", 1, trioexec.TaskStatus.COMPLETED, now, None, None, None)),
                Kept(("report-1", 1, json.dumps(value))),
            ]
        )
    server, url = start_dashboard(tmp_path, db)
    try:
        base = base_of(url)
        driver = browser
        driver.get(url)
        driver.get(f"{base}/tasks/report-1")
        shown = wait_for(
            driver, "the result", lambda d: attribute_of(d, "pre#result", "textContent")
        )
        assert shown.startswith('{\n  "note": "<script>alert(1)</script> 🚀"')
        assert not css(driver, "pre#result *")  # (text, never markup)
        shot(driver, "task-result")
        click(driver, "the whole result's link", "a#result-whole")
        wait_for(driver, "the whole result", lambda d: d.current_url.startswith(f"{base}/results/"))
        whole = wait_for(driver, "its JSON", lambda d: attribute_of(d, "pre", "textContent"))
        assert json.loads(whole) == value
        assert whole.startswith(shown)
        assert server.stop() == 0
    finally:
        server.cleanup()
