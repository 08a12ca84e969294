"""The machine: what an executor decides, with no I/O (no Trio, no store).

It holds the queue of tasks that have not started and decides who starts next
(`Pending`: priority, aging, keys, pauses), what a key lets through and when it
is due again (`KeyState`, `KeyTimers`), and whether one more submission gets in
(`admit`). Its methods are synchronous: they read the clock they are given and
return, or tell a `Listener`, what the shell is to carry out (wake a worker,
journal what a task waits on, tell the store of a shared key, set a timer) and
set what a waiting task's shell gave them to wake. The shell (`trioexec._core`
and the parts it makes) runs the Trio tasks that do it. The counts per state
are the `Tally` (`trioexec._metrics`), the rules of an execution's row the
transition table (`trioexec._store._base.TRANSITIONS`).

tests/test_machine.py drives it without Trio against a model.
"""
