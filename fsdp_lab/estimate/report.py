"""mode=estimate's answer: rank 0's traced peak plus the library workspaces the allocator also holds,
the assumptions it rests on, and whether it fits on the device."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from fsdp_lab.config import RunConfig
from fsdp_lab.estimate.cuda_kernels import SUBSTITUTED
from fsdp_lab.estimate.device import assumptions, verdict
from fsdp_lab.estimate.trace import trace_step
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.probes.memory_breakdown import render_table
from fsdp_lab.sinks.files import write_json_atomic, write_summary

ESTIMATE_FILE = "estimate.json"


def estimate(run: RunConfig, dims: ParallelDims, around_step: Callable[[], contextlib.AbstractContextManager] | None = None) -> dict:
    """The predicted allocator peak per rank over one optimizer step after warm-up (`around_step`: see
    trace_step). With pipeline stages, every pp rank's (`pp_ranks`), and the breakdown and peak of the
    largest, which is what must fit."""
    traces = [trace_step(run, dims, rank=r * (dims.world_size // dims.pp), around_step=around_step) for r in range(dims.pp)]
    workspace = run.estimate.workspace_mib
    trace = max(traces, key=lambda t: t.breakdown["peak_mib"])
    report = dict(trace.breakdown)
    for key in ("allocator_peak_mib", "untracked_mib", "tracker_accuracy", "ranks", "device"):
        report.pop(key)
    peak = report["peak_mib"] + workspace
    pipeline = {} if dims.pp == 1 else {"pp_ranks": [
        {"pp_rank": i, "rank": t.rank, "peak_mib": t.breakdown["peak_mib"] + workspace} for i, t in enumerate(traces)]}
    return {
        "mode": "estimate", "world_size": dims.world_size, "mesh": {**dims.as_dict(), "engine": run.mesh.engine},
        "model": {"name": run.model.name, "params": trace.params}, "rank": trace.rank,
        "phases_mib": trace.phases_mib, **report, "traced_peak_mib": report["peak_mib"], "peak_mib": peak, **pipeline,
        "assumptions": assumptions(run.estimate, SUBSTITUTED), **verdict(run.estimate, peak),
    }


def run_estimate(run: RunConfig, dims: ParallelDims, run_dir: Path) -> None:
    """Estimate, print the prediction with its breakdown and verdict, write estimate.json and summary.json."""
    result = estimate(run, dims)
    write_json_atomic(run_dir / ESTIMATE_FILE, result)
    write_summary(run_dir, {
        "status": "ok", "error": None, "mode": "estimate", "steps": 0, "world_size": dims.world_size,
        "device": "fake", "mesh": result["mesh"],
        "memory": {"peak_mib": result["peak_mib"], "phases_mib": result["phases_mib"]},
    })
    mesh = " x ".join(f"{k}={v}" for k, v in dims.as_dict().items() if v > 1) or "1 rank"
    traced = {**result, "peak_mib": result["traced_peak_mib"]}
    print(render_table(traced, f"Estimated memory per rank: {dims.world_size} ranks ({mesh}), {run.model.name} "
                               f"{result['model']['params'] / 1e6:.1f}M params"), flush=True)
    for stage in result.get("pp_ranks", ()):
        print(f"estimate: pp rank {stage['pp_rank']} (rank {stage['rank']}): peak {stage['peak_mib']:.1f} MiB", flush=True)
    print(f"estimate: peak {result['peak_mib']:.1f} MiB per rank (rank {result['rank']}: traced {result['traced_peak_mib']:.1f} + "
          f"{run.estimate.workspace_mib:.0f} MiB library workspaces)", flush=True)
    print(_verdict_line(result), flush=True)


def _verdict_line(result: dict) -> str:
    a = result["assumptions"]
    if result["fits"] is None:
        return ("estimate: no device to fit on (no GPU visible): set estimate.device or estimate.device_memory_gib; "
                f"needs {result['needed_mib'] / 1024:.1f} GiB")
    word = "fits" if result["fits"] else "does not fit"
    return (f"estimate: {word} on {result['device']}: needs {result['needed_mib'] / 1024:.1f} GiB of "
            f"{result['device_memory_mib'] / 1024:.1f} GiB (peak + {a['fragmentation']:.0%} fragmentation + "
            f"{a['reserved_mib']:.0f} MiB outside the allocator)")
