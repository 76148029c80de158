"""Injected faults (fault.*), for testing recovery and parity: a rank that dies, raises or hangs at
a given step or while saving, or one that corrupts one module's gradients in one step."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from fsdp_lab.config import ConfigError, FaultConfig, RunConfig
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models import build_meta
from fsdp_lab.modules import unwrap


class Faults:
    def __init__(self, cfg: FaultConfig, rank: int):
        self.cfg, self.rank = cfg, rank

    def _due(self, step: int, phase: str) -> bool:
        f = self.cfg
        # A restarted attempt must be able to get past the fault.
        return f.kill_rank == self.rank and f.at_step == step and f.phase == phase and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"

    def at(self, step: int, phase: str) -> None:
        """Die, raise or hang here if this is the configured rank, step and phase."""
        kind = self.cfg.kind
        if kind == "corrupt_grad" or not self._due(step, phase):
            return
        if kind == "raise":
            raise RuntimeError(f"injected fault: rank {self.rank} raised at step {step}" + (" while saving" if phase == "save" else ""))
        if kind == "hang":
            while True:
                time.sleep(60)
        os.kill(os.getpid(), signal.SIGKILL)

    @torch.no_grad()
    def corrupt_grads(self, model: nn.Module, step: int) -> None:
        """fault.kind=corrupt_grad: between backward and the optimizer step of 0-based step `step`,
        add 1 to this rank's local gradients of fault.module's parameters."""
        if self.cfg.kind != "corrupt_grad" or not self._due(step, "step"):
            return
        root = unwrap(model)
        try:
            module = root.get_submodule(self.cfg.module)
        except AttributeError:
            raise RuntimeError(f"fault.module={self.cfg.module}: no such module on rank {self.rank} (a pipeline rank holds only its stages)") from None
        for p in module.parameters():
            if p.grad is not None:
                (p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad).add_(1.0)


def _check_corrupt_grad(run: RunConfig) -> None:
    f = run.fault
    if f.phase != "step":
        raise ConfigError(f"fault.phase={f.phase} with fault.kind=corrupt_grad: gradients exist during a step; allowed: step")
    if run.mesh.engine == "fsdp1" and not run.fsdp.use_orig_params:
        raise ConfigError("fault.kind=corrupt_grad with mesh.engine=fsdp1: its modules' gradients live in flat parameters; allowed with fsdp.use_orig_params=true")
    model = build_meta(run.model)
    names = [name for name, m in model.named_modules() if name and any(True for _ in m.parameters())]
    if f.module not in names:
        raise ConfigError(f"fault.module={f.module}: not a module with parameters of model.name={run.model.name}; allowed: a module holding parameters, e.g. {names[0]}, {names[-1]}")


def check_fault(run: RunConfig, dims: ParallelDims) -> None:
    f = run.fault
    if f.kill_rank is not None and f.kill_rank >= dims.world_size:
        raise ConfigError(f"fault.kill_rank={f.kill_rank}: must be a rank in 0..{dims.world_size - 1}")
    if (f.kill_rank is None) != (f.at_step is None):
        raise ConfigError("fault.kill_rank and fault.at_step: set both or neither")
    if (f.kind == "corrupt_grad") != (f.module is not None):
        raise ConfigError(f"fault.module={f.module} with fault.kind={f.kind}: fault.kind=corrupt_grad needs fault.module=PATH, and only it takes one")
    if f.kind == "corrupt_grad":
        _check_corrupt_grad(run)
