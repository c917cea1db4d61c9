"""Turns (:mod:`dynamo_trio.frontend._turns`): at most N per scheduler pass, in order.

Passes are counted by an instrument of the test's own (``after_io_wait`` runs
once per pass, as for :class:`Turns` itself); every test runs on trio's real
scheduler, with nothing mocked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio
import trio.testing

from dynamo_trio.frontend import _turns
from dynamo_trio.frontend._turns import Turns
from tests._memhttp import http_client

from .conftest import CHAT_BODY, parse_sse

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .conftest import StartStack


class PassCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.passes = 0

    def after_io_wait(self, timeout: float) -> None:
        self.passes += 1


@pytest.fixture
async def passes() -> AsyncIterator[PassCounter]:
    counter = PassCounter()
    trio.lowlevel.add_instrument(counter)
    try:
        yield counter
    finally:
        trio.lowlevel.remove_instrument(counter)


async def take_all(turns: Turns, count: int, passes: PassCounter) -> list[tuple[int, int, int]]:
    """``count`` tasks take a turn, all asking in the same pass; for each, in the
    order they got their turn: (its place in the asking order, pass asked, pass got)."""
    asked: list[int] = []
    got: list[tuple[int, int, int]] = []

    async def one(n: int) -> None:
        asked.append(n)
        when = passes.passes
        await turns.take()
        got.append((asked.index(n), when, passes.passes))

    async with trio.open_nursery() as nursery:
        for n in range(count):
            nursery.start_soon(one, n)
    return got


async def test_at_most_per_pass_turns_each_pass_in_the_order_asked(passes: PassCounter) -> None:
    async with trio.open_nursery() as nursery:
        turns = Turns(2, nursery)
        turns.install()
        try:
            got = await take_all(turns, 7, passes)
        finally:
            turns.uninstall()
    assert sorted(place for place, _, _ in got) == list(range(7))
    asked_in = {when for _, when, _ in got}
    assert len(asked_in) == 1  # all asked in one pass
    (first,) = asked_in
    # In the order asked (tasks given turns in the same pass run in any order).
    waits = [at - first for _, _, at in sorted(got)]
    assert waits == sorted(waits)
    # Two at once, then two per pass (a waiter runs in the pass after the one
    # that handed it its turn).
    assert waits[:2] == [0, 0]
    assert waits[2] > 0
    per_pass: dict[int, int] = {}
    for wait in waits:
        per_pass[wait] = per_pass.get(wait, 0) + 1
    assert max(per_pass.values()) == 2
    assert len(per_pass) == 4  # 2 + 2 + 2 + 1


async def test_a_pass_younger_than_the_budget_gives_every_asker_a_turn(
    passes: PassCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(_turns, "perf_counter", lambda: now[0])
    async with trio.open_nursery() as nursery:
        turns = Turns(1, nursery, budget=0.001)
        turns.install()
        try:
            await trio.lowlevel.checkpoint()  # a pass that starts at 100.0
            asked_in = passes.passes
            for _ in range(5):  # beyond the count, in one pass younger than the budget
                await turns.take()
            assert passes.passes == asked_in
            assert not nursery.child_tasks  # no ticker: nobody waited
            now[0] += 0.002  # the pass is now older than its budget: the count applies
            await turns.take()
            assert passes.passes > asked_in
        finally:
            turns.uninstall()


async def test_a_young_pass_still_serves_the_waiters_first(
    passes: PassCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four ask in a pass over its budget: one goes, three wait.  The one that went
    starts a fifth, which asks in a young pass, and still goes after the three."""
    now = [100.0]
    monkeypatch.setattr(_turns, "perf_counter", lambda: now[0])

    class Ager(trio.abc.Instrument):
        """Makes the next pass older than any budget from its start (it runs after
        :class:`Turns`' own hook, which reads the time when the pass begins)."""

        age_next = False

        def after_io_wait(self, timeout: float) -> None:
            if self.age_next:
                self.age_next = False
                now[0] += 1.0

    ager = Ager()
    served: list[str] = []
    async with trio.open_nursery() as nursery:
        turns = Turns(1, nursery, budget=0.001)
        turns.install()
        trio.lowlevel.add_instrument(ager)
        try:
            async with trio.open_nursery() as takers:

                async def one(name: str) -> None:
                    await turns.take()
                    if not served:
                        takers.start_soon(one, "late")
                    served.append(name)

                ager.age_next = True
                for n in range(4):
                    takers.start_soon(one, f"waiter {n}")
        finally:
            trio.lowlevel.remove_instrument(ager)
            turns.uninstall()
    assert len(served) == 5
    assert served[-1] == "late"


def test_a_negative_budget_is_refused() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            with pytest.raises(ValueError, match="budget"):
                Turns(1, nursery, budget=-0.001)

    trio.run(main)


async def test_a_new_pass_frees_the_turns(passes: PassCounter) -> None:
    async with trio.open_nursery() as nursery:
        turns = Turns(1, nursery)
        turns.install()
        try:
            for _ in range(5):
                before = passes.passes
                await turns.take()  # alone in its pass each time: never waits
                assert passes.passes == before
                await trio.lowlevel.checkpoint()  # the next pass
        finally:
            turns.uninstall()


async def test_waiting_never_stalls_when_nothing_else_is_runnable() -> None:
    """No I/O and no timer anywhere: the ticker alone brings the next passes."""
    async with trio.open_nursery() as nursery:
        turns = Turns(1, nursery)
        turns.install()
        try:
            with trio.fail_after(5):
                async with trio.open_nursery() as takers:
                    for _ in range(20):
                        takers.start_soon(turns.take)
        finally:
            turns.uninstall()
        assert turns.waiting == 0


async def test_a_cancelled_waiter_leaves_the_line_and_the_others_get_their_turns() -> None:
    async with trio.open_nursery() as nursery:
        turns = Turns(1, nursery)
        turns.install()
        asked: list[int] = []
        served: list[int] = []
        cancelled: list[int] = []
        scopes = [trio.CancelScope() for _ in range(6)]
        try:

            async def one(n: int) -> None:
                with scopes[n]:
                    asked.append(n)
                    await turns.take()
                    served.append(n)
                if scopes[n].cancelled_caught:
                    cancelled.append(n)

            async with trio.open_nursery() as takers:
                for n in range(6):
                    takers.start_soon(one, n)
                while turns.waiting < 3:  # one per pass: the last to ask still waits
                    await trio.lowlevel.checkpoint()
                last = asked[-1]
                scopes[last].cancel()
        finally:
            turns.uninstall()
    assert cancelled == [last]
    assert sorted(served) == sorted(set(range(6)) - {last})
    assert turns.waiting == 0


async def test_the_ticker_only_runs_while_someone_waits(passes: PassCounter) -> None:
    async with trio.open_nursery() as nursery:
        turns = Turns(1, nursery)
        turns.install()
        try:
            await take_all(turns, 5, passes)
            await trio.testing.wait_all_tasks_blocked()
            assert not nursery.child_tasks  # the ticker has ended
            before = passes.passes
            await trio.sleep(0.05)  # an idle frontend: no pass goes by without a reason
            assert passes.passes - before <= 2
        finally:
            turns.uninstall()


async def test_zero_is_no_limit(passes: PassCounter) -> None:
    async with trio.open_nursery() as nursery:
        turns = Turns(0, nursery)
        turns.install()
        with pytest.raises(KeyError):
            trio.lowlevel.remove_instrument(turns)  # nothing to count: never installed
        got = await take_all(turns, 50, passes)
        turns.uninstall()
    assert {at - when for _, when, at in got} == {0}


async def test_take_is_a_cancellation_point_even_with_a_turn_free() -> None:
    async with trio.open_nursery() as nursery:
        turns = Turns(4, nursery)
        with trio.CancelScope() as scope:
            scope.cancel()
            await turns.take()
        assert scope.cancelled_caught


def test_a_negative_limit_is_refused() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            with pytest.raises(ValueError, match="0 or more"):
                Turns(-1, nursery)

    trio.run(main)


# ---------------------------------------------------------------------------- in the frontend


@pytest.mark.slow
async def test_many_streams_taking_turns_lose_nothing_and_count_exactly(
    stack: StartStack,
) -> None:
    """One turn per pass, 40 streams at once from a zero-latency engine: each stream
    still carries every token, in order, and ends ``[DONE]``; nothing is counted as
    cancelled (real frontend and worker processes, real HTTP)."""
    running = await stack(
        "--stream-writes-per-pass", "1", "--stream-pass-budget-ms", "0", inter_token_latency_ms=0
    )
    body = {**CHAT_BODY, "max_tokens": 300, "stream": True}
    unary = {**CHAT_BODY, "max_tokens": 300}
    async with http_client(running.url, timeout=60) as http:
        expected = (await http.post("/v1/chat/completions", json=unary)).json()
        want = expected["choices"][0]["message"]["content"]
        texts: list[str] = []

        async def one() -> None:
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                await response.aread()
                events = parse_sse(response.text)
            assert events[-1].data == "[DONE]"
            texts.append(
                "".join(
                    choice["delta"].get("content") or ""
                    for event in events[:-1]
                    for choice in event.json()["choices"]
                )
            )

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                for _ in range(40):
                    nursery.start_soon(one)
    assert len(want) > 300
    assert texts == [want] * 40
    assert await running.metric("dynamo_frontend_model_cancellation_total") == 0
    streams = await running.metric("dynamo_frontend_requests_total", request_type="stream")
    assert streams == 40


def test_the_limit_comes_from_the_environment_and_the_command_line() -> None:
    import argparse

    from dynamo_trio import Config
    from dynamo_trio._config import add_flags, config_from_args

    assert Config.from_env({}).frontend.stream_writes_per_pass == 2
    env = {"DYN_HTTP_STREAM_WRITES_PER_PASS": "0"}
    assert Config.from_env(env).frontend.stream_writes_per_pass == 0
    with pytest.raises(ValueError, match="DYN_HTTP_STREAM_WRITES_PER_PASS"):
        Config.from_env({"DYN_HTTP_STREAM_WRITES_PER_PASS": "-1"})
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(["--stream-writes-per-pass", "16"])
    assert config_from_args(args, env).frontend.stream_writes_per_pass == 16
    assert Config.from_env({}).frontend.stream_pass_budget_ms == 1.0
    budget = {"DYN_HTTP_STREAM_PASS_BUDGET_MS": "0.25"}
    assert Config.from_env(budget).frontend.stream_pass_budget_ms == 0.25
    for bad in ("-1", "inf", "nan"):
        with pytest.raises(ValueError, match="DYN_HTTP_STREAM_PASS_BUDGET_MS"):
            Config.from_env({"DYN_HTTP_STREAM_PASS_BUDGET_MS": bad})
