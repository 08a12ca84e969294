"""Quickstart (the sample on the docs' front page): a task waits without holding a slot.

An executor with one slot runs a task that stages some rows and then waits for an
upload. ``await handle.defer_until(upload_done)`` gives the slot back while it
waits and takes one back when the event is set; the task's local variables are
still there because the same coroutine simply resumes.

Run it with ``python examples/quickstart.py`` (about 0.1 s). It asserts what it
shows, so a regression makes it fail.
"""

from __future__ import annotations

import trio

import trioexec


async def wait_for_upload(upload_done: trio.Event, handle: trioexec.TaskHandle) -> str:
    staged = "rows staged"  # local state, kept across the wait
    await handle.defer_until(upload_done)  # no slot held while waiting
    return staged + ", then loaded"


async def main() -> None:
    upload_done = trio.Event()
    async with trioexec.open_executor(max_concurrent_tasks=1) as ex:
        ref = await ex.submit(wait_for_upload, upload_done)
        await trio.sleep(0.1)  # the upload, elsewhere
        assert ex.slots.in_use == 0  # the waiting task holds no slot
        upload_done.set()
        completion = await ref.wait()
    print(completion.result)  # rows staged, then loaded
    assert completion.result == "rows staged, then loaded"


if __name__ == "__main__":
    trio.run(main)
