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

from trace_events import Intervals, complete_events, fold_digits, inside, interval, is_step, length, subtract, union

HOST_CATEGORIES = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"}
# Runtime calls after which the host has waited for the device (or for the driver's lock while the
# device drains): cudaMalloc and cudaFree synchronize, a copy without Async waits for its stream.
BLOCKING = re.compile(r"Synchronize|^cudaMemcpy$|^cudaMemcpy2D$|^cudaFree|^cudaMalloc|^cuMemAlloc|^cuMemFree|HostAlloc")
LAUNCH = re.compile(r"LaunchKernel|cuLaunch")


def host_events(trace: dict) -> list[dict]:
    return [e for e in complete_events(trace) if e.get("cat") in HOST_CATEGORIES]


def window(events: list[dict], unnamed_steps: int) -> tuple[Intervals, int]:
    """(the profiled steps' host intervals, their number): the `step N` spans, or the host's whole
    span counted as `unnamed_steps` steps."""
    steps = [e for e in events if is_step(e)]
    if steps:
        return union(steps), len(steps)
    everything = union(events)
    return [(everything[0][0], everything[-1][1])], unnamed_steps


def busy_on_host(events: list[dict]) -> Intervals:
    """The union of a thread's events' intervals, its step spans left out (they hold its waits too)."""
    return union([e for e in events if not is_step(e)])


def within(event: dict, spans: Intervals) -> float:
    """µs of `event` inside `spans`."""
    return length(inside([interval(event)], spans))


def exclusive_by_annotation(events: list[dict], spans: Intervals) -> dict[str, float]:
    """{innermost annotation, digits folded: µs inside `spans`} for one thread's events: each
    annotation's time less its nested annotations', and `-` for busy time outside any annotation.
    Annotations nest (a record_function inside another ends first), so a stack walk finds the parents."""
    annotations = sorted((e for e in events if e["cat"] == "user_annotation" and not is_step(e)),
                         key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    time: dict[str, float] = defaultdict(float)
    stack: list[dict] = []
    for a in annotations:
        while stack and interval(stack[-1])[1] <= a["ts"]:
            stack.pop()
        us = within(a, spans)
        time[fold_digits(a["name"])] += us
        if stack:
            time[fold_digits(stack[-1]["name"])] -= us
        stack.append(a)
    time["-"] += length(inside(subtract(busy_on_host(events), union(annotations)), spans))
    return dict(time)


def runtime_calls(events: list[dict], spans: Intervals) -> tuple[int, float, dict[str, tuple[int, float]]]:
    """(kernel launches, their µs, {blocking runtime call: (count, µs)}) inside `spans`."""
    runtime = [(e["name"], us) for e in events if e["cat"] in ("cuda_runtime", "cuda_driver") and (us := within(e, spans)) > 0]
    launches = [us for name, us in runtime if LAUNCH.search(name)]
    blocked: dict[str, tuple[int, float]] = {}
    for name, us in runtime:
        if BLOCKING.search(name):
            n, total = blocked.get(name, (0, 0.0))
            blocked[name] = n + 1, total + us
    return len(launches), sum(launches), blocked


def thread_name(events: list[dict]) -> str:
    names = {e["name"] for e in events}
    if any(map(is_step, events)) or any(n.startswith("FSDP::pre_forward") for n in names):
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
        busy = length(inside(busy_on_host(mine), spans))
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
