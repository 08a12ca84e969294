"""Scenarios 3 and 4: the cost of a defer/resume cycle, and memory per deferred task.

    python benchmarks/deferral.py [N ...]

For each N (default 10,000 and 100,000), in fresh subprocesses so peak RSS is
per case:
- hand: N plain Trio tasks each holding a CapacityLimiter token, releasing it,
  waiting on an Event, and re-acquiring it (the hand-written pattern);
- trioexec: N executor tasks each doing one ``handle.defer_until(event)``.
Reports the time of the wake-and-reclaim phase per task and the peak RSS per
parked task over a bare baseline, one JSON line per case, then the ratios.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import trio

import trioexec


def rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


async def hand(n: int) -> dict[str, float]:
    limiter = trio.CapacityLimiter(4)
    ev = trio.Event()
    parked = 0
    all_parked = trio.Event()

    async def one() -> None:
        nonlocal parked
        await limiter.acquire()
        limiter.release()
        parked += 1
        if parked == n:
            all_parked.set()
        await ev.wait()
        await limiter.acquire()
        limiter.release()

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)
        await all_parked.wait()
        peak = rss_kb()
        t0 = time.perf_counter()
        ev.set()
    return {"resume_s": time.perf_counter() - t0, "rss_kb": peak}


async def executor(n: int) -> dict[str, float]:
    ev = trio.Event()
    out: dict[str, float] = {}

    async def one(handle: trioexec.TaskHandle) -> None:
        await handle.defer_until(ev)

    async with trioexec.open_executor(max_concurrent_tasks=4, queue_capacity=n) as ex:
        for _ in range(n):
            await ex.submit(one)
        while ex.statistics().deferred_count < n:  # noqa: ASYNC110 - measuring, not waiting
            await trio.sleep(0.01)
        out["rss_kb"] = rss_kb()
        t0 = time.perf_counter()
        ev.set()
        await ex.wait_for_idle()
        out["resume_s"] = time.perf_counter() - t0
    return out


async def baseline(n: int) -> dict[str, float]:
    return {"resume_s": 0.0, "rss_kb": rss_kb()}


def child(case: str, n: int) -> None:
    result = trio.run({"hand": hand, "trioexec": executor, "baseline": baseline}[case], n)
    print(json.dumps(result))


def run_case(case: str, n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", case, str(n)], capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(out.stderr)
    return dict(json.loads(out.stdout))


def main(sizes: list[int]) -> None:
    base = run_case("baseline", 0)["rss_kb"]
    for n in sizes:
        h, t = run_case("hand", n), run_case("trioexec", n)
        per_hand = (h["rss_kb"] - base) * 1024 / n
        per_ours = (t["rss_kb"] - base) * 1024 / n
        for name, r, per in (("hand", h, per_hand), ("trioexec", t, per_ours)):
            print(
                json.dumps(
                    {
                        "scenario": "deferral",
                        "case": name,
                        "n": n,
                        "resume_us_per_task": r["resume_s"] * 1e6 / n,
                        "bytes_per_parked_task": per,
                    }
                )
            )
        print(
            f"n={n}: resume {t['resume_s'] * 1e6 / n:.1f} vs {h['resume_s'] * 1e6 / n:.1f} us/task"
            f" ({t['resume_s'] / h['resume_s']:.2f}x, target <= 1.5x); memory {per_ours:.0f} vs"
            f" {per_hand:.0f} B/task ({per_ours / per_hand:.2f}x, target <= 1.5x)"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]))
    else:
        main([int(a) for a in sys.argv[1:]] or [10_000, 100_000])
