"""How-to: limit calls per host or tenant.

A crawler fetches pages from three hosts through one executor with twelve slots.
``slow.example`` allows 2 connections at once; ``api.example`` allows 4 requests
a second; ``fast.example`` has no limit. Each fetch is keyed by its host
(``@task(key=...)`` computes the key from the URL), so the executor keeps each
host within its limit while the other hosts' fetches go on in the free slots: a
host at its limit never delays another. An urgent fetch (``priority=10``) starts
before the queued ones.

The fetches "take" virtual time (``trio.sleep``), so the script runs on Trio's
``MockClock`` with autojump: exact durations, milliseconds of real time. In
production: ``trio.run(main)``.

Run it with ``python examples/howto_key_limits.py``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import trio
import trio.testing

import trioexec
from trioexec import KeyLimit

LIMITS = {
    "slow.example": KeyLimit(concurrency=2),  # 2 connections at once
    "api.example": KeyLimit(rate=4, per=1.0),  # 4 requests a second (burst of 4)
}
starts: dict[str, list[float]] = {}
order: list[str] = []  # the URLs, in the order they started


@trioexec.task(key=lambda url: urlsplit(url).hostname)
async def fetch(url: str) -> str:
    host = urlsplit(url).hostname or ""
    starts.setdefault(host, []).append(trio.current_time())
    order.append(url)
    await trio.sleep(1.0 if host == "slow.example" else 0.1)  # the request
    return f"<page {url}>"


async def main() -> None:
    async with trioexec.open_executor(max_concurrent_tasks=12, key_limits=LIMITS) as ex:
        refs = []
        for n in range(6):
            for host in ("slow.example", "api.example", "fast.example"):
                refs.append(await ex.submit(fetch, f"https://{host}/page/{n}"))
        await trio.testing.wait_all_tasks_blocked()
        for host in ("slow.example", "api.example", "fast.example"):
            stats = ex.key_statistics(host)
            print(f"{host:13} active {stats.active}  pending {stats.pending}")
        held = next(ref for ref in refs if ref.waiting_on is not None)
        print(f"{held.task_id[-4:]} waits on: {held.waiting_on}")
        urgent = await ex.submit(fetch, "https://slow.example/urgent", priority=10)
        await ex.wait_for_idle()

    print()
    for host, times in starts.items():
        print(f"{host:13} starts at " + " ".join(f"{t:4.2f}" for t in times))
    slow = starts["slow.example"]
    assert all(slow[i + 2] >= slow[i] + 1.0 for i in range(len(slow) - 2))  # 2 at once
    api = starts["api.example"]
    assert api == [0.0, 0.0, 0.0, 0.0, 0.25, 0.5]  # a burst of 4, then one every 0.25 s
    assert starts["fast.example"] == [0.0] * 6  # never behind the other hosts
    # The urgent fetch went ahead of the slow host's queued pages.
    slow_urls = [url for url in order if "slow.example" in url]
    assert slow_urls[2] == urgent.completion.result.removeprefix("<page ").rstrip(">")
    print(f"\nthird slow.example start: {slow_urls[2]} (submitted last, priority 10)")


if __name__ == "__main__":
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
