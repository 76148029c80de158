"""A fault that cannot fire is refused before any rank starts: a run that was asked to fail, hang
or corrupt a gradient and trains on unharmed would pass a recovery or parity test it never took."""

from __future__ import annotations

from fsdp_lab.checkpoint import saves_after
from fsdp_lab.config import ConfigError, FaultConfig, RunConfig

# The keys that only say how a fault strikes: set without a rank and a step, nothing strikes.
HOW = ("kind", "phase")


def check_fault_fires(run: RunConfig) -> None:
    f, steps = run.fault, run.train.steps
    if f.kill_rank is None:
        default = FaultConfig()
        for key in HOW:
            if getattr(f, key) != getattr(default, key):
                raise ConfigError(
                    f"fault.{key}={getattr(f, key)}: no fault.kill_rank and fault.at_step, so it never fires; "
                    "allowed: set both (which rank, after how many steps), or leave fault.* unset"
                )
        return
    if run.mode != "train":
        raise ConfigError(f"fault.kill_rank={f.kill_rank} with mode={run.mode}: nothing trains, so the fault never fires; allowed: mode=train")
    if f.phase == "step" and f.at_step >= steps:
        raise ConfigError(
            f"fault.at_step={f.at_step}: the run ends after train.steps={steps}, so the fault never fires; "
            f"allowed: 0..{steps - 1} (the steps done before it strikes)"
        )
    if f.phase == "save":
        c = run.checkpoint
        if c.kind != "dcp":
            raise ConfigError(f"fault.phase=save with checkpoint.kind={c.kind}: nothing is saved, so the fault never fires; allowed: checkpoint=dcp")
        if not 1 <= f.at_step <= steps or not saves_after(f.at_step, c.interval, steps):
            raise ConfigError(
                f"fault.at_step={f.at_step} with fault.phase=save: no checkpoint is saved after step {f.at_step} "
                f"(checkpoint.interval={c.interval}, train.steps={steps}); allowed: a multiple of {c.interval} up to {steps}, or {steps}"
            )
