"""What mode=estimate cannot predict faithfully, refused before it traces (the plan's search asks too)."""

from __future__ import annotations

from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.estimate.pipeline import ESTIMABLE_SCHEDULES


def check_estimable(run: RunConfig) -> None:
    """Configurations mode=estimate cannot predict faithfully."""
    refusals = {
        "mesh.engine": (run.mesh.engine, run.mesh.engine != "fsdp2", "allowed: fsdp2 (FSDPMemTracker follows fully_shard only)"),
        # Pipelines are estimated through the schedule's order of microbatches (estimate/pipeline.py),
        # which is written for the single-stage schedules; a sequence-parallel stage boundary is a shard.
        "mesh.pp_schedule": (run.mesh.pp_schedule, run.mesh.pp > 1 and run.mesh.pp_schedule not in ESTIMABLE_SCHEDULES,
                             f"allowed with mesh.pp>1: {', '.join(ESTIMABLE_SCHEDULES)} (one stage per rank)"),
        "mesh.sequence_parallel": (run.mesh.sequence_parallel, run.mesh.pp > 1 and run.mesh.sequence_parallel,
                                   "allowed with mesh.pp>1: false (stages would receive sequence shards)"),
        "fsdp.cpu_offload": (run.fsdp.cpu_offload, run.fsdp.cpu_offload, "allowed: false (the estimate runs on one fake device)"),
        "model.compile": (run.model.compile, run.model.compile, "allowed: false (compiled graphs are not traced by the tracker)"),
        "fsdp.cast_after_sharding": (run.fsdp.cast_after_sharding, run.fsdp.cast_after_sharding is not None, "allowed: null (the estimate does not cast)"),
        "train.standalone_layer": (run.train.standalone_layer, run.train.standalone_layer is not None, "allowed: null (the estimate runs one step of the whole model)"),
    }
    for key, (value, refused, allowed) in refusals.items():
        if refused:
            value = str(value).lower() if isinstance(value, bool) else value
            raise ConfigError(f"{key}={value}: mode=estimate cannot predict this; {allowed}")
