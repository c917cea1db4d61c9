"""Random sequences of link / stop / kill / finish, checked against a plain model of the tree."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from dynamo_trio import CancelReason, Context, ContextState
from tests._fuzz import examples


class ContextTreeMachine(RuleBasedStateMachine):
    contexts = Bundle("contexts")

    def __init__(self) -> None:
        super().__init__()
        self.all: list[Context] = []
        self.state: dict[int, ContextState] = {}
        self.parent: dict[int, Context | None] = {}
        self.children: dict[int, list[Context]] = {}
        self.highest_seen: dict[int, ContextState] = {}
        self.finished: set[int] = set()

    def _subtree(self, ctx: Context) -> list[Context]:
        out, stack = [], [ctx]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(self.children[id(node)])
        return out

    def _ancestors(self, ctx: Context) -> list[Context]:
        out = []
        node = self.parent[id(ctx)]
        while node is not None:
            out.append(node)
            node = self.parent[id(node)]
        return out

    def _apply(self, ctx: Context, target: ContextState) -> None:
        for node in self._subtree(ctx):
            self.state[id(node)] = max(self.state[id(node)], target)

    @initialize(target=contexts)
    def first(self) -> Context:
        return self._made()

    @rule(target=contexts)
    def new(self) -> Context:
        return self._made()

    def _made(self) -> Context:
        ctx = Context("req")
        self.all.append(ctx)
        self.state[id(ctx)] = ContextState.LIVE
        self.parent[id(ctx)] = None
        self.children[id(ctx)] = []
        self.highest_seen[id(ctx)] = ContextState.LIVE
        return ctx

    @rule(parent=contexts, child=contexts)
    def link(self, parent: Context, child: Context) -> None:
        current = self.parent[id(child)]
        refused = (
            parent is child
            or (current is not None and current is not parent)
            or child in self._ancestors(parent)
        )
        try:
            parent.link_child(child)
        except ValueError:
            assert refused
            return
        assert not refused
        if current is not None:
            return
        if id(parent) in self.finished:
            # Nothing linked outlives its parent's scope: work linked late is killed at once.
            self._apply(child, ContextState.KILLED)
            return
        self.parent[id(child)] = parent
        self.children[id(parent)].append(child)
        self._apply(child, self.state[id(parent)])

    @rule(ctx=contexts, reason=st.sampled_from(list(CancelReason)))
    def stop(self, ctx: Context, reason: CancelReason) -> None:
        ctx.stop(reason)
        self._apply(ctx, ContextState.STOPPED)

    @rule(ctx=contexts, reason=st.sampled_from(list(CancelReason)))
    def kill(self, ctx: Context, reason: CancelReason) -> None:
        ctx.kill(reason)
        self._apply(ctx, ContextState.KILLED)

    @rule(ctx=contexts)
    def finish(self, ctx: Context) -> None:
        ctx.finish()
        self.finished.add(id(ctx))
        for child in self.children[id(ctx)]:  # unfinished linked work ends with its parent
            self._apply(child, ContextState.KILLED)
        parent = self.parent[id(ctx)]
        if parent is not None:
            self.children[id(parent)].remove(ctx)
            self.parent[id(ctx)] = None

    @invariant()
    def states_match_the_model(self) -> None:
        for ctx in self.all:
            assert ctx.state is self.state[id(ctx)]

    @invariant()
    def states_never_move_backwards(self) -> None:
        for ctx in self.all:
            assert ctx.state >= self.highest_seen[id(ctx)]
            self.highest_seen[id(ctx)] = ctx.state

    @invariant()
    def killed_implies_stopped_and_reasons_exist(self) -> None:
        for ctx in self.all:
            if ctx.is_killed():
                assert ctx.is_stopped()
            assert (ctx.reason is None) == (ctx.state is ContextState.LIVE)

    @invariant()
    def children_are_never_behind_their_parent(self) -> None:
        for ctx in self.all:
            for child in ctx.children:
                assert child.state >= ctx.state

    @invariant()
    def links_are_consistent_and_acyclic(self) -> None:
        for ctx in self.all:
            assert list(ctx.children) == self.children[id(ctx)]
            assert ctx.parent is self.parent[id(ctx)]
            seen = {id(ctx)}
            node = ctx.parent
            while node is not None:
                assert id(node) not in seen, "cycle"
                seen.add(id(node))
                node = node.parent


ContextTreeMachine.TestCase.settings = settings(max_examples=examples(150), stateful_step_count=60)
test_context_tree_state_machine = ContextTreeMachine.TestCase
