"""How-to: export an executor's metrics to Prometheus.

An executor named ``ingest`` with two slots runs six fetches (one of which
fails), and a report that defers until the fetches are done. Midway, and at the
end, the script reads what a Prometheus server would scrape: the gauges while
tasks run, wait and queue, then the counters and histograms (the closed
executor's gauges are gone by then).

The waits are virtual (Trio's ``MockClock`` with autojump), so the script
finishes at once. In production: ``trio.run(main)``, the default registry, and
``prometheus_client.start_http_server(9100)`` (or your web framework's
``/metrics`` route) to serve it.

Run it with ``python examples/howto_prometheus.py``.
"""

from __future__ import annotations

import trio
import trio.testing
from prometheus_client import CollectorRegistry, generate_latest

import trioexec
from trioexec import TaskHandle
from trioexec.contrib.prometheus import instrument

fetched = trio.Event()


async def fetch(n: int) -> int:
    await trio.sleep(0.5 * n)  # (a network call)
    if n == 3:
        raise ConnectionError("reset by peer")
    return n


async def report(handle: TaskHandle) -> str:
    await handle.defer_until(fetched)  # gives its slot back meanwhile
    return "sent"


def show(registry: CollectorRegistry, *prefixes: str, zeros: bool = True) -> None:
    """Print the exposition lines (what Prometheus scrapes) with these names."""
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(prefixes) and (zeros or not line.endswith(" 0.0")):
            print("  " + line)


async def main() -> None:
    registry = CollectorRegistry()  # (in production: the default one, registry=None)
    async with trioexec.open_executor(max_concurrent_tasks=2) as ex:
        instrument(ex, registry, name="ingest")
        await ex.submit(report)
        refs = [await ex.submit(fetch, n) for n in range(1, 7)]
        await trio.sleep(0.1)
        print("at t=0.1 s:")
        show(
            registry,
            "trioexec_tasks_active{",
            "trioexec_tasks_deferred{",
            "trioexec_queue_depth{",
            "trioexec_slots{",
        )
        for ref in refs:
            await ref.wait()
        fetched.set()
    print("at the end:")
    prefixes = "trioexec_tasks_completed_total{", "trioexec_task_duration_seconds_sum{"
    show(registry, *prefixes, zeros=False)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"executor": "ingest", **labels})

    assert value("trioexec_tasks_submitted_total", task="fetch") == 6
    assert value("trioexec_tasks_completed_total", task="fetch", status="completed") == 5
    assert value("trioexec_tasks_completed_total", task="fetch", status="failed") == 1
    # 0.5 + 1 + ... + 3 seconds of fetching; the report waited for all of it.
    assert value("trioexec_task_duration_seconds_sum", task="fetch") == 10.5
    assert value("trioexec_task_deferred_seconds_count", task="report") == 1
    # The executor has closed: its gauges of what is now are gone, the totals stay.
    assert value("trioexec_tasks_active", task="report") is None
    assert value("trioexec_slots", state="available") is None


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
