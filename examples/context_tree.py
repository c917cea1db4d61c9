"""A request context tree being stopped, then another being killed, in one process.

Run: ``python examples/context_tree.py``

A "request" fans out to three "sub-requests", each generating tokens under its
own context, linked under the request's.  Stopping the request lets every
sub-request drain (each emits a final "cancelled" token); killing the request
cancels every sub-request's scope at once, mid-await.
"""

from __future__ import annotations

import time

import trio

from dynamo_trio import CancelReason, Context

START = time.monotonic()


def say(message: str) -> None:
    print(f"[{(time.monotonic() - START) * 1000:7.1f} ms] {message}", flush=True)


async def generate(ctx: Context, name: str) -> None:
    """Emit a token every 20 ms; drain on stop, get cancelled mid-sleep on kill."""
    tokens = 0
    try:
        while not ctx.is_stopped():
            await trio.sleep(0.02)  # "compute the next token"
            tokens += 1
        say(f"  {name}: saw the stop after {tokens} tokens; emits a final 'cancelled' token")
    except trio.Cancelled:
        say(f"  {name}: cancelled mid-await after {tokens} tokens (reason: {ctx.reason})")
        raise


async def request(title: str, cancel: str) -> None:
    root = Context()
    say(f"{title}: request {root.id()[:8]} fans out to 3 sub-requests")
    async with trio.open_nursery() as nursery:

        async def serve() -> None:
            async with root.scope():
                for i in range(3):
                    child = Context(root.id())
                    child.attributes["name"] = f"sub-{i}"
                    root.start_child(child, generate, child, f"sub-{i}")

        nursery.start_soon(serve)
        await trio.sleep(0.05)
        say(f"{title}: running: {_describe(root)}")
        if cancel == "stop":
            say(f"{title}: the client asks to stop (graceful)")
            root.stop(CancelReason.STOP_REQUESTED)
        else:
            say(f"{title}: the client disconnects (kill)")
            root.kill(CancelReason.CLIENT_DISCONNECT)
    say(
        f"{title}: done: request {root.state.name.lower()} ({root.reason}), "
        f"children still linked: {len(root.children)}"
    )


def _describe(ctx: Context) -> str:
    children = ctx.snapshot()["children"]
    return ", ".join(f"{c['attributes']['name']} {c['state']}" for c in children)


async def main() -> None:
    await request("tree 1", "stop")
    print()
    await request("tree 2", "kill")


if __name__ == "__main__":
    trio.run(main)
