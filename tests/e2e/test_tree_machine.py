"""A hypothesis state machine over random context trees with calls to a real worker process.

Each example builds a random tree of contexts in this process (roots; children
linked with ``link_child`` whose work runs in another nursery; children started
with ``start_child`` inside their parent's nursery; calls to a worker *process*
linked under any of them) and cancels parts of it from random sources: ``kill``,
``stop``, a context deadline, an enclosing ``move_on_after`` firing, a normal
scope exit, and a separate caller process SIGKILLed mid-call.

After every step, once the effects have settled, it checks:

* **nothing linked outlives its ancestor's scope**: every context under an
  ancestor that was killed, timed out or left its scope has left its own
  scope, and every remote handler under it has ended on the worker;
* **promptly, for the right reason**: each remote handler ended well within
  the heartbeat timeout of its cause (one monotonic clock for every process on this host; for a
  SIGKILLed caller, from the moment its process is gone), stopped
  for a stop and killed otherwise, with the cause's reason (``kill requested``,
  ``deadline``, ``scope timeout``, ``parent finished``, ``transport lost``);
* **never spuriously**: no context or remote handler without such a cause ended;
* **counted exactly once**: the worker's ``dynamo_component_cancellation_total``
  equals the number of remote handlers that ended (all of them end by
  cancellation here);

and at the end of each example, that nothing leaked: no stream open on either
side, no request in flight on the worker, the file descriptors of both
processes and the number of live contexts back where they started.

hypothesis's stateful API is synchronous, so the trio side (this process's
runtime and the tree) lives in a trio run on a helper thread, driven through
``trio.from_thread``: test infrastructure, not a pattern for the product.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import httpx
import pytest
import trio
from hypothesis import HealthCheck, Phase, settings, strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dynamo_trio import Config, Context
from dynamo_trio.runtime import DistributedRuntime
from tests._fuzz import examples
from tests._memhttp import TLS
from tests._metrics import parse, total

from .conftest import e2e_environment

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from dynamo_trio.runtime import Client, ResponseStream

pytestmark = [pytest.mark.slow, pytest.mark.fuzz]

WORKER: Final = Path(__file__).with_name("_tree_worker.py")
# A cause reaches the remote handler through its own ctl frame, or not at all: well
# within half the heartbeat timeout (the other way a worker could learn), a bound a
# busy machine does not break.
BOUND: Final = 0.5
DEADLINE_IN: Final = 0.02
SETTLE: Final = 3.0


def _fds(pid: int | None = None) -> int:
    return len(os.listdir(f"/proc/{pid or os.getpid()}/fd"))


# ---------------------------------------------------------------------------- the worker


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    status_url: str
    events_path: Path
    env: dict[str, str]
    http: httpx.Client

    def events(self) -> list[dict[str, Any]]:
        with open(self.events_path) as file:
            return [json.loads(line) for line in file if line.strip()]

    def metric(self, name: str) -> float:
        return total(parse(self.http.get(f"{self.status_url}/metrics").text), name)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    env = e2e_environment(tmp_path, DYN_DRAIN_GRACE_SECS="5")
    events = tmp_path / "events.jsonl"
    events.touch()
    process = subprocess.Popen(
        [sys.executable, str(WORKER), "worker", str(events)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline())
        # Connection: close: a pooled keep-alive connection would open and close between
        # examples and upset their file-descriptor accounting.
        with httpx.Client(verify=TLS, headers={"Connection": "close"}) as http:
            yield WorkerProcess(process, ready["status_url"], events, env, http)
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


# ---------------------------------------------------------------------------- the tree


@dataclass(eq=False)
class Node:
    """A context whose scope runs in this process."""

    name: str
    kind: str  # "root" | "linked" (work in another nursery) | "started" (start_child)
    ctx: Context
    parent: Node | None
    created_at: float
    exit_requested: trio.Event | None = None
    running: trio.Event | None = None
    done: trio.Event | None = None
    started_children: list[Node] = field(default_factory=list)
    enclosing: trio.CancelScope | None = None
    entered: bool = False
    ended_at: float | None = None
    signals: list[tuple[float, str, str]] = field(default_factory=list)  # (t, kind, reason)

    def ancestors(self) -> Iterator[Node]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def lineage(self) -> Iterator[Node]:
        yield self
        yield from self.ancestors()


@dataclass(eq=False)
class Leaf:
    """A call to the worker, linked under a node; the stream stays referenced."""

    tag: str
    parent: Node | None
    stream: ResponseStream | None = None
    sent_at: float = 0.0
    killed_at: float | None = None  # for calls made by a caller process we SIGKILL


_SERIAL: Final = itertools.count(1)
_KILLING: Final = {"kill": "kill requested", "deadline": "deadline", "enclosing": "scope timeout"}


class TrioSide:
    """The caller's trio run, on a thread: a runtime, a client, and a nursery for the tree."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._done: trio.Event | None = None
        self.runtime: DistributedRuntime | None = None
        self.client: Client | None = None
        self.nursery: trio.Nursery | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("the trio side did not start")
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        try:
            trio.run(self._run)
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _run(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._done = trio.Event()
        async with DistributedRuntime(self._config) as runtime, trio.open_nursery() as nursery:
            self.runtime, self.nursery = runtime, nursery
            endpoint = runtime.namespace("dynamo").component("tree").endpoint("work")
            self.client = await endpoint.client()
            with trio.fail_after(10):
                await self.client.wait_for_instances()
            self._ready.set()
            await self._done.wait()
            nursery.cancel_scope.cancel()

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def call_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def close(self) -> None:
        assert self._done is not None
        self.call_sync(self._done.set)
        self._thread.join(15)
        assert not self._thread.is_alive()
        if self._error is not None:
            raise self._error


async def _run_node(node: Node, task_status: trio.TaskStatus[None]) -> None:
    node.exit_requested = trio.Event()
    try:
        with trio.CancelScope() as node.enclosing:
            async with node.ctx.scope():
                node.entered = True
                task_status.started()
                await node.exit_requested.wait()
    finally:
        node.ended_at = time.monotonic()
        if not node.entered:
            task_status.started()


async def _started_body(node: Node, started_children: list[Node]) -> None:
    try:
        node.entered = True
        assert node.running is not None
        node.running.set()
        assert node.exit_requested is not None
        await node.exit_requested.wait()
        # The scope's nursery waits for the children started in it before the scope
        # exits; wait here, so that ended_at is when the scope really ends.
        for child in started_children:
            assert child.done is not None
            await child.done.wait()
    finally:
        node.ended_at = time.monotonic()
        assert node.done is not None
        node.done.set()


# ---------------------------------------------------------------------------- the machine


class TreeMachine(RuleBasedStateMachine):
    worker_process: WorkerProcess  # set by the test before the machine runs

    def __init__(self) -> None:
        super().__init__()
        wp = self.worker_process
        self.wp = wp
        gc.collect()
        self.contexts_before = sum(1 for obj in gc.get_objects() if isinstance(obj, Context))
        self.fds_before = _fds()
        self.worker_fds_before = _fds(wp.process.pid)
        self.events_before = len(wp.events())
        self.count_before = wp.metric("dynamo_component_cancellation_total")
        # The caller needs no status server of its own.
        self.trio = TrioSide(Config.from_env({**wp.env, "DYN_SYSTEM_PORT": "-1"}))
        self.all_nodes: list[Node] = []
        self.leaves: list[Leaf] = []
        self.sigkilled = False

    # ------------------------------------------------------------------ building

    def _name(self, prefix: str) -> str:
        # Unique across examples too: the worker's event log outlives each machine.
        return f"{prefix}-{next(_SERIAL)}"

    @staticmethod
    def _pick(data: st.DataObject, nodes: list[Node]) -> Node:
        # Draw an index, not the node: hypothesis keeps what it drew, and a node kept
        # alive by hypothesis would defeat the leak check on contexts.
        return nodes[data.draw(st.integers(0, len(nodes) - 1))]

    def _live(self, node: Node) -> bool:
        return node.entered and node.ended_at is None

    @rule()
    def root(self) -> None:
        name = self._name("root")
        node = Node(name, "root", Context(name), None, time.monotonic())
        self.all_nodes.append(node)
        nursery = self.trio.nursery
        assert nursery is not None
        self.trio.call(nursery.start, _run_node, node)

    @precondition(lambda self: any(self._live(n) for n in self.all_nodes))
    @rule(data=st.data(), kind=st.sampled_from(["linked", "started"]))
    def child(self, data: st.DataObject, kind: str) -> None:
        parent = self._pick(data, [n for n in self.all_nodes if self._live(n)])
        name = self._name(kind)
        node = Node(name, kind, Context(name), parent, time.monotonic())
        self.all_nodes.append(node)

        async def start() -> None:
            if kind == "linked":
                parent.ctx.link_child(node.ctx)
                assert self.trio.nursery is not None
                await self.trio.nursery.start(_run_node, node)  # work in another nursery
            else:
                node.exit_requested, node.running, node.done = (
                    trio.Event(),
                    trio.Event(),
                    trio.Event(),
                )
                parent.started_children.append(node)
                parent.ctx.start_child(node.ctx, _started_body, node, node.started_children)
                await node.running.wait()

        self.trio.call(start)

    @precondition(lambda self: any(self._live(n) for n in self.all_nodes))
    @rule(data=st.data())
    def call(self, data: st.DataObject) -> None:
        parent = self._pick(data, [n for n in self.all_nodes if self._live(n)])
        leaf = Leaf(self._name("call"), parent)

        async def send() -> None:
            assert self.trio.client is not None
            leaf.stream = await self.trio.client.generate({"tag": leaf.tag}, context=parent.ctx)
            leaf.sent_at = time.monotonic()

        self.trio.call(send)
        assert leaf.stream is not None
        if leaf.stream.instance_id is not None:
            self.leaves.append(leaf)
            self._wait_for(lambda: self._event("start", leaf.tag) is not None, "the call to start")

    # ------------------------------------------------------------------ cancelling

    @precondition(lambda self: any(self._live(n) for n in self.all_nodes))
    @rule(data=st.data(), how=st.sampled_from(["kill", "stop", "deadline", "enclosing", "exit"]))
    def cancel(self, data: st.DataObject, how: str) -> None:
        candidates = [n for n in self.all_nodes if self._live(n)]
        if how == "enclosing":  # a scope around the context's scope: roots and linked work
            candidates = [n for n in candidates if n.kind != "started"]
            if not candidates:
                return
        node = self._pick(data, candidates)

        def apply() -> None:
            now = time.monotonic()
            if how == "kill":
                node.signals.append((now, "kill", "kill requested"))
                node.ctx.kill()
            elif how == "stop":
                node.signals.append((now, "stop", "stop requested"))
                node.ctx.stop()
            elif how == "deadline":
                node.signals.append((now + DEADLINE_IN, "deadline", "deadline"))
                node.ctx.set_deadline(now + DEADLINE_IN)
            elif how == "enclosing":
                assert node.enclosing is not None
                node.signals.append((now, "enclosing", "scope timeout"))
                node.enclosing.deadline = trio.current_time()  # a move_on_after firing now
            else:
                assert node.exit_requested is not None
                node.exit_requested.set()

        self.trio.call_sync(apply)
        self._settle()

    @precondition(lambda self: not self.sigkilled)  # a process start costs ~0.4 s: one each
    @rule()
    def sigkill_a_caller_process(self) -> None:
        self.sigkilled = True
        leaf = Leaf(self._name("sigkill"), None)
        process = subprocess.Popen(
            [sys.executable, str(WORKER), "caller", leaf.tag],
            env=self.wp.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert process.stdout is not None
        try:
            assert json.loads(process.stdout.readline())["event"] == "sent"
            self._wait_for(lambda: self._event("start", leaf.tag) is not None, "the call to start")
            process.send_signal(signal.SIGKILL)
            process.wait()
            # The cause is the caller's socket closing, which happens as its process is
            # torn down: how long the kernel takes to do that (tens of ms on a loaded
            # machine) is not the runtime's to answer for.
            leaf.killed_at = time.monotonic()
        finally:
            process.kill()
            process.wait()
            process.stdout.close()
        self.leaves.append(leaf)
        self._settle()

    # ------------------------------------------------------------------ expectations

    def _event(self, kind: str, tag: str) -> dict[str, Any] | None:
        for event in self.wp.events()[self.events_before :]:
            if event["event"] == kind and event.get("tag") == tag:
                return event
        return None

    def _wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + SETTLE
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.005)

    def _killers(self, node: Node) -> list[tuple[float, str]]:
        """What must end ``node``'s scope: (when, the reason it records)."""
        found = [(t, reason) for t, kind, reason in node.signals if kind in _KILLING]
        for ancestor in node.ancestors():
            found += [(t, reason) for t, kind, reason in ancestor.signals if kind in _KILLING]
            if ancestor.ended_at is not None:
                found.append((ancestor.ended_at, "parent finished"))
        return [(max(t, node.created_at), reason) for t, reason in found]

    def _enders(self, leaf: Leaf) -> list[tuple[float, str]]:
        """What must end a call's remote handler: (when, the reason it records)."""
        if leaf.parent is None:
            assert leaf.killed_at is not None
            return [(leaf.killed_at, "transport lost")]
        found = []
        for node in leaf.parent.lineage():
            found += [(t, reason) for t, kind, reason in node.signals]
            if node.ended_at is not None:
                found.append((node.ended_at, "parent finished"))
        return sorted(found)

    def _expectations_met(self) -> bool:
        now = time.monotonic()
        for node in self.all_nodes:
            # A scope told to exit ends once the children started in it have: its end is
            # the cause of its linked work's end, so wait to have its time. (A scope's
            # exit reaches its remote calls before this thread notes its ended_at.)
            if (
                node.exit_requested is not None
                and node.exit_requested.is_set()
                and node.ended_at is None
                and all(child.ended_at is not None for child in node.started_children)
            ):
                return False
            if any(t <= now for t, _ in self._killers(node)) and node.ended_at is None:
                return False
        for leaf in self.leaves:
            enders = self._enders(leaf)
            if enders and enders[0][0] <= now and self._event("exit", leaf.tag) is None:
                return False
        return True

    def _settle(self) -> None:
        pending = [t for n in self.all_nodes for t, _, _ in n.signals if t > time.monotonic()]
        if pending:
            time.sleep(max(pending) - time.monotonic() + 0.005)
        self._wait_for(self._expectations_met, "the cancellations to take effect")

    # ------------------------------------------------------------------ invariants

    @invariant()
    def nothing_linked_outlives_its_ancestors_scope(self) -> None:
        for node in self.all_nodes:
            killers = self._killers(node)
            if not killers:
                assert not node.ctx.is_killed(), f"{node.name} killed without a cause"
                continue
            first = min(killers)
            if node.ended_at is not None and node.ended_at < first[0] - 0.001:
                continue  # it had ended on its own before
            assert node.ended_at is not None, f"{node.name} outlived {first}"
            assert node.ctx.is_killed(), node.name

    @invariant()
    def remote_work_ends_promptly_for_the_right_reason(self) -> None:
        for leaf in self.leaves:
            enders = self._enders(leaf)
            exit_event = self._event("exit", leaf.tag)
            if not enders:
                assert exit_event is None, f"{leaf.tag} ended without a cause: {exit_event}"
                continue
            assert exit_event is not None, f"{leaf.tag} still running after {enders[0]}"
            when, reason = enders[0]
            state = "STOPPED" if reason == "stop requested" else "KILLED"
            assert (exit_event["state"], exit_event["reason"]) == (state, reason), leaf.tag
            assert exit_event["t"] - when < BOUND, (leaf.tag, exit_event["t"] - when)

    @invariant()
    def each_cancellation_is_counted_once(self) -> None:
        # Both are read afresh each time: the worker counts a cancellation when its
        # signal arrives, a moment before the handler unwinds and logs its exit.
        counted: list[float] = []
        ended: list[int] = []

        def settled() -> bool:
            total = self.wp.metric("dynamo_component_cancellation_total")
            counted.append(total - self.count_before)
            events = self.wp.events()[self.events_before :]
            ended.append(sum(1 for event in events if event["event"] == "exit"))
            return counted[-1] == ended[-1]

        try:
            self._wait_for(settled, "the worker to count every cancellation once")
        except AssertionError:
            raise AssertionError(f"{ended[-3:]} ended; the worker counted {counted[-3:]}") from None

    # ------------------------------------------------------------------ leaks

    def _kill_roots(self) -> None:
        for node in self.all_nodes:
            if node.parent is None and self._live(node):
                node.signals.append((time.monotonic(), "kill", "kill requested"))
                self.trio.call_sync(node.ctx.kill)

    def teardown(self) -> None:
        try:
            self._kill_roots()
            self._settle()
            self.remote_work_ends_promptly_for_the_right_reason()
            self.each_cancellation_is_counted_once()
            self._wait_for(
                lambda: self.wp.metric("dynamo_component_inflight_requests") == 0,
                "the worker to have nothing in flight",
            )
            assert self.wp.http.get(f"{self.wp.status_url}/debug/requests").json() == []

            def open_streams() -> int:
                runtime = self.trio.runtime
                assert runtime is not None
                return sum(c.open_streams for c in runtime._pool().connections())

            assert self.trio.call_sync(open_streams) == 0
        finally:
            self.trio.close()
        self.all_nodes.clear()
        self.leaves.clear()
        gc.collect()
        contexts = sum(1 for obj in gc.get_objects() if isinstance(obj, Context))
        assert contexts <= self.contexts_before, (contexts, self.contexts_before)
        assert _fds() == self.fds_before
        self._wait_for(
            lambda: _fds(self.wp.process.pid) == self.worker_fds_before,
            "the worker's sockets to close",
        )


def test_context_trees_with_remote_calls(worker: WorkerProcess) -> None:
    TreeMachine.worker_process = worker
    run_state_machine_as_test(
        TreeMachine,
        settings=settings(
            max_examples=examples(10),
            stateful_step_count=12,
            deadline=None,
            # A failure prints its whole step list; shrinking (and replaying) examples that
            # run real processes is too slow for CI, and their timing is not reproducible.
            phases=[Phase.explicit, Phase.generate],
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )
