"""What each probe costs on GPU, on the speed benchmark's model (`+experiment=bench_llama1b`):
the median iteration time (`perf/iteration_time_s`: the step plus whatever the loop does around
it) and step time with probes off, with each probe on alone and with the default probes, in
alternating rounds on the same GPUs (so drift hits every configuration alike), plus the host time
of the per-step probe calls that need no GPU work.

    python benchmarks/probe_overhead.py [--rounds 2] [extra lab overrides...]

The throughput probe times every configuration, so its cost is given as host time per step (one
clock read and three divisions); the memory probe's readings too (allocator counters, no
synchronisation). Parity trains a DDP reference copy beside the model: it costs a second training
step by nature and is meant for correctness runs, not for timing."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from fsdp_lab.memory_phases import PHASES
from fsdp_lab.probes.memory import PhaseMemory
from fsdp_lab.probes.perf import Throughput
from speed import lab_run

# Steps apart in every configuration: parity keeps them apart (its reference replays each finished
# step), so with bench_llama1b's overlapping steps its cost would include theirs.
APART = "train.overlap_steps=false"
CONFIGS = {
    "probes off": [APART, "probes=off"],
    "memory": [APART, "probes=off", "probes.memory.enabled=true"],
    "parity": [APART, "probes=off", "probes.parity.enabled=true"],
    "default probes (parity, memory, throughput)": [APART, "probes=default"],
}
REPEATS = 2000


def host_us(per_step) -> float:
    """Host microseconds of `per_step()`, averaged over many calls."""
    start = time.perf_counter()
    for _ in range(REPEATS):
        per_step()
    return (time.perf_counter() - start) / REPEATS * 1e6


def memory_readings(device: torch.device):
    model = torch.nn.Linear(8, 8, device=device)
    probe = PhaseMemory(device, model, torch.optim.SGD(model.parameters()))

    def one_step():
        with probe.step():
            for phase in PHASES:
                probe.mark(phase)
        probe.metrics()
    return one_step


def throughput_readings(device: torch.device):
    probe = Throughput(tokens_per_step=8192, world_size=2, flops_per_token=6e9, device=device, warmup_steps=0)
    return lambda: probe.metrics(time.perf_counter())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: this benchmark measures probe costs on GPUs")
    device = torch.device("cuda", 0)
    torch.cuda.init()
    print(f"host time per step: memory probe {host_us(memory_readings(device)):.1f} us, "
          f"throughput probe {host_us(throughput_readings(device)):.1f} us", flush=True)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in CONFIGS}
    for _ in range(args.rounds):
        for name, overrides in CONFIGS.items():
            perf = lab_run([*overrides, *args.overrides]).summary["perf"]
            times[name].append((perf["iteration_time_s"], perf["step_time_s"]))
            print(f"{name}: iteration {perf['iteration_time_s'] * 1e3:.2f} ms, step {perf['step_time_s'] * 1e3:.2f} ms", flush=True)
    base = statistics.median(t for t, _ in times["probes off"])
    print("\n| probes | iteration time (ms) | overhead | step time (ms) |\n|---|---|---|---|")
    for name, pairs in times.items():
        iteration, step = (statistics.median(column) for column in zip(*pairs))
        print(f"| {name} | {iteration * 1e3:.2f} | {(iteration / base - 1) * 100:+.1f}% | {step * 1e3:.2f} |")


if __name__ == "__main__":
    main()
