"""The frozen-parameter check (on when model.freeze is set): the parameters model.freeze matched,
compared at the end with their values before training (local shards, every rank)."""

from __future__ import annotations

from torch import nn

from fsdp_lab.config import RunConfig
from fsdp_lab.dist import DistContext
from fsdp_lab.freeze import frozen_names
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.probes.base import Probe, ProbeSetup
from fsdp_lab.probes.parity import change_since


class FrozenProbe(Probe):
    summary_keys = ("frozen",)

    @staticmethod
    def enabled(run: RunConfig, dims: ParallelDims, ctx: DistContext) -> bool:
        return bool(run.model.freeze)

    def before_sharding(self, model: nn.Module) -> None:
        params = dict(model.named_parameters())
        self.initial = {name: params[name].detach().clone() for name in frozen_names(model, self.run.model.freeze)}

    def attach(self, setup: ProbeSetup) -> None:
        self.model = setup.model

    def summary(self) -> dict:
        change, numel = change_since(self.model, self.initial)
        return {"frozen": {"params": len(self.initial), "compared_numel": numel, "max_abs_change": change}}
