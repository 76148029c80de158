"""Gradient accumulation: how the microbatches of one optimizer step reduce their gradients and
when FSDP2 reshards parameters between them."""

from __future__ import annotations

import contextlib

from torch import nn
from torch.distributed.fsdp import FSDPModule

from fsdp_lab.config import AccumConfig, ConfigError, RunConfig
from fsdp_lab.mesh import ParallelDims


class Accumulation:
    def __init__(self, model: nn.Module, cfg: AccumConfig):
        self.model, self.cfg = model, cfg
        self.fsdp2 = isinstance(model, FSDPModule)
        # Forward order: the root's own parameters (embeddings) are needed first.
        self.units = [m for m in model.modules() if isinstance(m, FSDPModule)]

    def microbatch(self, index: int, count: int):
        """Set up microbatch `index` of `count`; returns the context its forward+backward runs in."""
        last = index == count - 1
        sync = self.cfg.sync
        if self.fsdp2:
            self.model.set_requires_gradient_sync(last or sync != "last")
            if sync == "reduce_scatter_only":
                self.model.set_requires_all_reduce(last)
            self.model.set_reshard_after_backward(last or self.cfg.reshard_after_backward)
            self.model.set_is_last_backward(last)
            if self.cfg.explicit_unshard:
                for unit in self.units:
                    unit.unshard(async_op=True)  # FSDP's pre-forward waits on the pending all-gather
            return contextlib.nullcontext()
        if sync == "last" and not last:
            return self.model.no_sync()  # DDP and FSDP1
        return contextlib.nullcontext()


def check_accum(run: RunConfig, dims: ParallelDims) -> None:
    a = run.train.accum
    if a.sync == "reduce_scatter_only" and not (run.mesh.engine == "fsdp2" and dims.hsdp_enabled):
        raise ConfigError(
            "train.accum.sync=reduce_scatter_only: needs HSDP with FSDP2 (mesh.engine=fsdp2, mesh.dp_replicate>1 "
            f"and mesh.dp_shard>1; here engine={run.mesh.engine}, dp_replicate={dims.dp_replicate}, "
            f"dp_shard={dims.dp_shard}); allowed otherwise: every, last"
        )
    for key, value, default in (("reshard_after_backward", a.reshard_after_backward, True), ("explicit_unshard", a.explicit_unshard, False)):
        if value != default and run.mesh.engine != "fsdp2":
            raise ConfigError(f"train.accum.{key}={str(value).lower()}: only FSDP2 has it; mesh.engine={run.mesh.engine}")
