"""Where the GPU waits for the host, from a profiler trace (probes.profile's profile/trace_rank<R>.json,
or speed.py --profile's): every gap between the device's kernels and copies inside the profiled steps,
charged to what the host was running when the gap began (the innermost host annotation, such as
`FSDP::pre_forward (layers.3)`, with digits folded so the blocks add up, and the innermost aten op).

    python benchmarks/gpu_idle.py TRACE [--top 25] [--min-us 2]

A gap charged to an FSDP hook is host time that the hook spends while the device has run out of
work; one charged to a plain aten op (aten::mm, aten::mul) is the dispatch of the ops themselves:
a step that is bound by its host rather than its device."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from trace_events import busy_intervals, complete_events, fold_digits, inside, interval, is_step


def innermost(spans: list[dict], t: float) -> str | None:
    """The name of the shortest span that holds time t."""
    holding = [s for s in spans if s["ts"] <= t < s["ts"] + s.get("dur", 0.0)]
    return min(holding, key=lambda s: s.get("dur", 0.0))["name"] if holding else None


def idle_by_host_activity(trace: dict, min_us: float) -> tuple[float, float, dict[str, float]]:
    """(profiled steps' µs, idle µs, {host annotation | aten op: idle µs}) over the `step N` spans
    (the lab's), or over the whole trace where it has none."""
    events = complete_events(trace)
    steps = [e for e in events if is_step(e)]
    annotations = [e for e in events if e.get("cat") == "user_annotation" and e not in steps]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    busy = busy_intervals(events)
    if not steps and busy:  # a loop that names no steps (the yardsticks'): the whole profiled window
        steps = [{"ts": busy[0][0], "dur": busy[-1][1] - busy[0][0]}]
    total = idle = 0.0
    charged: dict[str, float] = defaultdict(float)
    for step in steps:
        in_step = inside(busy, [interval(step)])
        if not in_step:
            continue
        total += in_step[-1][1] - in_step[0][0]
        for (_, gap_start), (gap_end, _) in zip(in_step, in_step[1:]):
            if gap_end - gap_start < min_us:
                continue
            idle += gap_end - gap_start
            where = fold_digits(innermost(annotations, gap_start) or "-")
            charged[f"{where}  /  {innermost(ops, gap_start) or '-'}"] += gap_end - gap_start
    return total, idle, charged


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--min-us", type=float, default=2.0, help="gaps shorter than this are launch latency, not counted")
    a = p.parse_args()
    total, idle, charged = idle_by_host_activity(json.loads(a.trace.read_text()), a.min_us)
    if not total:
        raise SystemExit(f"{a.trace}: no device kernels (a CPU run's trace has none)")
    print(f"device span of the profiled steps {total / 1e3:.2f} ms, idle {idle / 1e3:.2f} ms ({idle / total:.1%})")
    print(f"{'idle ms':>9}  host annotation  /  aten op")
    for name, us in sorted(charged.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{us / 1e3:9.3f}  {name}")


if __name__ == "__main__":
    main()
