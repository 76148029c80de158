"""mode=estimate: predict a configuration's memory per rank without its hardware, in one process.

A fake process group of the configured world size stands in for the ranks (collectives do nothing),
the model lives under FakeTensorMode (no storage is allocated), and the model goes through the same
parallelize path as a real run. A warm-up step creates the optimizer state; the measured step runs
under FSDPMemTracker, which counts what each tensor would occupy. The process plays rank 0, which
holds the largest shard when a dimension does not divide evenly, so its figure bounds every rank's.

The fake device is the CPU, and the optimizer is built for it: where a GPU run fuses Adam, which
updates the state in place with no temporaries, the estimate steps with torch's single-tensor Adam
(the CPU default), which holds the same state, also updates in place, and adds one parameter-sized
temporary at a time. Fused Adam over fake DTensors would not be faithful: torch 2.11 gathers the
full parameters, gradients and state for it, five times the optimizer state. An explicit
`optim.foreach=true` is estimated as configured."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

from fsdp_lab.config import RunConfig
from fsdp_lab.data import microbatches
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models import build_model, count_params
from fsdp_lab.optim import build_optimizer
from fsdp_lab.parallel import parallelize
from fsdp_lab.probes.memory import PhaseMemory
from fsdp_lab.probes.memory_breakdown import ModuleBreakdown, measured, render_table
from fsdp_lab.probes.parity import unwrap
from fsdp_lab.sinks.files import write_json_atomic, write_summary
from fsdp_lab.accum import Accumulation
from fsdp_lab.step import train_step, unmeasured

ESTIMATE_FILE = "estimate.json"
MEASURED_STEP = 2

log = logging.getLogger("fsdp_lab")


def estimate(run: RunConfig, dims: ParallelDims, around_step: Callable[[], contextlib.AbstractContextManager] | None = None) -> dict:
    """The predicted memory of rank 0 over one optimizer step after warm-up. `around_step()` gives a
    context the measured step runs in, inside the fake mode (mode=plan records the step's ops there)."""
    device = torch.device("cpu")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dims.world_size)
    try:
        mesh, dp_mesh = dims.build_meshes(device.type)  # real tensors: outside the fake mode
        with FakeTensorMode():
            model = build_model(run.model, run.train.seed)
            n_params = count_params(model)
            model = parallelize(model, dims, mesh, dp_mesh, run, device)
            optimizer = build_optimizer(model.parameters(), run.optim, device)
            phases = PhaseMemory(device, model, optimizer)
            breakdown = ModuleBreakdown(model, optimizer, device, step=MEASURED_STEP, gather=False)
            around = Accumulation(model, run.train.accum).microbatch if run.train.microbatches > 1 else None
            for step in range(MEASURED_STEP):
                batches = microbatches(
                    unwrap(model), seed=run.train.seed, step=step, dp_rank=0, batch_size=run.train.batch_size,
                    seq_len=run.train.seq_len, n=run.train.microbatches, device=device,
                )
                if step + 1 < MEASURED_STEP:
                    train_step(model, optimizer, batches, unmeasured, around)
                    continue
                with measured(phases, breakdown, batches) as mark, around_step() if around_step else contextlib.nullcontext():
                    train_step(model, optimizer, batches, mark, around)
            phases.metrics()
    finally:
        dist.destroy_process_group()
    report = breakdown.report
    for key in ("allocator_peak_mib", "untracked_mib", "tracker_accuracy", "ranks", "device"):
        report.pop(key)
    return {
        "mode": "estimate", "world_size": dims.world_size, "mesh": {**dims.as_dict(), "engine": run.mesh.engine},
        "model": {"name": run.model.name, "params": n_params}, "rank": 0,
        "phases_mib": phases.summary()["phases_mib"], **report,
    }


def run_estimate(run: RunConfig, dims: ParallelDims, run_dir: Path) -> None:
    """Estimate, print the prediction with its breakdown, write estimate.json and summary.json."""
    result = estimate(run, dims)
    write_json_atomic(run_dir / ESTIMATE_FILE, result)
    write_summary(run_dir, {
        "status": "ok", "error": None, "mode": "estimate", "steps": 0, "world_size": dims.world_size,
        "device": "fake", "mesh": result["mesh"],
        "memory": {"peak_mib": result["peak_mib"], "phases_mib": result["phases_mib"]},
    })
    mesh = " x ".join(f"{k}={v}" for k, v in dims.as_dict().items() if v > 1) or "1 rank"
    print(render_table(result, f"Estimated memory per rank: {dims.world_size} ranks ({mesh}), {run.model.name} "
                               f"{result['model']['params'] / 1e6:.1f}M params"), flush=True)
    print(f"estimate: peak {result['peak_mib']:.1f} MiB per rank", flush=True)
