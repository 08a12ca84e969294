"""`trioexec.contrib.otel`: the spans of real executors, through the
OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import messaging_attributes as messaging
from opentelemetry.semconv.attributes import error_attributes
from opentelemetry.semconv.schemas import Schemas
from opentelemetry.trace import NoOpTracerProvider, SpanKind, StatusCode

import trioexec
from trioexec import Backoff, DeterministicExecutor, Overflow, TaskHandle, TaskStatus, open_executor
from trioexec.contrib import otel
from trioexec.contrib.otel import instrument
from trioexec.testing import FakeWallClock


class Traces:
    """A tracer provider whose finished spans can be read back."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = self.exporter.get_finished_spans()
        return [s for s in found if name is None or s.name == name]

    def attempts(self, task_name: str) -> list[ReadableSpan]:
        spans = self.spans(f"process {task_name}")
        return sorted(spans, key=lambda s: s.attributes[otel.ATTEMPT])


@pytest.fixture
def traces() -> Traces:
    return Traces()


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def observer_of(ex):
    (tracing,) = ex._core.lifecycle.observer.all  # (observers are kept in an Observers)
    return tracing


async def ok() -> str:
    return "ok"


async def boom() -> None:
    raise ValueError("boom")


def test_the_attribute_names_are_the_semantic_conventions_ones():
    assert otel.MESSAGING_SYSTEM == messaging.MESSAGING_SYSTEM
    assert otel.MESSAGING_OPERATION_NAME == messaging.MESSAGING_OPERATION_NAME
    assert otel.MESSAGING_OPERATION_TYPE == messaging.MESSAGING_OPERATION_TYPE
    assert otel.MESSAGING_MESSAGE_ID == messaging.MESSAGING_MESSAGE_ID
    assert otel.MESSAGING_DESTINATION_NAME == messaging.MESSAGING_DESTINATION_NAME
    assert otel.MESSAGING_CLIENT_ID == messaging.MESSAGING_CLIENT_ID
    assert otel.ERROR_TYPE == error_attributes.ERROR_TYPE
    assert messaging.MessagingOperationTypeValues.PROCESS.value == "process"
    assert otel.SCHEMA_URL in {s.value for s in Schemas}


async def test_an_attempt_is_a_consumer_span_child_of_the_submitters_span(traces):
    async with open_executor() as ex:
        instrument(ex, traces.provider)
        with traces.tracer.start_as_current_span("request") as request:
            ref = await ex.submit(ok)
            assert (await ref.wait()).result == "ok"
            assert trace.get_current_span() is request  # (the submitter's context is its own)
    (span,) = traces.attempts("ok")
    assert span.kind is SpanKind.CONSUMER
    assert parent_id(span) == request.get_span_context().span_id
    assert span.context.trace_id == request.get_span_context().trace_id
    assert span.status.status_code is StatusCode.UNSET
    assert span.instrumentation_scope.name == "trioexec.contrib.otel"
    assert span.instrumentation_scope.schema_url == otel.SCHEMA_URL
    assert dict(span.attributes) == {
        "messaging.system": "trioexec",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": ref.task_id,
        "messaging.destination.name": "ok",
        "messaging.client.id": ex.owner,
        "trioexec.attempt": 1,
        "trioexec.status": "completed",
    }


async def test_a_task_submitted_outside_any_span_is_a_root_span_with_its_key(traces):
    async with open_executor(key_limits={"host": trioexec.KeyLimit(concurrency=1)}) as ex:
        instrument(ex, traces.provider)
        await (await ex.submit(ok, key="host")).wait()
    (span,) = traces.attempts("ok")
    assert span.parent is None
    assert span.attributes["trioexec.key"] == "host"


async def test_each_attempt_has_a_span_and_retries_link_to_the_first(traces, autojump_clock):
    calls: list[int] = []

    @trioexec.task(retries=2, backoff=Backoff(initial=1.0, jitter=0))
    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OSError(f"reset {len(calls)}")
        return "done"

    async with open_executor() as ex:
        instrument(ex, traces.provider)
        with traces.tracer.start_as_current_span("request") as request:
            ref = await ex.submit(flaky)
        assert (await ref.wait()).result == "done"
    first, second, third = spans = traces.attempts(ref.name)
    assert [s.attributes["trioexec.attempt"] for s in spans] == [1, 2, 3]
    assert [parent_id(s) for s in spans] == [request.get_span_context().span_id] * 3
    assert not first.links
    for retry in (second, third):
        (link,) = retry.links
        assert link.context.span_id == first.context.span_id
    for failed, n in ((first, 1), (second, 2)):
        assert failed.status.status_code is StatusCode.ERROR
        assert failed.attributes["trioexec.status"] == "failed"
        assert failed.attributes["trioexec.retry.delay"] > 0
        assert failed.attributes["error.type"] == "OSError"
        (event,) = failed.events
        assert event.name == "exception"
        assert event.attributes["exception.message"] == f"reset {n}"
    assert third.status.status_code is StatusCode.UNSET
    assert "trioexec.retry.delay" not in third.attributes
    assert third.attributes["trioexec.status"] == "completed"
    assert first.end_time <= second.start_time  # (the backoff is the gap between them)


async def test_deferral_and_resumption_are_events_of_the_attempts_span(traces, autojump_clock):
    upload = trio.Event()

    async def report(handle: TaskHandle) -> str:
        await handle.defer_until(upload)
        return "sent"

    async with open_executor() as ex:
        instrument(ex, traces.provider)
        ref = await ex.submit(report)
        await trio.sleep(5)
        upload.set()
        await ref.wait()
    (span,) = traces.attempts(ref.name)
    assert [e.name for e in span.events] == ["trioexec.deferred", "trioexec.resumed"]
    assert span.events[0].attributes["trioexec.waiting_on"] == "event"
    assert span.events[0].timestamp <= span.events[1].timestamp


async def test_a_failure_and_a_timeout_set_error_status_and_record_the_exception(
    traces, autojump_clock
):
    async with open_executor() as ex:
        instrument(ex, traces.provider)
        failed = await ex.submit(boom)
        slow = await ex.submit(trio.sleep, 10, timeout=1)
        await failed.wait()
        await slow.wait()
    (span,) = traces.attempts("boom")
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "ValueError('boom')"
    assert span.attributes["error.type"] == "ValueError"
    (event,) = span.events
    assert event.attributes["exception.type"] == "ValueError"
    assert "raise ValueError" in event.attributes["exception.stacktrace"]
    (span,) = traces.attempts("sleep")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["trioexec.status"] == "timed_out"
    assert span.attributes["error.type"] == "trioexec._errors.TaskTimeout"


async def test_an_error_whose_str_is_broken_is_still_recorded(traces):
    class Odd(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str")

    async def odd() -> None:
        raise Odd()

    async with open_executor() as ex:
        instrument(ex, traces.provider)
        ref = await ex.submit(odd)
        await ref.wait()
    (span,) = traces.attempts(ref.name)
    assert span.status.status_code is StatusCode.ERROR
    assert span.events[0].name == "exception"


async def test_a_task_cancelled_while_pending_has_no_span(traces):
    async with open_executor(max_concurrent_tasks=1) as ex:
        instrument(ex, traces.provider)
        blocker = await ex.submit(trio.sleep_forever)
        await trio.testing.wait_all_tasks_blocked()
        waiting = await ex.submit(ok)
        waiting.cancel()
        assert (await waiting.wait()).status is TaskStatus.CANCELLED
        blocker.cancel()
        await blocker.wait()
        assert not observer_of(ex).tasks
    assert traces.spans("process ok") == []
    (span,) = traces.attempts("sleep_forever")  # cancelled while running: its span ends
    assert span.attributes["trioexec.status"] == "cancelled"
    assert span.status.status_code is StatusCode.UNSET


async def test_shutdown_cancelling_pending_and_running_tasks_leaves_no_state(traces):
    async with open_executor(max_concurrent_tasks=1) as ex:
        instrument(ex, traces.provider)
        running = await ex.submit(trio.sleep_forever)
        await trio.testing.wait_all_tasks_blocked()
        pending = [await ex.submit(ok) for _ in range(3)]
        await ex.shutdown(trioexec.ShutdownPolicy.CANCEL)
        assert not observer_of(ex).tasks
    assert all(ref.status is TaskStatus.CANCELLED for ref in (running, *pending))
    assert [s.name for s in traces.spans()] == ["process sleep_forever"]


async def test_a_task_cancelled_between_attempts_adds_no_span(traces, autojump_clock):
    @trioexec.task(retries=1, backoff=Backoff(initial=60, jitter=0))
    async def fails() -> None:
        raise OSError("down")

    async with open_executor() as ex:
        instrument(ex, traces.provider)
        ref = await ex.submit(fails)
        await trio.sleep(1)  # (in its backoff)
        ref.cancel()
        assert (await ref.wait()).status is TaskStatus.CANCELLED
        assert not observer_of(ex).tasks
    (span,) = traces.attempts(ref.name)
    assert span.attributes["trioexec.status"] == "failed"


async def test_a_task_dropped_on_arrival_has_no_span_and_no_state(traces):
    async with open_executor(
        max_concurrent_tasks=1, queue_capacity=1, overflow=Overflow.DROP_NEWEST
    ) as ex:
        instrument(ex, traces.provider)
        blocker = await ex.submit(trio.sleep_forever)
        await trio.testing.wait_all_tasks_blocked()
        queued = await ex.submit(ok)
        dropped = await ex.submit(ok)
        assert dropped.status is TaskStatus.DROPPED
        assert set(observer_of(ex).tasks) == {blocker.task_id, queued.task_id}
        blocker.cancel()
    assert len(traces.spans("process ok")) == 1
    assert not observer_of(ex).tasks


async def test_the_tasks_own_spans_are_children_of_its_attempt_even_after_a_deferral(
    traces, autojump_clock
):
    go = trio.Event()
    seen: list[object] = []

    async def work(handle: TaskHandle) -> None:
        with traces.tracer.start_as_current_span("before"):
            pass
        await handle.defer_until(go)
        with traces.tracer.start_as_current_span("after"):
            seen.append(baggage.get_baggage("tenant"))

    def blocking() -> None:  # a sync task: run in a thread, with the context copied
        with traces.tracer.start_as_current_span("in thread"):
            pass

    async def other() -> None:
        seen.append(trace.get_current_span())  # (another task, run meanwhile)

    async with open_executor(max_concurrent_tasks=1) as ex:
        instrument(ex, traces.provider)
        token = otel_context.attach(baggage.set_baggage("tenant", "acme"))
        try:
            ref = await ex.submit(work)
        finally:
            otel_context.detach(token)
        await trio.sleep(1)  # deferred: its slot runs `other` meanwhile
        other_ref = await ex.submit(other)
        await other_ref.wait()
        go.set()
        await ref.wait()
        blocking_ref = await ex.submit(blocking)
        await blocking_ref.wait()
    (attempt,) = traces.attempts(ref.name)
    for name in ("before", "after"):
        (span,) = traces.spans(name)
        assert parent_id(span) == attempt.context.span_id
    (threaded,) = traces.spans("in thread")
    (blocking_span,) = traces.attempts(blocking_ref.name)
    assert parent_id(threaded) == blocking_span.context.span_id
    (other_span,) = traces.attempts(other_ref.name)
    assert seen[0].get_span_context().span_id == other_span.context.span_id
    assert seen[1] == "acme"  # the submitter's baggage travels with the task


async def test_two_executors_tell_their_spans_apart_and_instrument_once_each(traces):
    async with open_executor() as first, open_executor() as second:
        instrument(first, traces.provider)
        instrument(second, traces.provider)
        with pytest.raises(ValueError, match="instrumented"):
            instrument(first, traces.provider)
        await (await first.submit(ok)).wait()
        await (await second.submit(ok)).wait()
    spans = traces.attempts("ok")
    assert {s.attributes["messaging.client.id"] for s in spans} == {first.owner, second.owner}


@pytest.mark.parametrize("name", ['say "hi"', "it's", "list[0]", "🚀 launch", "a\nb", "é" * 300])
async def test_odd_task_names_are_kept_as_they_are(traces, name):
    async with open_executor() as ex:
        instrument(ex, traces.provider)
        await (await ex.submit(ok, name=name)).wait()
    (span,) = traces.spans(f"process {name}")
    assert span.attributes["messaging.destination.name"] == name


async def test_many_tasks_leave_no_state_behind(traces, autojump_clock):
    @trioexec.task(retries=1, backoff=Backoff(initial=0.1, jitter=0))
    async def flaky(n: int) -> None:
        if n % 3 == 0:
            raise OSError("flaky")

    async with open_executor(max_concurrent_tasks=8) as ex:
        instrument(ex, traces.provider)
        refs = [await ex.submit(flaky, n) for n in range(300)]
        refs += [await ex.submit(trio.sleep, 10, timeout=0.5) for _ in range(20)]
        refs += [await ex.submit(ok) for _ in range(100)]
        for ref in refs[-50:]:
            ref.cancel()
        for ref in refs:
            await ref.wait()
        assert not observer_of(ex).tasks
    assert otel_context.get_current() == otel_context.Context()


async def test_a_no_op_tracer_provider_runs_tasks_and_keeps_the_submitters_parent(traces):
    async def inner() -> None:
        with traces.tracer.start_as_current_span("inner"):
            pass

    async with open_executor() as ex:
        instrument(ex, NoOpTracerProvider())
        with traces.tracer.start_as_current_span("request") as request:
            await (await ex.submit(inner)).wait()
        assert not observer_of(ex).tasks
    (span,) = traces.spans("inner")
    assert parent_id(span) == request.get_span_context().span_id


async def test_tasks_submitted_before_instrument_are_traced_as_root_spans(traces):
    async with open_executor(max_concurrent_tasks=1) as ex:
        blocker = await ex.submit(trio.sleep_forever)
        await trio.testing.wait_all_tasks_blocked()
        with traces.tracer.start_as_current_span("request"):
            earlier = await ex.submit(ok)
        instrument(ex, traces.provider)
        blocker.cancel()
        await earlier.wait()
    (span,) = traces.attempts("ok")
    assert span.parent is None


async def test_a_deterministic_executor_is_traced_in_its_callers_task(traces):
    ex = DeterministicExecutor()
    instrument(ex, traces.provider)
    with traces.tracer.start_as_current_span("request") as request:
        ref = ex.submit_nowait(ok)
        await ex.run_ready()
        assert trace.get_current_span() is request
    assert ref.status is TaskStatus.COMPLETED
    (span,) = traces.attempts("ok")
    assert parent_id(span) == request.get_span_context().span_id


async def test_an_attempt_ended_from_another_trio_task_leaves_both_contexts_alone(traces, caplog):
    # (The executor ends an attempt in the task that started it; should that ever
    # change, the span still ends and no context is reset in the wrong task.)
    class FakeJob:
        task_id = "t-1"
        name = "fake"
        attempts = 1
        key = None
        error = None

    class FakeLifecycle:
        def waiting_on(self, job: object) -> None:
            return None

    tracing = otel._Tracing(traces.provider.get_tracer("t"), FakeLifecycle(), "owner")
    job = FakeJob()
    tracing.submitted(job)
    started = trio.Event()
    release = trio.Event()

    async def worker() -> None:
        tracing.started(job)
        seen = trace.get_current_span()
        started.set()
        await release.wait()
        assert trace.get_current_span() is seen  # (not reset from elsewhere)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker)
        await started.wait()
        tracing.finished(job, TaskStatus.CANCELLED)
        release.set()
    assert not tracing.tasks
    (span,) = traces.spans("process fake")
    assert span.attributes["trioexec.status"] == "cancelled"
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert trace.get_current_span() is trace.INVALID_SPAN


async def test_an_end_the_store_fences_out_leaves_the_span_and_the_tracing_on(
    traces, autojump_clock
):
    """The attempt's span ended with the task; the store then refuses the
    completion: the span cannot change, and the observer stays (not dropped)."""
    store = trioexec.MemoryStore(clock=FakeWallClock(start=0))

    @trioexec.task(id="work")
    async def work() -> str:
        await trio.sleep(1)
        return "done"

    async with open_executor(store=store, lease=30, tasks=[work]) as ex:
        instrument(ex, traces.provider)
        ref = await ex.submit(work)
        await ex.flush()
        assert len(store.recover("B", 10**6, lambda r: True, 3).claimed) == 1
        assert (await ref.wait()).status is TaskStatus.CANCELLED  # (fenced out)
        assert await ex.run(work) == "done"
        assert len(ex._core.lifecycle.observer.all) == 1  # still told
    # The fenced-out attempt's span says how it ended here; the next one is traced.
    spans = traces.spans("process work")
    assert [s.attributes[otel.STATUS] for s in spans] == ["completed", "completed"]
