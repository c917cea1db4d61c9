"""The Context contract of SPEC §1, rule by rule."""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
import trio
import trio.testing

from dynamo_trio import CancelReason, Context, ContextState

if TYPE_CHECKING:
    from collections.abc import Callable

# ---------------------------------------------------------------------------- basics


def test_default_id_is_a_fresh_uuid4() -> None:
    first, second = Context(), Context()
    assert uuid.UUID(first.id()).version == 4
    assert first.id() != second.id()
    assert Context("req-1").id() == "req-1"
    # Across several batches of ready ids: each a canonical RFC 4122 version 4 UUID.
    ids = [Context().id() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)


_FORK_CHECK = """
import os
from dynamo_trio import Context
Context()  # the parent now holds ready ids
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, " ".join(Context().id() for _ in range(3)).encode())
    os._exit(0)
os.close(write)
with os.fdopen(read) as pipe:
    child = pipe.read().split()
os.waitpid(pid, 0)
parent = [Context().id() for _ in range(3)]
print(len(child), len(set(child) & set(parent)))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_reuse_its_parents_ready_ids() -> None:
    # In a fresh interpreter: forking this (threaded) test process is unsafe.
    done = subprocess.run(
        [sys.executable, "-c", _FORK_CHECK], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["3", "0"]


def test_new_context_is_live() -> None:
    ctx = Context()
    assert ctx.state is ContextState.LIVE
    assert not ctx.is_stopped()
    assert not ctx.is_killed()
    assert ctx.reason is None
    assert ctx.state_changed_at is None


def test_stop_and_stop_generating_are_aliases() -> None:
    for method in ("stop", "stop_generating"):
        ctx = Context()
        getattr(ctx, method)()
        assert ctx.is_stopped()
        assert not ctx.is_killed()
        assert ctx.reason is CancelReason.STOP_REQUESTED


def test_kill_implies_stopped() -> None:
    ctx = Context()
    ctx.kill()
    assert ctx.is_stopped()
    assert ctx.is_killed()
    assert ctx.reason is CancelReason.KILL_REQUESTED


def test_states_only_move_forward() -> None:
    ctx = Context()
    ctx.kill(CancelReason.CLIENT_DISCONNECT)
    changed_at = ctx.state_changed_at
    ctx.stop()
    ctx.stop_generating()
    assert ctx.is_killed()
    assert ctx.reason is CancelReason.CLIENT_DISCONNECT
    assert ctx.state_changed_at == changed_at


def test_stop_then_kill_upgrades() -> None:
    ctx = Context()
    ctx.stop()
    ctx.kill(CancelReason.DEADLINE)
    assert ctx.is_killed()
    assert ctx.reason is CancelReason.DEADLINE


def test_repeated_calls_are_harmless() -> None:
    ctx = Context()
    calls: list[ContextState] = []
    ctx.add_cancel_callback(lambda c, state, reason: calls.append(state))
    for _ in range(3):
        ctx.stop()
    for _ in range(3):
        ctx.kill()
    assert calls == [ContextState.STOPPED, ContextState.KILLED]


def test_reason_and_time_are_recorded() -> None:
    ctx = Context()
    before = time.monotonic()
    ctx.kill(CancelReason.TRANSPORT_LOST)
    assert ctx.reason is CancelReason.TRANSPORT_LOST
    assert ctx.state_changed_at is not None
    assert before <= ctx.state_changed_at <= time.monotonic()
    assert "transport lost" in repr(ctx)


# ---------------------------------------------------------------------------- waiting


async def test_waiters_return_at_once_when_state_already_holds() -> None:
    ctx = Context()
    ctx.kill()
    with trio.fail_after(1):
        await ctx.stopped()
        await ctx.killed()
        assert await ctx.async_killed_or_stopped() is True


async def test_any_number_of_waiters_wake_on_stop() -> None:
    ctx = Context()
    woke: list[int] = []

    async def wait(i: int) -> None:
        await ctx.stopped()
        woke.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(50):
            nursery.start_soon(wait, i)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []
        ctx.stop()
    assert sorted(woke) == list(range(50))


async def test_killed_waiter_is_not_woken_by_stop() -> None:
    ctx = Context()
    with trio.fail_after(30):  # a hang guard only
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ctx.killed)
            await trio.testing.wait_all_tasks_blocked()
            ctx.stop()
            await trio.testing.wait_all_tasks_blocked()  # all it does about the stop, done
            assert nursery.child_tasks, "a stop woke the killed() waiter"
            ctx.kill()  # and a kill does wake it: the nursery closes


async def test_async_killed_or_stopped_returns_true_on_stop() -> None:
    ctx = Context()
    result: list[bool] = []

    async def wait() -> None:
        result.append(await ctx.async_killed_or_stopped())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        ctx.stop_generating()
    assert result == [True]


# ---------------------------------------------------------------------------- the tree


def _chain(length: int) -> list[Context]:
    contexts = [Context("chain") for _ in range(length)]
    for parent, child in itertools.pairwise(contexts):
        parent.link_child(child)
    return contexts


def _appending(
    into: list[Any], value: Any
) -> Callable[[Context, ContextState, CancelReason], None]:
    """A cancel callback that appends ``value`` to ``into``."""
    return lambda context, state, reason: into.append(value)


def _recording(
    into: list[tuple[str, ContextState, CancelReason]], name: str
) -> Callable[[Context, ContextState, CancelReason], None]:
    """A cancel callback that records ``(name, state, reason)`` in ``into``."""
    return lambda context, state, reason: into.append((name, state, reason))


def test_stop_reaches_every_descendant_in_link_order() -> None:
    root = Context("r")
    a, b, a1, a2 = Context("r"), Context("r"), Context("r"), Context("r")
    root.link_child(a)
    root.link_child(b)
    a.link_child(a1)
    a.link_child(a2)
    order: list[str] = []
    for name, ctx in {"root": root, "a": a, "b": b, "a1": a1, "a2": a2}.items():
        ctx.add_cancel_callback(_appending(order, name))
    root.stop(CancelReason.CLIENT_DISCONNECT)
    # Children first, in link order (depth first), then the parent.
    assert order == ["a1", "a2", "a", "b", "root"]
    assert all(c.reason is CancelReason.CLIENT_DISCONNECT for c in (a, b, a1, a2))
    assert not any(c.is_killed() for c in (root, a, b, a1, a2))


async def test_children_are_signalled_before_parent_waiters_wake() -> None:
    root = Context()
    children = [Context(root.id()) for _ in range(5)]
    signalled: list[int] = []
    for i, child in enumerate(children):
        root.link_child(child)
        child.add_cancel_callback(_appending(signalled, i))
    seen_at_wake: list[list[int]] = []

    async def parent_waiter() -> None:
        await root.killed()
        seen_at_wake.append(list(signalled))
        assert all(child.is_killed() for child in children)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(parent_waiter)
        await trio.testing.wait_all_tasks_blocked()
        root.kill()
    assert seen_at_wake == [[0, 1, 2, 3, 4]]


def test_linking_under_a_stopped_parent_stops_the_child_at_once() -> None:
    parent = Context()
    parent.stop(CancelReason.CLIENT_DISCONNECT)
    child, grandchild = Context(), Context()
    child.link_child(grandchild)
    parent.link_child(child)
    assert child.is_stopped() and not child.is_killed()
    assert grandchild.is_stopped()
    assert child.reason is CancelReason.CLIENT_DISCONNECT


def test_linking_under_a_killed_parent_kills_the_child_at_once() -> None:
    parent = Context()
    parent.kill(CancelReason.DEADLINE)
    child = Context()
    parent.link_child(child)
    assert child.is_killed()
    assert child.reason is CancelReason.DEADLINE


def test_a_killed_child_is_not_downgraded_by_linking() -> None:
    parent, child = Context(), Context()
    child.kill()
    parent.stop()
    parent.link_child(child)
    assert child.is_killed()


def test_cycles_are_refused() -> None:
    a, _, c = _chain(3)
    with pytest.raises(ValueError, match="cycle"):
        c.link_child(a)
    with pytest.raises(ValueError, match="itself"):
        a.link_child(a)
    # Nothing changed.
    assert c.children == ()
    assert a.parent is None


def test_a_context_has_one_parent() -> None:
    first, second, child = Context(), Context(), Context()
    first.link_child(child)
    first.link_child(child)  # linking again to the same parent is a no-op
    assert first.children == (child,)
    with pytest.raises(ValueError, match="already linked"):
        second.link_child(child)


def test_finished_children_are_unlinked() -> None:
    parent = Context()
    for _ in range(1000):
        child = Context(parent.id())
        parent.link_child(child)
        child.finish()
    assert parent.children == ()
    assert child.parent is None and child.finished


def test_unlink_child_keeps_the_childs_state() -> None:
    parent, child = Context(), Context()
    parent.link_child(child)
    parent.unlink_child(child)
    parent.kill()
    assert not child.is_stopped()


async def test_scope_exit_unlinks_a_long_lived_parents_children() -> None:
    parent = Context()
    async with parent.scope():
        for _ in range(200):
            child = Context(parent.id())
            parent.link_child(child)
            async with child.scope():
                await trio.lowlevel.checkpoint()
        assert parent.children == ()


# ---------------------------------------------------------------------------- deep trees


class _CountingDict(dict[Context, None]):
    """Counts how often a context's children are walked."""

    visits = 0

    def __iter__(self):
        _CountingDict.visits += 1
        return super().__iter__()


def _counted_chain(length: int) -> list[Context]:
    contexts = []
    for _ in range(length):
        ctx = Context("deep")
        ctx._children = _CountingDict()
        contexts.append(ctx)
    for parent, child in itertools.pairwise(contexts):
        parent.link_child(child)
    return contexts


@pytest.mark.parametrize("length", [10_000, 40_000])
def test_deep_chain_links_and_kills_in_linear_work(length: int) -> None:
    _CountingDict.visits = 0
    chain = _counted_chain(length)
    link_visits = _CountingDict.visits
    _CountingDict.visits = 0
    chain[0].kill()
    kill_visits = _CountingDict.visits
    assert all(ctx.is_killed() for ctx in chain)
    # Linking a fresh leaf under a deep chain looks at O(1) contexts, and a kill
    # walks each context once: no recursion, no quadratic re-walks.
    assert link_visits <= 2 * length
    assert kill_visits <= 2 * length
    _CountingDict.visits = 0
    chain[0].kill()  # already killed: the walk stops at the root
    assert _CountingDict.visits == 0


def test_deep_chain_built_bottom_up_is_linear() -> None:
    _CountingDict.visits = 0
    length = 10_000
    contexts = []
    for _ in range(length):
        ctx = Context("deep")
        ctx._children = _CountingDict()
        contexts.append(ctx)
    for child, parent in itertools.pairwise(contexts):
        parent.link_child(child)  # a fresh root above an ever deeper chain
    assert _CountingDict.visits <= 2 * length
    contexts[-1].stop()
    assert all(ctx.is_stopped() for ctx in contexts)


def test_wide_tree_of_ten_thousand() -> None:
    root = Context()
    children = [Context(root.id()) for _ in range(10_000)]
    for child in children:
        root.link_child(child)
    order: list[int] = []
    for i, child in enumerate(children):
        child.add_cancel_callback(_appending(order, i))
    root.kill()
    assert order == list(range(10_000))


async def test_deep_running_tree_kill_cancels_every_scope() -> None:
    # Nested *running* scopes are bounded by trio itself (its cancellation
    # recursion gives out near 160 levels, with or without contexts); the
    # context tree is not: see the 10,000-deep tests above.
    chain = _chain(120)
    entered = trio.Event()
    finished: list[int] = []

    async def level(i: int) -> None:
        try:
            async with chain[i].scope() as nursery:
                if i + 1 < len(chain):
                    nursery.start_soon(level, i + 1)
                else:
                    entered.set()
                await trio.sleep_forever()
        finally:
            finished.append(i)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(level, 0)
        await entered.wait()
        chain[0].kill()
    assert sorted(finished) == list(range(120))
    assert all(ctx.is_killed() and ctx.finished for ctx in chain)


# ---------------------------------------------------------------------------- threads


async def test_kill_from_a_foreign_thread() -> None:
    ctx = Context()
    child = Context(ctx.id())
    ctx.link_child(child)
    seen_in_thread: list[bool] = []

    def from_thread() -> None:
        ctx.kill(CancelReason.CLIENT_DISCONNECT)
        seen_in_thread.append(ctx.is_killed() and child.is_killed())

    async def work() -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ctx.run, work)
        await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(2):
            await trio.to_thread.run_sync(from_thread)
            await ctx.killed()
            await child.killed()
    assert seen_in_thread == [True]
    assert ctx.reason is CancelReason.CLIENT_DISCONNECT


async def test_stop_from_a_plain_thread_wakes_trio_waiters() -> None:
    ctx = Context()
    woke = trio.Event()

    async def waiter() -> None:
        await ctx.stopped()
        woke.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        thread = threading.Thread(target=ctx.stop_generating)
        thread.start()
        with trio.fail_after(2):
            await woke.wait()
        thread.join()
    assert ctx.is_stopped() and not ctx.is_killed()


async def test_many_threads_racing_stop_and_kill() -> None:
    contexts = [Context() for _ in range(50)]
    root = Context()
    for ctx in contexts:
        root.link_child(ctx)
    barrier = threading.Barrier(8)

    def hammer(i: int) -> None:
        barrier.wait()
        for ctx in contexts:
            if i % 2:
                ctx.stop()
            else:
                ctx.kill()
            assert ctx.is_stopped()
        root.stop()

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(trio.to_thread.run_sync, hammer, i)
    assert all(ctx.is_killed() for ctx in contexts)
    assert root.is_stopped() and not root.is_killed()


async def test_is_killed_from_a_thread_is_immediate() -> None:
    ctx = Context()

    def check() -> tuple[bool, bool]:
        before = ctx.is_killed()
        ctx.kill()
        return before, ctx.is_killed()

    assert await trio.to_thread.run_sync(check) == (False, True)


# ---------------------------------------------------------------------------- the trio structure


async def test_kill_cancels_the_scope_at_the_next_checkpoint() -> None:
    ctx = Context()
    reached_end = False
    async with trio.open_nursery() as nursery:

        async def work() -> None:
            nonlocal reached_end
            async with ctx.scope():
                await trio.sleep_forever()
            reached_end = True  # the block exits normally: the kill was expected

        nursery.start_soon(work)
        await trio.testing.wait_all_tasks_blocked()
        ctx.kill()
    assert reached_end


async def test_kill_before_the_scope_cancels_at_first_checkpoint() -> None:
    ctx = Context()
    ctx.kill()
    ran_past = False
    async with ctx.scope():
        await trio.lowlevel.checkpoint()
        ran_past = True
    assert not ran_past


async def test_kill_cancels_tasks_started_in_the_context_nursery() -> None:
    ctx = Context()
    cancelled: list[str] = []

    async def side_task(name: str) -> None:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.append(name)

    async with trio.open_nursery() as nursery:

        async def work() -> None:
            async with ctx.scope() as scope_nursery:
                scope_nursery.start_soon(side_task, "a")
                ctx.start_soon(side_task, "b")
                await trio.sleep_forever()

        nursery.start_soon(work)
        await trio.testing.wait_all_tasks_blocked()
        ctx.kill()
    assert sorted(cancelled) == ["a", "b"]


async def test_stop_does_not_cancel_the_scope() -> None:
    ctx = Context()
    produced: list[int | str] = []
    async with ctx.scope():
        for i in range(5):
            if ctx.is_stopped():
                produced.append("drained")
                break
            produced.append(i)
            if i == 2:
                ctx.stop()
            await trio.lowlevel.checkpoint()
    assert produced == [0, 1, 2, "drained"]
    assert ctx.is_stopped() and not ctx.is_killed()


async def test_body_exception_surfaces_unwrapped() -> None:
    with pytest.raises(ValueError, match="boom"):
        async with Context().scope():
            raise ValueError("boom")


async def test_outer_cancellation_passes_through() -> None:
    with trio.move_on_after(0.01) as outer:
        async with Context().scope():
            await trio.sleep_forever()
    assert outer.cancelled_caught


async def test_scope_can_be_entered_once() -> None:
    ctx = Context()
    async with ctx.scope():
        pass
    with pytest.raises(RuntimeError, match="already entered"):
        async with ctx.scope():
            pass


def test_start_soon_needs_an_open_scope() -> None:
    async def nothing() -> None:
        pass

    with pytest.raises(RuntimeError, match="no open scope"):
        Context().start_soon(nothing)


async def test_run_returns_the_result_or_none_when_killed() -> None:
    async def answer() -> int:
        return 42

    assert await Context().run(answer) == 42
    killed = Context()
    killed.kill()

    async def slow() -> int:
        await trio.sleep(10)
        return 1

    assert await killed.run(slow) is None


async def test_start_child_runs_in_the_parent_tree() -> None:
    parent = Context("p")
    child = Context("p")
    child_cancelled = trio.Event()

    async def child_work() -> None:
        try:
            await trio.sleep_forever()
        finally:
            child_cancelled.set()

    async with trio.open_nursery() as nursery:

        async def parent_work() -> None:
            async with parent.scope():
                parent.start_child(child, child_work)
                await trio.sleep_forever()

        nursery.start_soon(parent_work)
        await trio.testing.wait_all_tasks_blocked()
        assert child.parent is parent
        parent.kill()
    assert child_cancelled.is_set()
    assert child.is_killed() and child.finished
    assert parent.children == ()


# ---------------------------------------------------------------------------- drain grace


async def test_drain_grace_escalates_to_kill(autojump_clock: trio.testing.MockClock) -> None:
    ctx = Context()
    ctx.stop()
    start = trio.current_time()
    async with ctx.scope(drain_grace=2.0):
        await trio.sleep(100)  # ignores the stop
    assert trio.current_time() - start == pytest.approx(2.0)
    assert ctx.is_killed()
    assert ctx.reason is CancelReason.DRAIN_TIMEOUT


async def test_work_that_drains_in_time_stays_stopped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ctx = Context()
    async with ctx.scope(drain_grace=2.0):
        ctx.stop()
        await trio.sleep(1.5)
    await trio.sleep(5)
    assert ctx.is_stopped() and not ctx.is_killed()
    assert ctx.reason is CancelReason.STOP_REQUESTED


async def test_without_grace_a_stop_never_escalates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ctx = Context()
    async with ctx.scope():
        ctx.stop()
        await trio.sleep(1000)
    assert not ctx.is_killed()


# ---------------------------------------------------------------------------- deadlines


async def test_deadline_kills_running_work() -> None:
    # Deadlines are time.monotonic() seconds (they travel between processes): real time.
    ctx = Context(timeout=0.05)
    start = trio.current_time()
    slept = False
    async with ctx.scope():
        await trio.sleep(60)
        slept = True
    assert not slept, "the deadline did not cut the work"
    assert trio.current_time() - start >= 0.04  # not before it (a busy machine only delays)
    assert ctx.is_killed()
    assert ctx.reason is CancelReason.DEADLINE


async def test_deadline_wakes_waiters_without_running_work() -> None:
    ctx = Context(timeout=0.05)
    with trio.fail_after(5):
        await ctx.killed()
    assert ctx.reason is CancelReason.DEADLINE


def test_deadline_is_seen_by_polling_alone() -> None:
    ctx = Context(timeout=0.01)
    time.sleep(0.02)
    assert ctx.is_killed()
    assert ctx.reason is CancelReason.DEADLINE


def test_deadline_only_moves_earlier_and_is_inherited() -> None:
    parent = Context(timeout=100)
    deadline = parent.deadline
    assert deadline is not None
    parent.set_deadline(deadline + 50)
    assert parent.deadline == deadline
    child = Context(timeout=1000)
    parent.link_child(child)
    assert child.deadline == deadline
    parent.set_deadline(deadline - 10)
    assert child.deadline == deadline - 10
    remaining = child.time_remaining()
    assert remaining is not None and 0 < remaining < 100


async def test_tightening_a_deadline_reaches_running_work() -> None:
    ctx = Context(timeout=100)

    async def work() -> None:
        async with ctx.scope():
            await trio.sleep(50)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(work)
            await trio.testing.wait_all_tasks_blocked()
            ctx.set_deadline(time.monotonic() + 0.02)
    assert ctx.reason is CancelReason.DEADLINE


# ---------------------------------------------------------------------------- introspection


def test_snapshot_describes_the_tree() -> None:
    root = Context("r")
    child = Context("r")
    child.attributes["instance"] = "abc"
    root.link_child(child)
    child.kill(CancelReason.TRANSPORT_LOST)
    snapshot = root.snapshot()
    assert snapshot["id"] == "r"
    assert snapshot["state"] == "live"
    [child_snapshot] = snapshot["children"]
    assert child_snapshot["state"] == "killed"
    assert child_snapshot["reason"] == "transport lost"
    assert child_snapshot["attributes"] == {"instance": "abc"}
    assert child_snapshot["age_s"] >= 0


def test_callback_errors_are_contained(caplog: pytest.LogCaptureFixture) -> None:
    ctx = Context()
    seen: list[str] = []

    def bad(c: Context, s: ContextState, r: CancelReason) -> None:
        raise RuntimeError("callback bug")

    ctx.add_cancel_callback(bad)
    ctx.add_cancel_callback(lambda c, s, r: seen.append("after"))
    ctx.kill()
    assert seen == ["after"]
    assert "callback bug" in caplog.text
    ctx.remove_cancel_callback(bad)
    ctx.remove_cancel_callback(bad)  # absent: no error


# ---------------------------------------------------------------------------- one tree, both ways


async def _run_until_blocked(nursery: trio.Nursery, fn: object, *args: object) -> None:
    nursery.start_soon(fn, *args)  # type: ignore[arg-type]
    await trio.testing.wait_all_tasks_blocked()


async def test_enclosing_timeout_kills_the_context_and_its_children() -> None:
    parent, child, grandchild = Context("p"), Context("p"), Context("p")
    parent.link_child(child)
    child.link_child(grandchild)
    seen: list[tuple[str, ContextState, CancelReason]] = []
    for name, ctx in (("parent", parent), ("child", child), ("grandchild", grandchild)):
        ctx.add_cancel_callback(_recording(seen, name))
    with trio.move_on_after(0.05) as outer:
        async with parent.scope():
            await trio.sleep_forever()
    assert outer.cancelled_caught
    assert parent.is_killed() and parent.reason is CancelReason.SCOPE_TIMEOUT
    assert child.is_killed() and child.reason is CancelReason.SCOPE_TIMEOUT
    assert grandchild.is_killed() and grandchild.reason is CancelReason.SCOPE_TIMEOUT
    # Callbacks fired once each, children first: the order of a kill().
    assert seen == [
        ("grandchild", ContextState.KILLED, CancelReason.SCOPE_TIMEOUT),
        ("child", ContextState.KILLED, CancelReason.SCOPE_TIMEOUT),
        ("parent", ContextState.KILLED, CancelReason.SCOPE_TIMEOUT),
    ]


async def test_enclosing_fail_after_kills_with_scope_timeout() -> None:
    ctx = Context()
    with pytest.raises(trio.TooSlowError), trio.fail_after(0.01):
        async with ctx.scope():
            await trio.sleep_forever()
    assert ctx.is_killed() and ctx.reason is CancelReason.SCOPE_TIMEOUT


async def test_enclosing_cancel_scope_kills_with_scope_cancelled() -> None:
    ctx, child = Context(), Context()
    ctx.link_child(child)
    with trio.CancelScope() as outer:
        async with trio.open_nursery() as nursery:
            await _run_until_blocked(nursery, _sleep_in_scope, ctx)
            outer.cancel()
    assert ctx.reason is CancelReason.SCOPE_CANCELLED and ctx.is_killed()
    assert child.reason is CancelReason.SCOPE_CANCELLED and child.is_killed()


async def _sleep_in_scope(ctx: Context) -> None:
    async with ctx.scope():
        await trio.sleep_forever()


async def test_a_failed_sibling_kills_the_context_through_the_nursery() -> None:
    ctx, child = Context(), Context()
    ctx.link_child(child)

    async def fail_soon() -> None:
        await trio.testing.wait_all_tasks_blocked()
        raise ValueError("sibling failed")

    with pytest.RaisesGroup(ValueError):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_sleep_in_scope, ctx)
            nursery.start_soon(fail_soon)
    assert ctx.is_killed() and ctx.reason is CancelReason.SCOPE_CANCELLED
    assert child.is_killed() and child.reason is CancelReason.SCOPE_CANCELLED


async def test_the_kill_happens_while_the_work_is_still_unwinding() -> None:
    # The watcher kills the context the moment the enclosing scope is cancelled,
    # not only when the scope finally exits: work that takes time to unwind (a
    # shielded cleanup) does not delay its linked children's kill.
    ctx, child = Context(), Context()
    ctx.link_child(child)
    killed_during_cleanup: list[bool] = []

    async def work() -> None:
        async with ctx.scope():
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await trio.sleep(0.05)
                    killed_during_cleanup.append(child.is_killed())

    with trio.move_on_after(0.02):
        await work()
    assert killed_during_cleanup == [True]
    assert ctx.reason is CancelReason.SCOPE_TIMEOUT


async def test_own_kill_keeps_its_reason_and_is_not_a_scope_cancellation() -> None:
    ctx = Context()
    async with trio.open_nursery() as nursery:
        await _run_until_blocked(nursery, _sleep_in_scope, ctx)
        ctx.kill(CancelReason.CLIENT_DISCONNECT)
    assert ctx.reason is CancelReason.CLIENT_DISCONNECT


async def test_a_parents_kill_reaches_a_nested_unlinked_scope_as_scope_cancelled() -> None:
    outer, inner = Context("outer"), Context("inner")

    async def nested() -> None:
        async with outer.scope(), inner.scope():
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await _run_until_blocked(nursery, nested)
        outer.kill(CancelReason.CLIENT_DISCONNECT)
    assert outer.reason is CancelReason.CLIENT_DISCONNECT
    assert inner.is_killed() and inner.reason is CancelReason.SCOPE_CANCELLED


async def test_leaving_a_scope_kills_unfinished_children_in_link_order() -> None:
    parent = Context("p")
    children = [Context(f"c{i}") for i in range(3)]
    done = Context("done")
    order: list[str] = []
    async with parent.scope():
        for child in [*children, done]:
            parent.link_child(child)
            child.add_cancel_callback(lambda c, state, reason: order.append(c.id()))
        done.finish()  # finished work is unlinked: it is not killed
    assert order == ["c0", "c1", "c2"]
    assert all(c.is_killed() and c.reason is CancelReason.PARENT_FINISHED for c in children)
    assert not done.is_stopped()
    assert not parent.is_stopped() and parent.finished  # a normal exit is not a cancellation


async def test_leaving_a_scope_by_an_error_kills_unfinished_children() -> None:
    parent, child = Context(), Context()

    async def fail() -> None:
        async with parent.scope():
            parent.link_child(child)
            raise KeyError("boom")

    with pytest.raises(KeyError):
        await fail()
    assert child.is_killed() and child.reason is CancelReason.PARENT_FINISHED


async def test_a_local_child_running_in_another_nursery_is_in_its_parents_scope() -> None:
    # The child's work lives in a different task tree (say, a server's
    # long-lived nursery); the link alone puts it in the parent's scope.
    parent, child = Context("p"), Context("p")
    parent.link_child(child)
    child_exit: list[CancelReason | None] = []

    async def child_work() -> None:
        async with child.scope():
            await trio.sleep_forever()
        child_exit.append(child.reason)

    async with trio.open_nursery() as elsewhere:
        elsewhere.start_soon(child_work)
        with trio.move_on_after(0.02):
            async with parent.scope():
                await trio.sleep_forever()
    assert child_exit == [CancelReason.SCOPE_TIMEOUT]


async def test_a_stopped_child_is_killed_when_its_parents_scope_ends() -> None:
    parent, child = Context(), Context()
    async with parent.scope():
        parent.link_child(child)
        child.stop()
    assert child.is_killed() and child.reason is CancelReason.PARENT_FINISHED


def test_linking_under_a_finished_context_kills_the_child_at_once() -> None:
    parent, child = Context(), Context()
    parent.finish()
    parent.link_child(child)
    assert child.is_killed() and child.reason is CancelReason.PARENT_FINISHED
    assert child.parent is None and parent.children == ()


async def test_is_killed_after_leaving_a_scope_cancelled_before_it_was_entered() -> None:
    # Cancelled before any of its work (or its watcher) could start.
    ctx = Context()
    with trio.CancelScope() as outer:
        outer.cancel()
        async with ctx.scope():
            await trio.lowlevel.checkpoint()
    assert ctx.is_killed() and ctx.reason is CancelReason.SCOPE_CANCELLED


# ---------------------------------------------------------------- the watcher starts when needed


class _Spawns(trio.abc.Instrument):
    """Counts the tasks spawned while it is installed."""

    def __init__(self) -> None:
        self.count = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.count += 1


async def _spawns_in(ctx: Context, *, waits: bool = False) -> int:
    spawns = _Spawns()
    trio.lowlevel.add_instrument(spawns)
    try:
        async with ctx.scope():
            if waits:  # the work's own task waits for a stop (as an engine between tokens)
                with trio.move_on_after(0.001):
                    await ctx.stopped()
            await trio.lowlevel.checkpoint()
    finally:
        trio.lowlevel.remove_instrument(spawns)
    return spawns.count


async def test_a_scope_with_nothing_to_watch_starts_no_task() -> None:
    # No child, waiter, cancel callback, deadline or stop: nothing runs beside the
    # work, and leaving the scope costs no trip through the scheduler for a watcher.
    assert await _spawns_in(Context()) == 0
    assert await _spawns_in(Context(), waits=True) == 0
    linked = Context()
    linked.link_child(Context())
    assert await _spawns_in(linked) == 1
    assert await _spawns_in(Context(timeout=60)) == 1


class _Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.count += 1


async def test_a_given_nursery_hosts_the_watcher_and_saves_a_trip_through_the_scheduler(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def nothing() -> str:
        return "done"

    async def steps_in(watchers: trio.Nursery | None, *, run: bool = False) -> int:
        steps = _Steps()
        trio.lowlevel.add_instrument(steps)
        try:
            if run:
                assert await Context().run(nothing, watchers=watchers) == "done"
            else:
                async with Context().scope(watchers=watchers):
                    pass
        finally:
            trio.lowlevel.remove_instrument(steps)
        return steps.count

    async with trio.open_nursery() as host:
        # Leaving a nursery is a schedule point: one nursery fewer, one step fewer.
        assert await steps_in(None) == 2
        assert await steps_in(host) == 1
        assert await steps_in(None, run=True) == 2
        assert await steps_in(host, run=True) == 1
        ctx = Context(timeout=0.05)
        async with ctx.scope(watchers=host):
            assert len(host.child_tasks) == 1  # the watcher, for the deadline
            await trio.sleep_forever()
        assert ctx.reason is CancelReason.DEADLINE
        await trio.testing.wait_all_tasks_blocked()
        assert not host.child_tasks  # ended with its scope

        ctx = Context()

        async def drain_slowly() -> None:
            async with ctx.scope(drain_grace=1.0, watchers=host):
                await trio.sleep(100)

        host.start_soon(drain_slowly)
        await trio.testing.wait_all_tasks_blocked()
        assert len(host.child_tasks) == 1  # the work; nothing to watch yet
        ctx.stop_generating()  # starts the watcher in the host, which enforces the grace
        await trio.testing.wait_all_tasks_blocked()
        assert len(host.child_tasks) == 2
        await trio.sleep(2)
        assert ctx.reason is CancelReason.DRAIN_TIMEOUT


async def test_a_watcher_in_a_given_nursery_hears_an_enclosing_cancellation_at_once() -> None:
    ctx = Context()
    heard: list[str] = []
    during_cleanup: list[bool] = []
    work_runs = trio.Event()

    async def work(host: trio.Nursery) -> None:
        async with ctx.scope(watchers=host):
            work_runs.set()
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await trio.sleep(0.05)
                    during_cleanup.append(bool(heard))

    async def waiter() -> None:
        await ctx.killed()
        heard.append("woke")

    async with trio.open_nursery() as outside:
        with trio.CancelScope() as around_the_work:
            async with trio.open_nursery() as host:
                host.start_soon(work, host)
                await work_runs.wait()
                outside.start_soon(waiter)
                await trio.testing.wait_all_tasks_blocked()
                around_the_work.cancel()
        outside.cancel_scope.cancel()
    assert during_cleanup == [True]
    assert ctx.reason is CancelReason.SCOPE_CANCELLED


async def test_an_enclosing_cancellation_the_work_swallows_still_kills_the_context() -> None:
    ctx = Context()
    with trio.CancelScope() as outer:
        async with ctx.scope():
            outer.cancel()
            with contextlib.suppress(trio.Cancelled):
                await trio.sleep_forever()
    assert ctx.is_killed() and ctx.reason is CancelReason.SCOPE_CANCELLED


@pytest.mark.parametrize("how", ["link a child", "wait from outside", "add a callback"])
async def test_what_comes_during_the_work_starts_the_watcher(how: str) -> None:
    # Linked (or waiting) only once the work runs: an enclosing cancellation still
    # reaches it while the work is unwinding, as in the test above with the child
    # linked before the scope.
    ctx, child = Context(), Context()
    heard: list[str] = []
    during_cleanup: list[bool] = []
    work_runs = trio.Event()

    async def work() -> None:
        async with ctx.scope():
            work_runs.set()
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await trio.sleep(0.05)
                    during_cleanup.append(bool(heard))

    async def waiter() -> None:
        await ctx.killed()
        heard.append("woke")

    async with trio.open_nursery() as outside:
        with trio.CancelScope() as around_the_work:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(work)
                await work_runs.wait()
                if how == "link a child":
                    ctx.link_child(child)
                    child.add_cancel_callback(lambda *_: heard.append("child"))
                elif how == "wait from outside":
                    outside.start_soon(waiter)
                    await trio.testing.wait_all_tasks_blocked()
                else:
                    ctx.add_cancel_callback(lambda *_: heard.append("callback"))
                around_the_work.cancel()
        outside.cancel_scope.cancel()
    assert during_cleanup == [True]


async def test_a_stop_during_the_work_starts_the_drain_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ctx = Context()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_drain_slowly, ctx)
        await trio.testing.wait_all_tasks_blocked()
        ctx.stop_generating()
    assert ctx.reason is CancelReason.DRAIN_TIMEOUT


async def _drain_slowly(ctx: Context) -> None:
    async with ctx.scope(drain_grace=1.0):
        await trio.sleep(100)


async def test_a_deadline_set_during_the_work_kills_it_in_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ctx = Context()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_sleep_in_scope, ctx)
        await trio.testing.wait_all_tasks_blocked()
        ctx.set_deadline(time.monotonic() + 0.5)
    assert ctx.reason is CancelReason.DEADLINE
