"""How-to: trace an executor's tasks with OpenTelemetry.

A web request (its own span, ``POST /orders/42``) submits three tasks: an
invoice rendered under a span of its own, a payment whose first attempt fails
and is retried, and an email that defers until an upload is done.
`trioexec.contrib.otel.instrument` gives each attempt a span under the request's
span; the script prints the tree the exporter received and checks its shape.

The spans go to the SDK's in-memory exporter here; in production, a
``BatchSpanProcessor`` with an OTLP exporter (see docs/howto/opentelemetry.rst).
The waits are virtual (Trio's ``MockClock`` with autojump), so the script
finishes at once.

Needs the ``otel`` extra and the SDK: ``pip install 'trioexec[otel]'
opentelemetry-sdk``. Run it with ``python examples/howto_opentelemetry.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio
import trio.testing
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import trioexec
from trioexec import Backoff, TaskHandle
from trioexec.contrib.otel import instrument

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = provider.get_tracer("shop")

upload_done = trio.Event()
charges: list[int] = []


async def render_invoice(order: int) -> str:
    with tracer.start_as_current_span("render pdf"):  # a child of the task's span
        await trio.sleep(0.2)
    return f"invoice-{order}.pdf"


@trioexec.task(retries=2, backoff=Backoff(initial=1.0, jitter=0))
async def charge(order: int) -> str:
    charges.append(order)
    if len(charges) == 1:
        raise ConnectionError("payment gateway reset")
    return "charged"


async def email(order: int, handle: TaskHandle) -> str:
    await handle.defer_until(upload_done)  # gives its slot back: a span event each way
    return "sent"


async def main() -> None:
    async with trioexec.open_executor() as ex:
        instrument(ex, provider)  # tracer_provider=None: the global provider
        with tracer.start_as_current_span("POST /orders/42"):
            refs = [
                await ex.submit(render_invoice, 42),
                await ex.submit(charge, 42),
                await ex.submit(email, 42),
            ]
        await trio.sleep(5)
        upload_done.set()
        for ref in refs:
            await ref.wait()
    spans = exporter.get_finished_spans()
    print_tree(spans)
    check(spans)


def describe(span: ReadableSpan) -> str:
    """One line: the span's name and what trioexec says of it."""
    attrs = span.attributes or {}
    text = span.name
    if "trioexec.attempt" in attrs:
        text += f"  attempt {attrs['trioexec.attempt']!s}: {attrs['trioexec.status']!s}"
    if span.status.status_code is StatusCode.ERROR:
        text += f"  ERROR {span.status.description}"
    if span.links:
        text += "  (linked to attempt 1)"
    events = [e.name for e in span.events if e.name != "exception"]
    if events:
        text += f"  events: {', '.join(events)}"
    return text


def print_tree(spans: Sequence[ReadableSpan]) -> None:
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        children.setdefault(parent_of(span), []).append(span)

    def show(span: ReadableSpan, depth: int) -> None:
        print("  " * depth + describe(span))
        for child in sorted(children.get(span_id(span), []), key=describe):
            show(child, depth + 1)

    for root in children[None]:
        show(root, 0)


def check(spans: Sequence[ReadableSpan]) -> None:
    """What the tree above shows, asserted."""
    (request,) = [s for s in spans if s.name == "POST /orders/42"]
    attempts = [s for s in spans if s.name.startswith("process ")]
    assert {parent_of(s) for s in attempts} == {span_id(request)}
    assert sorted(s.name for s in attempts) == [
        "process charge",
        "process charge",
        "process email",
        "process render_invoice",
    ]
    (pdf,) = [s for s in spans if s.name == "render pdf"]
    (invoice,) = [s for s in attempts if s.name == "process render_invoice"]
    assert parent_of(pdf) == span_id(invoice)


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
