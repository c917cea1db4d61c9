"""What an owner does about each owned key, given what the store holds (all backends)."""

from __future__ import annotations

from dynamo_trio.discovery._base import Repairs, plan_repairs

OURS = 7
OTHER_LIVE = 8
OTHER_DEAD = 9


def test_each_case() -> None:
    owned = {
        "intact": b"v",
        "missing": b"v",
        "spoiled": b"v",
        "taken": b"v",
        "stale copy": b"v",
    }
    found = {
        "intact": (b"v", OURS),
        "spoiled": (b"garbage", OURS),
        "taken": (b"theirs", OTHER_LIVE),
        "stale copy": (b"old", OTHER_DEAD),
    }
    repairs = plan_repairs(owned, OURS, found, lambda lease: lease == OTHER_LIVE)
    assert repairs == Repairs(rewrite=("missing", "spoiled", "stale copy"), relinquish=("taken",))
    assert plan_repairs({"intact": b"v"}, OURS, {"intact": (b"v", OURS)}) == Repairs()
