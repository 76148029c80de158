"""What the trace scripts (gpu_idle.py, kernel_time.py, host_time.py) read in a torch.profiler chrome
trace: its complete events, the steps the lab names, and time as sorted, disjoint (start, end)
intervals in µs (a union, its length, what is left of it outside or inside others)."""

from __future__ import annotations

import re

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
STEP = re.compile(r"step \d+")  # the lab's step spans (fsdp_lab.probes.profile); the yardsticks' loop names none

Intervals = list[tuple[float, float]]


def complete_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


def is_step(event: dict) -> bool:
    return event.get("cat") == "user_annotation" and bool(STEP.fullmatch(event["name"]))


def fold_digits(name: str) -> str:
    """`FSDP::pre_forward (layers.3)` -> `FSDP::pre_forward (layers.N)`: the blocks' spans add up."""
    return re.sub(r"\d+", "N", name)


def interval(event: dict) -> tuple[float, float]:
    return event["ts"], event["ts"] + event.get("dur", 0.0)


def union(events: list[dict]) -> Intervals:
    """The time any of `events` covers: sorted, disjoint intervals."""
    merged: list[list[float]] = []
    for start, end in sorted(map(interval, events)):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def busy_intervals(events: list[dict]) -> Intervals:
    """The device's busy time, streams merged: the union of its kernels, copies and memsets."""
    return union([e for e in events if e.get("cat") in DEVICE_CATEGORIES])


def length(intervals: Intervals) -> float:
    return sum(end - start for start, end in intervals)


def subtract(intervals: Intervals, minus: Intervals) -> Intervals:
    """The parts of `intervals` that no interval of `minus` covers; both sorted and disjoint."""
    left: Intervals = []
    first = 0  # minus's intervals that end before this one starts end before every later one too
    for start, end in intervals:
        while first < len(minus) and minus[first][1] <= start:
            first += 1
        for cut_start, cut_end in minus[first:]:
            if cut_start >= end:
                break
            if cut_start > start:
                left.append((start, cut_start))
            start = cut_end
        if start < end:
            left.append((start, end))
    return left


def inside(intervals: Intervals, within: Intervals) -> Intervals:
    """The parts of `intervals` that `within` covers."""
    return subtract(intervals, subtract(intervals, within))
