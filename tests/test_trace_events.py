"""benchmarks/trace_events.py, the interval arithmetic under the trace scripts' figures: a union of
events, what is left of intervals outside others (a collective alone, host time outside any
annotation) and what lies inside them (the device's or a thread's time within the profiled steps)."""

from __future__ import annotations

import pytest

from benchmark_scripts import load, span


@pytest.fixture(scope="module")
def trace_events():
    return load("trace_events")


def test_union_merges_overlapping_and_touching_events(trace_events):
    events = [span("kernel", "a", 10, 20), span("cpu_op", "b", 0, 5), span("kernel", "c", 25, 10), span("kernel", "d", 35, 5)]
    assert trace_events.union(events) == [(0, 5), (10, 40)]
    # The device's busy time counts its kernels, copies and memsets, not the host's ops.
    assert trace_events.busy_intervals(events) == [(10, 40)]


def test_subtract_keeps_what_no_cut_covers(trace_events):
    # A cut across two intervals, one past an interval's end, one covering an interval whole.
    kept = trace_events.subtract([(0, 10), (20, 30), (40, 50), (60, 70)], [(5, 25), (28, 45), (60, 70)])
    assert kept == [(0, 5), (25, 28), (45, 50)]


def test_inside_keeps_what_the_window_covers(trace_events):
    assert trace_events.inside([(0, 10), (20, 30), (40, 50)], [(5, 25), (45, 100)]) == [(5, 10), (20, 25), (45, 50)]
    assert trace_events.inside([(0, 10)], []) == []
