"""What trioexec.contrib costs per task: 100,000 empty tasks through one executor,
plain and instrumented, interleaved in one run, the best of 3 rounds each.

    python benchmarks/contrib_cost.py [--tasks N] [--rounds R]

Rows: not instrumented; Prometheus (a registry of its own); OpenTelemetry with
the API only (the global no-op provider); with the SDK's TracerProvider and no
span processor; with the SDK exporting every span to an exporter that discards
it; and the same with a sampler that records none, or one in ten. The figures
in docs/howto/prometheus.rst and opentelemetry.rst come from it (needs the
``prometheus`` and ``otel`` extras and opentelemetry-sdk).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, Sampler, TraceIdRatioBased
from prometheus_client import CollectorRegistry

import trioexec
from trioexec.contrib import otel, prometheus


class _Discard(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _sdk(exporting: bool, sampler: Sampler | None = None) -> TracerProvider:
    provider = TracerProvider(sampler=sampler)
    if exporting:
        provider.add_span_processor(SimpleSpanProcessor(_Discard()))
    return provider


CASES: dict[str, Callable[[trioexec.Executor], object] | None] = {
    "not instrumented": None,
    "prometheus": lambda ex: prometheus.instrument(ex, CollectorRegistry()),
    "otel, API only (no-op provider)": lambda ex: otel.instrument(ex),
    "otel, SDK, no processor": lambda ex: otel.instrument(ex, _sdk(False)),
    "otel, SDK, spans exported (discarded)": lambda ex: otel.instrument(ex, _sdk(True)),
    "otel, SDK, exported, sampler ALWAYS_OFF": lambda ex: otel.instrument(
        ex, _sdk(True, ALWAYS_OFF)
    ),
    "otel, SDK, exported, 10% sampled": lambda ex: otel.instrument(
        ex, _sdk(True, ParentBased(TraceIdRatioBased(0.1)))
    ),
}


async def _noop() -> None:
    pass


async def _batch(instrument: Callable[[trioexec.Executor], object] | None, n: int) -> float:
    async with trioexec.open_executor(max_concurrent_tasks=8, queue_capacity=n) as ex:
        if instrument is not None:
            instrument(ex)
        t0 = time.perf_counter()
        for _ in range(n):
            ex.submit_nowait(_noop)
        await ex.wait_for_idle()
        return time.perf_counter() - t0


async def _main(n: int, rounds: int) -> None:
    best = dict.fromkeys(CASES, float("inf"))
    for _ in range(rounds):
        for name, instrument in CASES.items():
            best[name] = min(best[name], await _batch(instrument, n))
    plain = best["not instrumented"]
    print(f"{n:,} empty tasks, best of {rounds} interleaved rounds")
    for name, seconds in best.items():
        per = seconds / n * 1e6
        extra = (seconds - plain) / n * 1e6
        print(f"  {name:40} {per:6.2f} us/task  {seconds / plain:5.2f}x  (+{extra:.2f} us)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trio.run(_main, args.tasks, args.rounds)


if __name__ == "__main__":
    main()
