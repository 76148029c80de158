"""Where the device's time goes, from a profiler trace of an FSDP training step (probes.profile's
profile/trace_rank<R>.json, or speed.py --profile's DIR/<peer>/ traces), per profiled step:

    python benchmarks/kernel_time.py TRACE [TRACE ...] [--steps 2]

1. busy time by kernel class (collective, matmul, attention, optimizer, multi-tensor, copy, other),
   each the union of its own kernels' intervals (streams merged), beside the device's busy time.
   Classes run side by side on their streams, so the shares add up to more than 100%.
2. collective-alone time: a collective runs and nothing else does, the communication that compute
   did not hide; then by the collective's kind (all-gather, reduce-scatter, all-reduce, ...), which
   says which end of the step it is at: the forward starts on an all-gather with nothing to hide it,
   the backward ends on reduce-scatters (kinds running together each count the time). Then each kind's
   kernels per step and their median duration: a blocking collective (tensor parallel's all-reduces on
   the compute stream) costs the step its whole duration, and the median over a step's many calls is
   the in-step price to hold beside an isolated one's (the device table's).
3. matmuls beside collectives: the mean duration of the matmul kernels that overlap a collective
   against those that overlap none. NCCL's kernels take SMs and memory bandwidth from the matmuls
   beside them; the ratio is what that contention costs a matmul (shapes mixed: the kernels beside a
   collective need not be the same shapes as those alone; benchmarks/sm_contention.py times one set of
   shapes both ways), and the share of the matmuls' time a collective runs beside.
4. with several ranks' traces, which rank reaches the collectives last: a collective ends on every
   rank together, once the last one has arrived, and each rank's kernel starts when that rank gets
   there, so the difference of the start times of the same collective is how long the rank that
   came first waited for the other.

Every device event of the trace counts (the profiler's window is the profiled steps): the host's
`step N` spans cannot split the device's work, since with steps overlapped (train.overlap_steps) a
step's kernels run after its span on the host has ended. The times are divided by the number of
`step N` spans, or by --steps where the trace names none (the yardsticks' loop; speed.py --profile
profiles 2 steps in every peer). Several traces (one per rank) print one block each."""

from __future__ import annotations

import argparse
import bisect
import json
import math
import re
import statistics
from pathlib import Path

from trace_events import DEVICE_CATEGORIES, busy_intervals, complete_events, inside, interval, is_step, length, subtract

COPY_CATEGORIES = {"gpu_memcpy", "gpu_memset"}
# Kernel classes by name, first match wins. Attention comes before matmul because attention kernels'
# names carry matmul words: cuDNN's `..._sdpa_sm90_flash_fprop_wgmma...` (sm90_), FlashAttention's
# templates (cutlass::bfloat16_t), the memory-efficient `fmha_cutlassF...` (cutlass). Optimizer comes
# before multi-tensor because fused Adam is a multi_tensor_apply_kernel too.
NAMED_CLASSES = [
    ("collective", re.compile(r"nccl", re.IGNORECASE)),
    ("attention", re.compile(r"flash|fmha|cudnn|attention|sdpa", re.IGNORECASE)),
    ("matmul", re.compile(r"gemm|cutlass|nvjet|xmma|sm90_|matmul", re.IGNORECASE)),
    ("optimizer", re.compile(r"FusedOptimizer|adam", re.IGNORECASE)),
    ("multi-tensor", re.compile(r"multi_tensor")),  # FSDP's copy-in casts, foreach norms
]
CLASSES = ["collective", "matmul", "attention", "optimizer", "multi-tensor", "copy", "other"]


def classify(event: dict) -> str:
    """The class of one device event: a copy or memset by its category (its name only says which
    way it copies), a kernel by its name, `other` for the rest (elementwise, reductions, Triton)."""
    if event.get("cat") in COPY_CATEGORIES:
        return "copy"
    return next((cls for cls, pattern in NAMED_CLASSES if pattern.search(event["name"])), "other")


def profiled(trace: dict, unnamed_steps: int) -> tuple[list[dict], int]:
    """(the device's events, the number of `step N` spans, or `unnamed_steps` where there are none)."""
    events = complete_events(trace)
    steps = sum(map(is_step, events))
    return [e for e in events if e.get("cat") in DEVICE_CATEGORIES], steps or unnamed_steps


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def by_class(events: list[dict]) -> dict[str, list[dict]]:
    """{class: its events}, every class, in CLASSES' order; each event classified once."""
    groups: dict[str, list[dict]] = {cls: [] for cls in CLASSES}
    for e in events:
        groups[classify(e)].append(e)
    return groups


def time_by_class(groups: dict[str, list[dict]], steps: int) -> dict[str, float]:
    """{class: busy µs per step, ..., "busy": the device's busy µs per step, all classes merged}, from
    by_class's groups."""
    times = {cls: length(busy_intervals(group)) / steps for cls, group in groups.items()}
    return {**times, "busy": length(busy_intervals([e for group in groups.values() for e in group])) / steps}


NCCL_KIND = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")


def collective_kind(event: dict) -> str:
    """AllGather, ReduceScatter, AllReduce, SendRecv, ... from NCCL's kernel name."""
    match = NCCL_KIND.search(event["name"])
    return match.group(1) if match else event["name"]


def collective_alone(groups: dict[str, list[dict]], steps: int) -> tuple[float, dict[str, float]]:
    """(µs per step when a collective runs and no kernel or copy of another class does, {collective
    kind: the same for that kind's kernels}, the largest first)."""
    others = busy_intervals([e for cls, group in groups.items() if cls != "collective" for e in group])

    def alone(events: list[dict]) -> float:
        return length(subtract(busy_intervals(events), others)) / steps

    kinds: dict[str, list[dict]] = {}
    for e in groups["collective"]:
        kinds.setdefault(collective_kind(e), []).append(e)
    by_kind = sorted(((kind, alone(events)) for kind, events in kinds.items()), key=lambda item: -item[1])
    return alone(groups["collective"]), dict(by_kind)


def collective_calls(groups: dict[str, list[dict]], steps: int) -> dict[str, tuple[float, float]]:
    """{collective kind: (kernels per step, their median µs)}, in order of first appearance."""
    durations: dict[str, list[float]] = {}
    for e in groups["collective"]:
        durations.setdefault(collective_kind(e), []).append(e.get("dur", 0.0))
    return {kind: (len(ds) / steps, statistics.median(ds)) for kind, ds in durations.items()}


def matmuls_beside_collectives(groups: dict[str, list[dict]]) -> tuple[float, int, float, int]:
    """(mean µs, count) of the matmul kernels that overlap a collective, then of those that overlap
    none, over all the profiled steps; a mean of no kernels is nan."""
    collectives = busy_intervals(groups["collective"])
    beside: list[float] = []
    alone: list[float] = []
    for e in groups["matmul"]:
        span = [interval(e)]
        # Overlapping means the collectives take something away from it (touching takes nothing).
        (beside if length(subtract(span, collectives)) < length(span) else alone).append(length(span))
    return mean(beside), len(beside), mean(alone), len(alone)


def matmul_share_beside_collectives(groups: dict[str, list[dict]]) -> float:
    """Of the matmuls' busy time (their union), the share a collective runs beside (nan: no matmuls):
    how much of the matmul work the contention of part 3 can reach."""
    matmuls = busy_intervals(groups["matmul"])
    total = length(matmuls)
    return length(inside(matmuls, busy_intervals(groups["collective"]))) / total if total else math.nan


def collectives_on_the_clock(trace: dict, collectives: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """{kernel name: sorted (end, start) in µs of the host's clock} of the collective kernels: each
    trace's `ts` counts from its own baseTimeNanoseconds, so traces of different processes compare
    only with it added."""
    base = trace.get("baseTimeNanoseconds", 0) / 1e3
    by_name: dict[str, list[tuple[float, float]]] = {}
    for e in collectives:
        by_name.setdefault(e["name"], []).append((base + e["ts"] + e.get("dur", 0.0), base + e["ts"]))
    return {name: sorted(spans) for name, spans in by_name.items()}


def arrival_lags(first: dict[str, list[tuple[float, float]]], second: dict[str, list[tuple[float, float]]],
                 tolerance_us: float = 100.0) -> list[float]:
    """For each collective of `first` (collectives_on_the_clock), how many µs later `second`'s rank
    started it (negative: earlier): matched to the kernel of the same name on `second` whose end is
    nearest, within `tolerance_us` (a collective outside the other's profiled window has no match)."""
    lags = []
    for name, spans in first.items():
        ends = [end for end, _ in second.get(name, [])]
        for end, start in spans:
            i = bisect.bisect_left(ends, end)
            nearest = min((j for j in (i - 1, i) if 0 <= j < len(ends)), key=lambda j: abs(ends[j] - end), default=None)
            if nearest is not None and abs(ends[nearest] - end) <= tolerance_us:
                lags.append(second[name][nearest][1] - start)
    return lags


def report_arrivals(first_name: str, first: dict, name: str, other: dict, steps: int) -> None:
    """One line: how often and by how much `name`'s rank reached the collectives after `first_name`'s."""
    lags = arrival_lags(first, other)
    if not lags:
        print(f"{name}: no collective matched {first_name}'s (the traces are of different runs or windows)")
        return
    later = [lag for lag in lags if lag > 0]
    first_waited, other_waited = sum(later) / steps, -sum(lag for lag in lags if lag < 0) / steps
    print(f"{name} against {first_name}: started {len(later)} of {len(lags)} matched collectives later, median "
          f"{statistics.median(lags) / 1e3:+.3f} ms; {first_name} waited {first_waited / 1e3:.3f} ms/step, "
          f"{name} {other_waited / 1e3:.3f} ms/step")


def report(name: str, groups: dict[str, list[dict]], steps: int) -> None:
    times = time_by_class(groups, steps)
    busy = times["busy"]
    if not busy:
        raise SystemExit(f"{name}: no device kernels (a CPU run's trace has none)")
    print(f"{name}: {steps} profiled step{'s' * (steps > 1)}")
    print(f"  {'class':<13}{'ms/step':>9}  share of busy")
    for cls, us in times.items():
        print(f"  {cls:<13}{us / 1e3:9.3f}  {us / busy:6.1%}")
    alone, by_kind = collective_alone(groups, steps)
    print(f"  collective alone (not hidden by compute): {alone / 1e3:.3f} ms/step ({alone / busy:.1%} of busy)")
    print("    by kind: " + ", ".join(f"{kind} {us / 1e3:.3f}" for kind, us in by_kind.items()))
    print("  collective kernels per step, median µs: " + ", ".join(
        f"{kind} {calls:g} x {median:.1f}" for kind, (calls, median) in collective_calls(groups, steps).items()))
    mean_beside, n_beside, mean_alone, n_alone = matmuls_beside_collectives(groups)
    ratio = f", {mean_beside / mean_alone:.2f}x" if n_beside and n_alone else ""
    print(f"  matmuls beside a collective: mean {mean_beside:.1f} µs (n={n_beside}) vs alone "
          f"{mean_alone:.1f} µs (n={n_alone}){ratio}; {matmul_share_beside_collectives(groups):.1%} of the matmuls' time beside one")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", type=Path, nargs="+", metavar="TRACE", help="one per rank")
    p.add_argument("--steps", type=int, default=2, help="steps profiled, for a trace that names none")
    a = p.parse_args()
    clocks = {}  # {trace: (its collectives on the host's clock, its profiled steps)}
    for path in a.traces:
        trace = json.loads(path.read_text())
        events, steps = profiled(trace, a.steps)
        groups = by_class(events)  # each event classified once, for every figure
        report(str(path), groups, steps)
        clocks[str(path)] = collectives_on_the_clock(trace, groups["collective"]), steps
    (first_name, (first, _)), *others = clocks.items()
    for name, (other, steps) in others:
        report_arrivals(first_name, first, name, other, steps)


if __name__ == "__main__":
    main()
