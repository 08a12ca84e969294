"""The objects every task goes through keep CPython's fast attribute path: an
instance's attributes live in its class's shared keys only up to 30 of them
(CPython 3.11's ``SHARED_KEYS_MAX_SIZE``); past that each ``self.x`` on the hot
path is a dict lookup (measured: ExecutorCore at 30 attributes cost a no-op task
0.7k instructions, ``benchmarks/instructions.py --only noop``)."""

from __future__ import annotations

import trio

import trioexec

SHARED_KEYS_MAX = 30


async def test_the_hot_objects_stay_under_the_shared_keys_limit(tmp_path):
    for store in (None, trioexec.SQLiteStore(tmp_path / "runs.db")):
        async with trioexec.open_executor(store=store, keep_results=True) as ex:

            async def child() -> None:
                await trio.lowlevel.checkpoint()

            async def parent() -> None:
                await ex.submit(child)

            await ex.run(parent)  # (what a child and a kept result add)
            core = ex._core
            parts = [core, core.lifecycle, core.workers, core.pending, core.gate]
            with_dict = [p for p in parts if hasattr(p, "__dict__")]  # (slotted: no limit)
            assert core in with_dict
            for part in with_dict:
                assert len(vars(part)) < SHARED_KEYS_MAX, (type(part).__name__, sorted(vars(part)))
        if store is not None:
            store.close()
