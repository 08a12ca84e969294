"""How-to: a durable task's trace continues in the worker process that runs it.

The "web" process (this script) handles ``POST /refunds`` under a span and
creates a durable task for the ``refunds`` workers. A worker process (this
script again, started with ``worker``: another host would do the same with a
PostgreSQL URL) claims the task from the same SQLite file and runs it. Both
stores are instrumented with `trioexec.contrib.otel.instrument_durable`, and the
worker's executor with `trioexec.contrib.otel.instrument`: the worker's span for
the run is a child of the request's span, in the request's trace, and the
handler's own span (``bank transfer``) is a child of that.

Each process exports its spans; here the worker prints them as JSON lines, and
this process draws the one trace both made. In production each process sends
them to your backend (an OTLP exporter) and the backend joins them.

Needs the ``otel`` extra and the SDK: ``pip install 'trioexec[otel]'
opentelemetry-sdk``. Run it with ``python examples/howto_otel_durable.py``
(about a second).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trioexec.contrib.otel import instrument, instrument_durable
from trioexec.durable import DurableStore, open_worker

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = provider.get_tracer("shop")


# ------------------------------------------------------------ the web process


async def web(db: str) -> None:
    with DurableStore(db) as ds:
        instrument_durable(ds)  # tasks created here carry the current trace context
        with tracer.start_as_current_span("POST /refunds"):
            await ds.promises.create("refund-7", 3600, data={"order": 7}, target="refunds")
        promise = await ds.promises.get("refund-7")
        assert promise is not None
        print(f"tags of refund-7: {promise.tags}")

    # The worker: another process (on another host, the same with a PostgreSQL URL).
    done = await trio.run_process([sys.executable, __file__, "worker", db], capture_stdout=True)
    spans = [as_dict(s) for s in exporter.get_finished_spans()]
    spans += [json.loads(line) for line in done.stdout.decode().splitlines()]
    print_tree(spans)
    check(spans)


# ------------------------------------------------------------ the worker process


refunded = trio.Event()


async def refund(param: dict[str, int]) -> str:
    with tracer.start_as_current_span("bank transfer"):  # a child of the run's span
        await trio.sleep(0.01)
    refunded.set()
    return f"refunded order {param['order']}"


async def worker(db: str) -> None:
    with DurableStore(db) as ds:
        instrument_durable(ds)  # tasks claimed here continue their creator's trace
        async with open_worker(ds, "refunds", refund, poll_interval=0.05) as w:
            instrument(w.executor, provider)  # first thing in the block: spans per run
            with trio.fail_after(30):
                await refunded.wait()
        # (leaving the worker's block wrote the run's result: the promise is resolved)
        promise = await ds.promises.get("refund-7")
        assert promise is not None
        assert not promise.pending
    for span in exporter.get_finished_spans():
        print(json.dumps(as_dict(span)))


# ------------------------------------------------------------ the trace


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    assert span.context is not None
    return {
        "name": span.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "kind": span.kind.name,
        "message_id": (span.attributes or {}).get("messaging.message.id"),
    }


def print_tree(spans: list[dict[str, Any]]) -> None:
    def show(span: dict[str, Any], depth: int) -> None:
        run = f", message id {span['message_id']}" if span.get("message_id") else ""
        print(
            f"{'  ' * depth}{span['name']}  ({span['kind']}, trace {span['trace_id'][:8]}...{run})"
        )
        for child in spans:
            if child["parent_id"] == span["span_id"]:
                show(child, depth + 1)

    for root in spans:
        if root["parent_id"] is None:
            show(root, 0)


def check(spans: list[dict[str, Any]]) -> None:
    """What the tree shows, asserted: one trace across the two processes."""
    by_name = {s["name"]: s for s in spans}
    request = by_name["POST /refunds"]
    run = by_name["process durable:refunds"]  # (named by its target: one name per target)
    assert run["message_id"] == "refund-7@1"  # the task's id, at its first claim
    transfer = by_name["bank transfer"]
    assert {s["trace_id"] for s in spans} == {request["trace_id"]}
    assert run["parent_id"] == request["span_id"]
    assert run["kind"] == "CONSUMER"
    assert transfer["parent_id"] == run["span_id"]


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        trio.run(worker, sys.argv[2])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            trio.run(web, str(Path(tmp) / "refunds.db"))
