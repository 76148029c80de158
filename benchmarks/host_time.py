"""Where the host's time goes, from a profiler trace of a training step (probes.profile's
profile/trace_rank<R>.json, or speed.py --profile's DIR/<peer>/ traces), per profiled step:

    python benchmarks/host_time.py TRACE [TRACE ...] [--steps 2] [--top 20]

1. each host thread's busy time (the union of its ops, annotations and CUDA runtime calls) against
   the profiled window: the main thread issues the forward and the optimizer, autograd's device
   thread the backward. A thread busy through the window paces a host-bound step.
2. each thread's time by the innermost annotation it was in, less the annotations inside it (FSDP's
   hooks by kind, digits folded so that the blocks add up; `-`: outside any annotation, the model's
   own ops and autograd's engine).
3. the CUDA runtime calls: kernel launches, and the calls that hold the host until the device has
   caught up (a synchronize, a blocking copy, cudaMalloc and cudaFree): time in those is waiting,
   not work, though it counts as busy in 1.
4. the ops dispatched per step (every aten op, nested ones included: the dispatcher's work).

The window is the union of the `step N` spans (the lab's), or where the trace names none (the
yardsticks' loop) the host's first to last event, divided by --steps. Several traces (one per rank)
print one block each; with gpu_idle.py (what the device waits for) and kernel_time.py (what it does)
it says whether a step is bound by its host, and by which of the host's work."""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from gpu_idle import busy_intervals
from kernel_time import length, subtract

HOST_CATEGORIES = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"}
STEP = re.compile(r"step \d+|ProfilerStep#\d+")
# Runtime calls after which the host has waited for the device (or for the driver's lock while the
# device drains): cudaMalloc and cudaFree synchronize, a copy without Async waits for its stream.
BLOCKING = re.compile(r"Synchronize|^cudaMemcpy$|^cudaMemcpy2D$|^cudaFree|^cudaMalloc|^cuMemAlloc|^cuMemFree|HostAlloc")
LAUNCH = re.compile(r"LaunchKernel|cuLaunch")


def host_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in HOST_CATEGORIES]


def window(events: list[dict], unnamed_steps: int) -> tuple[list[tuple[float, float]], int]:
    """(the profiled steps' host intervals, their number): the `step N` spans, or the host's whole
    span counted as `unnamed_steps` steps."""
    steps = [e for e in events if e["cat"] == "user_annotation" and STEP.fullmatch(e["name"])]
    if steps:
        return busy_intervals([{**e, "cat": "kernel"} for e in steps]), len(steps)
    start = min(e["ts"] for e in events)
    return [(start, max(e["ts"] + e.get("dur", 0.0) for e in events))], unnamed_steps


def clip(e: dict, spans: list[tuple[float, float]]) -> float:
    """µs of event `e` inside `spans`."""
    start, end = e["ts"], e["ts"] + e.get("dur", 0.0)
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans)


def busy_on_host(events: list[dict]) -> list[tuple[float, float]]:
    """The union of a thread's events' intervals, its step spans left out (they hold its waits too)."""
    return busy_intervals([{**e, "cat": "kernel"} for e in events if not STEP.fullmatch(e["name"])])


def exclusive_by_annotation(events: list[dict], spans: list[tuple[float, float]]) -> dict[str, float]:
    """{innermost annotation, digits folded: µs inside `spans`} for one thread's events: each
    annotation's time less its nested annotations', and `-` for busy time outside any annotation.
    Annotations nest (a record_function inside another ends first), so a stack walk finds the parents."""
    annotations = sorted((e for e in events if e["cat"] == "user_annotation" and not STEP.fullmatch(e["name"])),
                         key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    time: dict[str, float] = defaultdict(float)
    stack: list[dict] = []
    for a in annotations:
        while stack and stack[-1]["ts"] + stack[-1].get("dur", 0.0) <= a["ts"]:
            stack.pop()
        inside = clip(a, spans)
        time[re.sub(r"\d+", "N", a["name"])] += inside
        if stack:
            time[re.sub(r"\d+", "N", stack[-1]["name"])] -= inside
        stack.append(a)
    covered = busy_intervals([{**a, "cat": "kernel"} for a in annotations])
    outside = [(max(s, a), min(e, b)) for s, e in subtract(busy_on_host(events), covered) for a, b in spans if min(e, b) > max(s, a)]
    time["-"] += length(outside)
    return dict(time)


def runtime_calls(events: list[dict], spans: list[tuple[float, float]]) -> tuple[int, float, dict[str, tuple[int, float]]]:
    """(kernel launches, their µs, {blocking runtime call: (count, µs)}) inside `spans`."""
    runtime = [e for e in events if e["cat"] in ("cuda_runtime", "cuda_driver") and clip(e, spans) > 0]
    launches = [e for e in runtime if LAUNCH.search(e["name"])]
    blocked: dict[str, tuple[int, float]] = {}
    for e in runtime:
        if BLOCKING.search(e["name"]):
            n, us = blocked.get(e["name"], (0, 0.0))
            blocked[e["name"]] = n + 1, us + clip(e, spans)
    return len(launches), sum(clip(e, spans) for e in launches), blocked


def thread_name(events: list[dict]) -> str:
    names = {e["name"] for e in events}
    if any(STEP.fullmatch(n) for n in names) or any(n.startswith("FSDP::pre_forward") for n in names):
        return "main"
    if any(n.startswith("autograd::engine") for n in names):
        return "autograd"
    return "other"


def report(name: str, trace: dict, unnamed_steps: int, top: int) -> None:
    events = host_events(trace)
    if not events:
        raise SystemExit(f"{name}: no host events")
    spans, steps = window(events, unnamed_steps)
    print(f"{name}: {steps} profiled step{'s' * (steps > 1)}, host window {length(spans) / steps / 1e3:.2f} ms/step")
    threads: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        threads[e.get("tid", 0)].append(e)
    for tid, mine in sorted(threads.items(), key=lambda kv: -len(kv[1])):
        busy = sum(clip({"ts": s, "dur": e - s}, spans) for s, e in busy_on_host(mine))
        if busy < 0.01 * length(spans):
            continue  # a thread that barely ran (the profiler's own, NCCL's watchdog)
        print(f"  thread {tid} ({thread_name(mine)}): busy {busy / steps / 1e3:.2f} ms/step ({busy / length(spans):.1%} of the window)")
        for where, us in sorted(exclusive_by_annotation(mine, spans).items(), key=lambda kv: -kv[1])[:top]:
            if us >= 1.0:
                print(f"    {us / steps / 1e3:9.3f}  {where}")
    launched, launch_us, blocked = runtime_calls(events, spans)
    print(f"  kernel launches: {launched / steps:.0f}/step, {launch_us / steps / 1e3:.2f} ms/step")
    for call, (n, us) in sorted(blocked.items(), key=lambda kv: -kv[1][1]):
        print(f"  blocking {call}: {n / steps:g}/step, {us / steps / 1e3:.3f} ms/step")
    ops = [e for e in events if e["cat"] == "cpu_op"]
    print(f"  ops dispatched: {len(ops) / steps:.0f}/step; most dispatched:")
    for op, n in Counter(e["name"] for e in ops).most_common(top):
        print(f"    {n / steps:9.0f}  {op}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", type=Path, nargs="+", metavar="TRACE", help="one per rank")
    p.add_argument("--steps", type=int, default=2, help="steps profiled, for a trace that names none")
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args()
    for path in a.traces:
        report(str(path), json.loads(path.read_text()), a.steps, a.top)


if __name__ == "__main__":
    main()
