"""How-to: one tenant does not starve the others (``fairness="keys"``).

Tenant A submits three reports, then tenant B two, to an executor with one slot.
In submission order B would wait for all of A's; with ``fairness="keys"`` the
tenants (the tasks' admission keys) take turns: A1 B1 A2 B2 A3. Each tenant's own
reports still start in the order it submitted them, and a higher priority still
goes first.

Run it with ``python examples/howto_fair_order.py``.
"""

from __future__ import annotations

import trio

import trioexec

started: list[str] = []


async def report(name: str) -> None:
    started.append(name)
    await trio.sleep(0.01)  # (the work)


async def run(fairness: str | None) -> list[str]:
    started.clear()
    async with trioexec.open_executor(max_concurrent_tasks=1, fairness=fairness) as ex:
        for tenant, count in (("A", 3), ("B", 2)):
            for n in range(1, count + 1):
                ex.submit_nowait(report, f"{tenant}{n}", key=f"tenant-{tenant}")
    return list(started)


async def main() -> None:
    in_order = await run(None)
    fair = await run("keys")
    print("submission order:", " ".join(in_order))
    print("fairness='keys': ", " ".join(fair))
    assert in_order == ["A1", "A2", "A3", "B1", "B2"]
    assert fair == ["A1", "B1", "A2", "B2", "A3"]


if __name__ == "__main__":
    trio.run(main)
