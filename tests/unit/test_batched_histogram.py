"""The batched frame-pipeline histogram exports exactly what observing each value would."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from voicegate.observe.batched import BatchedHistogram

BUCKETS = (5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 5e-3)


def _pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, BatchedHistogram]:
    plain_registry, batched_registry = CollectorRegistry(), CollectorRegistry()
    plain = Histogram("x_seconds", "x", buckets=BUCKETS, registry=plain_registry)
    batched = BatchedHistogram(
        Histogram("x_seconds", "x", buckets=BUCKETS, registry=batched_registry)
    )
    return plain_registry, plain, batched_registry, batched


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for metric in registry.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


amounts = st.lists(
    st.one_of(
        st.sampled_from(BUCKETS),  # on a bound: that bucket ("le" is inclusive)
        st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
        st.just(math.inf),
    ),
    max_size=200,
)


@given(st.lists(amounts, min_size=1, max_size=4))
def test_flushed_batches_equal_plain_observations(batches: list[list[float]]) -> None:
    plain_registry, plain, batched_registry, batched = _pair()
    for batch in batches:
        for amount in batch:
            plain.observe(amount)
            batched.observe(amount)
        batched.flush()
    got, want = _samples(batched_registry), _samples(plain_registry)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-12), key


def test_nothing_reaches_the_histogram_before_a_flush_and_a_flush_empties_the_batch() -> None:
    _, _, registry, batched = _pair()
    batched.observe(3e-5)
    batched.observe(2e-2)
    assert registry.get_sample_value("x_seconds_count") == 0
    assert batched.pending == 2
    batched.flush()
    assert registry.get_sample_value("x_seconds_count") == 2
    assert registry.get_sample_value("x_seconds_bucket", {"le": "5e-05"}) == 1
    assert registry.get_sample_value("x_seconds_bucket", {"le": "0.005"}) == 1
    assert registry.get_sample_value("x_seconds_sum") == 3e-5 + 2e-2
    batched.flush()  # nothing new: nothing added twice
    assert registry.get_sample_value("x_seconds_count") == 2
    assert batched.pending == 0
    assert b"x_seconds_bucket" in generate_latest(registry)
