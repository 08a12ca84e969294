"""The machine: what an executor decides, with no I/O (no Trio, no store).

- `_admit`: whether one more submission gets in (`admit`, `Admission`);
- `_pending`: who starts next (`Pending`: priority, aging; the ready heap);
- `_keygate`: the keys' side of the queue (`KeyGate`);
- `_keys`: one key's limit, counts and token bucket (`KeyLimit`, `KeyState`,
  `KeyTimers`);
- `_pauses`: what an operator's pause holds back (`Pauses`);
- `_lifecycle`: each transition of a task (`Lifecycle`), counted, journaled, told;
- `_closing`: what a shutdown policy cancels and still admits (`Closing`).

Its methods are synchronous. They read the clock they are given, and tell the
parts they were given (a `Listener`, the journal, the event stream: typed here
by what is asked of them) what the shell is to carry out: wake a worker,
journal a change, tell the store of a shared key, set a timer, wake who waits.
The shell (`trioexec._core` and its parts, `trioexec._waits`) runs the Trio
tasks that do it. The rules of an execution's row are the transition table
(`trioexec._store._base.TRANSITIONS`).

tests/test_machine.py drives it without Trio, against a model.
"""
