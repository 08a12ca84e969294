"""`trioexec.contrib.otel.instrument_durable`: a durable task carries its
creator's trace context through the store, and a worker in another process
continues that trace. The worker is a real subprocess on the same SQLite file
(or PostgreSQL database), with the SDK's in-memory exporter; it prints the spans
it made, as JSON, for the test to check against the creator's span."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
from opentelemetry import baggage, propagate
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import trioexec
from trioexec.contrib import otel
from trioexec.contrib.otel import instrument, instrument_durable
from trioexec.durable import DurableHandle, DurableStore, PromiseState, open_worker
from trioexec.testing import FakeWallClock

#: The worker process: claims the target's tasks on the store given, runs each
#: (under a span of the handler's own, reading the baggage), and prints every
#: span it finished as one JSON line once ``count`` tasks ran.
WORKER = textwrap.dedent(
    """
    import json, sys

    import trio
    from opentelemetry import baggage
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from trioexec.contrib.otel import instrument, instrument_durable
    from trioexec.durable import DurableStore, open_worker

    target, count = sys.argv[1], int(sys.argv[2])
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("worker")


    async def main():
        ran = []
        all_ran = trio.Event()

        async def refund(param):
            with tracer.start_as_current_span("bank call") as span:
                span.set_attribute("order", str(baggage.get_baggage("order")))
            ran.append(param)
            if len(ran) == count:
                all_ran.set()
            return {"refunded": param}

        with DurableStore(target) as ds:
            instrument_durable(ds)
            async with open_worker(ds, "refunds", refund, poll_interval=0.05) as worker:
                instrument(worker.executor, provider)
                with trio.fail_after(60):
                    await all_ran.wait()
            # (leaving the block wrote the fulfils)
        for s in exporter.get_finished_spans():
            print(json.dumps({
                "name": s.name,
                "kind": s.kind.name,
                "trace_id": s.context.trace_id,
                "span_id": s.context.span_id,
                "parent_id": None if s.parent is None else s.parent.span_id,
                "remote_parent": None if s.parent is None else s.parent.is_remote,
                "attributes": dict(s.attributes),
            }))


    trio.run(main)
    """
)


class Caller:
    """The creating process's tracer (a provider of the test's own)."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("caller")


async def run_worker(tmp_path: Path, target: str, count: int) -> list[dict[str, Any]]:
    """Run the worker process until it ran ``count`` tasks; the spans it printed."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with trio.fail_after(90):
        done = await trio.run_process(
            [sys.executable, str(script), target, str(count)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def only(spans: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [s for s in spans if s["name"] == name]
    return found


def runs_of(spans: list[dict[str, Any]], id: str) -> list[dict[str, Any]]:
    """The spans of the runs of durable task ``id``: named by the target, the
    task's id (and claim version) in ``messaging.message.id``."""
    return [
        s
        for s in spans
        if s["name"] == "process durable:refunds"
        and s["attributes"]["messaging.message.id"].rpartition("@")[0] == id
    ]


async def test_a_worker_in_another_process_continues_the_creators_trace(
    db_target: str, tmp_path: Path
) -> None:
    caller = Caller()
    with DurableStore(db_target) as ds:
        instrument_durable(ds)
        with caller.tracer.start_as_current_span("POST /refunds") as request:
            token = otel_context.attach(baggage.set_baggage("order", "42"))
            try:
                await ds.promises.create("refund-42", 600, data=42, target="refunds")
            finally:
                otel_context.detach(token)
        untraced = await ds.promises.create("refund-43", 600, data=43, target="refunds")
        created = await ds.promises.get("refund-42")
    assert created is not None
    context = request.get_span_context()
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert created.tags["otel:traceparent"] == traceparent
    assert created.tags["otel:baggage"] == "order=42"
    assert not any(tag.startswith(otel.TAG_PREFIX) for tag in untraced.tags)  # no span there

    spans = await run_worker(tmp_path, db_target, 2)

    (run,) = runs_of(spans, "refund-42")
    assert run["kind"] == SpanKind.CONSUMER.name
    assert run["trace_id"] == context.trace_id  # the creator's trace ...
    assert run["parent_id"] == context.span_id  # ... under the creator's span
    assert run["remote_parent"] is True
    assert run["attributes"]["messaging.message.id"] == "refund-42@1"  # (its first claim)
    assert run["attributes"]["messaging.destination.name"] == "durable:refunds"
    # The handler's own span is the run's child, and the baggage came along.
    calls = [s for s in spans if s["name"] == "bank call"]
    (call,) = [s for s in calls if s["trace_id"] == context.trace_id]
    assert call["parent_id"] == run["span_id"]
    assert call["attributes"]["order"] == "42"
    # The task created outside any span starts a trace of its own in the worker.
    (other,) = runs_of(spans, "refund-43")
    assert other["trace_id"] != context.trace_id
    assert other["parent_id"] is None
    with DurableStore(db_target) as ds:
        done = await ds.promises.get("refund-42")
    assert done is not None
    assert done.state is PromiseState.RESOLVED
    assert json.loads(done.data or "null") == {"refunded": 42}


# In one process: a creator's store and a worker's, each a DurableStore of its
# own on one MemoryStore (the worker's runs get no context from the creator's
# Trio task but the one carried in the tags).


@pytest.fixture
async def two_stores() -> Any:
    """The creator's `DurableStore` and the worker's, on one MemoryStore."""
    memory = trioexec.MemoryStore(clock=FakeWallClock(0))
    stores = DurableStore(memory), DurableStore(memory)
    yield stores
    for ds in stores:
        ds.close()


@pytest.fixture
def caller() -> Caller:
    return Caller()


async def run_until_settled(
    ds: DurableStore, handler: Any, provider: TracerProvider, ids: list[str], *, then: Any = None
) -> None:
    """A worker on ``ds``, its executor traced, until every promise of ``ids``
    settled (``then()`` is called once the worker is up)."""
    async with open_worker(ds, "refunds", handler, poll_interval=0.1) as worker:
        instrument(worker.executor, provider)
        if then is not None:
            await then()
        with trio.fail_after(100):
            for id in ids:
                while (p := await ds.promises.get(id)) is None or p.pending:
                    await trio.sleep(0.1)


def process_spans(caller: Caller, id: str) -> list[Any]:
    return [
        s
        for s in caller.exporter.get_finished_spans()
        if s.name == "process durable:refunds"
        and str(s.attributes["messaging.message.id"]).rpartition("@")[0] == id
    ]


async def test_each_run_after_a_suspension_continues_the_creators_trace(
    two_stores: Any, caller: Caller, autojump_clock: Any
) -> None:
    creator, worker_ds = two_stores
    instrument_durable(creator)
    instrument_durable(worker_ds)
    await creator.promises.create("approval", 600)
    with caller.tracer.start_as_current_span("POST /refunds") as request:
        await creator.promises.create("refund", 600, data=7, target="refunds")
    runs = []

    async def refund(param: int, handle: DurableHandle) -> str:
        runs.append(param)
        return str(await handle.await_promise("approval"))

    async def approve() -> None:
        while (task := await creator.tasks.get("refund")) is None or not task.awaiting:
            await trio.sleep(0.1)
        with caller.tracer.start_as_current_span("approve"):  # (not the runs' parent)
            await creator.promises.resolve("approval", data=True)

    await run_until_settled(worker_ds, refund, caller.provider, ["refund"], then=approve)
    spans = process_spans(caller, "refund")
    assert len(runs) == len(spans) == 2  # suspended, then run again from the top
    # Each run is a claim of its own: the task's id, at the claim's version.
    assert [s.attributes["messaging.message.id"] for s in spans] == ["refund@1", "refund@2"]
    context = request.get_span_context()
    assert [s.context.trace_id for s in spans] == [context.trace_id] * 2
    assert [s.parent.span_id for s in spans] == [context.span_id] * 2


async def test_a_worker_whose_store_is_not_instrumented_starts_traces_of_its_own(
    two_stores: Any, caller: Caller, autojump_clock: Any
) -> None:
    creator, worker_ds = two_stores
    instrument_durable(creator)  # (the worker's store is not)
    with caller.tracer.start_as_current_span("POST /refunds") as request:
        await creator.promises.create("refund", 600, data=7, target="refunds")

    async def refund(param: int) -> int:
        return param

    await run_until_settled(worker_ds, refund, caller.provider, ["refund"])
    (span,) = process_spans(caller, "refund")
    assert span.parent is None
    assert span.context.trace_id != request.get_span_context().trace_id


async def test_what_is_carried_in_the_tags(two_stores: Any, caller: Caller) -> None:
    ds, _ = two_stores
    instrument_durable(ds)
    with caller.tracer.start_as_current_span("POST /refunds") as request:
        mine = {"team": "billing", "otel:tracestate": "mine=1"}
        tagged = await ds.promises.create("a", 600, target="refunds", tags=mine)
        alone = await ds.promises.create("b", 600)  # no task: nothing to continue
    trace_id = f"{request.get_span_context().trace_id:032x}"
    assert tagged.tags["team"] == "billing"
    assert tagged.tags["otel:tracestate"] == "mine=1"  # the creator's own tags win
    assert tagged.tags["otel:traceparent"].split("-")[1] == trace_id
    assert mine == {"team": "billing", "otel:tracestate": "mine=1"}  # (not changed)
    assert not [t for t in alone.tags if t.startswith(otel.TAG_PREFIX)]
    outside = await ds.promises.create("c", 600, target="refunds")  # no span: none
    assert not [t for t in outside.tags if t.startswith(otel.TAG_PREFIX)]


async def test_instrumenting_a_store_twice_raises(two_stores: Any) -> None:
    ds, _ = two_stores
    instrument_durable(ds)
    with pytest.raises(ValueError, match="carries a trace context already"):
        instrument_durable(ds)


async def test_a_propagator_that_raises_leaves_the_tasks_untraced(
    two_stores: Any,
    caller: Caller,
    autojump_clock: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    creator, worker_ds = two_stores
    instrument_durable(creator)
    instrument_durable(worker_ds)
    with caller.tracer.start_as_current_span("POST /refunds"):
        await creator.promises.create("carried", 600, data=1, target="refunds")

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("broken propagator")

    monkeypatch.setattr(propagate, "inject", broken)
    monkeypatch.setattr(propagate, "extract", broken)
    with caplog.at_level(logging.ERROR, "trioexec"):
        with caller.tracer.start_as_current_span("POST /refunds"):
            untraced = await creator.promises.create("plain", 600, data=2, target="refunds")

        async def echo(param: int) -> int:
            return param

        await run_until_settled(worker_ds, echo, caller.provider, ["carried", "plain"])
    assert not [t for t in untraced.tags if t.startswith(otel.TAG_PREFIX)]
    assert [s.parent for s in process_spans(caller, "carried")] == [None]  # ran, as a root
    assert len(process_spans(caller, "plain")) == 1
    assert [r.getMessage() for r in caplog.records] == ["the OpenTelemetry propagator raised"] * 2
