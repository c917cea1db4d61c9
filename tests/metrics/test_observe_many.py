"""``observe_many`` exposes exactly what ``count`` calls of ``observe`` would."""

from __future__ import annotations

import math

from hypothesis import given, strategies as st
from prometheus_client import CollectorRegistry, Histogram

from dynamo_trio.metrics._buckets import INTER_TOKEN_LATENCY_BUCKETS
from dynamo_trio.metrics._frontend import observe_many

amounts = st.one_of(
    st.floats(allow_nan=False, allow_infinity=True, min_value=-1.0),
    st.sampled_from([*INTER_TOKEN_LATENCY_BUCKETS, 0.0]),  # exactly on a bound
    st.just(math.nan),
)


def _samples(histogram: Histogram) -> dict[str, float]:
    (metric,) = histogram.collect()
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for s in metric.samples
        if not s.name.endswith("_created")
    }


@given(st.lists(st.tuples(amounts, st.integers(min_value=1, max_value=50)), max_size=8))
def test_observe_many_is_count_observations(batches: list[tuple[float, int]]) -> None:
    one_by_one = Histogram(
        "a", "a", buckets=INTER_TOKEN_LATENCY_BUCKETS, registry=CollectorRegistry()
    )
    batched = Histogram("a", "a", buckets=INTER_TOKEN_LATENCY_BUCKETS, registry=CollectorRegistry())
    for amount, count in batches:
        for _ in range(count):
            one_by_one.observe(amount)
        observe_many(batched, amount, count)
    expected, got = _samples(one_by_one), _samples(batched)
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        if name.startswith("a_sum"):
            assert math.isclose(got[name], value, rel_tol=1e-9, abs_tol=1e-9) or (
                math.isnan(got[name]) and math.isnan(value)
            ), (name, got[name], value)
        else:
            assert got[name] == value, (name, got[name], value)
