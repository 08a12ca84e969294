"""One process of the deduplication tests (not a test module): ``python
dedupe_worker.py TARGET NAME KEY...``: an executor on the store TARGET (a SQLite
file or a PostgreSQL URL) with ``keep_results=True`` prints ``READY``, waits
for a line "go" on stdin, then submits one charge per KEY at once (``dedupe_key``
KEY), prints ``REF <key> <task id> <deduplicated 0|1>`` for each, waits for
every ref and prints ``GOT <key> <value's JSON>``, then ``DONE``."""

from __future__ import annotations

import json
import sys

import trio

import trioexec


async def charge(key: str, name: str) -> dict[str, str]:
    await trio.sleep(0.05)  # (a charge takes a moment: the other process finds it live or
    # completed, and either holds the key: the test's assertions hold both ways)
    return {"key": key, "charged_by": name}


async def main(target: str, name: str, keys: list[str]) -> None:
    store = trioexec.open_store(target)
    async with trioexec.open_executor(
        store=store, keep_results=True, max_concurrent_tasks=64
    ) as ex:
        print("READY", flush=True)
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        assert line.strip() == "go", line
        refs: dict[str, trioexec.TaskRef[dict[str, str]]] = {}

        async def submit(key: str) -> None:
            refs[key] = await ex.submit(charge, key, name, dedupe_key=key)

        async with trio.open_nursery() as nursery:
            for key in keys:
                nursery.start_soon(submit, key)
        for key, ref in refs.items():
            print("REF", key, ref.task_id, int(ref.deduplicated), flush=True)
        for key, ref in refs.items():
            completion = await ref.wait()
            print("GOT", key, json.dumps(completion.result), flush=True)
    store.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3:])
