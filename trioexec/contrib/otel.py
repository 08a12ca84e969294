"""OpenTelemetry traces of an executor's tasks (extra ``otel``: opentelemetry-api).

`instrument` makes a span per attempt (``process <task name>``, ``CONSUMER``, a child
of the submitter's context, the current span while the task runs, a retry linked to
the first attempt); `instrument_durable` carries the creator's context through a
durable store's promise tags. docs/howto/opentelemetry.rst documents them (spans,
events, attributes, what has no span): keep it in step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, final

import attrs
import trio
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

import trioexec
from trioexec._observe import Observed, Observers, lifecycle_of, logger, owner_of
from trioexec._records import FAILURES, TaskStatus, safe_repr
from trioexec.durable._store import UNTRACED, trace_with

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from contextvars import Token

    from opentelemetry.trace import Span, SpanContext, TracerProvider
    from opentelemetry.util.types import AttributeValue

    from trioexec import DeterministicExecutor, Executor
    from trioexec._taskref import Job
    from trioexec.durable import DurableStore

__all__ = ["instrument", "instrument_durable"]

# OpenTelemetry's messaging semantic conventions (opentelemetry.semconv's
# messaging_attributes; written out: the extra depends on the API only).
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_MESSAGE_ID = "messaging.message.id"
MESSAGING_DESTINATION_NAME = "messaging.destination.name"
MESSAGING_CLIENT_ID = "messaging.client.id"
ERROR_TYPE = "error.type"
SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"
# trioexec's own.
ATTEMPT = "trioexec.attempt"
STATUS = "trioexec.status"
KEY = "trioexec.key"
RETRY_DELAY = "trioexec.retry.delay"
WAITING_ON = "trioexec.waiting_on"
DEFERRED_EVENT = "trioexec.deferred"
RESUMED_EVENT = "trioexec.resumed"

#: Where a durable task's promise carries its creator's trace context: each name
#: the propagator writes (``traceparent``...), prefixed with this, in its tags.
TAG_PREFIX = "otel:"

_EMPTY = Context()  # the parent of a task submitted before `instrument`


def instrument(
    ex: Executor | DeterministicExecutor, tracer_provider: TracerProvider | None = None
) -> None:
    """Trace ``ex``'s tasks from now on: a span per attempt (see the module).

    ``tracer_provider``: the provider to take the tracer from (the global one,
    `opentelemetry.trace.get_tracer_provider`, if None; with the API alone, a
    no-op). Tasks already submitted are traced from their next attempt, as
    root spans.

    Raises:
      ValueError: ``ex`` is instrumented already.
    """
    lifecycle = lifecycle_of(ex)
    current = lifecycle.observer
    observers = current.all if isinstance(current, Observers) else [current]
    if any(isinstance(observer, _Tracing) for observer in observers):
        raise ValueError("this executor is instrumented for OpenTelemetry already")
    tracer = trace.get_tracer(
        "trioexec.contrib.otel",
        trioexec.__version__,
        tracer_provider=tracer_provider,
        schema_url=SCHEMA_URL,
    )
    lifecycle.add_observer(_Tracing(tracer, lifecycle, owner_of(ex)))


def instrument_durable(ds: DurableStore) -> None:
    """Carry the trace context through ``ds`` from now on (see the module):
    a task created through it (``ds.promises.create(..., target=...)``) carries
    the creator's context in its promise's tags, and a worker on it
    (`trioexec.durable.open_worker`) submits each task it claims in that context.

    Call it in every process, on each `~trioexec.durable.DurableStore`: the
    creators' and the workers'. A worker's spans come from its executor, which
    `instrument` traces (``instrument(worker.executor)``, first thing in the
    worker's block). It uses the global propagator (`opentelemetry.propagate`:
    W3C trace context and baggage unless the application set another). A store
    that is not instrumented pays nothing; one that is reads the tags of each
    task it claims, in the claim's transaction.

    Raises:
      ValueError: ``ds`` is instrumented already.

    Example::

        ds = DurableStore("app.db")
        instrument_durable(ds)
        with tracer.start_as_current_span("POST /refunds"):
            await ds.promises.create("refund-7", 3600, data=..., target="refunds")
    """
    trace_with(ds, _Carrier())


@final
class _Carrier:
    """`trioexec.durable._store.Tracing` with OpenTelemetry's global propagator."""

    __slots__ = ()

    def inject(self, tags: dict[str, str] | None) -> dict[str, str] | None:
        carrier: dict[str, str] = {}
        try:
            propagate.inject(carrier)
        except Exception:  # (a broken propagator: the task goes, untraced)
            logger.exception("the OpenTelemetry propagator raised")
            return tags
        if not carrier:  # no trace here
            return tags
        carried = {TAG_PREFIX + name: value for name, value in carrier.items()}
        return carried if tags is None else {**carried, **tags}  # the creator's own win

    def extract(self, tags: Mapping[str, str]) -> AbstractContextManager[object]:
        start = len(TAG_PREFIX)
        carrier = {name[start:]: v for name, v in tags.items() if name.startswith(TAG_PREFIX)}
        if not carrier:  # created untraced (or through a store not instrumented)
            return UNTRACED
        try:
            return _continued(propagate.extract(carrier, _EMPTY))
        except Exception:
            logger.exception("the OpenTelemetry propagator raised")
            return UNTRACED

    def __repr__(self) -> str:
        return "<trioexec.contrib.otel.instrument_durable>"


@contextlib.contextmanager
def _continued(context: Context) -> Iterator[None]:
    """The context a claimed task's run is submitted in: its creator's."""
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


@attrs.define(eq=False)
class _Task:
    """What the tracing keeps of one task between its submission and its end."""

    context: Context  # the submitter's: each attempt's parent
    first: SpanContext | None = None  # the first attempt's span
    span: Span | None = None  # the attempt under way
    token: Token[Context] | None = None  # its context, attached ...
    task: trio.lowlevel.Task | None = None  # ... in this Trio task


@final
@attrs.define(eq=False)
class _Tracing:
    """The observer: each attempt a span (`trioexec._observe.Observer`)."""

    tracer: trace.Tracer
    lifecycle: Observed
    client_id: str
    tasks: dict[str, _Task] = attrs.field(init=False, factory=dict)  # accepted, not finished

    def submitted(self, job: Job) -> None:
        self.tasks[job.task_id] = _Task(otel_context.get_current())

    def started(self, job: Job) -> None:
        state = self.tasks.get(job.task_id)
        if state is None:  # submitted before `instrument`
            state = self.tasks[job.task_id] = _Task(_EMPTY)
        elif state.span is not None:  # (never: the last attempt ended first)
            self._end(state, job, TaskStatus.CANCELLED)
        attributes: dict[str, AttributeValue] = {
            MESSAGING_SYSTEM: "trioexec",
            MESSAGING_OPERATION_TYPE: "process",
            MESSAGING_OPERATION_NAME: "process",
            MESSAGING_MESSAGE_ID: job.task_id,
            MESSAGING_DESTINATION_NAME: job.name,
            MESSAGING_CLIENT_ID: self.client_id,
            ATTEMPT: job.attempts,
        }
        if job.key is not None:
            attributes[KEY] = job.key
        first = state.first
        span = self.tracer.start_span(
            f"process {job.name}",
            state.context,
            SpanKind.CONSUMER,
            attributes,
            None if first is None else (Link(first),),
        )
        span_context = span.get_span_context()
        if span_context.is_valid:
            if first is None:
                state.first = span_context
            current = trace.set_span_in_context(span, state.context)
        else:  # a no-op tracer: the task's own spans are the submitter's children
            current = state.context
        state.span = span
        state.token = otel_context.attach(current)
        state.task = trio.lowlevel.current_task()

    def deferred(self, job: Job) -> None:
        state = self.tasks.get(job.task_id)
        if state is not None and state.span is not None and state.span.is_recording():
            waiting = self.lifecycle.waiting_on(job)
            state.span.add_event(DEFERRED_EVENT, None if waiting is None else {WAITING_ON: waiting})

    def resumed(self, job: Job) -> None:
        state = self.tasks.get(job.task_id)
        if state is not None and state.span is not None:
            state.span.add_event(RESUMED_EVENT)

    def retrying(self, job: Job, status: TaskStatus, delay: float) -> None:
        state = self.tasks.get(job.task_id)
        if state is not None and state.span is not None:
            state.span.set_attribute(RETRY_DELAY, delay)
            self._end(state, job, status)

    def finished(self, job: Job, status: TaskStatus) -> None:
        state = self.tasks.pop(job.task_id, None)  # (none: dropped on arrival)
        if state is not None and state.span is not None:
            self._end(state, job, status)

    def overruled(self, job: Job, status: TaskStatus) -> None:
        """Nothing to do: the attempt's span ended (and may be exported) when the
        task did; an ended span cannot change. The ``trioexec`` logger says it."""

    def _end(self, state: _Task, job: Job, status: TaskStatus) -> None:
        """The attempt under way ended with ``status``: end its span, and give
        the worker's task its context back."""
        span = state.span
        assert span is not None
        state.span = None
        if span.is_recording():
            span.set_attribute(STATUS, status.value)
            if status in FAILURES:
                _record_error(span, job.error)
        span.end()
        token = state.token
        if token is not None:
            state.token = None
            # A token is only good in the context it was made in: the attempt
            # always ends in the Trio task it started in, but never fail there.
            if state.task is trio.lowlevel.current_task():
                otel_context.detach(token)
            state.task = None


def _record_error(span: Span, error: BaseException | None) -> None:
    if error is None:
        span.set_status(Status(StatusCode.ERROR))
        return
    span.set_status(Status(StatusCode.ERROR, safe_repr(error)))
    kind = type(error)
    module = kind.__module__
    span.set_attribute(
        ERROR_TYPE, kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
    )
    try:
        span.record_exception(error)
    except Exception:  # (its str() is broken: the status still says what it was)
        span.add_event("exception", {"exception.type": kind.__qualname__})
