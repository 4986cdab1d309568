"""A histogram observed on every caller frame, written to prometheus-client once a second.

In a pool every observation of a prometheus-client histogram is two writes to a memory-mapped
file (its bucket and its sum), each behind a lock and a pid check: about 1.7 us on this machine,
as much as webrtcvad's verdict on the same frame. ``voicegate_frame_pipeline_seconds`` is
observed for every 20 ms caller frame of every call, so its observations are counted here in
plain integers and added to the histogram in one go by :meth:`BatchedHistogram.flush`, which the
runtime calls about once a second. The exported series are those of observing each value: the
same counts, and the same sum but for float rounding.

prometheus-client has no public call to add n observations to a bucket, so the flush uses the
histogram's ``_upper_bounds``, ``_buckets`` and ``_sum`` (the same in every release since 0.4);
tests/unit/test_batched_histogram.py compares the result with plain observations and fails if
that ever changes.
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import Histogram


class BatchedHistogram:
    """Counts observations of an unlabelled ``Histogram`` until :meth:`flush`. One thread only
    (the event loop's)."""

    __slots__ = ("_bounds", "_counts", "_histogram", "_sum")

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram
        # Bucket i counts amounts <= bounds[i] and > bounds[i - 1] (the last bound is +Inf).
        self._bounds: tuple[float, ...] = tuple(histogram._upper_bounds)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0

    @property
    def pending(self) -> int:
        """Observations not yet added to the histogram."""
        return sum(self._counts)

    def observe(self, amount: float) -> None:
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._sum += amount

    def add(self, counts: list[int], total: float) -> None:
        """Observations counted elsewhere (the C media port's detector): ``counts`` per bucket,
        in the histogram's order with +Inf last, and ``total`` the sum of their amounts."""
        mine = self._counts
        if len(counts) != len(mine):
            raise ValueError(f"{len(counts)} bucket counts for a histogram of {len(mine)}")
        for i, count in enumerate(counts):
            mine[i] += count
        self._sum += total

    def flush(self) -> None:
        """Add what was observed since the last flush to the histogram."""
        if not any(self._counts):
            return
        histogram = self._histogram
        for i, count in enumerate(self._counts):
            if count:
                histogram._buckets[i].inc(count)
                self._counts[i] = 0
        histogram._sum.inc(self._sum)
        self._sum = 0.0
